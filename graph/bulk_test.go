package graph_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/workers"
)

type bulkView struct {
	ID, Status                     string
	Matched, Done, Failed, Skipped int
}

func (w tenantWorld) bulkOp(t *testing.T, sys *apptest.System, id string) bulkView {
	t.Helper()
	var v struct{ BulkOperation bulkView }
	sys.GraphQL(w.owner, `query($id: ID!) { bulkOperation(id: $id) { id status matched done failed skipped } }`, map[string]any{"id": id}).Decode(t, &v)
	return v.BulkOperation
}

// TestBulkOperationsOverGraphQL: a bulk cancel over a workflow's runs,
// followed live to completion; the same idempotency key answers the same
// operation; tenant B's bulk cancel naming A's workflow and B's queue pause
// touch nothing of A's; a viewer may read but not create.
func TestBulkOperationsOverGraphQL(t *testing.T) {
	t.Parallel()
	sys, a, b := twoTenants(t)
	var ids []string
	for i := 0; i < 30; i++ {
		var started struct {
			StartRun struct{ Run struct{ ID string } }
		}
		sys.GraphQL(a.owner, `mutation($w: ID!) { startRun(input: {workflowId: $w}) { run { id } } }`, map[string]any{"w": a.workflow}).Decode(t, &started)
		ids = append(ids, started.StartRun.Run.ID)
	}
	// B names A's workflow: its operation matches nothing of A's.
	var bop struct {
		CreateBulkOperation struct{ Operation struct{ ID string } }
	}
	sys.GraphQL(b.owner, `mutation($w: ID!) { createBulkOperation(input: {action: CANCEL, filter: {workflowId: $w}}) { operation { id } } }`,
		map[string]any{"w": a.workflow}).Decode(t, &bop)
	res := sys.GraphQL(b.owner, `mutation { pauseQueue(queue: "default", reason: "b's") { queue } }`, nil)
	require.Empty(t, res.Errors)
	require.Eventually(t, func() bool { return b.bulkOp(t, sys, bop.CreateBulkOperation.Operation.ID).Status == "COMPLETED" }, 20*time.Second, 50*time.Millisecond)
	assert.Zero(t, b.bulkOp(t, sys, bop.CreateBulkOperation.Operation.ID).Matched)
	var paused struct{ PausedQueues []struct{ Queue string } }
	sys.GraphQL(a.owner, `{ pausedQueues { queue } }`, nil).Decode(t, &paused)
	assert.Empty(t, paused.PausedQueues, "B's pause is B's")

	res = sys.GraphQL(a.viewer, `mutation($w: ID!) { createBulkOperation(input: {action: CANCEL, filter: {workflowId: $w}}) { operation { id } } }`,
		map[string]any{"w": a.workflow})
	assert.Equal(t, []string{"FORBIDDEN"}, res.Codes())

	create := `mutation($w: ID!) { createBulkOperation(input: {action: CANCEL, filter: {workflowId: $w, status: [RUNNING, COMPLETED]}, reason: "cleanup", idempotencyKey: "k1"}) {
		created operation { id action status filter { status workflowId metadata } } } }`
	var op struct {
		CreateBulkOperation struct {
			Created   bool
			Operation struct {
				ID, Action string
				Filter     struct {
					Status     []string
					WorkflowID string
					Metadata   json.RawMessage
				}
			}
		}
	}
	sys.GraphQL(a.owner, create, map[string]any{"w": a.workflow}).Decode(t, &op)
	require.True(t, op.CreateBulkOperation.Created)
	id := op.CreateBulkOperation.Operation.ID
	assert.Equal(t, "CANCEL", op.CreateBulkOperation.Operation.Action)
	assert.Equal(t, []string{"RUNNING"}, op.CreateBulkOperation.Operation.Filter.Status, "narrowed to what a cancel applies to")
	watcher := dialWS(t, sys, a.viewer)
	watcher.subscribe("1", `subscription($id: ID!) { bulkOperationUpdated(id: $id) { id status matched done } }`, map[string]any{"id": id})

	var last wsMsg
	for {
		m := watcher.next(30 * time.Second)
		require.NotEmpty(t, m.Type, "the subscription stalled before the operation finished")
		if m.Type == "complete" {
			break
		}
		require.Equal(t, "next", m.Type, "%s", m.Payload)
		last = m
	}
	assert.Contains(t, string(last.Payload), `"COMPLETED"`)
	got := a.bulkOp(t, sys, id)
	// A's world holds one more run of the workflow (its parked run).
	assert.Equal(t, bulkView{ID: id, Status: "COMPLETED", Matched: 31, Done: 31}, got)
	for _, r := range ids {
		var run struct{ Run struct{ Status string } }
		sys.GraphQL(a.owner, `query($id: ID!) { run(id: $id) { status } }`, map[string]any{"id": r}).Decode(t, &run)
		assert.Equal(t, "CANCELLED", run.Run.Status)
	}
	var again struct {
		CreateBulkOperation struct {
			Created   bool
			Operation struct{ ID string }
		}
	}
	sys.GraphQL(a.owner, create, map[string]any{"w": a.workflow}).Decode(t, &again)
	assert.False(t, again.CreateBulkOperation.Created)
	assert.Equal(t, id, again.CreateBulkOperation.Operation.ID)
	var list struct{ BulkOperations []struct{ ID string } }
	sys.GraphQL(a.viewer, `{ bulkOperations(first: 100) { id } }`, nil).Decode(t, &list)
	assert.Len(t, list.BulkOperations, 2, "A's world's operation and this one")
}

// TestPauseAndResumeAWorkflowOverGraphQL: a paused workflow's new run is
// QUEUED and followed live; resuming starts it (the payload's operation).
func TestPauseAndResumeAWorkflowOverGraphQL(t *testing.T) {
	t.Parallel()
	sys, a, _ := twoTenants(t)
	var p struct {
		PauseWorkflow struct {
			PausedAt    *string
			PauseReason *string
		}
	}
	sys.GraphQL(a.developer, `mutation($id: ID!) { pauseWorkflow(id: $id, reason: "deploy") { pausedAt pauseReason } }`, map[string]any{"id": a.workflow}).Decode(t, &p)
	require.NotNil(t, p.PauseWorkflow.PausedAt)
	assert.Equal(t, "deploy", *p.PauseWorkflow.PauseReason)
	res := sys.GraphQL(a.viewer, `mutation($id: ID!) { resumeWorkflow(id: $id) { workflow { id } } }`, map[string]any{"id": a.workflow})
	assert.Equal(t, []string{"FORBIDDEN"}, res.Codes())

	var started struct {
		StartRun struct{ Run struct{ ID, Status string } }
	}
	sys.GraphQL(a.owner, `mutation($w: ID!) { startRun(input: {workflowId: $w}) { run { id status } } }`, map[string]any{"w": a.workflow}).Decode(t, &started)
	assert.Equal(t, "QUEUED", started.StartRun.Run.Status)
	watcher := dialWS(t, sys, a.viewer)
	watcher.subscribe("1", `subscription($id: ID!) { runUpdated(id: $id) { id status } }`, map[string]any{"id": started.StartRun.Run.ID})
	first := watcher.next(10 * time.Second)
	require.Equal(t, "next", first.Type, "%s", first.Payload)
	assert.Contains(t, string(first.Payload), `"QUEUED"`)

	var resumed struct {
		ResumeWorkflow struct {
			Workflow struct{ PausedAt *string }
			Resume   struct{ ID, Action string }
		}
	}
	sys.GraphQL(a.owner, `mutation($id: ID!) { resumeWorkflow(id: $id) { workflow { pausedAt } resume { id action } } }`, map[string]any{"id": a.workflow}).Decode(t, &resumed)
	assert.Nil(t, resumed.ResumeWorkflow.Workflow.PausedAt)
	assert.Equal(t, "RESUME", resumed.ResumeWorkflow.Resume.Action)
	for {
		m := watcher.next(20 * time.Second)
		require.Equal(t, "next", m.Type, "the queued run was not started: %s", m.Payload)
		if strings.Contains(string(m.Payload), `"RUNNING"`) {
			break
		}
	}
	require.Eventually(t, func() bool { return a.bulkOp(t, sys, resumed.ResumeWorkflow.Resume.ID).Status == "COMPLETED" }, 20*time.Second, 50*time.Millisecond)
}

// TestPausedQueueHoldsTasksFromARealWorker: with a real server and worker,
// a paused queue runs nothing new — the messages the worker reads are
// refused at lease and dropped — while the step that was running finishes
// (and its eager successor is not taken); resuming dispatches again what
// was held and every task runs exactly once.
func TestPausedQueueHoldsTasksFromARealWorker(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	var mu sync.Mutex
	runs := map[uuid.UUID]int{}
	release := make(chan struct{})
	sys.StartWorker(apptest.WorkerOptions{Noop: workers.ExecutorFunc(func(ctx context.Context, tk workers.Task) (json.RawMessage, error) {
		mu.Lock()
		runs[tk.ID]++
		mu.Unlock()
		if strings.Contains(string(tk.Input), "slow") {
			<-release
		}
		return json.RawMessage(`{}`), nil
	})})
	executed := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(runs)
	}
	chain := sys.Workflow(`{"nodes":[{"id":"a","type":"noop","input":{"slow":"input.slow"}},{"id":"b","type":"noop","depends_on":["a"]},{"id":"c","type":"noop","depends_on":["b"]}]}`)
	first := sys.StartRun(chain, `{"slow":"slow"}`)
	require.Eventually(t, func() bool { return executed() == 1 }, 10*time.Second, 10*time.Millisecond, "the first step is running")

	_, err := sys.Coordinator().PauseQueue(ctx, sys.Tenant, "default", "test", "tester")
	require.NoError(t, err)
	var held []uuid.UUID
	for i := 0; i < 30; i++ {
		held = append(held, sys.StartRun(chain, `{"slow":"no"}`))
	}
	close(release) // the running step finishes
	require.Eventually(t, func() bool {
		_, tasks := sys.Run(first)
		return tasks["a"].State == "completed"
	}, 10*time.Second, 10*time.Millisecond)
	time.Sleep(1500 * time.Millisecond)
	assert.Equal(t, 1, executed(), "nothing ran while the queue was paused")
	for _, id := range append(held, first) {
		run, _ := sys.Run(id)
		assert.Equal(t, "running", run.Status)
	}

	n, err := sys.Coordinator().ResumeQueue(ctx, sys.Tenant, "default")
	require.NoError(t, err)
	t.Logf("%d held tasks dispatched again at resume", n)
	for _, id := range append(held, first) {
		run, _ := sys.WaitRun(id, 30*time.Second)
		require.Equal(t, "completed", run.Status)
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, runs, 31*3, "every task ran")
	for id, n := range runs {
		assert.Equal(t, 1, n, "task %s ran %d times", id, n)
	}
}
