package engine

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/engine/dag"
	"github.com/composer-dev/composer/engine/stream"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/tenants"
)

func TestPriorityRangesAgree(t *testing.T) {
	assert.Equal(t, dag.MinPriority, stream.MinPriority)
	assert.Equal(t, dag.MaxPriority, stream.MaxPriority)
}

// TestTasksKeepTheirPriority: a run's priority is its tasks' unless their
// node sets one, on the outbox row and in the task's config — which the
// lost-dispatch sweep reads back when it re-dispatches.
func TestTasksKeepTheirPriority(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	wf := f.workflow(`{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"noop","priority":-1}]}`)
	_, err := f.c.StartRun(ctx, f.tenant, StartRun{WorkflowID: wf, Priority: 3})
	require.Error(t, err, "out of range")
	res, err := f.c.StartRun(ctx, f.tenant, StartRun{WorkflowID: wf, Priority: 2})
	require.NoError(t, err)
	prio := func(node string) (outbox, config int) {
		require.NoError(t, f.env.System.QueryRow(ctx, `SELECT o.priority, coalesce((t.config->>'priority')::int, 0)
			FROM task_instances t JOIN outbox o ON o.task_id = t.id WHERE t.run_id = $1 AND t.node_id = $2`, res.RunID, node).Scan(&outbox, &config))
		return
	}
	o, c := prio("a")
	assert.Equal(t, []int{2, 2}, []int{o, c}, "the run's")
	o, c = prio("b")
	assert.Equal(t, []int{-1, -1}, []int{o, c}, "the node's own")
	require.NoError(t, f.db.WithTenant(ctx, f.tenant, func(ctx context.Context, tx *pg.Tx) error {
		run, err := GetRun(ctx, tx, res.RunID)
		assert.Equal(t, 2, run.Priority)
		return err
	}))

	// Lost: the outbox rows gone, no message anywhere; the sweep's new
	// rows keep the priorities.
	_, err = f.env.System.Exec(ctx, `DELETE FROM outbox WHERE run_id = $1`, res.RunID)
	require.NoError(t, err)
	_, err = f.env.System.Exec(ctx, `UPDATE task_instances SET dispatch_at = now() - interval '1 hour', updated_at = now() - interval '1 hour' WHERE run_id = $1`, res.RunID)
	require.NoError(t, err)
	s := NewSweeper(f.c, f.db, SweeperConfig{LostDispatchAge: time.Second}, nil)
	_, err = s.redispatchLost(ctx)
	require.NoError(t, err)
	o, _ = prio("a")
	assert.Equal(t, 2, o)
	o, _ = prio("b")
	assert.Equal(t, -1, o)
}

// newRateFixture is a fixture whose coordinator enforces step rate limits
// against a real Redis, with one limit declared.
func newRateFixture(t *testing.T, perSecond float64, burst int) *fixture {
	t.Helper()
	env := testenv.New(t)
	db := pg.New(env.App, env.System, false)
	tn, err := tenants.Create(context.Background(), db, tenants.CreateParams{Name: "acme"})
	require.NoError(t, err)
	require.NoError(t, tenants.Update(context.Background(), db, tn.ID, tenants.UpdateParams{Limits: &tenants.Limits{
		MaxQueuedTasks: 100_000, MaxRunningTasks: 1000}}))
	require.NoError(t, db.WithTenant(context.Background(), tn.ID, func(ctx context.Context, tx *pg.Tx) error {
		_, err := tenants.CreateRateLimit(ctx, tx, tenants.RateLimit{Name: "partner-api", PerSecond: perSecond, Burst: burst})
		return err
	}))
	c := NewCoordinator(db, Options{StepLimits: tenants.NewStepLimiter(env.Redis, env.Namespace)})
	return &fixture{t: t, env: env, db: db, c: c, tenant: tn.ID}
}

// TestAStepOverItsLimitWaitsOnTheSameAttempt: with a burst of 2, the third
// step of a key is not leased: it is pending again on attempt 1 with an
// outbox row due when its reserved token is (about 1 s at 1/s), and then
// runs without taking another token. Another key is not held up.
func TestAStepOverItsLimitWaitsOnTheSameAttempt(t *testing.T) {
	t.Parallel()
	f := newRateFixture(t, 1, 2)
	ctx := context.Background()
	wf := f.workflow(`{"nodes":[{"id":"call","type":"noop","rate_limit":{"name":"partner-api","key":"input.p"}}]}`)
	var runs []uuid.UUID
	for range 3 {
		runs = append(runs, f.start(wf, `{"p": "a"}`))
	}
	other := f.start(wf, `{"p": "b"}`)
	var cfg json.RawMessage
	require.NoError(t, f.env.System.QueryRow(ctx, `SELECT config FROM task_instances WHERE run_id = $1`, runs[0]).Scan(&cfg))
	assert.JSONEq(t, `{"rate_limit": {"name": "partner-api", "key": "a"}}`, string(cfg), "the key the state machine evaluated")
	_, err := f.env.System.Exec(ctx, `DELETE FROM outbox`)
	require.NoError(t, err)

	reqs := func(ids ...uuid.UUID) []LeaseRequest {
		var out []LeaseRequest
		for _, r := range ids {
			tk := f.mustTask(r, "call")
			out = append(out, LeaseRequest{RunID: r, TaskID: tk.ID, Attempt: tk.Attempt})
		}
		return out
	}
	leases, _, err := f.c.AcquireLeases(ctx, f.tenant, Holder{Worker: "w1"}, 30*time.Second, reqs(append(runs, other)...))
	require.NoError(t, err)
	got := []bool{leases[0].Acquired, leases[1].Acquired, leases[2].Acquired, leases[3].Acquired}
	assert.Equal(t, []bool{true, true, false, true}, got, "the burst, then the third waits; key b has its own bucket")
	third := f.mustTask(runs[2], "call")
	assert.Equal(t, "pending", third.State)
	assert.Equal(t, 1, third.Attempt, "no attempt spent")
	var due time.Duration
	require.NoError(t, f.env.System.QueryRow(ctx, `SELECT extract(epoch FROM next_attempt_at - now()) * interval '1 second' FROM outbox WHERE task_id = $1`,
		third.ID).Scan(&due))
	assert.InDelta(t, time.Second.Seconds(), due.Seconds(), 0.3, "re-dispatched for its token")
	assert.Equal(t, 0, f.count(`SELECT count(*) FROM task_instances WHERE run_id = $1 AND last_error IS NOT NULL`, runs[2]), "no failure recorded")
	var detail json.RawMessage
	require.NoError(t, f.env.System.QueryRow(ctx, `SELECT detail FROM run_events WHERE run_id = $1 AND kind = 'rate_limited' AND attempt = 1`,
		runs[2]).Scan(&detail))
	var d struct {
		Limit, Key string
		WaitMS     float64 `json:"wait_ms"`
	}
	require.NoError(t, json.Unmarshal(detail, &d))
	assert.Equal(t, "partner-api", d.Limit)
	assert.Equal(t, "a", d.Key)
	assert.InDelta(t, 1000, d.WaitMS, 300, "the timeline says why it waits, and for how long")

	// Early: still its reservation's, deferred again; on time: runs.
	leases, _, err = f.c.AcquireLeases(ctx, f.tenant, Holder{Worker: "w1"}, 30*time.Second, reqs(runs[2]))
	require.NoError(t, err)
	assert.False(t, leases[0].Acquired)
	time.Sleep(1100 * time.Millisecond)
	leases, _, err = f.c.AcquireLeases(ctx, f.tenant, Holder{Worker: "w1"}, 30*time.Second, reqs(runs[2]))
	require.NoError(t, err)
	assert.True(t, leases[0].Acquired, "its reserved token")
	assert.Equal(t, 3, leases[0].MaxAttempts, "the lease is the ordinary one")
}

// TestRateLimitIsExactAcrossCoordinators: four coordinators (server
// replicas) lease 60 steps of one key from parallel goroutines, each
// step asked for until it runs: the steps run no faster than the bucket
// allows, and each exactly once.
func TestRateLimitIsExactAcrossCoordinators(t *testing.T) {
	t.Parallel()
	const n, rate, burst = 60, 20.0, 5
	f := newRateFixture(t, rate, burst)
	ctx := context.Background()
	wf := f.workflow(`{"nodes":[{"id":"call","type":"noop","rate_limit":{"name":"partner-api","key":"'one'"}}]}`)
	var runs []uuid.UUID
	for range n {
		runs = append(runs, f.start(wf, `{}`))
	}
	coords := []*Coordinator{f.c}
	for range 3 {
		coords = append(coords, NewCoordinator(f.db, Options{StepLimits: tenants.NewStepLimiter(f.env.Redis, f.env.Namespace)}))
	}
	var mu sync.Mutex
	var at []time.Time
	leased := map[uuid.UUID]int{}
	var wg sync.WaitGroup
	start := time.Now()
	for i, r := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := coords[i%len(coords)]
			tk := f.mustTask(r, "call")
			for time.Since(start) < 20*time.Second {
				ls, _, err := c.AcquireLeases(ctx, f.tenant, Holder{Worker: "w"}, 30*time.Second, []LeaseRequest{{RunID: r, TaskID: tk.ID, Attempt: tk.Attempt}})
				if err != nil {
					t.Error(err)
					return
				}
				if ls[0].Acquired {
					mu.Lock()
					at = append(at, time.Now())
					leased[r]++
					mu.Unlock()
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	require.Len(t, leased, n, "every step ran")
	for _, k := range leased {
		assert.Equal(t, 1, k)
	}
	took := time.Since(start)
	assert.GreaterOrEqual(t, took.Seconds(), (n-burst)/rate*0.9, "no faster than the bucket")
	t.Logf("%d steps in %s at %.0f/s, burst %d", n, took.Round(time.Millisecond), rate, burst)
}

// TestStartsByEventsAndParentsTakeAPriority: an event trigger's priority
// is its runs'; a child runs at its workflow node's priority, else at its
// parent's; a trigger priority out of range is refused with its field.
func TestStartsByEventsAndParentsTakeAPriority(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	runPrio := func(run uuid.UUID) int {
		var p int
		require.NoError(t, f.env.System.QueryRow(ctx, `SELECT priority FROM workflow_runs WHERE id = $1`, run).Scan(&p))
		return p
	}
	urgent := f.workflow(triggered(`[{"event": "order.created", "priority": 2}]`))
	plain := f.workflow(triggered(`[{"event": "order.created"}]`))
	byWorkflow := map[uuid.UUID]uuid.UUID{}
	for _, r := range f.publish("order.created", "e1", `{}`).Runs {
		require.Equal(t, EventRunStarted, r.Outcome)
		byWorkflow[r.WorkflowID] = r.RunID
	}
	assert.Equal(t, 2, runPrio(byWorkflow[urgent]))
	assert.Equal(t, 0, runPrio(byWorkflow[plain]))

	f.namedWorkflow("leaf", `{"nodes": [{"id": "a", "type": "noop"}]}`)
	parentWf := f.workflow(`{"nodes": [{"id": "inherit", "type": "workflow", "workflow": {"name": "leaf"}},
		{"id": "own", "type": "workflow", "priority": -1, "workflow": {"name": "leaf"}}]}`)
	res, err := f.c.StartRun(ctx, f.tenant, StartRun{WorkflowID: parentWf, Priority: 1})
	require.NoError(t, err)
	kids := map[string]uuid.UUID{}
	for _, k := range f.childrenOf(res.RunID) {
		kids[k.Node] = k.ID
	}
	assert.Equal(t, 1, runPrio(kids["inherit"]), "the parent's priority")
	assert.Equal(t, -1, runPrio(kids["own"]), "the node's own")

	_, err = dag.Parse([]byte(triggered(`[{"event": "order.created", "priority": 3}]`)))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "triggers[0].priority")
}
