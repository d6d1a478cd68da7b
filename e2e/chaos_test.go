package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/billing"
	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/tenants"
)

// proc is one composer process the chaos loop kills, freezes and restarts.
type proc struct {
	name string
	args []string
	env  []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	out    bytes.Buffer
	exited chan struct{}
}

func (p *proc) start(t *testing.T, bin string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cmd := exec.Command(bin, p.args...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = &syncWriter{p: p}, &syncWriter{p: p}
	require.NoError(t, cmd.Start(), p.name)
	p.cmd, p.exited = cmd, make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) { _ = c.Wait(); close(done) }(cmd, p.exited)
}

type syncWriter struct{ p *proc }

func (w *syncWriter) Write(b []byte) (int, error) {
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	if w.p.out.Len() < 1<<20 {
		w.p.out.Write(b)
	}
	return len(b), nil
}

func (p *proc) signal(s syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return // never started (a test that failed before starting it)
	}
	_ = p.cmd.Process.Signal(s)
}

func (p *proc) kill() {
	if p.exited == nil {
		return
	}
	p.signal(syscall.SIGCONT) // a frozen process must be able to die
	p.signal(syscall.SIGKILL)
	<-p.exited
}

// lb spreads task API calls over the server processes and skips dead ones,
// as a load balancer in front of the servers would.
func lb(backends []string) http.Handler {
	var next atomic.Uint32
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{Proxy: nil}}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		start := int(next.Add(1))
		for i := range backends {
			backend := backends[(start+i)%len(backends)]
			if track, ok := r.Context().Value(trackKey{}).(func(string)); ok {
				track(backend)
			}
			req, _ := http.NewRequestWithContext(r.Context(), r.Method, backend+r.URL.Path, bytes.NewReader(body))
			req.Header = r.Header.Clone()
			resp, err := client.Do(req)
			if err != nil {
				continue
			}
			for k, v := range resp.Header {
				w.Header()[k] = v
			}
			w.WriteHeader(resp.StatusCode)
			_, _ = io.Copy(w, resp.Body)
			resp.Body.Close()
			return
		}
		http.Error(w, "no server answered", http.StatusBadGateway)
	})
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

// TestChaos is the crash test: 2 servers and 3 workers run 200 fork/join
// workflows of HTTP steps while a chaos loop SIGKILLs and restarts random
// processes, freezes a worker past its lease, and flushes Redis once.
// Afterwards every run has ended exactly once, every step's effect reached
// the sink under one Idempotency-Key (though raw requests show
// duplicates), and nothing is left running or pending.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("the crash test takes about a minute; run without -short")
	}
	t.Parallel()
	bin := apptest.Binary(t)
	env := testenv.WithPrivateRedis(t)
	cfg := apptest.Config(env)
	cfg.LostDispatchAge = 2 * time.Second
	ctx := context.Background()

	// The sink: every step POSTs here; it keeps each Idempotency-Key once.
	var raw atomic.Int64
	var keysMu sync.Mutex
	keys := map[string]int{}
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw.Add(1)
		k := r.Header.Get("Idempotency-Key")
		keysMu.Lock()
		keys[k]++
		keysMu.Unlock()
		time.Sleep(time.Duration(50+rand.IntN(100)) * time.Millisecond)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok": true}`)
	}))
	defer sink.Close()

	serverAddrs := []string{freeAddr(t), freeAddr(t)}
	var backends []string
	for _, a := range serverAddrs {
		backends = append(backends, "http://"+a)
	}
	proxy := httptest.NewServer(lb(backends))
	defer proxy.Close()

	base := (&apptest.System{Cfg: cfg, URL: proxy.URL}).ProcessEnv()
	var servers, workerProcs []*proc
	for i, a := range serverAddrs {
		servers = append(servers, &proc{name: fmt.Sprintf("server-%d", i), args: []string{"server"}, env: append(append([]string{}, base...), "COMPOSER_HTTP_ADDR="+a)})
	}
	for i := 0; i < 3; i++ {
		workerProcs = append(workerProcs, &proc{name: fmt.Sprintf("worker-%d", i), args: []string{"worker", "--concurrency", "8"}, env: base})
	}
	all := append(append([]*proc{}, servers...), workerProcs...)
	for _, p := range all {
		p.start(t, bin)
	}
	defer func() {
		for _, p := range all {
			p.kill()
		}
		if t.Failed() {
			for _, p := range all {
				p.mu.Lock()
				t.Logf("--- %s output (tail) ---\n%s", p.name, tail(p.out.String(), 3000))
				p.mu.Unlock()
			}
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

	db := pg.New(env.App, env.System, false)
	tn, err := tenants.Create(ctx, db, tenants.CreateParams{Name: "chaos", StreamShards: 4})
	require.NoError(t, err)
	coord := engine.NewCoordinator(db, engine.Options{Hooks: []engine.TxHook{billing.Meter{}.Hook}})
	step := func(id string, deps ...string) string {
		d, _ := json.Marshal(deps)
		return fmt.Sprintf(`{"id":%q,"type":"http","depends_on":%s,"http":{"method":"POST","url":"%s/%s"},
			"retry":{"max_attempts":25,"backoff":"100ms","max_backoff":"1s"}}`, id, d, sink.URL, id)
	}
	wf, _, err := coord.CreateWorkflow(ctx, tn.ID, "chaos", "", []byte(fmt.Sprintf(`{"nodes":[%s,%s,%s,%s]}`,
		step("a"), step("b", "a"), step("c", "a"), step("d", "b", "c"))))
	require.NoError(t, err)

	// Runs start throughout the chaos, so kills land on work in flight;
	// they spread over every priority, so their streams go through it too.
	const runs = 200
	startErr := make(chan error, 1)
	go func() {
		for i := 0; i < runs; i++ {
			if _, err := coord.StartRun(ctx, tn.ID, engine.StartRun{WorkflowID: wf.ID, Input: json.RawMessage(fmt.Sprintf(`{"i": %d}`, i)),
				Priority: i%5 - 2}); err != nil {
				startErr <- err
				return
			}
			time.Sleep(70 * time.Millisecond)
		}
		startErr <- nil
	}()

	// Chaos.
	var events []string
	chaosEnd := time.Now().Add(20 * time.Second)
	flushed, froze := false, 0
	for time.Now().Before(chaosEnd) {
		time.Sleep(time.Duration(700+rand.IntN(800)) * time.Millisecond)
		switch {
		case !flushed && time.Until(chaosEnd) < 12*time.Second:
			require.NoError(t, env.Redis.FlushAll(ctx).Err())
			flushed = true
			events = append(events, "FLUSHALL")
		case froze < 2 && rand.IntN(4) == 0:
			w := workerProcs[rand.IntN(len(workerProcs))]
			w.signal(syscall.SIGSTOP)
			froze++
			events = append(events, "SIGSTOP "+w.name)
			go func() {
				time.Sleep(cfg.LeaseTTL + 1500*time.Millisecond)
				w.signal(syscall.SIGCONT)
			}()
		default:
			p := all[rand.IntN(len(all))]
			p.kill()
			events = append(events, "SIGKILL "+p.name)
			time.Sleep(300 * time.Millisecond)
			p.start(t, bin)
		}
	}
	for _, w := range workerProcs {
		w.signal(syscall.SIGCONT)
	}
	t.Logf("chaos: %v", events)
	require.NoError(t, <-startErr)

	// Every run finishes.
	deadline := time.Now().Add(75 * time.Second)
	for {
		var open int
		require.NoError(t, env.System.QueryRow(ctx, `SELECT count(*) FROM workflow_runs WHERE status = 'running'`).Scan(&open))
		if open == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d runs still running after the chaos", open, runs)
		}
		time.Sleep(200 * time.Millisecond)
	}

	var completed, terminalWrites, active, steps int
	require.NoError(t, env.System.QueryRow(ctx, `SELECT count(*) FROM workflow_runs WHERE status = 'completed'`).Scan(&completed))
	assert.Equal(t, runs, completed, "every run completed")
	// The terminal state was written once per run: one timeline entry with
	// a terminal action each.
	require.NoError(t, env.System.QueryRow(ctx, `SELECT count(*) FROM run_events e
		WHERE EXISTS (SELECT 1 FROM jsonb_array_elements(e.detail->'actions') a WHERE a->>'kind' IN ('complete_run', 'fail_run', 'cancel_run'))`).Scan(&terminalWrites))
	assert.Equal(t, runs, terminalWrites, "exactly one terminal transition per run")
	require.NoError(t, env.System.QueryRow(ctx, `SELECT count(*) FROM task_instances WHERE state IN ('pending', 'running', 'waiting')`).Scan(&active))
	assert.Zero(t, active, "nothing left running or pending")
	require.NoError(t, env.System.QueryRow(ctx, `SELECT count(*) FROM task_instances WHERE state = 'completed'`).Scan(&steps))
	assert.Equal(t, runs*4, steps)

	keysMu.Lock()
	distinct := len(keys)
	keysMu.Unlock()
	rows, err := env.System.Query(ctx, `SELECT id::text FROM task_instances`)
	require.NoError(t, err)
	taskIDs := map[string]bool{}
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		taskIDs[id] = true
	}
	keysMu.Lock()
	for k := range keys {
		assert.True(t, taskIDs[k], "the sink saw a key that is no task: %s", k)
	}
	keysMu.Unlock()
	assert.Equal(t, runs*4, distinct, "each step's effect reached the sink under exactly one key")
	t.Logf("sink: %d raw requests for %d distinct keys (%d duplicates absorbed by Idempotency-Key)", raw.Load(), distinct, raw.Load()-int64(distinct))
	assert.Greater(t, raw.Load(), int64(distinct), "the chaos caused duplicate deliveries")

	// Usage is exact: each meter's total, rolled up by two passes at once,
	// equals what the committed run and timeline rows say — through
	// duplicate deliveries, retried steps and killed processes.
	rollup := &billing.Rollup{DB: db, Log: zap.NewNop()}
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); _, err := rollup.Pass(ctx); assert.NoError(t, err) }()
	}
	wg.Wait()
	meters := map[string]int64{}
	rows, err = env.System.Query(ctx, `SELECT meter, sum(quantity)::bigint FROM usage_hourly WHERE tenant_id = $1 GROUP BY meter`, tn.ID)
	require.NoError(t, err)
	for rows.Next() {
		var m string
		var q int64
		require.NoError(t, rows.Scan(&m, &q))
		meters[m] = q
	}
	var derivedRuns, derivedSteps, derivedMillis, reported int64
	require.NoError(t, env.System.QueryRow(ctx, `SELECT count(*) FROM workflow_runs WHERE tenant_id = $1`, tn.ID).Scan(&derivedRuns))
	// An executed attempt is one whose worker's result was applied: its
	// timeline entry names the worker and when the attempt's lease began.
	require.NoError(t, env.System.QueryRow(ctx, `SELECT count(*), coalesce(sum(floor(extract(epoch FROM created_at - (detail->>'started_at')::timestamptz) * 1000)), 0)::bigint
		FROM run_events WHERE tenant_id = $1 AND kind IN ('node_completed', 'node_failed') AND detail ? 'worker'`, tn.ID).Scan(&derivedSteps, &derivedMillis))
	require.NoError(t, env.System.QueryRow(ctx, `SELECT count(*) FROM run_events WHERE tenant_id = $1 AND kind IN ('node_completed', 'node_failed', 'lease_expired')`, tn.ID).Scan(&reported))
	assert.Equal(t, derivedRuns, meters[billing.RunsStarted], "runs_started")
	assert.Equal(t, derivedSteps, meters[billing.StepsExecuted], "steps_executed")
	assert.Equal(t, derivedMillis, meters[billing.StepSeconds], "step_seconds (ms)")
	assert.GreaterOrEqual(t, derivedSteps, int64(runs*4), "at least one executed attempt per step")
	t.Logf("usage: %d runs, %d executed attempts (%d attempts ended in all, incl. lost ones), %d ms of steps", meters[billing.RunsStarted],
		meters[billing.StepsExecuted], reported, meters[billing.StepSeconds])
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
