package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/internal/app"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/tenants"
)

// recoveryBound is what the issue promises with the default settings:
// every run terminal within a lease TTL (30 s) plus 10 s of the store
// coming back.
const recoveryBound = 30*time.Second + 10*time.Second

// starter starts runs through the public GraphQL API, as a tenant's
// program would, each with an idempotency key, and records every answer.
type starter struct {
	url, key, workflow string
	client             *http.Client

	mu      sync.Mutex
	answers []startAnswer
}

type startAnswer struct {
	key     string
	at      time.Time
	latency time.Duration
	ok      bool
	err     string
	code    string // extensions.code of a refused start
}

func (s *starter) start(i int, tag string) {
	key := fmt.Sprintf("%s-%d", tag, i)
	body, _ := json.Marshal(map[string]any{
		"query":     `mutation($w: ID!, $k: String) { startRun(input: {workflowId: $w, idempotencyKey: $k}) { run { id status } } }`,
		"variables": map[string]any{"w": s.workflow, "k": key}})
	req, _ := http.NewRequest(http.MethodPost, s.url+"/graphql", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+s.key)
	req.Header.Set("Content-Type", "application/json")
	began := time.Now()
	a := startAnswer{key: key, at: began}
	resp, err := s.client.Do(req)
	if err != nil {
		a.err = err.Error()
	} else {
		var out struct {
			Data struct {
				StartRun *struct{ Run struct{ ID string } }
			}
			Errors []struct {
				Message    string
				Extensions struct{ Code string }
			}
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		_ = json.Unmarshal(b, &out)
		switch {
		case len(out.Errors) > 0:
			a.err, a.code = out.Errors[0].Message, out.Errors[0].Extensions.Code
		case out.Data.StartRun == nil || out.Data.StartRun.Run.ID == "":
			a.err = fmt.Sprintf("%d %s", resp.StatusCode, b)
		default:
			a.ok = true
		}
	}
	a.latency = time.Since(began)
	s.mu.Lock()
	s.answers = append(s.answers, a)
	s.mu.Unlock()
}

// load starts runs, ten a second from each of four callers, until stop
// is closed.
func (s *starter) load(tag string, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for c := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				s.start(i*4+c, tag)
			}
		}()
	}
	return &wg
}

func (s *starter) taken() []startAnswer {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.answers
	s.answers = nil
	return out
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// TestStoresRestartedUnderLoadRecoverWithinALeaseTTL is the store-fault
// test, run against real processes with the default settings (lease TTL,
// sweep interval, lost-dispatch age, claim idle — nothing shortened): a
// server and a platform worker as their own processes, a tenant's SDK
// worker as its own process, runs of HTTP, task and HTTP steps started
// through GraphQL all along, on a PostgreSQL and a Redis of the test's
// own. Three faults in turn:
//   - PostgreSQL crashes and restarts (pg_ctl restart -m immediate);
//   - Redis is SIGKILLed and restarted empty (every message, consumer
//     group and quota permit is gone);
//   - Redis is frozen (SIGSTOP) for 15 s while starts go on.
//
// After each, every run is terminal — completed, each step once — within
// a lease TTL plus 10 s of the store coming back; a start that fails
// answers UNAVAILABLE or OUTCOME_UNKNOWN, never INTERNAL; during the
// freeze no start answers failure for a run it committed (checked by
// idempotency key), and the start latencies are reported.
func TestStoresRestartedUnderLoadRecoverWithinALeaseTTL(t *testing.T) {
	if testing.Short() {
		t.Skip("the store-fault test takes about two minutes; run without -short")
	}
	t.Parallel()
	bin := apptest.Binary(t)
	sdkBin := apptest.Build(t, "./e2e/sdkworker")
	env, pgServer, rs := testenv.WithPrivateServices(t)
	ctx := context.Background()

	// The sink answers the HTTP steps; slowed down, it makes a backlog
	// build up in the streams.
	var delay atomic.Int64
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(time.Duration(delay.Load()))
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok": true}`)
	}))
	defer sink.Close()

	addr := freeAddr(t)
	url := "http://" + addr
	// Only what a deployment sets: where the stores are, the platform
	// token, where to listen. No timing is shortened.
	base := append(os.Environ(), "COMPOSER_DATABASE_URL="+env.AppURL, "COMPOSER_SYSTEM_DATABASE_URL="+env.SystemURL,
		"COMPOSER_MIGRATE_DATABASE_URL="+env.OwnerURL, "COMPOSER_REDIS_URL="+env.RedisURL, "COMPOSER_REDIS_NAMESPACE="+env.Namespace,
		"COMPOSER_WORKER_TOKEN=recovery-test-token", "COMPOSER_SERVER_URL="+url, "COMPOSER_ALLOW_PRIVATE_NETWORKS=127.0.0.0/8",
		"COMPOSER_LOG_LEVEL=warn", "COMPOSER_ADMIN_ADDR=127.0.0.1:0", "COMPOSER_AUDIT_KEY="+app.DevAuditKey)
	server := &proc{name: "server", args: []string{"server"}, env: append(slices.Clone(base), "COMPOSER_HTTP_ADDR="+addr)}
	worker := &proc{name: "worker", args: []string{"worker", "--concurrency", "16"}, env: base}
	server.start(t, bin)
	defer func() {
		server.kill()
		worker.kill()
		if t.Failed() {
			for _, p := range []*proc{server, worker} {
				p.mu.Lock()
				t.Logf("--- %s output (tail) ---\n%s", p.name, tail(p.out.String(), 4000))
				p.mu.Unlock()
			}
		}
	}()
	apptest.Eventually(t, "the server to serve", 30*time.Second, func() bool {
		resp, err := http.Get(url + "/readyz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
	worker.start(t, bin)

	db := pg.New(env.App, env.System, false)
	tn, err := tenants.Create(ctx, db, tenants.CreateParams{Name: "recovery", Plan: "pro"})
	require.NoError(t, err)
	keyOf := func(scopes ...string) string {
		var plain string
		require.NoError(t, db.WithTenant(ctx, tn.ID, func(ctx context.Context, tx *pg.Tx) error {
			var err error
			plain, _, err = auth.Keys{}.Create(ctx, tx, "recovery", scopes, nil, "test")
			return err
		}))
		return plain
	}
	startSDKProc(t, sdkBin, url, keyOf(auth.ScopeWorker))
	wf, _, err := engine.NewCoordinator(db, engine.Options{}).CreateWorkflow(ctx, tn.ID, "recovery", "", []byte(fmt.Sprintf(`{"nodes":[
		{"id":"a","type":"http","http":{"method":"POST","url":"%[1]s/a"},"retry":{"max_attempts":20,"backoff":"200ms","max_backoff":"2s"}},
		{"id":"b","type":"task","depends_on":["a"],"task":{"handler":"slow"},"input":{"sleep_ms":"0"},"retry":{"max_attempts":20,"backoff":"200ms","max_backoff":"2s"}},
		{"id":"c","type":"http","depends_on":["b"],"http":{"method":"POST","url":"%[1]s/c"},"retry":{"max_attempts":20,"backoff":"200ms","max_backoff":"2s"}}]}`, sink.URL)))
	require.NoError(t, err)
	st := &starter{url: url, key: keyOf(auth.ScopeRunsWrite), workflow: wf.ID.String(), client: &http.Client{Timeout: time.Minute}}

	// Warm up: the system runs at all.
	st.start(0, "warmup")
	require.True(t, st.taken()[0].ok, "a start before any fault")

	openRuns := func() int {
		var n int
		if err := env.System.QueryRow(ctx, `SELECT count(*) FROM workflow_runs WHERE tenant_id = $1 AND status = 'running'`, tn.ID).Scan(&n); err != nil {
			return -1 // the store is still coming back
		}
		return n
	}
	// settle waits for every run to finish and returns how long after
	// back that was.
	settle := func(fault string, back time.Time) time.Duration {
		t.Helper()
		deadline := back.Add(recoveryBound)
		for {
			if openRuns() == 0 {
				took := time.Since(back)
				t.Logf("%s: every run terminal %s after the store came back", fault, took.Round(100*time.Millisecond))
				return took
			}
			if time.Now().After(deadline) {
				var stuck []string
				rows, err := env.System.Query(ctx, `SELECT r.id::text || ' ' || t.node_id || ' ' || t.state || ' attempt ' || t.attempt
					FROM workflow_runs r JOIN task_instances t ON t.tenant_id = r.tenant_id AND t.run_id = r.id
					WHERE r.tenant_id = $1 AND r.status = 'running' AND t.state NOT IN ('completed') LIMIT 10`, tn.ID)
				if err == nil {
					for rows.Next() {
						var s string
						_ = rows.Scan(&s)
						stuck = append(stuck, s)
					}
					rows.Close()
				}
				t.Fatalf("%s: %d runs still running %s after the store came back (bound %s); e.g. %v", fault, openRuns(),
					time.Since(back).Round(time.Second), recoveryBound, stuck)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	redispatched := func() int {
		var n int
		require.NoError(t, env.System.QueryRow(ctx, `SELECT count(*) FROM run_events WHERE tenant_id = $1 AND kind = 'redispatched'`, tn.ID).Scan(&n))
		return n
	}
	type figure struct {
		fault        string
		recovery     time.Duration
		starts       int
		failed       int
		redispatched int
	}
	var figures []figure
	phase := func(fault string, inject func() (back time.Time)) []startAnswer {
		t.Helper()
		before := redispatched()
		stop := make(chan struct{})
		wg := st.load(fault, stop)
		time.Sleep(3 * time.Second) // work in flight at every stage
		back := inject()
		time.Sleep(2 * time.Second)
		close(stop)
		wg.Wait()
		took := settle(fault, back)
		answers := st.taken()
		failed := 0
		for _, a := range answers {
			if !a.ok {
				failed++
				// A store fault is answered for what it is, never INTERNAL.
				assert.Contains(t, []string{"UNAVAILABLE", "OUTCOME_UNKNOWN"}, a.code, "%s: start %s answered %q", fault, a.key, a.err)
			}
		}
		figures = append(figures, figure{fault, took, len(answers), failed, redispatched() - before})
		return answers
	}

	phase("PostgreSQL restart -m immediate", func() time.Time {
		pgServer.RestartImmediate()
		return time.Now()
	})
	delay.Store(int64(400 * time.Millisecond)) // more HTTP work than the worker's slots: a backlog waits in the streams
	phase("Redis SIGKILL, restarted empty", func() time.Time {
		rs.Kill()
		delay.Store(0)
		time.Sleep(time.Second)
		rs.Start()
		return time.Now()
	})
	var frozeAt, thawedAt time.Time
	answers := phase("Redis SIGSTOP 15 s", func() time.Time {
		frozeAt = time.Now()
		rs.Freeze()
		time.Sleep(15 * time.Second)
		rs.Thaw()
		thawedAt = time.Now()
		return thawedAt
	})

	// During the freeze: no start answered failure for a run it
	// committed, and what the starts cost.
	var during []time.Duration
	var failedKeys []string
	for _, a := range answers {
		if !a.ok {
			failedKeys = append(failedKeys, a.key)
		}
		if a.at.After(frozeAt) && a.at.Before(thawedAt) {
			during = append(during, a.latency)
		}
	}
	var committedAfterFailure []string
	if len(failedKeys) > 0 {
		rows, err := env.System.Query(ctx, `SELECT key FROM run_idempotency_keys WHERE tenant_id = $1 AND key = ANY($2)`, tn.ID, failedKeys)
		require.NoError(t, err)
		for rows.Next() {
			var k string
			require.NoError(t, rows.Scan(&k))
			committedAfterFailure = append(committedAfterFailure, k)
		}
		require.NoError(t, rows.Err())
	}
	assert.Empty(t, committedAfterFailure, "starts that answered failure although their run was committed")
	require.NotEmpty(t, during, "starts were made during the freeze")
	t.Logf("starts during the 15 s Redis freeze: %d, %d failed; latency p50 %s, p99 %s, max %s", len(during), len(failedKeys),
		percentile(during, 0.5).Round(time.Millisecond), percentile(during, 0.99).Round(time.Millisecond), slices.Max(during).Round(time.Millisecond))
	assert.Less(t, percentile(during, 0.99), 5*time.Second, "a frozen Redis does not hold starts up")

	// Every run completed, each step exactly once.
	var runs, completed, steps int
	require.NoError(t, env.System.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'completed') FROM workflow_runs WHERE tenant_id = $1`, tn.ID).Scan(&runs, &completed))
	require.NoError(t, env.System.QueryRow(ctx, `SELECT count(*) FROM task_instances WHERE tenant_id = $1 AND state = 'completed'`, tn.ID).Scan(&steps))
	assert.Equal(t, runs, completed, "every run completed")
	assert.Equal(t, 3*runs, steps, "each step completed once")
	for _, f := range figures {
		t.Logf("FIGURE %s | recovery %s | %d starts, %d answered failure | %d tasks re-dispatched", f.fault,
			f.recovery.Round(100*time.Millisecond), f.starts, f.failed, f.redispatched)
	}
	// Only a real loss re-dispatches: the restart of PostgreSQL and the
	// freeze of Redis lost no message; the killed Redis lost its backlog.
	assert.Zero(t, figures[0].redispatched, "nothing re-dispatched after a PostgreSQL restart")
	assert.Positive(t, figures[1].redispatched, "the killed Redis lost waiting messages, and they were re-dispatched")
	assert.Zero(t, figures[2].redispatched, "nothing re-dispatched after a Redis freeze")
}
