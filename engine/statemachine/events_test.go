package statemachine

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/engine/dag"
)

func published(id, name, payload string) EventReceived {
	return EventReceived{Event: dag.EventData{ID: id, Name: name, Payload: json.RawMessage(payload)}}
}

func TestEventWaitRegistersItsKeyAndResolvesOnlyOnAMatch(t *testing.T) {
	wf := dag.MustParse(`{"nodes":[
		{"id":"paid","type":"wait","wait":{"event":"order.paid","match":"event.payload.order_id == input.order_id","timeout":"1h"}},
		{"id":"ship","type":"noop","depends_on":["paid"],"input":{"amount":"nodes.paid.output.payload.amount"}}]}`)
	s := newSim(t, wf, `{"order_id":"A-17"}`)
	tr := s.step(RunStarted{})
	require.Equal(t, []string{"create_task", "await_event", "schedule_timer"}, kinds(tr))
	aw := tr.Actions[1].(AwaitEvent)
	assert.Equal(t, AwaitEvent{NodeID: "paid", Name: "order.paid", KeyExpr: "event.payload.order_id", Key: `"A-17"`}, aw)

	assert.True(t, s.step(published("e1", "order.paid", `{"order_id":"B-2"}`)).Ignored, "another order's event")
	assert.True(t, s.step(published("e2", "order.shipped", `{"order_id":"A-17"}`)).Ignored, "another event name")
	assert.True(t, s.step(published("e3", "order.paid", `{}`)).Ignored, "a payload without the field does not match")

	tr = s.step(published("e4", "order.paid", `{"order_id":"A-17","amount":30}`))
	require.Equal(t, []string{"complete_task", "create_task", "dispatch"}, kinds(tr))
	assert.JSONEq(t, `{"id":"e4","name":"order.paid","payload":{"order_id":"A-17","amount":30}}`, string(s.task("paid").Output))
	assert.JSONEq(t, `{"amount":30}`, string(tr.Actions[1].(CreateTask).Input))
	assert.Empty(t, s.awaits, "a resolved wait leaves the index")
	assert.True(t, s.fire(TimerWaitTimeout, "paid").Ignored)
}

func TestEventsBeforeTheWaitAreNotKept(t *testing.T) {
	wf := dag.MustParse(`{"nodes":[{"id":"a","type":"noop"},{"id":"w","type":"wait","depends_on":["a"],"wait":{"event":"go"}}]}`)
	s := newSim(t, wf, "")
	s.step(RunStarted{})
	assert.True(t, s.step(published("e1", "go", `{}`)).Ignored, "nothing waits yet")
	tr := s.complete("a", `{}`)
	assert.Equal(t, []string{"complete_task", "create_task", "await_event"}, kinds(tr))
	assert.Equal(t, TaskWaiting, s.task("w").State)
}

func TestOneEventResolvesEveryWaitItMatches(t *testing.T) {
	wf := dag.MustParse(`{"nodes":[{"id":"w1","type":"wait","wait":{"event":"go"}},{"id":"w2","type":"wait","wait":{"event":"go"}}]}`)
	s := newSim(t, wf, "")
	s.step(RunStarted{})
	tr := s.step(published("e1", "go", `{}`))
	assert.Equal(t, []string{"complete_task", "complete_task", "complete_run"}, kinds(tr))
}

func TestEventWaitTimeoutNamesTheEvent(t *testing.T) {
	s := newSim(t, dag.MustParse(`{"nodes":[{"id":"w","type":"wait","wait":{"event":"order.paid","timeout":"2h"}}]}`), "")
	s.step(RunStarted{})
	tr := s.fire(TimerWaitTimeout, "w")
	assert.Equal(t, []string{"fail_task", "fail_run"}, kinds(tr))
	assert.Equal(t, CodeWaitTimeout, s.task("w").Error.Code)
	assert.Contains(t, s.task("w").Error.Message, `no matching "order.paid" event within 2h0m0s`)
	assert.Empty(t, s.awaits)
}

func TestEventWaitWhoseKeyCannotBeEvaluatedFailsTheNode(t *testing.T) {
	s := newSim(t, dag.MustParse(`{"nodes":[{"id":"w","type":"wait","wait":{"event":"e","match":"event.payload.k == input.k"}}]}`), `{}`)
	tr := s.step(RunStarted{})
	assert.Equal(t, []string{"create_task", "fail_run"}, kinds(tr))
	assert.Equal(t, CodeExpression, s.task("w").Error.Code)
	assert.Contains(t, s.task("w").Error.Message, "wait.match")
}

func TestCancelOnCancelsTheMatchingRunAndIsRegisteredAgainOnRerun(t *testing.T) {
	wf := dag.MustParse(`{"cancel_on":[{"event":"order.cancelled","match":"event.payload.order_id == input.order_id"}],
		"nodes":[{"id":"a","type":"noop"},{"id":"w","type":"wait","depends_on":["a"],"wait":{"event":"order.cancelled"}}]}`)
	s := newSim(t, wf, `{"order_id":7}`)
	tr := s.step(RunStarted{})
	require.Equal(t, []string{"await_event", "create_task", "dispatch"}, kinds(tr))
	assert.Equal(t, AwaitEvent{CancelOn: 0, Name: "order.cancelled", KeyExpr: "event.payload.order_id", Key: "7"}, tr.Actions[0])
	s.complete("a", `{}`)

	assert.True(t, s.step(published("e0", "order.paid", `{"order_id":7}`)).Ignored)
	tr = s.step(published("e1", "order.cancelled", `{"order_id":7}`))
	assert.Equal(t, []string{"cancel_task", "cancel_run"}, kinds(tr), "cancel_on wins over a wait for the same event")
	assert.Equal(t, RunCancelled, tr.Status)
	assert.Contains(t, tr.Actions[1].(CancelRun).Reason, "cancelled by event order.cancelled (e1)")
	assert.Empty(t, s.awaits, "a finished run leaves the index")
	assert.True(t, s.step(published("e2", "order.cancelled", `{"order_id":7}`)).Ignored, "a finished run ignores events")

	tr = s.step(RerunRequested{})
	assert.Contains(t, kinds(tr), "await_event")
	assert.Contains(t, s.awaits, "cancel_on/0", "a re-run registers its cancel_on again")
	assert.Contains(t, s.awaits, "w")
}

func TestCancelOnForAnotherKeyLeavesTheRunAlone(t *testing.T) {
	wf := dag.MustParse(`{"cancel_on":[{"event":"order.cancelled","match":"event.payload.order_id == input.order_id"}],
		"nodes":[{"id":"a","type":"noop"}]}`)
	s := newSim(t, wf, `{"order_id":7}`)
	s.step(RunStarted{})
	assert.True(t, s.step(published("e1", "order.cancelled", `{"order_id":8}`)).Ignored)
	assert.Equal(t, RunRunning, s.run.Status)
}
