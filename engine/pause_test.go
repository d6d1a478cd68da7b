package engine

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	sm "github.com/composer-dev/composer/engine/statemachine"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
)

// TestPausedWorkflowQueuesRunsAndResumeStartsThemInOrder: while a workflow
// is paused its new runs are queued (no task, nothing dispatched) and its
// running run goes on; a queued run can be cancelled; resuming starts the
// queued runs oldest first in batches, and a runner that claimed the
// resume and died is taken over once its lease ends.
func TestPausedWorkflowQueuesRunsAndResumeStartsThemInOrder(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	wf := f.workflow(`{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"noop","depends_on":["a"]}]}`)
	before := f.start(wf, `{}`)

	p, err := f.c.PauseWorkflow(ctx, f.tenant, wf, "maintenance")
	require.NoError(t, err)
	require.NotNil(t, p.PausedAt)
	var queued []uuid.UUID
	for i := 0; i < 7; i++ {
		res, err := f.c.StartRun(ctx, f.tenant, StartRun{WorkflowID: wf, Input: json.RawMessage(`{}`)})
		require.NoError(t, err)
		require.Equal(t, RunQueued, res.Status)
		queued = append(queued, res.RunID)
	}
	require.Equal(t, 0, f.count(`SELECT count(*) FROM task_instances WHERE run_id = ANY($1)`, queued))
	require.Equal(t, 0, f.count(`SELECT count(*) FROM outbox WHERE run_id = ANY($1)`, queued))
	// The run that started before the pause goes on to the end.
	f.complete(before, "a", `{}`)
	f.complete(before, "b", `{}`)
	require.Equal(t, sm.RunCompleted, f.runStatus(before))
	// A queued run can be cancelled.
	_, err = f.c.CancelRun(ctx, f.tenant, queued[0], "not needed")
	require.NoError(t, err)
	require.Equal(t, sm.RunCancelled, f.runStatus(queued[0]))
	// Queued runs are listed by status.
	require.NoError(t, f.db.WithTenant(ctx, f.tenant, func(ctx context.Context, tx *pg.Tx) error {
		list, _, err := ListRuns(ctx, tx, RunFilter{Statuses: []string{"queued"}}, 100, nil)
		require.Len(t, list, 6)
		return err
	}))
	// Pausing again changes nothing.
	p2, err := f.c.PauseWorkflow(ctx, f.tenant, wf, "maintenance")
	require.NoError(t, err)
	require.True(t, p.PausedAt.Equal(*p2.PausedAt))

	_, op, err := f.c.ResumeWorkflow(ctx, f.tenant, wf, "tester")
	require.NoError(t, err)
	require.NotNil(t, op)
	require.Equal(t, BulkResume, op.Action)
	_, none, err := f.c.ResumeWorkflow(ctx, f.tenant, wf, "tester")
	require.NoError(t, err)
	require.Nil(t, none, "a workflow not paused has nothing to resume")
	// A new start runs at once.
	after := f.start(wf, `{}`)
	require.Equal(t, sm.RunRunning, f.runStatus(after))

	// A runner claims the resume and dies without recording anything.
	var claimed uuid.UUID
	require.NoError(t, f.env.System.QueryRow(ctx, qClaimBulk, "dead", 1.0).Scan(new(uuid.UUID), &claimed))
	require.Equal(t, op.ID, claimed)
	r := f.runner("alive")
	r.Batch = 2
	worked, err := r.Step(ctx)
	require.NoError(t, err)
	require.False(t, worked, "the dead runner's lease still holds")
	time.Sleep(1100 * time.Millisecond)
	got := f.drain(op.ID, r)
	require.Equal(t, BulkCompleted, got.Status)
	require.EqualValues(t, 6, got.Done)
	// Started in order: each queued run's run_started event comes after the
	// one of the run queued before it.
	var last int64
	for _, id := range queued[1:] {
		require.Equal(t, sm.RunRunning, f.runStatus(id))
		var ev int64
		require.NoError(t, f.env.System.QueryRow(ctx, `SELECT id FROM run_events WHERE run_id = $1 AND kind = 'run_started'`, id).Scan(&ev))
		require.Greater(t, ev, last)
		last = ev
		f.mustTask(id, "a")
	}
}

// TestStartAndResumeRacingLeaveNoRunQueued: starts racing a resume never
// leave a queued run behind the resume job.
func TestStartAndResumeRacingLeaveNoRunQueued(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	wf := f.workflow(`{"nodes":[{"id":"a","type":"noop"}]}`)
	for round := 0; round < 5; round++ {
		_, err := f.c.PauseWorkflow(ctx, f.tenant, wf, "")
		require.NoError(t, err)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := 0; i < 20; i++ {
				_, err := f.c.StartRun(ctx, f.tenant, StartRun{WorkflowID: wf})
				require.NoError(t, err)
			}
		}()
		time.Sleep(time.Duration(round) * 2 * time.Millisecond)
		_, op, err := f.c.ResumeWorkflow(ctx, f.tenant, wf, "")
		require.NoError(t, err)
		<-done
		f.drain(op.ID, f.runner("r"))
		require.Equal(t, 0, f.count(`SELECT count(*) FROM workflow_runs WHERE tenant_id = $1 AND status = 'queued'`, f.tenant), "round %d", round)
	}
}

// TestPausedQueueHoldsItsTasks: a paused queue's tasks are not leased, an
// eager offer on it is not taken, and its outbox rows are held; resuming
// dispatches again each pending task that lost its message, exactly once,
// and leases work again. Other queues and tenants are not affected.
func TestPausedQueueHoldsItsTasks(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	wf := f.workflow(`{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"noop","depends_on":["a"]}]}`)
	other := f.workflow(`{"nodes":[{"id":"a","type":"noop","queue":"other"}]}`)
	running := f.start(wf, `{}`)
	ta := f.mustTask(running, "a")
	leases, _, err := f.c.AcquireLeases(ctx, f.tenant, Holder{Worker: "w1"}, time.Minute, []LeaseRequest{{RunID: running, TaskID: ta.ID, Attempt: ta.Attempt}})
	require.NoError(t, err)
	require.True(t, leases[0].Acquired)

	_, err = f.c.PauseQueue(ctx, f.tenant, "default", "partner down", "tester")
	require.NoError(t, err)
	_, err = f.c.PauseQueue(ctx, f.tenant, "bad queue!", "", "")
	require.Equal(t, errs.Invalid, errs.KindOf(err))

	held := f.start(wf, `{}`)
	th := f.mustTask(held, "a")
	leases, _, err = f.c.AcquireLeases(ctx, f.tenant, Holder{Worker: "w1"}, time.Minute, []LeaseRequest{{RunID: held, TaskID: th.ID, Attempt: th.Attempt}})
	require.NoError(t, err)
	require.False(t, leases[0].Acquired, "a paused queue's task is not leased")
	// Another queue is served.
	free := f.start(other, `{}`)
	tf := f.mustTask(free, "a")
	leases, _, err = f.c.AcquireLeases(ctx, f.tenant, Holder{Worker: "w1"}, time.Minute, []LeaseRequest{{RunID: free, TaskID: tf.ID, Attempt: tf.Attempt}})
	require.NoError(t, err)
	require.True(t, leases[0].Acquired)

	// The running task finishes; its eager offer for the next task on the
	// paused queue is not taken: the task waits in the outbox.
	ack, err := f.c.CompleteTask(ctx, f.tenant, Report{RunID: running, TaskID: ta.ID, NodeID: "a", Attempt: ta.Attempt, LeaseOwner: "w1",
		Output: json.RawMessage(`{}`), Eager: &EagerOffer{Queue: "default", NodeTypes: []string{"noop"}, TTL: time.Minute}})
	require.NoError(t, err)
	require.Nil(t, ack.Next)
	tb := f.mustTask(running, "b")
	require.Equal(t, "pending", tb.State)

	// The outbox holds the paused queue's rows: none is due.
	var due int
	require.NoError(t, f.env.System.QueryRow(ctx, `SELECT count(*) FROM outbox o WHERE o.tenant_id = $1 AND NOT EXISTS
		(SELECT 1 FROM queue_pauses p WHERE p.tenant_id = o.tenant_id AND p.queue = o.queue) AND queue = 'default'`, f.tenant).Scan(&due))
	require.Zero(t, due)
	// A message published before the pause was read and dropped: its task
	// has no outbox row any more.
	_, err = f.env.System.Exec(ctx, `DELETE FROM outbox WHERE task_id = $1`, th.ID)
	require.NoError(t, err)

	n, err := f.c.ResumeQueue(ctx, f.tenant, "default")
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "only the task without an outbox row is dispatched again")
	require.Equal(t, 1, f.count(`SELECT count(*) FROM outbox WHERE task_id = $1`, th.ID))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM outbox WHERE task_id = $1`, tb.ID))
	leases, _, err = f.c.AcquireLeases(ctx, f.tenant, Holder{Worker: "w1"}, time.Minute, []LeaseRequest{{RunID: held, TaskID: th.ID, Attempt: th.Attempt}})
	require.NoError(t, err)
	require.True(t, leases[0].Acquired)
	n, err = f.c.ResumeQueue(ctx, f.tenant, "default")
	require.NoError(t, err)
	require.Zero(t, n)
}

// TestEventsIntoAPausedWorkflowQueueTheirRuns: an event trigger's start is
// queued like any other while the workflow is paused (the event records it
// as started), and the resume starts it.
func TestEventsIntoAPausedWorkflowQueueTheirRuns(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	wf := f.workflow(triggered(`[{"event": "order.created"}]`))
	_, err := f.c.PauseWorkflow(ctx, f.tenant, wf, "")
	require.NoError(t, err)
	p := f.publish("order.created", "e1", `{}`)
	require.Len(t, p.Runs, 1)
	require.Equal(t, EventRunStarted, p.Runs[0].Outcome)
	require.Equal(t, RunQueued, f.runStatus(p.Runs[0].RunID))
	_, op, err := f.c.ResumeWorkflow(ctx, f.tenant, wf, "")
	require.NoError(t, err)
	f.drain(op.ID, f.runner("r"))
	require.Equal(t, sm.RunRunning, f.runStatus(p.Runs[0].RunID))
	f.mustTask(p.Runs[0].RunID, "a")
}

// TestSignalsToAQueuedRunAreKept: a signal sent to a queued run is kept
// (once per id) and consumed by the run's wait node when it starts.
func TestSignalsToAQueuedRunAreKept(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	wf := f.workflow(`{"nodes":[{"id":"w","type":"wait","wait":{"signal":"go"}},{"id":"n","type":"noop","depends_on":["w"]}]}`)
	_, err := f.c.PauseWorkflow(ctx, f.tenant, wf, "")
	require.NoError(t, err)
	res, err := f.c.StartRun(ctx, f.tenant, StartRun{WorkflowID: wf})
	require.NoError(t, err)
	for i := 0; i < 2; i++ {
		ack, err := f.c.SignalRun(ctx, f.tenant, res.RunID, Signal{ID: "s1", Name: "go", Payload: json.RawMessage(`{"ok":true}`)})
		require.NoError(t, err)
		require.Equal(t, i == 1, ack.Ignored, "a repeated id is ignored")
		require.Equal(t, RunQueued, ack.Status)
	}
	require.Equal(t, 1, f.count(`SELECT count(*) FROM run_signals WHERE run_id = $1`, res.RunID))
	_, op, err := f.c.ResumeWorkflow(ctx, f.tenant, wf, "")
	require.NoError(t, err)
	f.drain(op.ID, f.runner("r"))
	w := f.mustTask(res.RunID, "w")
	require.Equal(t, "completed", w.State, "the kept signal completed the wait")
	require.JSONEq(t, `{"ok":true}`, string(w.Output))
	f.mustTask(res.RunID, "n")
}

// TestBulkResumeSkipsRunsOfPausedWorkflows: a RESUME bulk operation over
// every queued run starts those whose workflow was resumed and skips those
// whose workflow is still paused (they stay queued).
func TestBulkResumeSkipsRunsOfPausedWorkflows(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	still := f.workflow(`{"nodes":[{"id":"a","type":"noop"}]}`)
	again := f.workflow(`{"nodes":[{"id":"a","type":"noop"}]}`)
	for _, wf := range []uuid.UUID{still, again} {
		_, err := f.c.PauseWorkflow(ctx, f.tenant, wf, "")
		require.NoError(t, err)
		for i := 0; i < 3; i++ {
			f.startQueuedRun(wf)
		}
	}
	// The workflow is un-paused without its own resume job (as if that job
	// had been cancelled): an explicit RESUME picks its runs up.
	require.NoError(t, f.db.WithTenant(ctx, f.tenant, func(ctx context.Context, tx *pg.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE workflow_definitions SET paused_at = NULL WHERE tenant_id = $1 AND id = $2`, f.tenant, again)
		return err
	}))
	op, _, err := f.c.CreateBulkOperation(ctx, f.tenant, BulkRequest{Action: BulkResume})
	require.NoError(t, err)
	got := f.drain(op.ID, f.runner("r"))
	require.EqualValues(t, 6, got.Matched)
	require.EqualValues(t, 3, got.Done)
	require.EqualValues(t, 3, got.Skipped)
	require.Equal(t, 3, f.count(`SELECT count(*) FROM workflow_runs WHERE workflow_id = $1 AND status = 'queued'`, still))
	require.Equal(t, 3, f.count(`SELECT count(*) FROM workflow_runs WHERE workflow_id = $1 AND status = 'running'`, again))
}

func (f *fixture) startQueuedRun(wf uuid.UUID) uuid.UUID {
	f.t.Helper()
	res, err := f.c.StartRun(context.Background(), f.tenant, StartRun{WorkflowID: wf})
	require.NoError(f.t, err)
	require.Equal(f.t, RunQueued, res.Status)
	return res.RunID
}
