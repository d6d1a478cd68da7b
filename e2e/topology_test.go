package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/engine/stream"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/sdk/worker"
	"github.com/composer-dev/composer/tenants"
)

// failoverBound is how long after a Redis master is killed every run of
// the workload must have finished.
const failoverBound = 60 * time.Second

// failoverWorkload is a system on a replicated Redis running runs of
// several tenants — HTTP step, step, HTTP step; the system's own tenant's
// middle step is a task node served by its SDK worker — started through
// GraphQL all along, while kill takes the Redis master down.
type failoverWorkload struct {
	t   *testing.T
	sys *apptest.System
	// tenants: the system's own first, whose keys the killed master holds.
	tenants  []uuid.UUID
	starters []*starter

	rawRequests atomic.Int64
	keysMu      sync.Mutex
	keys        map[string]int
}

func newFailoverWorkload(t *testing.T, env *testenv.Env, extraTenants int) *failoverWorkload {
	t.Helper()
	w := &failoverWorkload{t: t, keys: map[string]int{}}
	sink := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w.rawRequests.Add(1)
		w.keysMu.Lock()
		w.keys[r.Header.Get("Idempotency-Key")]++
		w.keysMu.Unlock()
		rw.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(rw, `{"ok": true}`)
	}))
	t.Cleanup(sink.Close)
	w.sys = apptest.StartWith(t, env)
	for range 2 {
		w.sys.StartWorker(apptest.WorkerOptions{})
	}
	w.sys.StartSDKWorker(func(sw *worker.Worker) {
		sw.HandleRaw("echo", func(_ context.Context, in json.RawMessage) (json.RawMessage, error) { return in, nil })
	}, apptest.SDKWorkerOptions{})
	ctx := context.Background()
	db := w.sys.Deps.DB
	w.tenants = []uuid.UUID{w.sys.Tenant}
	for i := range extraTenants {
		tn, err := tenants.Create(ctx, db, tenants.CreateParams{Name: fmt.Sprintf("failover-%d", i), Plan: "pro", StreamShards: 2})
		require.NoError(t, err)
		w.tenants = append(w.tenants, tn.ID)
	}
	step := func(id, deps string) string {
		return fmt.Sprintf(`{"id":%q,"type":"http","depends_on":%s,"http":{"method":"POST","url":"%s/%s"},
			"retry":{"max_attempts":30,"backoff":"100ms","max_backoff":"1s"}}`, id, deps, sink.URL, id)
	}
	for i, tenant := range w.tenants {
		middle := `{"id":"b","type":"noop","depends_on":["a"]}`
		if i == 0 {
			middle = `{"id":"b","type":"task","depends_on":["a"],"task":{"handler":"echo"},"retry":{"max_attempts":30,"backoff":"100ms","max_backoff":"1s"}}`
		}
		wf, _, err := w.sys.Coordinator().CreateWorkflow(ctx, tenant, "failover", "", []byte(fmt.Sprintf(`{"nodes":[%s,%s,%s]}`,
			step("a", `[]`), middle, step("c", `["b"]`))))
		require.NoError(t, err)
		var key string
		require.NoError(t, db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
			var err error
			key, _, err = auth.Keys{}.Create(ctx, tx, "failover", []string{auth.ScopeRunsWrite}, nil, "test")
			return err
		}))
		w.starters = append(w.starters, &starter{url: w.sys.URL, key: key, workflow: wf.ID.String(), client: &http.Client{Timeout: time.Minute}})
	}
	for _, s := range w.starters {
		s.start(0, "warmup")
		a := s.taken()
		require.True(t, a[0].ok, "a start before the kill: %s", a[0].err)
	}
	w.waitTerminal("the warm-up's starts", time.Now(), 30*time.Second)
	return w
}

// run starts runs for every tenant (one caller each, a start every 200 ms)
// for before, calls kill, goes on for after, and returns when the kill
// was made and every start's answer.
func (w *failoverWorkload) run(before, after time.Duration, kill func()) (killedAt time.Time, answers []startAnswer) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, s := range w.starters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1; ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(200 * time.Millisecond):
				}
				s.start(i, "load")
			}
		}()
	}
	time.Sleep(before) // (the workload's own pace: work in flight at every stage when the kill lands)
	killedAt = time.Now()
	kill()
	time.Sleep(after)
	close(stop)
	wg.Wait()
	for _, s := range w.starters {
		answers = append(answers, s.taken()...)
	}
	return killedAt, answers
}

func (w *failoverWorkload) openRuns() int {
	var n int
	if err := w.sys.Env.System.QueryRow(context.Background(), `SELECT count(*) FROM workflow_runs WHERE status = 'running'`).Scan(&n); err != nil {
		return -1
	}
	return n
}

// waitTerminal waits until no run is running, at most bound after since,
// and returns how long after since that was.
func (w *failoverWorkload) waitTerminal(what string, since time.Time, bound time.Duration) time.Duration {
	w.t.Helper()
	for w.openRuns() != 0 {
		if time.Since(since) > bound {
			w.t.Fatalf("%d runs still running %s after %s (bound %s); tenants %v; e.g.\n%s", w.openRuns(), time.Since(since).Round(time.Second),
				what, bound, w.tenants, w.stuck())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(since)
}

// stuck describes unfinished tasks of running runs: their rows, outbox
// rows and what Redis holds of their tenant's streams.
func (w *failoverWorkload) stuck() string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db, rdb := w.sys.Env.System, w.sys.Env.Redis
	names := stream.NewNames(w.sys.Env.Namespace)
	var b strings.Builder
	rows, err := db.Query(ctx, `SELECT t.tenant_id, t.id, t.node_id, t.state, t.attempt, t.created_at, coalesce(t.lease_owner, ''),
		(SELECT count(*) FROM outbox o WHERE o.tenant_id = t.tenant_id AND o.task_id = t.id),
		(SELECT coalesce(max(o.last_error), '') FROM outbox o WHERE o.tenant_id = t.tenant_id AND o.task_id = t.id),
		(SELECT count(*) FROM outbox_dead_letters d WHERE d.tenant_id = t.tenant_id AND d.task_id = t.id)
		FROM workflow_runs r JOIN task_instances t ON t.tenant_id = r.tenant_id AND t.run_id = r.id
		WHERE r.status = 'running' AND t.state <> 'completed' LIMIT 5`)
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	for rows.Next() {
		var tenant, task uuid.UUID
		var node, state, owner, lastErr string
		var attempt, outbox, dead int
		var created time.Time
		if err := rows.Scan(&tenant, &task, &node, &state, &attempt, &created, &owner, &outbox, &lastErr, &dead); err != nil {
			return err.Error()
		}
		fmt.Fprintf(&b, "tenant %s task %s node %s %s attempt %d created %s ago owner %q; outbox rows %d (%s), dead letters %d\n",
			tenant, task, node, state, attempt, time.Since(created).Round(time.Millisecond), owner, outbox, lastErr, dead)
		queued, _ := names.StillQueued(ctx, rdb, tenant, []uuid.UUID{task})
		fmt.Fprintf(&b, "  queued hash says in a stream: %v\n", queued)
		for shard := range 2 {
			key := names.Stream(tenant, "default", shard)
			n, _ := rdb.XLen(ctx, key).Result()
			p, perr := rdb.XPending(ctx, key, stream.Group).Result()
			fmt.Fprintf(&b, "  %s: %d entries, pending %+v %v\n", key, n, p, perr)
		}
	}
	active, _ := rdb.ZRangeWithScores(ctx, names.Active("default"), 0, -1).Result()
	fmt.Fprintf(&b, "active set: %v (now %d)\n", active, time.Now().UnixMilli())
	return b.String()
}

// check asserts that every run completed once and each step's completion
// was applied once, and returns the longest pause in step completions of
// the tenant whose master was killed around the kill.
func (w *failoverWorkload) check(killedAt time.Time, answers []startAnswer) (stall time.Duration) {
	t := w.t
	ctx := context.Background()
	db := w.sys.Env.System
	failed := 0
	for _, a := range answers {
		if !a.ok {
			failed++
			t.Logf("start %s answered failure: %s", a.key, a.err)
		}
	}
	assert.Zero(t, failed, "starts answer while Redis fails over (the rate limiter admits when it cannot ask)")
	var runs, completed, terminalWrites, steps, completions, doubled int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'completed') FROM workflow_runs`).Scan(&runs, &completed))
	assert.Equal(t, len(answers)+len(w.starters), runs, "one run per start (and the warm-up's)")
	assert.Equal(t, runs, completed, "every run completed")
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM run_events e
		WHERE EXISTS (SELECT 1 FROM jsonb_array_elements(e.detail->'actions') a WHERE a->>'kind' IN ('complete_run', 'fail_run', 'cancel_run'))`).Scan(&terminalWrites))
	assert.Equal(t, runs, terminalWrites, "exactly one terminal transition per run")
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM task_instances WHERE state = 'completed'`).Scan(&steps))
	assert.Equal(t, 3*runs, steps, "every step completed")
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM run_events WHERE kind = 'node_completed'`).Scan(&completions))
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM run_events WHERE kind = 'node_completed'
		GROUP BY tenant_id, run_id, task_id HAVING count(*) > 1) d`).Scan(&doubled))
	assert.Equal(t, steps, completions, "one completion per step")
	assert.Zero(t, doubled, "no step executed and completed twice")
	w.keysMu.Lock()
	distinct := len(w.keys)
	w.keysMu.Unlock()
	assert.Equal(t, 2*runs, distinct, "each HTTP step's effect reached the sink under exactly one key")

	var redispatched int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM run_events WHERE kind = 'redispatched'`).Scan(&redispatched))
	// The stall: the longest gap between consecutive step completions of
	// the killed master's tenant from a second before the kill.
	rows, err := db.Query(ctx, `SELECT created_at FROM run_events WHERE tenant_id = $1 AND kind = 'node_completed' AND created_at > $2 ORDER BY created_at`,
		w.tenants[0], killedAt.Add(-time.Second))
	require.NoError(t, err)
	prev := killedAt
	for rows.Next() {
		var at time.Time
		require.NoError(t, rows.Scan(&at))
		if at.After(killedAt) && at.Sub(prev) > stall {
			stall = at.Sub(prev)
		}
		if at.After(prev) {
			prev = at
		}
	}
	require.NoError(t, rows.Err())
	t.Logf("%d runs (%d starts during the workload, none failed: %v), %d steps, %d re-dispatched, %d raw sink requests for %d keys",
		runs, len(answers), failed == 0, steps, redispatched, w.rawRequests.Load(), distinct)
	return stall
}

// TestClusterMasterKilledMidWorkload: on a Redis Cluster of three masters
// with a replica each, the master holding the keys of a tenant in use is
// SIGKILLed while runs of several tenants start and run. Its replica takes
// over; every run completes, no step's completion is applied twice, and
// every run is done within failoverBound of the kill.
func TestClusterMasterKilledMidWorkload(t *testing.T) {
	if testing.Short() {
		t.Skip("the cluster failover test takes about half a minute; run without -short")
	}
	t.Parallel()
	env, pc := testenv.WithPrivateCluster(t)
	w := newFailoverWorkload(t, env, 3)
	names := stream.NewNames(env.Namespace)
	victim := pc.MasterOf(names.Queued(w.tenants[0]))
	var promoted time.Duration
	killedAt, answers := w.run(4*time.Second, 6*time.Second, func() {
		pc.Kill(victim)
		promoted = pc.WaitPromoted(victim, time.Now(), 30*time.Second)
	})
	done := w.waitTerminal("the kill", killedAt, failoverBound)
	stall := w.check(killedAt, answers)
	t.Logf("FIGURE cluster master SIGKILL | replica serving after %s | longest pause in the tenant's step completions %s | every run done %s after the kill",
		promoted.Round(10*time.Millisecond), stall.Round(10*time.Millisecond), done.Round(100*time.Millisecond))
	assert.Less(t, stall, 30*time.Second, "the outage is bounded")
}

// TestSentinelMasterKilledMidWorkload: Composer reaches Redis through
// Sentinel; the master is SIGKILLed mid-workload, Sentinel promotes the
// replica, and every run completes with nothing lost or doubled.
func TestSentinelMasterKilledMidWorkload(t *testing.T) {
	if testing.Short() {
		t.Skip("the Sentinel failover test takes about half a minute; run without -short")
	}
	t.Parallel()
	env, ps := testenv.WithPrivateSentinel(t)
	w := newFailoverWorkload(t, env, 1)
	var promoted time.Duration
	killedAt, answers := w.run(4*time.Second, 6*time.Second, func() {
		ps.KillMaster()
		promoted = ps.WaitPromoted(time.Now(), 30*time.Second)
	})
	done := w.waitTerminal("the kill", killedAt, failoverBound)
	stall := w.check(killedAt, answers)
	t.Logf("FIGURE Sentinel master SIGKILL | replica promoted after %s | longest pause in step completions %s | every run done %s after the kill",
		promoted.Round(10*time.Millisecond), stall.Round(10*time.Millisecond), done.Round(100*time.Millisecond))
	assert.Less(t, stall, 30*time.Second, "the outage is bounded")
}
