package engine

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	sm "github.com/composer-dev/composer/engine/statemachine"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/tenants"
)

func TestRunCompletesThroughTheCoordinator(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	wf := f.workflow(forkJoinDef)
	run := f.start(wf, `{"x": 1}`)

	a := f.mustTask(run, "a")
	assert.Equal(t, "pending", a.State)
	assert.Equal(t, 1, f.count(`SELECT count(*) FROM outbox WHERE task_id = $1 AND attempt = 1`, a.ID), "dispatch left through the outbox")

	f.complete(run, "a", `{"a": true}`)
	f.complete(run, "b", `{"from": "b"}`)
	f.complete(run, "c", `{"from": "c"}`)
	var input json.RawMessage
	require.NoError(t, f.env.System.QueryRow(context.Background(), `SELECT input FROM task_instances WHERE run_id = $1 AND node_id = 'join'`, run).Scan(&input))
	assert.JSONEq(t, `{"b": {"from": "b"}, "c": {"from": "c"}}`, string(input))
	ack := f.complete(run, "join", `{"done": 1}`)
	assert.Equal(t, sm.RunCompleted, ack.Status)
	assert.Equal(t, sm.RunCompleted, f.runStatus(run))
	var out json.RawMessage
	require.NoError(t, f.env.System.QueryRow(context.Background(), `SELECT output FROM workflow_runs WHERE id = $1`, run).Scan(&out))
	assert.JSONEq(t, `{"join": {"done": 1}}`, string(out))
	assert.Equal(t, 5, f.count(`SELECT count(*) FROM run_events WHERE run_id = $1`, run), "one timeline entry per applied event")
}

// TestForkBranchesCompletingAtOnceCreateTheJoinOnce is the write-skew test:
// the two branches of a fork report from parallel goroutines at the same
// instant. Without the run lock each transaction would see the other branch
// still pending and neither would create the join.
func TestForkBranchesCompletingAtOnceCreateTheJoinOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	wf := f.workflow(forkJoinDef)
	ctx := context.Background()
	for i := 0; i < 200; i++ {
		run := f.start(wf, `{}`)
		f.complete(run, "a", `{}`)
		b, c := f.mustTask(run, "b"), f.mustTask(run, "c")
		var wg sync.WaitGroup
		start := make(chan struct{})
		for _, tk := range []struct {
			node string
			row  taskRow
		}{{"b", b}, {"c", c}} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				ack, err := f.c.CompleteTask(ctx, f.tenant, Report{RunID: run, TaskID: tk.row.ID, NodeID: tk.node, Attempt: 1, Output: json.RawMessage(`{}`)})
				assert.NoError(t, err)
				assert.False(t, ack.Ignored, ack.Reason)
			}()
		}
		close(start)
		wg.Wait()
		require.Equal(t, 1, f.count(`SELECT count(*) FROM task_instances WHERE run_id = $1 AND node_id = 'join'`, run), "iteration %d", i)
		join := f.mustTask(run, "join")
		require.Equal(t, 1, f.count(`SELECT count(*) FROM outbox WHERE task_id = $1`, join.ID), "iteration %d: the join was dispatched once", i)
		ack := f.complete(run, "join", `{}`)
		require.Equal(t, sm.RunCompleted, ack.Status, "iteration %d: the run finishes", i)
	}
}

func TestIdempotentStartUnderConcurrency(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	wf := f.workflow(forkJoinDef)
	ctx := context.Background()
	const callers = 64
	ids := make([]uuid.UUID, callers)
	created := make([]bool, callers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < callers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := f.c.StartRun(ctx, f.tenant, StartRun{WorkflowID: wf, Input: json.RawMessage(`{"order": 42}`), IdempotencyKey: "order-42"})
			if assert.NoError(t, err) {
				ids[i], created[i] = res.RunID, res.Created
			}
		}()
	}
	close(start)
	wg.Wait()
	for i := 1; i < callers; i++ {
		assert.Equal(t, ids[0], ids[i], "caller %d got another run", i)
	}
	n := 0
	for _, c := range created {
		if c {
			n++
		}
	}
	assert.Equal(t, 1, n, "exactly one caller created the run")
	assert.Equal(t, 1, f.count(`SELECT count(*) FROM workflow_runs`))
	assert.Equal(t, 1, f.count(`SELECT count(*) FROM task_instances`), "the run started once")

	// The same key with different input is a conflict, and writes nothing.
	_, err := f.c.StartRun(ctx, f.tenant, StartRun{WorkflowID: wf, Input: json.RawMessage(`{"order": 43}`), IdempotencyKey: "order-42"})
	assert.True(t, errors.Is(err, errs.Conflict), "got %v", err)
	// Key order in the input does not matter.
	res, err := f.c.StartRun(ctx, f.tenant, StartRun{WorkflowID: wf, Input: json.RawMessage(`{ "order" : 42 }`), IdempotencyKey: "order-42"})
	require.NoError(t, err)
	assert.Equal(t, ids[0], res.RunID)
	assert.Equal(t, 1, f.count(`SELECT count(*) FROM workflow_runs`))
}

func TestStaleAndDuplicateResultsAreAcknowledgedAndIgnored(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	wf := f.workflow(`{"nodes":[{"id":"a","type":"noop","retry":{"max_attempts":3,"backoff":"1s","no_jitter":true}},{"id":"b","type":"noop","depends_on":["a"]}]}`)
	run := f.start(wf, `{}`)
	a := f.mustTask(run, "a")

	// A retryable failure bumps the attempt in the same statement.
	ack, err := f.c.FailTask(ctx, f.tenant, Report{RunID: run, TaskID: a.ID, NodeID: "a", Attempt: 1, Retryable: true, Error: sm.Error{Code: "http_status", Message: "503"}})
	require.NoError(t, err)
	require.False(t, ack.Ignored)
	a2 := f.mustTask(run, "a")
	assert.Equal(t, 2, a2.Attempt)
	assert.Equal(t, "pending", a2.State)
	assert.Equal(t, 1, f.count(`SELECT count(*) FROM outbox WHERE task_id = $1 AND attempt = 2 AND next_attempt_at > now()`, a.ID), "the retry waits in the outbox")

	// The state machine drops a report for the superseded attempt.
	before := f.snapshot(run)
	ack, err = f.c.CompleteTask(ctx, f.tenant, Report{RunID: run, TaskID: a.ID, NodeID: "a", Attempt: 1, Output: json.RawMessage(`{"zombie": true}`)})
	require.NoError(t, err, "a stale report is still acknowledged")
	assert.True(t, ack.Ignored)
	assert.Contains(t, ack.Reason, "stale attempt 1")
	assert.Equal(t, before, f.snapshot(run), "and changes nothing")

	// The SQL guard drops a report the state machine would accept: the lease
	// belongs to another worker.
	_, err = f.env.System.Exec(ctx, `UPDATE task_instances SET state = 'running', lease_owner = 'worker-2', lease_expires_at = now() + interval '1 minute' WHERE id = $1`, a.ID)
	require.NoError(t, err)
	before = f.snapshot(run)
	ack, err = f.c.CompleteTask(ctx, f.tenant, Report{RunID: run, TaskID: a.ID, NodeID: "a", Attempt: 2, LeaseOwner: "worker-1", Output: json.RawMessage(`{}`)})
	require.NoError(t, err)
	assert.True(t, ack.Ignored)
	assert.Contains(t, ack.Reason, "matched no row")
	assert.Equal(t, before, f.snapshot(run))

	// The lease holder's report applies; its duplicate is ignored.
	rep := Report{RunID: run, TaskID: a.ID, NodeID: "a", Attempt: 2, LeaseOwner: "worker-2", Output: json.RawMessage(`{"ok": 1}`)}
	ack, err = f.c.CompleteTask(ctx, f.tenant, rep)
	require.NoError(t, err)
	assert.False(t, ack.Ignored)
	before = f.snapshot(run)
	ack, err = f.c.CompleteTask(ctx, f.tenant, rep)
	require.NoError(t, err)
	assert.True(t, ack.Ignored)
	assert.Contains(t, ack.Reason, "already completed")
	assert.Equal(t, before, f.snapshot(run))
}

// TestFaultMidPersistLeavesTheRunUntouched injects a failing statement
// before each action of a transition in turn: every attempt must leave the
// run exactly as it was, and the event must still apply afterwards.
func TestFaultMidPersistLeavesTheRunUntouched(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	run := f.start(f.workflow(forkJoinDef), `{}`)
	a := f.mustTask(run, "a")
	rep := Report{RunID: run, TaskID: a.ID, NodeID: "a", Attempt: 1, Output: json.RawMessage(`{}`)}
	before := f.snapshot(run)
	// Completing a persists: complete a, create b, dispatch b, create c, dispatch c.
	for i := 0; i < 5; i++ {
		f.c.fault = func(action int) bool { return action == i }
		_, err := f.c.CompleteTask(ctx, f.tenant, rep)
		require.Error(t, err, "fault at action %d", i)
		assert.Equal(t, before, f.snapshot(run), "fault at action %d left a partial write", i)
	}
	f.c.fault = nil
	ack, err := f.c.CompleteTask(ctx, f.tenant, rep)
	require.NoError(t, err)
	assert.False(t, ack.Ignored)
	assert.NotEqual(t, before, f.snapshot(run))
	_, ok := f.task(run, "b")
	assert.True(t, ok)
}

func TestCancelSignalAndTimersThroughTheCoordinator(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	wf := f.workflow(`{"nodes":[
		{"id":"w","type":"wait","wait":{"signal":"approval","approval":true,"timeout":"1h"}},
		{"id":"nap","type":"sleep","sleep":{"duration":"1h"}},
		{"id":"after","type":"noop","depends_on":["w","nap"]}]}`)
	run := f.start(wf, `{}`)
	assert.Equal(t, 2, f.count(`SELECT count(*) FROM timers WHERE run_id = $1`, run))

	ack, err := f.c.SignalRun(ctx, f.tenant, run, Signal{ID: "sig-1", Name: "approval", Payload: json.RawMessage(`{"approved": true, "by": "ann"}`)})
	require.NoError(t, err)
	assert.False(t, ack.Ignored)
	assert.Equal(t, "completed", f.mustTask(run, "w").State)
	ack, err = f.c.SignalRun(ctx, f.tenant, run, Signal{ID: "sig-1", Name: "approval", Payload: json.RawMessage(`{"approved": false}`)})
	require.NoError(t, err)
	assert.True(t, ack.Ignored, "the same signal id twice applies once")

	// Fire the sleep's timer by hand (the timer loop does this when due).
	var timerID int64
	require.NoError(t, f.env.System.QueryRow(ctx, `SELECT id FROM timers WHERE run_id = $1 AND kind = 'sleep'`, run).Scan(&timerID))
	ack, err = f.c.FireTimer(ctx, f.tenant, run, timerID)
	require.NoError(t, err)
	assert.False(t, ack.Ignored)
	ack, err = f.c.FireTimer(ctx, f.tenant, run, timerID)
	require.NoError(t, err)
	assert.True(t, ack.Ignored, "a timer fires once")

	ack, err = f.c.CancelRun(ctx, f.tenant, run, "changed my mind")
	require.NoError(t, err)
	assert.Equal(t, sm.RunCancelled, ack.Status)
	assert.Equal(t, "cancelled", f.mustTask(run, "after").State)
	assert.Equal(t, "completed", f.mustTask(run, "w").State, "finished outputs are kept")
	assert.Zero(t, f.count(`SELECT count(*) FROM timers WHERE run_id = $1`, run), "a finished run has no timers")
	ack, err = f.c.CancelRun(ctx, f.tenant, run, "again")
	require.NoError(t, err)
	assert.True(t, ack.Ignored)
}

func TestBadInputChangesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	_, _, err := f.c.CreateWorkflow(ctx, f.tenant, "bad", "", []byte(`{"nodes":[{"id":"a","type":"noop","depends_on":["ghost"]}]}`))
	var e *errs.Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, errs.Invalid, e.Kind)
	require.Len(t, e.Fields, 1)
	assert.Equal(t, errs.Field{Node: "a", Field: "depends_on", Message: `unknown node "ghost"`}, e.Fields[0])
	assert.Zero(t, f.count(`SELECT count(*) FROM workflow_definitions`))

	wf := f.workflow(forkJoinDef)
	_, _, err = f.c.CreateWorkflow(ctx, f.tenant, "dup", "", []byte(forkJoinDef))
	require.NoError(t, err)
	_, _, err = f.c.CreateWorkflow(ctx, f.tenant, "dup", "", []byte(forkJoinDef))
	assert.True(t, errors.Is(err, errs.Conflict))

	for _, in := range []string{`[1,2]`, `"x"`, `{`} {
		_, err = f.c.StartRun(ctx, f.tenant, StartRun{WorkflowID: wf, Input: json.RawMessage(in)})
		assert.True(t, errors.Is(err, errs.Invalid), "input %s: %v", in, err)
	}
	_, err = f.c.StartRun(ctx, f.tenant, StartRun{WorkflowID: uuid.New()})
	assert.True(t, errors.Is(err, errs.NotFound))
	_, err = f.c.StartRun(ctx, f.tenant, StartRun{WorkflowID: wf, Version: 7})
	assert.True(t, errors.Is(err, errs.NotFound))
	assert.Zero(t, f.count(`SELECT count(*) FROM workflow_runs`))

	_, err = f.c.CompleteTask(ctx, f.tenant, Report{RunID: uuid.New(), TaskID: uuid.New(), NodeID: "a", Attempt: 1})
	assert.True(t, errors.Is(err, errs.NotFound))

	v, err := f.c.PublishVersion(ctx, f.tenant, wf, []byte(`{"nodes":[{"id":"a","type":"noop"}]}`))
	require.NoError(t, err)
	assert.Equal(t, 2, v.Version)
	_, err = f.c.PublishVersion(ctx, f.tenant, wf, []byte(`{"nodes":[]}`))
	assert.True(t, errors.Is(err, errs.Invalid))
}

// TestTenantsCannotTouchEachOthersRuns uses tenant B's scope on tenant A's
// run: it does not exist for B.
func TestTenantsCannotTouchEachOthersRuns(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	run := f.start(f.workflow(forkJoinDef), `{}`)
	other, err := tenants.Create(ctx, f.db, tenantsParams("other"))
	require.NoError(t, err)
	a := f.mustTask(run, "a")
	_, err = f.c.CompleteTask(ctx, other.ID, Report{RunID: run, TaskID: a.ID, NodeID: "a", Attempt: 1})
	assert.True(t, errors.Is(err, errs.NotFound), "got %v", err)
	_, err = f.c.CancelRun(ctx, other.ID, run, "")
	assert.True(t, errors.Is(err, errs.NotFound))
	assert.Equal(t, sm.RunRunning, f.runStatus(run))
}

// TestReadBackIsTheCommittedRun: a caller asking for the run with its
// event gets it as the event's own transaction left it — for a start, a
// repeat of it, a signal and a cancel — with no read after the commit
// that could fail for a change that was made. An ignored event committed
// nothing and leaves the target empty.
func TestReadBackIsTheCommittedRun(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	wf := f.workflow(`{"nodes":[{"id":"w","type":"wait","wait":{"signal":"go"}},{"id":"n","type":"noop","depends_on":["w"]}]}`)
	committed := func(id uuid.UUID) RunView {
		var v RunView
		require.NoError(t, f.db.WithTenant(ctx, f.tenant, func(ctx context.Context, tx *pg.Tx) error {
			var err error
			v, err = GetRun(ctx, tx, id)
			return err
		}))
		return v
	}
	var started RunView
	res, err := f.c.StartRun(WithReadBack(ctx, &started), f.tenant, StartRun{WorkflowID: wf, IdempotencyKey: "k"})
	require.NoError(t, err)
	assert.Equal(t, committed(res.RunID), started)

	var repeated RunView
	_, err = f.c.StartRun(WithReadBack(ctx, &repeated), f.tenant, StartRun{WorkflowID: wf, IdempotencyKey: "k"})
	require.NoError(t, err)
	assert.Equal(t, started, repeated, "a repeat answers the run it named")

	var signalled RunView
	_, err = f.c.SignalRun(WithReadBack(ctx, &signalled), f.tenant, res.RunID, Signal{ID: "s1", Name: "go"})
	require.NoError(t, err)
	assert.Equal(t, committed(res.RunID), signalled)
	assert.True(t, signalled.UpdatedAt.After(started.UpdatedAt) || signalled.UpdatedAt.Equal(started.UpdatedAt))

	var again RunView
	ack, err := f.c.SignalRun(WithReadBack(ctx, &again), f.tenant, res.RunID, Signal{ID: "s1", Name: "go"})
	require.NoError(t, err)
	assert.True(t, ack.Ignored)
	assert.Equal(t, uuid.Nil, again.ID, "an ignored event committed nothing to read back")

	var cancelled RunView
	_, err = f.c.CancelRun(WithReadBack(ctx, &cancelled), f.tenant, res.RunID, "enough")
	require.NoError(t, err)
	assert.Equal(t, committed(res.RunID), cancelled)
}
