package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/engine/dag"
	sm "github.com/composer-dev/composer/engine/statemachine"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
)

func concurrent(strategy string, limit int) string {
	return fmt.Sprintf(`{"concurrency": {"key": "input.customer", "limit": %d, "strategy": %q},
		"nodes": [{"id": "a", "type": "noop"}]}`, limit, strategy)
}

func (f *fixture) statuses(runs ...uuid.UUID) []string {
	f.t.Helper()
	out := make([]string, len(runs))
	for i, r := range runs {
		out[i] = string(f.runStatus(r))
	}
	return out
}

func (f *fixture) keys(wf uuid.UUID) []KeyState {
	f.t.Helper()
	var out []KeyState
	require.NoError(f.t, f.db.WithTenant(context.Background(), f.tenant, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		out, err = ConcurrencyKeys(ctx, tx, wf, 10)
		return err
	}))
	return out
}

func TestConcurrencyKeyQueuesBeyondItsLimitInOrder(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	wf := f.workflow(concurrent("queue", 1))
	a1, a2, a3 := f.start(wf, `{"customer": "A"}`), f.start(wf, `{"customer": "A"}`), f.start(wf, `{"customer": "A"}`)
	b1 := f.start(wf, `{"customer": "B"}`)
	assert.Equal(t, []string{"running", "queued", "queued", "running"}, f.statuses(a1, a2, a3, b1), "one run per key; B is not held up by A")
	_, ok := f.task(a2, "a")
	assert.False(t, ok, "a queued run has no task")
	assert.Equal(t, []KeyState{{Key: "A", Running: 1, Queued: 2}, {Key: "B", Running: 1}}, f.keys(wf))

	f.complete(a1, "a", `{}`)
	f.fireTimers()
	assert.Equal(t, []string{"completed", "running", "queued"}, f.statuses(a1, a2, a3), "the oldest queued run of the key starts")
	_, err := f.c.CancelRun(context.Background(), f.tenant, a2, "no")
	require.NoError(t, err)
	f.fireTimers()
	assert.Equal(t, []string{"cancelled", "running"}, f.statuses(a2, a3), "a cancelled run frees its slot too")
	f.complete(a3, "a", `{}`)
	f.complete(b1, "a", `{}`)
	f.fireTimers()
	assert.Empty(t, f.keys(wf))
	assert.Zero(t, f.count(`SELECT count(*) FROM timers WHERE tenant_id = $1`, f.tenant))

	var reason string
	require.NoError(t, f.env.System.QueryRow(context.Background(), `SELECT detail->>'reason' FROM run_events WHERE run_id = $1 AND kind = 'run_queued'`, a2).Scan(&reason))
	assert.Equal(t, `concurrency key "A" is at its limit of 1`, reason)
}

func TestCancelNewestAndCancelInProgress(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	newest := f.workflow(concurrent("cancel_newest", 1))
	first := f.start(newest, `{"customer": "A"}`)
	res, err := f.c.StartRun(context.Background(), f.tenant, StartRun{WorkflowID: newest, Input: json.RawMessage(`{"customer": "A"}`)})
	require.NoError(t, err)
	assert.Equal(t, sm.RunCancelled, res.Status, "the newest run is cancelled at once")
	assert.Equal(t, []string{"running", "cancelled"}, f.statuses(first, res.RunID))

	inProgress := f.workflow(concurrent("cancel_in_progress", 1))
	old := f.start(inProgress, `{"customer": "A"}`)
	younger := f.start(inProgress, `{"customer": "A"}`)
	assert.Equal(t, []string{"running", "running"}, f.statuses(old, younger), "the new run starts; the old one is cancelled by its timer")
	f.fireTimers()
	assert.Equal(t, []string{"cancelled", "running"}, f.statuses(old, younger))
	var reason string
	require.NoError(t, f.env.System.QueryRow(context.Background(), `SELECT error->>'message' FROM workflow_runs WHERE id = $1`, old).Scan(&reason))
	assert.Contains(t, reason, `superseded by a newer run of concurrency key "A"`)
}

func TestARerunTakesASlotOrIsRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	wf := f.workflow(concurrent("queue", 1))
	a := f.start(wf, `{"customer": "A"}`)
	_, err := f.c.CancelRun(context.Background(), f.tenant, a, "stop")
	require.NoError(t, err)
	f.fireTimers()
	b := f.start(wf, `{"customer": "A"}`)
	_, err = f.c.RerunRun(context.Background(), f.tenant, a)
	assert.Equal(t, errs.Conflict, errs.KindOf(err), "the key has no room: %v", err)
	assert.Equal(t, sm.RunCancelled, f.runStatus(a))
	f.complete(b, "a", `{}`)
	f.fireTimers()
	_, err = f.c.RerunRun(context.Background(), f.tenant, a)
	require.NoError(t, err)
	assert.Equal(t, sm.RunRunning, f.runStatus(a))
}

func TestAConcurrencyKeyThatCannotBeEvaluatedRefusesTheStart(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	wf := f.workflow(concurrent("queue", 1))
	_, err := f.c.StartRun(context.Background(), f.tenant, StartRun{WorkflowID: wf, Input: json.RawMessage(`{}`)})
	require.Equal(t, errs.Invalid, errs.KindOf(err))
	var e *errs.Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, "concurrency.key", e.Fields[0].Field)
	assert.Zero(t, f.count(`SELECT count(*) FROM workflow_runs WHERE tenant_id = $1`, f.tenant), "nothing written")
	meta := f.workflow(`{"concurrency": {"key": "metadata.account", "limit": 2}, "nodes": [{"id": "a", "type": "noop"}]}`)
	res, err := f.c.StartRun(context.Background(), f.tenant, StartRun{WorkflowID: meta, Metadata: map[string]string{"account": "acc-1"}})
	require.NoError(t, err)
	assert.Equal(t, []KeyState{{Key: "acc-1", Running: 1}}, f.keys(meta), "a key from the metadata")
	_ = res
}

// TestConcurrentStartsNeverExceedTheLimit: 16 goroutines start runs of 4
// keys at once (limit 2); under the key's lock no key ever has more than 2
// running, the rest queue, and releasing drains every key in order.
func TestConcurrentStartsNeverExceedTheLimit(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	wf := f.workflow(concurrent("queue", 2))
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 5 {
				_, err := f.c.StartRun(context.Background(), f.tenant, StartRun{WorkflowID: wf,
					Input: json.RawMessage(fmt.Sprintf(`{"customer": "k%d"}`, (g+i)%4))})
				if err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		require.NoError(t, err)
	}
	for _, k := range f.keys(wf) {
		assert.Equal(t, 2, k.Running, "key %s", k.Key)
		assert.Equal(t, 18, k.Queued, "key %s", k.Key)
	}
	// Drain: complete whatever runs, release, until nothing is left.
	for round := 0; f.count(`SELECT count(*) FROM workflow_runs WHERE tenant_id = $1 AND status IN ('running', 'queued')`, f.tenant) > 0; round++ {
		require.Less(t, round, 100)
		rows, err := f.env.System.Query(context.Background(), `SELECT id FROM workflow_runs WHERE tenant_id = $1 AND status = 'running'`, f.tenant)
		require.NoError(t, err)
		var running []uuid.UUID
		for rows.Next() {
			var id uuid.UUID
			require.NoError(t, rows.Scan(&id))
			running = append(running, id)
		}
		rows.Close()
		for _, id := range running {
			f.complete(id, "a", `{}`)
		}
		f.fireTimers()
		for _, k := range f.keys(wf) {
			require.LessOrEqual(t, k.Running, 2)
		}
	}
	assert.Equal(t, 80, f.count(`SELECT count(*) FROM workflow_runs WHERE tenant_id = $1 AND status = 'completed'`, f.tenant))
}

// TestAStepConcurrencyKeyHoldsTasksUntilASlotIsFree: a step limited to one
// task per key across runs: the first run's task is dispatched, the second
// and third wait with their outbox rows held (and are not recovered as
// lost), and each end grants the next in order; another key is not held up.
func TestAStepConcurrencyKeyHoldsTasksUntilASlotIsFree(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	wf := f.workflow(`{"nodes": [{"id": "call", "type": "noop", "retry": {"max_attempts": 1},
		"concurrency": {"key": "input.partner", "limit": 1}}]}`)
	due := func(run uuid.UUID) string {
		var n, held int
		require.NoError(t, f.env.System.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE next_attempt_at <= now()),
			count(*) FILTER (WHERE next_attempt_at = 'infinity') FROM outbox WHERE run_id = $1`, run).Scan(&n, &held))
		switch {
		case n > 0:
			return "due"
		case held > 0:
			return "held"
		}
		return "none"
	}
	r1, r2, r3 := f.start(wf, `{"partner": "p"}`), f.start(wf, `{"partner": "p"}`), f.start(wf, `{"partner": "p"}`)
	other := f.start(wf, `{"partner": "q"}`)
	assert.Equal(t, []string{"due", "held", "held", "due"}, []string{due(r1), due(r2), due(r3), due(other)})
	var keys []KeyState
	require.NoError(t, f.db.WithTenant(context.Background(), f.tenant, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		keys, err = f.c.WorkflowKeys(ctx, tx, wf, 10)
		return err
	}))
	assert.Equal(t, []KeyState{{Node: "call", Key: "p", Running: 1, Queued: 2, Limit: 1}, {Node: "call", Key: "q", Running: 1, Limit: 1}}, keys)

	f.complete(r1, "call", `{}`)
	assert.Equal(t, []string{"due", "held"}, []string{due(r2), due(r3)}, "the oldest waiting task got the slot")
	tk := f.mustTask(r2, "call")
	_, err := f.c.FailTask(context.Background(), f.tenant, Report{RunID: r2, TaskID: tk.ID, NodeID: "call", Attempt: 1, Error: sm.Error{Code: "x", Message: "x"}})
	require.NoError(t, err)
	assert.Equal(t, "due", due(r3), "a failed task gives its slot back too")
	_, err = f.c.CancelRun(context.Background(), f.tenant, r3, "stop")
	require.NoError(t, err)
	assert.Zero(t, f.count(`SELECT count(*) FROM task_instances WHERE tenant_id = $1 AND concurrency_slot AND state IN ('pending', 'running')
		AND concurrency_key LIKE '%/p'`, f.tenant))

	// A waiting task is not "lost": the held row is there.
	r4, r5 := f.start(wf, `{"partner": "p"}`), f.start(wf, `{"partner": "p"}`)
	assert.Equal(t, []string{"due", "held"}, []string{due(r4), due(r5)})
	_, err = f.c.CancelRun(context.Background(), f.tenant, r5, "stop")
	require.NoError(t, err)
	assert.Zero(t, f.count(`SELECT count(*) FROM outbox WHERE run_id = $1 AND next_attempt_at = 'infinity'`, r5), "a cancelled waiting task leaves no held row")
}

// TestStepConcurrencyCancelStrategies: a step whose key is full cancels
// its own run (cancel_newest), or cancels the runs holding or waiting for
// the key's slots and takes the first slot their ends free
// (cancel_in_progress); another key is not touched.
func TestStepConcurrencyCancelStrategies(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	keyed := func(strategy string, limit int) uuid.UUID {
		return f.workflow(fmt.Sprintf(`{"nodes": [{"id": "call", "type": "noop", "retry": {"max_attempts": 1},
			"concurrency": {"key": "input.partner", "limit": %d, "strategy": %q}}]}`, limit, strategy))
	}
	reason := func(run uuid.UUID) string {
		var r string
		require.NoError(t, f.env.System.QueryRow(context.Background(), `SELECT coalesce(error->>'message', '') FROM workflow_runs WHERE id = $1`, run).Scan(&r))
		return r
	}
	due := func(run uuid.UUID) int {
		return f.count(`SELECT count(*) FROM outbox WHERE tenant_id = $1 AND run_id = '`+run.String()+`' AND next_attempt_at <= now()`, f.tenant)
	}

	newest := keyed("cancel_newest", 1)
	first, second, other := f.start(newest, `{"partner": "p"}`), f.start(newest, `{"partner": "p"}`), f.start(newest, `{"partner": "q"}`)
	f.fireTimers()
	assert.Equal(t, []string{"running", "cancelled", "running"}, f.statuses(first, second, other))
	assert.Contains(t, reason(second), "step call found its concurrency key at its limit of 1 (cancel_newest)")
	assert.Equal(t, 1, due(first))
	f.complete(first, "call", `{}`)
	third := f.start(newest, `{"partner": "p"}`)
	f.fireTimers()
	assert.Equal(t, []string{"completed", "running"}, f.statuses(first, third), "the slot was free again")

	inProgress := keyed("cancel_in_progress", 2)
	a, b := f.start(inProgress, `{"partner": "p"}`), f.start(inProgress, `{"partner": "p"}`)
	f.fireTimers()
	assert.Equal(t, []string{"running", "running"}, f.statuses(a, b), "within the limit")
	c := f.start(inProgress, `{"partner": "p"}`)
	assert.Zero(t, due(c), "no slot yet: held")
	f.fireTimers()
	assert.Equal(t, []string{"cancelled", "running", "running"}, f.statuses(a, b, c), "the oldest beyond limit-1 is cancelled")
	assert.Contains(t, reason(a), "superseded by a newer run at step call of its concurrency key (cancel_in_progress)")
	assert.Equal(t, 1, due(c), "the cancelled run's slot went to the newest task")
	assert.Equal(t, 2, f.count(`SELECT count(*) FROM task_instances WHERE tenant_id = $1 AND concurrency_slot AND state IN ('pending', 'running')
		AND concurrency_key = $2`, f.tenant, inProgress.String()+"/call/p"), "b and c hold the key's two slots")

	_, err := dag.Parse([]byte(`{"nodes": [{"id": "call", "type": "noop", "concurrency": {"key": "input.p", "limit": 1, "strategy": "drop"}}]}`))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "concurrency.strategy")
}
