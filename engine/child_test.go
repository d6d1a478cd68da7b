package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	sm "github.com/composer-dev/composer/engine/statemachine"
	"github.com/composer-dev/composer/tenants"
)

// fireTimers fires every due timer (the crossings between parents and
// children are due at once), as the sweeper's timer loop does.
func (f *fixture) fireTimers() {
	f.t.Helper()
	sw := NewSweeper(f.c, f.db, SweeperConfig{}, nil)
	for range 20 {
		if f.count(`SELECT count(*) FROM timers WHERE tenant_id = $1 AND fire_at <= now()`, f.tenant) == 0 {
			return
		}
		_, err := sw.FireDueTimers(context.Background())
		require.NoError(f.t, err)
	}
}

type childRow struct {
	ID     uuid.UUID
	Status string
	Depth  int
	Node   string
}

func (f *fixture) childrenOf(parent uuid.UUID) []childRow {
	f.t.Helper()
	rows, err := f.env.System.Query(context.Background(), `SELECT id, status, depth, parent_node FROM workflow_runs
		WHERE tenant_id = $1 AND parent_run_id = $2 ORDER BY parent_node, id`, f.tenant, parent)
	require.NoError(f.t, err)
	defer rows.Close()
	var out []childRow
	for rows.Next() {
		var c childRow
		require.NoError(f.t, rows.Scan(&c.ID, &c.Status, &c.Depth, &c.Node))
		out = append(out, c)
	}
	require.NoError(f.t, rows.Err())
	return out
}

func (f *fixture) namedWorkflow(name, def string) uuid.UUID {
	f.t.Helper()
	w, _, err := f.c.CreateWorkflow(context.Background(), f.tenant, name, "", []byte(def))
	require.NoError(f.t, err)
	return w.ID
}

func TestAChildWorkflowRunsAndItsOutputComesBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.namedWorkflow("charge", `{"output": {"receipt": "nodes.pay.output.id"}, "nodes": [{"id": "pay", "type": "noop", "input": {"amount": "input.amount"}}]}`)
	parent := f.start(f.workflow(`{"nodes": [
		{"id": "charge", "type": "workflow", "workflow": {"name": "charge"}, "input": {"amount": "input.total"}},
		{"id": "ship", "type": "noop", "depends_on": ["charge"], "input": {"receipt": "nodes.charge.output.receipt"}}]}`), `{"total": 30}`)
	kids := f.childrenOf(parent)
	require.Len(t, kids, 1, "the child started in the parent's start transaction")
	child := kids[0]
	assert.Equal(t, childRow{ID: child.ID, Status: "running", Depth: 1, Node: "charge"}, child)
	assert.Equal(t, "waiting", f.mustTask(parent, "charge").State)
	assert.JSONEq(t, `{"amount": 30}`, string(mustInput(t, f, child.ID, "pay")), "the node's input is the child's input")

	f.complete(child.ID, "pay", `{"id": "r-1"}`)
	assert.Equal(t, sm.RunCompleted, f.runStatus(child.ID))
	f.fireTimers()
	charge := f.mustTask(parent, "charge")
	assert.Equal(t, "completed", charge.State)
	assert.JSONEq(t, `{"receipt": "r-1"}`, string(charge.Output))
	assert.JSONEq(t, `{"receipt": "r-1"}`, string(mustInput(t, f, parent, "ship")))

	var linked int
	require.NoError(t, f.env.System.QueryRow(context.Background(), `SELECT count(*) FROM run_events WHERE run_id = $1
		AND detail->'children'->>'charge' = $2`, parent, child.ID.String()).Scan(&linked))
	assert.Equal(t, 1, linked, "the parent's timeline names the child")
}

func TestAFailedChildFailsTheNodeAndACancelledParentCancelsItsChild(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.namedWorkflow("slow", `{"nodes": [{"id": "w", "type": "wait", "wait": {"signal": "go"}}, {"id": "x", "type": "noop", "retry": {"max_attempts": 1}}]}`)
	wf := f.workflow(`{"nodes": [{"id": "c", "type": "workflow", "workflow": {"name": "slow"}}]}`)

	failing := f.start(wf, `{}`)
	child := f.childrenOf(failing)[0].ID
	tk := f.mustTask(child, "x")
	_, err := f.c.FailTask(context.Background(), f.tenant, Report{RunID: child, TaskID: tk.ID, NodeID: "x", Attempt: 1, Error: sm.Error{Code: "boom", Message: "it broke"}})
	require.NoError(t, err)
	f.fireTimers()
	assert.Equal(t, sm.RunFailed, f.runStatus(failing))
	var msg string
	require.NoError(t, f.env.System.QueryRow(context.Background(), `SELECT last_error->>'message' FROM task_instances WHERE run_id = $1 AND node_id = 'c'`, failing).Scan(&msg))
	assert.Contains(t, msg, "child run "+child.String()+" failed")

	cancelled := f.start(wf, `{}`)
	child = f.childrenOf(cancelled)[0].ID
	_, err = f.c.CancelRun(context.Background(), f.tenant, cancelled, "stop")
	require.NoError(t, err)
	assert.Equal(t, sm.RunRunning, f.runStatus(child), "the child hears of it through its timer")
	f.fireTimers()
	assert.Equal(t, sm.RunCancelled, f.runStatus(child))
	assert.Equal(t, "cancelled", f.mustTask(child, "w").State)
	assert.Zero(t, f.count(`SELECT count(*) FROM timers WHERE tenant_id = $1 AND kind IN ('child_finished', 'parent_cancelled')`, f.tenant),
		"the cancelled child's end came back to a parent that no longer waits, and was dropped")
}

func TestARefusedChildStartFailsTheNode(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	run := f.start(f.workflow(`{"nodes": [{"id": "c", "type": "workflow", "workflow": {"name": "does-not-exist"}}]}`), `{}`)
	assert.Empty(t, f.childrenOf(run))
	f.fireTimers()
	assert.Equal(t, sm.RunFailed, f.runStatus(run))
	var code, msg string
	require.NoError(t, f.env.System.QueryRow(context.Background(), `SELECT last_error->>'code', last_error->>'message' FROM task_instances
		WHERE run_id = $1 AND node_id = 'c'`, run).Scan(&code, &msg))
	assert.Equal(t, sm.CodeChildRefused, code)
	assert.Contains(t, msg, `starting a run of workflow "does-not-exist" was refused`)
}

// TestChildRunsNestAtMostEightDeep: a workflow that starts itself starts
// eight generations in one transaction and no ninth; the refusal fails the
// deepest, and each failure comes back up to the top.
func TestChildRunsNestAtMostEightDeep(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.namedWorkflow("again", `{"nodes": [{"id": "c", "type": "workflow", "workflow": {"name": "again"}}]}`)
	top, err := f.c.StartRun(context.Background(), f.tenant, StartRun{WorkflowName: "again"})
	require.NoError(t, err)
	assert.Equal(t, 9, f.count(`SELECT count(*) FROM workflow_runs WHERE tenant_id = $1`, f.tenant), "depths 0 to 8")
	assert.Equal(t, 8, f.count(`SELECT max(depth) FROM workflow_runs WHERE tenant_id = $1`, f.tenant))
	f.fireTimers()
	assert.Equal(t, sm.RunFailed, f.runStatus(top.RunID))
	assert.Equal(t, 9, f.count(`SELECT count(*) FROM workflow_runs WHERE tenant_id = $1 AND status = 'failed'`, f.tenant))
}

// TestAMapOfAThousandRunsEachElementOnce: 1,000 elements with parallelism
// 50 run exactly 1,000 tasks, never more than 50 at once, and the map's
// output is in element order.
func TestAMapOfAThousandRunsEachElementOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	items := make([]int, 1000)
	for i := range items {
		items[i] = i
	}
	in, _ := json.Marshal(map[string]any{"items": items})
	run := f.start(f.workflow(`{"nodes": [{"id": "m", "type": "map", "map": {"items": "input.items", "max_parallelism": 50,
		"step": {"type": "noop", "input": {"n": "item"}}}}]}`), string(in))
	ctx := context.Background()
	for done := 0; done < 1000; {
		active := f.count(`SELECT count(*) FROM task_instances WHERE run_id = $1 AND node_id LIKE 'm[%' AND state IN ('pending', 'running')`, run)
		require.LessOrEqual(t, active, 50)
		rows, err := f.env.System.Query(ctx, `SELECT id, node_id, input->>'n' FROM task_instances WHERE run_id = $1 AND state = 'pending' ORDER BY node_id`, run)
		require.NoError(t, err)
		type pending struct {
			id   uuid.UUID
			node string
			n    string
		}
		var batch []pending
		for rows.Next() {
			var p pending
			require.NoError(t, rows.Scan(&p.id, &p.node, &p.n))
			batch = append(batch, p)
		}
		rows.Close()
		require.NotEmpty(t, batch, "elements are pending while the map runs")
		for _, p := range batch {
			_, err := f.c.CompleteTask(ctx, f.tenant, Report{RunID: run, TaskID: p.id, NodeID: p.node, Attempt: 1, Output: json.RawMessage(`{"v":` + p.n + `}`)})
			require.NoError(t, err)
			done++
		}
	}
	assert.Equal(t, sm.RunCompleted, f.runStatus(run))
	assert.Equal(t, 1000, f.count(`SELECT count(*) FROM task_instances WHERE run_id = $1 AND node_id LIKE 'm[%' AND state = 'completed'`, run))
	var outs []struct{ V int }
	require.NoError(t, json.Unmarshal(f.mustTask(run, "m").Output, &outs))
	require.Len(t, outs, 1000)
	for i, o := range outs {
		require.Equal(t, i, o.V, "output %d", i)
	}
}

func TestAMapOfChildWorkflows(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.namedWorkflow("greet", `{"output": {"hi": "nodes.g.output.name"}, "nodes": [{"id": "g", "type": "noop"}]}`)
	run := f.start(f.workflow(`{"nodes": [{"id": "each", "type": "map", "map": {"items": "input.names", "max_parallelism": 2,
		"step": {"type": "workflow", "workflow": {"name": "greet"}, "input": {"name": "item"}}}}]}`), `{"names": ["ann", "bob", "cy"]}`)
	for round := 0; f.runStatus(run) == sm.RunRunning; round++ {
		require.Less(t, round, 10)
		for _, c := range f.childrenOf(run) {
			if c.Status == "running" {
				var name string
				require.NoError(t, f.env.System.QueryRow(context.Background(), `SELECT input->>'name' FROM workflow_runs WHERE id = $1`, c.ID).Scan(&name))
				f.complete(c.ID, "g", fmt.Sprintf(`{"name": %q}`, name))
			}
		}
		f.fireTimers()
	}
	assert.Equal(t, sm.RunCompleted, f.runStatus(run))
	assert.Len(t, f.childrenOf(run), 3)
	assert.JSONEq(t, `[{"hi": "ann"}, {"hi": "bob"}, {"hi": "cy"}]`, string(f.mustTask(run, "each").Output))
}

// TestAChildWorkflowIsLookedUpInTheParentsTenant: a workflow node naming a
// workflow only another tenant has is refused as not found.
func TestAChildWorkflowIsLookedUpInTheParentsTenant(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	tb, err := tenants.Create(context.Background(), f.db, tenants.CreateParams{Name: "other"})
	require.NoError(t, err)
	g := &fixture{t: t, env: f.env, db: f.db, c: f.c, tenant: tb.ID}
	g.namedWorkflow("theirs", `{"nodes": [{"id": "a", "type": "noop"}]}`)
	run := f.start(f.workflow(`{"nodes": [{"id": "c", "type": "workflow", "workflow": {"name": "theirs"}}]}`), `{}`)
	assert.Zero(t, g.count(`SELECT count(*) FROM workflow_runs WHERE tenant_id = $1`, tb.ID), "nothing started in the other tenant")
	f.fireTimers()
	assert.Equal(t, sm.RunFailed, f.runStatus(run))
	var code string
	require.NoError(t, f.env.System.QueryRow(context.Background(), `SELECT last_error->'details'->>'code' FROM task_instances
		WHERE run_id = $1 AND node_id = 'c'`, run).Scan(&code))
	assert.Equal(t, "NOT_FOUND", code)
}

// TestACancelledParentCancelsAQueuedChild: a child queued behind its
// workflow's concurrency key is cancelled with its parent too.
func TestACancelledParentCancelsAQueuedChild(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.namedWorkflow("one-at-a-time", `{"concurrency": {"key": "'all'", "limit": 1}, "nodes": [{"id": "w", "type": "wait", "wait": {"signal": "go"}}]}`)
	wf := f.workflow(`{"nodes": [{"id": "c", "type": "workflow", "workflow": {"name": "one-at-a-time"}}]}`)
	first, second := f.start(wf, `{}`), f.start(wf, `{}`)
	queued := f.childrenOf(second)[0]
	require.Equal(t, "queued", queued.Status)
	_, err := f.c.CancelRun(context.Background(), f.tenant, second, "stop")
	require.NoError(t, err)
	f.fireTimers()
	assert.Equal(t, sm.RunCancelled, f.runStatus(queued.ID))
	assert.Equal(t, "running", f.childrenOf(first)[0].Status, "the other child keeps its slot")
}
