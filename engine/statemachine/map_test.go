package statemachine

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/engine/dag"
)

func TestMapRunsEveryElementWithinItsParallelismInOrder(t *testing.T) {
	wf := dag.MustParse(`{"nodes":[
		{"id":"fan","type":"map","map":{"items":"input.orders","max_parallelism":2,
			"step":{"type":"noop","input":{"order":"item.id","i":"index","tenant":"input.tenant"}}}},
		{"id":"after","type":"noop","depends_on":["fan"],"input":{"n":"size(nodes.fan.output)"}}]}`)
	s := newSim(t, wf, `{"tenant":"t1","orders":[{"id":"a"},{"id":"b"},{"id":"c"},{"id":"d"},{"id":"e"}]}`)
	tr := s.step(RunStarted{})
	require.Equal(t, []string{"create_task", "create_task", "dispatch", "create_task", "dispatch"}, kinds(tr))
	assert.JSONEq(t, `{"count":5,"max_parallelism":2}`, string(tr.Actions[0].(CreateTask).Input))
	assert.Equal(t, "fan[0]", tr.Actions[1].(CreateTask).NodeID)
	assert.JSONEq(t, `{"order":"a","i":0,"tenant":"t1"}`, string(tr.Actions[1].(CreateTask).Input))
	assert.Equal(t, "fan[1]", tr.Actions[3].(CreateTask).NodeID)

	// Out of order completions: the next element starts each time one ends.
	tr = s.complete("fan[1]", `{"done":"b"}`)
	assert.Equal(t, []string{"complete_task", "create_task", "dispatch"}, kinds(tr))
	assert.Equal(t, "fan[2]", tr.Actions[1].(CreateTask).NodeID)
	assert.True(t, s.fail("fan[0]", true).Status == RunRunning, "a retry keeps the element's slot")
	s.complete("fan[2]", `{"done":"c"}`)
	s.complete("fan[3]", `{"done":"d"}`)
	tr = s.step(NodeCompleted{NodeID: "fan[0]", TaskID: s.task("fan[0]").ID, Attempt: 2, Output: json.RawMessage(`{"done":"a"}`)})
	assert.Equal(t, []string{"complete_task"}, kinds(tr), "fan[4] already runs")
	tr = s.complete("fan[4]", `{"done":"e"}`)
	require.Equal(t, []string{"complete_task", "complete_task", "create_task", "dispatch"}, kinds(tr))
	assert.JSONEq(t, `[{"done":"a"},{"done":"b"},{"done":"c"},{"done":"d"},{"done":"e"}]`, string(s.task("fan").Output), "outputs in element order")
	assert.JSONEq(t, `{"n":5}`, string(tr.Actions[2].(CreateTask).Input))
}

func TestMapOfAThousandWithParallelismFifty(t *testing.T) {
	items := make([]int, 1000)
	for i := range items {
		items[i] = i
	}
	in, _ := json.Marshal(map[string]any{"items": items})
	s := newSim(t, dag.MustParse(`{"nodes":[{"id":"m","type":"map","map":{"items":"input.items","max_parallelism":50,"step":{"type":"noop"}}}]}`), string(in))
	s.step(RunStarted{})
	executions := 0
	for s.run.Status == RunRunning {
		running := 0
		for id, tk := range s.run.Tasks {
			if id != "m" && tk.State.Active() {
				running++
			}
		}
		require.LessOrEqual(t, running, 50)
		for i := range items {
			if tk := s.run.Tasks[dag.ItemID("m", i)]; tk != nil && tk.State == TaskPending {
				s.complete(dag.ItemID("m", i), fmt.Sprintf(`{"v":%d}`, i*2))
				executions++
				break
			}
		}
	}
	assert.Equal(t, 1000, executions)
	assert.Equal(t, RunCompleted, s.run.Status)
	var outs []struct{ V int }
	require.NoError(t, json.Unmarshal(s.task("m").Output, &outs))
	require.Len(t, outs, 1000)
	for i, o := range outs {
		require.Equal(t, i*2, o.V)
	}
}

func TestMapItemsMustBeAListWithinTheBound(t *testing.T) {
	wf := dag.MustParse(`{"nodes":[{"id":"m","type":"map","map":{"items":"input.items","step":{"type":"noop"}}}]}`)
	s := newSim(t, wf, `{"items":"not a list"}`)
	s.step(RunStarted{})
	assert.Equal(t, RunFailed, s.run.Status)
	assert.Contains(t, s.task("m").Error.Message, "not a list")

	empty := newSim(t, wf, `{"items":[]}`)
	tr := empty.step(RunStarted{})
	assert.Equal(t, []string{"create_task", "complete_run"}, kinds(tr))
	assert.JSONEq(t, `[]`, string(empty.task("m").Output))
}

func TestAFailedElementFailsTheMapAndARerunKeepsTheCompletedOnes(t *testing.T) {
	wf := dag.MustParse(`{"nodes":[{"id":"m","type":"map","map":{"items":"input.items","max_parallelism":3,
		"step":{"type":"noop","retry":{"max_attempts":1}}}}]}`)
	s := newSim(t, wf, `{"items":[1,2,3]}`)
	s.step(RunStarted{})
	s.complete("m[0]", `{"ok":0}`)
	tr := s.fail("m[1]", true)
	assert.Equal(t, RunFailed, tr.Status)
	assert.Equal(t, TaskCancelled, s.task("m[2]").State, "the other elements are cancelled")
	assert.Equal(t, TaskCancelled, s.task("m").State)

	tr = s.step(RerunRequested{})
	assert.Equal(t, RunRunning, tr.Status)
	assert.Equal(t, TaskCompleted, s.task("m[0]").State, "a completed element keeps its output")
	assert.Equal(t, TaskPending, s.task("m[1]").State)
	assert.Equal(t, TaskPending, s.task("m[2]").State)
	s.complete("m[1]", `{"ok":1}`)
	s.complete("m[2]", `{"ok":2}`)
	assert.JSONEq(t, `[{"ok":0},{"ok":1},{"ok":2}]`, string(s.task("m").Output))
}

func TestWorkflowNodeStartsAChildAndEndsWithIt(t *testing.T) {
	wf := dag.MustParse(`{"nodes":[{"id":"charge","type":"workflow","workflow":{"name":"charge-card"},"input":{"amount":"input.amount"}},
		{"id":"after","type":"noop","depends_on":["charge"],"input":{"receipt":"nodes.charge.output.receipt"}}]}`)
	s := newSim(t, wf, `{"amount":5}`)
	tr := s.step(RunStarted{})
	require.Equal(t, []string{"create_task", "start_child"}, kinds(tr))
	assert.Equal(t, StartChild{NodeID: "charge", Workflow: "charge-card", Input: json.RawMessage(`{"amount":5}`)}, tr.Actions[1])
	assert.Equal(t, TaskWaiting, s.task("charge").State)
	ct := s.task("charge")

	assert.True(t, s.step(ChildFinished{NodeID: "charge", TaskID: "stale", Attempt: 1, Status: RunCompleted}).Ignored, "fenced by task id")
	tr = s.step(ChildFinished{NodeID: "charge", TaskID: ct.ID, Attempt: 1, ChildID: "c1", Status: RunCompleted, Output: json.RawMessage(`{"receipt":"r-1"}`)})
	require.Equal(t, []string{"complete_task", "create_task", "dispatch"}, kinds(tr))
	assert.JSONEq(t, `{"receipt":"r-1"}`, string(tr.Actions[1].(CreateTask).Input))

	s2 := newSim(t, wf, `{"amount":5}`)
	s2.step(RunStarted{})
	tr = s2.step(ChildFinished{NodeID: "charge", TaskID: s2.task("charge").ID, Attempt: 1, ChildID: "c2", Status: RunFailed,
		Error: &Error{Code: "http_status", Message: "card declined"}})
	assert.Equal(t, RunFailed, tr.Status)
	assert.Equal(t, CodeChildFailed, s2.task("charge").Error.Code)
	assert.Contains(t, s2.task("charge").Error.Message, "child run c2 failed: card declined")

	s3 := newSim(t, wf, `{"amount":5}`)
	s3.step(RunStarted{})
	tr = s3.step(CancelRequested{Reason: "stop"})
	assert.Equal(t, []string{"cancel_task", "cancel_run"}, kinds(tr), "the coordinator cancels the child of a cancelled task")
}

func TestMapOfChildWorkflows(t *testing.T) {
	wf := dag.MustParse(`{"nodes":[{"id":"each","type":"map","map":{"items":"input.users","max_parallelism":2,
		"step":{"type":"workflow","workflow":{"name":"onboard","version":3},"input":{"user":"item"}}}}]}`)
	s := newSim(t, wf, `{"users":["ann","bob","cy"]}`)
	tr := s.step(RunStarted{})
	require.Equal(t, []string{"create_task", "create_task", "start_child", "create_task", "start_child"}, kinds(tr))
	assert.Equal(t, StartChild{NodeID: "each[0]", Workflow: "onboard", Version: 3, Input: json.RawMessage(`{"user":"ann"}`)}, tr.Actions[2])
	for i := 0; i < 3; i++ {
		id := dag.ItemID("each", i)
		s.step(ChildFinished{NodeID: id, TaskID: s.task(id).ID, Attempt: 1, Status: RunCompleted, Output: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))})
	}
	assert.Equal(t, RunCompleted, s.run.Status)
	assert.JSONEq(t, `[{"n":0},{"n":1},{"n":2}]`, string(s.task("each").Output))
	assert.Equal(t, 3, s.children)
}
