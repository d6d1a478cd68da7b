package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/sdk/client"
	"github.com/composer-dev/composer/tenants"
)

// sdkProc is a tenant's worker running as its own process, with nothing in
// its environment but the server URL and an API key (and, for the test
// worker, a short lease TTL).
type sdkProc struct {
	cmd  *exec.Cmd
	out  *outBuffer
	done chan struct{}
}

type outBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *outBuffer) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *outBuffer) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

func startSDKProc(t *testing.T, bin, url, key string, env ...string) *sdkProc {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append([]string{"COMPOSER_URL=" + url, "COMPOSER_API_KEY=" + key}, env...)
	p := &sdkProc{cmd: cmd, out: &outBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	require.NoError(t, cmd.Start())
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("--- %s output ---\n%s", bin, tail(p.out.String(), 4000))
		}
	})
	return p
}

func (p *sdkProc) exited(d time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		return false
	}
}

func uuidOf(t *testing.T, s string) uuid.UUID {
	id, err := uuid.Parse(s)
	require.NoError(t, err)
	return id
}

// leaseOwner is who holds the lease of a run's node, if anyone.
func leaseOwner(t *testing.T, sys *apptest.System, run, node string) string {
	var owner *string
	err := sys.Deps.DB.System().QueryRow(context.Background(), `SELECT lease_owner FROM task_instances
		WHERE tenant_id = $1 AND run_id = $2 AND node_id = $3 AND state = 'running'`, sys.Tenant, run, node).Scan(&owner)
	if err != nil || owner == nil {
		return ""
	}
	return *owner
}

// TestSDKWorkerBinaryRunsAMixedWorkflow: the README's example program,
// built as its own binary and given only the server URL and a worker key,
// runs the task step of a workflow that also has a wait and an HTTP step;
// another tenant's task for the same handler is never offered to it; a
// key without the worker scope stops the program with a clear error.
func TestSDKWorkerBinaryRunsAMixedWorkflow(t *testing.T) {
	t.Parallel()
	bin := apptest.Build(t, "./examples/worker")
	sys := apptest.Start(t)
	ctx := context.Background()
	sys.StartWorker(apptest.WorkerOptions{}) // the platform's worker runs the HTTP step
	var shipped atomic.Value
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		shipped.Store(string(b))
		_, _ = io.WriteString(w, `{"tracking":"T-1"}`)
	}))
	defer sink.Close()

	// Tenant B queues a charge first: A's worker must never see it.
	other, err := tenants.Create(ctx, sys.Deps.DB, tenants.CreateParams{Name: "other", Plan: "pro"})
	require.NoError(t, err)
	owf, _, err := sys.Coordinator().CreateWorkflow(ctx, other.ID, "theirs", "", []byte(`{"nodes":[{"id":"c","type":"task","task":{"handler":"charge"},"input":{"id":"'b'","amount":"1"}}]}`))
	require.NoError(t, err)
	theirs, err := sys.Coordinator().StartRun(ctx, other.ID, engine.StartRun{WorkflowID: owf.ID})
	require.NoError(t, err)

	proc := startSDKProc(t, bin, sys.URL, sys.APIKey(auth.ScopeWorker))
	c, err := client.New(sys.URL, sys.APIKey(auth.ScopeAdmin))
	require.NoError(t, err)
	_, _, err = c.CreateWorkflow(ctx, "order", json.RawMessage(fmt.Sprintf(`{"nodes":[
		{"id":"charge","type":"task","task":{"handler":"charge"},"input":{"id":"input.order","amount":"input.amount"}},
		{"id":"ok","type":"wait","depends_on":["charge"],"wait":{"signal":"approval","approval":true,"timeout":"1h"}},
		{"id":"ship","type":"http","depends_on":["ok"],"http":{"method":"POST","url":"%s/ship"},"input":{"receipt":"nodes.charge.output"}}]}`, sink.URL)))
	require.NoError(t, err)
	run, _, err := c.StartRun(ctx, client.Start{Workflow: "order", Input: map[string]any{"order": "o-1", "amount": 42}})
	require.NoError(t, err)
	apptest.Eventually(t, "the charge to run and the run to wait for approval", 20*time.Second, func() bool {
		r, err := c.GetRun(ctx, run.ID)
		return err == nil && len(r.Tasks) == 2 && r.Tasks[0].State == "COMPLETED" && r.Tasks[1].State == "WAITING"
	})
	_, err = c.Approve(ctx, run.ID, true, "")
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	done, err := c.WaitRun(wctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, "COMPLETED", done.Status, "error: %s", done.Error)
	charge := done.Tasks[0]
	assert.JSONEq(t, fmt.Sprintf(`{"order":"o-1","charged":42,"idempotency_key":%q}`, charge.ID), string(charge.Output))
	assert.Contains(t, shipped.Load(), `"charged":42`, "the HTTP step got the task's output")

	_, tasks := func() (engine.RunView, map[string]engine.TaskView) {
		s := *sys
		s.Tenant = other.ID
		return s.Run(theirs.RunID)
	}()
	assert.Equal(t, "pending", tasks["c"].State, "tenant B's task was not offered to tenant A's worker")
	assert.False(t, proc.exited(0), "the worker is still running")

	// A key without the worker scope: the program stops with a clear error.
	refused := startSDKProc(t, bin, sys.URL, sys.APIKey(auth.ScopeRunsRead, auth.ScopeRunsWrite))
	require.True(t, refused.exited(10*time.Second), "a worker with a key lacking the worker scope must stop")
	assert.Contains(t, refused.out.String(), "lacks the worker scope")
	assert.NotZero(t, refused.cmd.ProcessState.ExitCode())
}

// TestSDKWorkerKilledMidTaskIsRetriedElsewhere: the worker process running
// an attempt is SIGKILLed; after the lease TTL the attempt is retried on
// another worker process and the run completes. A worker frozen (SIGSTOP)
// past its lease loses its attempt the same way, and when it wakes its
// result is fenced out: the run keeps the second worker's.
func TestSDKWorkerKilledMidTaskIsRetriedElsewhere(t *testing.T) {
	t.Parallel()
	bin := apptest.Build(t, "./e2e/sdkworker")
	sys := apptest.Start(t)
	key := sys.APIKey(auth.ScopeWorker)
	ttl := "COMPOSER_LEASE_TTL=" + sys.Cfg.LeaseTTL.String()
	wf := sys.Workflow(`{"nodes":[{"id":"s","type":"task","task":{"handler":"slow"},"input":{"sleep_ms":"input.sleep_ms"},"retry":{"max_attempts":3}}]}`)

	for _, how := range []syscall.Signal{syscall.SIGKILL, syscall.SIGSTOP} {
		t.Run(how.String(), func(t *testing.T) {
			first := startSDKProc(t, bin, sys.URL, key, ttl)
			run := sys.StartRun(wf, `{"sleep_ms": 8000}`).String()
			var holder string
			apptest.Eventually(t, "the first worker to hold the task", 20*time.Second, func() bool {
				holder = leaseOwner(t, sys, run, "s")
				return holder != ""
			})
			require.NoError(t, first.cmd.Process.Signal(how))
			second := startSDKProc(t, bin, sys.URL, key, ttl)
			got, _ := sys.WaitRun(uuidOf(t, run), 30*time.Second)
			require.Equal(t, "completed", got.Status, "error: %s", got.Error)
			_, tasks := sys.Run(uuidOf(t, run))
			assert.Equal(t, 2, tasks["s"].Attempt, "attempt 1 was lost with its worker")
			var out struct {
				Worker  string
				Attempt int
			}
			require.NoError(t, json.Unmarshal(tasks["s"].Output, &out))
			assert.NotEqual(t, holder, out.Worker, "another worker ran attempt 2")
			assert.Equal(t, 2, out.Attempt)
			if how == syscall.SIGSTOP {
				require.NoError(t, first.cmd.Process.Signal(syscall.SIGCONT))
				apptest.Eventually(t, "the woken worker to give up its stale attempt", 20*time.Second, func() bool {
					s := first.out.String()
					return strings.Contains(s, "no longer this worker's") || strings.Contains(s, "result ignored")
				})
				_, after := sys.Run(uuidOf(t, run))
				assert.JSONEq(t, string(tasks["s"].Output), string(after["s"].Output), "the late result was fenced out")
			}
			_ = second.cmd.Process.Kill()
		})
	}
}

// TestSDKWorkerSurvivesTheLossOfItsServer: two `composer server` processes
// behind a load balancer; the one holding the worker's open poll is
// SIGKILLed; the worker continues through the other and runs new work.
func TestSDKWorkerSurvivesTheLossOfItsServer(t *testing.T) {
	t.Parallel()
	bin, worker := apptest.Binary(t), apptest.Build(t, "./e2e/sdkworker")
	env := testenv.New(t)
	sys := apptest.StartWith(t, env) // provisions the tenant; its own server stays out of the balancer
	addrs := []string{freeAddr(t), freeAddr(t)}
	var backends []string
	for _, a := range addrs {
		backends = append(backends, "http://"+a)
	}
	bal := &pollTracker{}
	proxy := httptest.NewServer(bal.wrap(lb(backends)))
	defer proxy.Close()
	var servers []*proc
	for i, a := range addrs {
		p := &proc{name: fmt.Sprintf("server-%d", i), args: []string{"server"}, env: append(sys.ProcessEnv(), "COMPOSER_HTTP_ADDR="+a)}
		p.start(t, bin)
		servers = append(servers, p)
	}
	defer func() {
		for _, p := range servers {
			p.kill()
		}
	}()
	for _, b := range backends {
		apptest.Eventually(t, b+" to serve", 30*time.Second, func() bool {
			resp, err := http.Get(b + "/readyz")
			if err == nil {
				resp.Body.Close()
			}
			return err == nil && resp.StatusCode == 200
		})
	}
	startSDKProc(t, worker, proxy.URL, sys.APIKey(auth.ScopeWorker), "COMPOSER_LEASE_TTL=3s")
	wf := sys.Workflow(`{"nodes":[{"id":"s","type":"task","task":{"handler":"slow"}}]}`)
	run, _ := sys.WaitRun(sys.StartRun(wf, `{}`), 20*time.Second)
	require.Equal(t, "completed", run.Status)

	var holding string
	apptest.Eventually(t, "a server to hold the worker's poll", 10*time.Second, func() bool {
		holding = bal.holder()
		return holding != ""
	})
	for i, b := range backends {
		if b == holding {
			servers[i].kill()
		}
	}
	run, _ = sys.WaitRun(sys.StartRun(wf, `{}`), 30*time.Second)
	assert.Equal(t, "completed", run.Status, "the worker went on through the other server")
}

// pollTracker records which backend holds each poll in flight through lb.
type pollTracker struct {
	mu   sync.Mutex
	open map[*http.Request]string
}

func (p *pollTracker) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/poll") {
			p.mu.Lock()
			if p.open == nil {
				p.open = map[*http.Request]string{}
			}
			p.open[r] = ""
			p.mu.Unlock()
			defer func() { p.mu.Lock(); delete(p.open, r); p.mu.Unlock() }()
			r = r.WithContext(context.WithValue(r.Context(), trackKey{}, func(backend string) {
				p.mu.Lock()
				p.open[r] = backend
				p.mu.Unlock()
			}))
		}
		next.ServeHTTP(w, r)
	})
}

type trackKey struct{}

func (p *pollTracker) holder() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, b := range p.open {
		if b != "" {
			return b
		}
	}
	return ""
}

// TestTaskWaitsForAWorkerThatServesIt: a task node whose handler no
// connected worker serves waits, listed as PENDING with its handler, while
// the tenant's workers show nobody serving it; when a worker for it
// connects, it runs. Its schedule-to-start timeout still applies.
func TestTaskWaitsForAWorkerThatServesIt(t *testing.T) {
	t.Parallel()
	bin := apptest.Build(t, "./e2e/sdkworker")
	sys := apptest.Start(t)
	admin := sys.APIKey(auth.ScopeAdmin)
	c, err := client.New(sys.URL, admin)
	require.NoError(t, err)
	ctx := context.Background()
	run := sys.StartRun(sys.Workflow(`{"nodes":[{"id":"s","type":"task","task":{"handler":"slow"}}]}`), `{}`).String()
	timed := sys.StartRun(sys.Workflow(`{"nodes":[{"id":"s","type":"task","task":{"handler":"nobody"},"schedule_to_start_timeout":"300ms","retry":{"max_attempts":1}}]}`), `{}`)
	got, _ := sys.WaitRun(timed, 20*time.Second)
	assert.Equal(t, "failed", got.Status)
	assert.Equal(t, "schedule_to_start_timeout", errCode(t, got.Error))

	r, err := c.GetRun(ctx, run)
	require.NoError(t, err)
	require.Len(t, r.Tasks, 1)
	assert.Equal(t, "PENDING", r.Tasks[0].State, "the task waits for a worker instead of failing")
	assert.Equal(t, "slow", r.Tasks[0].Handler)
	ws, err := c.Workers(ctx)
	require.NoError(t, err)
	assert.Empty(t, ws, "no worker is connected")

	startSDKProc(t, bin, sys.URL, sys.APIKey(auth.ScopeWorker), "COMPOSER_LEASE_TTL=3s")
	done, _ := sys.WaitRun(uuidOf(t, run), 20*time.Second)
	assert.Equal(t, "completed", done.Status)
	ws, err = c.Workers(ctx)
	require.NoError(t, err)
	require.Len(t, ws, 1)
	assert.Equal(t, []string{"slow"}, ws[0].Handlers)
	assert.Equal(t, []string{"default"}, ws[0].Queues)
	assert.Contains(t, ws[0].Version, "composer-go/")
}

// TestRevokedKeyStopsTheWorkerProcess: revoking the key of a running worker
// process through the API stops it within a heartbeat interval, and its
// task goes back to the queue for another worker.
func TestRevokedKeyStopsTheWorkerProcess(t *testing.T) {
	t.Parallel()
	bin := apptest.Build(t, "./e2e/sdkworker")
	sys := apptest.Start(t)
	const ttl = 3 * time.Second
	admin := sys.APIKey(auth.ScopeAdmin)
	key := sys.APIKey(auth.ScopeWorker)
	p := startSDKProc(t, bin, sys.URL, key, "COMPOSER_LEASE_TTL="+ttl.String())
	run := sys.StartRun(sys.Workflow(`{"nodes":[{"id":"s","type":"task","task":{"handler":"slow"},"input":{"sleep_ms":"60000"},"retry":{"max_attempts":3}}]}`), `{}`)
	apptest.Eventually(t, "the worker to hold the task", 20*time.Second, func() bool { return leaseOwner(t, sys, run.String(), "s") != "" })

	var keys struct {
		APIKeys []struct{ ID, KeyID string } `json:"apiKeys"`
	}
	sys.GraphQL(admin, `{ apiKeys { id keyId } }`, nil).Decode(t, &keys)
	for _, k := range keys.APIKeys {
		if strings.Contains(key, "_"+k.KeyID+"_") {
			res := sys.GraphQL(admin, `mutation($id: ID!) { revokeApiKey(id: $id) { revokedAt } }`, map[string]any{"id": k.ID})
			require.Empty(t, res.Errors)
		}
	}
	require.True(t, p.exited(ttl/3+5*time.Second), "the worker stops within a heartbeat interval (and the time to exit)")
	assert.Contains(t, p.out.String(), "refused the API key")
	startSDKProc(t, bin, sys.URL, sys.APIKey(auth.ScopeWorker), "COMPOSER_LEASE_TTL="+ttl.String())
	got, tasks := sys.WaitRun(run, 20*time.Second)
	require.Equal(t, "completed", got.Status)
	assert.Equal(t, 2, tasks["s"].Attempt)
}
