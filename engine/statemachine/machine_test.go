package statemachine

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/engine/dag"
)

func TestChainRunsInOrderAndCompletes(t *testing.T) {
	s := newSim(t, dag.MustParse(`{"nodes":[
		{"id":"a","type":"noop","input":{"v":"input.v"}},
		{"id":"b","type":"noop","depends_on":["a"],"input":{"v":"nodes.a.output.v * 10"}}]}`), `{"v": 4}`)
	tr := s.step(RunStarted{})
	assert.Equal(t, []string{"create_task", "dispatch"}, kinds(tr))
	ct := tr.Actions[0].(CreateTask)
	assert.Equal(t, "a", ct.NodeID)
	assert.Equal(t, "default", ct.Queue)
	assert.Equal(t, dag.DefaultRetry.MaxAttempts, ct.MaxAttempts)
	assert.JSONEq(t, `{"v": 4}`, string(ct.Input))
	assert.Nil(t, s.run.Tasks["b"], "b waits for a")

	tr = s.complete("a", `{"v": 5}`)
	assert.Equal(t, []string{"complete_task", "create_task", "dispatch"}, kinds(tr))
	assert.JSONEq(t, `{"v": 50}`, string(tr.Actions[1].(CreateTask).Input), "upstream output feeds the input mapping")

	tr = s.complete("b", `{"done": true}`)
	assert.Equal(t, []string{"complete_task", "complete_run"}, kinds(tr))
	assert.JSONEq(t, `{"b": {"done": true}}`, string(tr.Actions[1].(CompleteRun).Output))
	assert.Equal(t, RunCompleted, tr.Status)

	assert.True(t, s.step(RunStarted{}).Ignored, "a finished run does not start again")
}

func TestForkJoinCreatesTheJoinOnceAfterBothBranches(t *testing.T) {
	s := newSim(t, dag.MustParse(`{"nodes":[
		{"id":"a","type":"noop"},
		{"id":"b","type":"noop","depends_on":["a"]},
		{"id":"c","type":"noop","depends_on":["a"]},
		{"id":"join","type":"noop","depends_on":["b","c"]}]}`), "")
	s.step(RunStarted{})
	tr := s.complete("a", `{}`)
	assert.Equal(t, []string{"complete_task", "create_task", "dispatch", "create_task", "dispatch"}, kinds(tr))
	tr = s.complete("c", `{}`)
	assert.Equal(t, []string{"complete_task"}, kinds(tr), "join waits for b")
	tr = s.complete("b", `{}`)
	assert.Equal(t, []string{"complete_task", "create_task", "dispatch"}, kinds(tr))
	assert.Equal(t, "join", tr.Actions[1].(CreateTask).NodeID)
}

func TestConditionSkipsAndSkipsPropagate(t *testing.T) {
	wf := dag.MustParse(`{"nodes":[
		{"id":"a","type":"noop"},
		{"id":"left","type":"noop","depends_on":["a"],"if":"input.go_left"},
		{"id":"left2","type":"noop","depends_on":["left"]},
		{"id":"right","type":"noop","depends_on":["a"],"if":"!input.go_left"},
		{"id":"join","type":"noop","depends_on":["left2","right"]}]}`)
	s := newSim(t, wf, `{"go_left": false}`)
	s.step(RunStarted{})
	tr := s.complete("a", `{}`)
	// left is skipped by its condition, left2 because all it depends on was
	// skipped; right runs.
	require.Equal(t, []string{"complete_task", "create_task", "create_task", "dispatch", "create_task"}, kinds(tr))
	left := tr.Actions[1].(CreateTask)
	assert.Equal(t, TaskSkipped, left.State)
	assert.Equal(t, "condition is false", left.Reason)
	assert.Equal(t, "right", tr.Actions[2].(CreateTask).NodeID)
	left2 := tr.Actions[4].(CreateTask)
	assert.Equal(t, "left2", left2.NodeID)
	assert.Equal(t, TaskSkipped, left2.State)
	assert.Equal(t, "every dependency was skipped", left2.Reason)

	tr = s.complete("right", `{"r": 1}`)
	assert.Equal(t, []string{"complete_task", "create_task", "dispatch"}, kinds(tr), "a join with one completed and one skipped dependency runs")
	tr = s.complete("join", `{}`)
	assert.Equal(t, RunCompleted, tr.Status)
}

func TestEverythingSkippedStillCompletesTheRun(t *testing.T) {
	s := newSim(t, dag.MustParse(`{"nodes":[{"id":"a","type":"noop","if":"false"},{"id":"b","type":"noop","depends_on":["a"]}]}`), "")
	tr := s.step(RunStarted{})
	assert.Equal(t, []string{"create_task", "create_task", "complete_run"}, kinds(tr))
	assert.JSONEq(t, `{}`, string(tr.Actions[2].(CompleteRun).Output))
}

func TestRetryBacksOffBumpsTheAttemptAndFencesTheOldOne(t *testing.T) {
	wf := dag.MustParse(`{"nodes":[{"id":"a","type":"noop","retry":{"max_attempts":3,"backoff":"10s","max_backoff":"15s","no_jitter":true}},
		{"id":"b","type":"noop"}]}`)
	s := newSim(t, wf, "")
	s.step(RunStarted{})
	old := *s.task("a")

	tr := s.fail("a", true)
	require.Equal(t, []string{"retry_task"}, kinds(tr))
	rt := tr.Actions[0].(RetryTask)
	assert.Equal(t, 1, rt.Attempt)
	assert.Equal(t, epoch.Add(10*time.Second), rt.NotBefore)
	assert.Equal(t, 2, s.task("a").Attempt)

	stale := s.step(NodeCompleted{NodeID: "a", TaskID: old.ID, Attempt: 1, Output: json.RawMessage(`{}`)})
	assert.True(t, stale.Ignored)
	assert.Contains(t, stale.Reason, "stale attempt 1")

	tr = s.fail("a", true)
	assert.Equal(t, epoch.Add(15*time.Second), tr.Actions[0].(RetryTask).NotBefore, "capped at max_backoff")

	tr = s.fail("a", true)
	assert.Equal(t, []string{"fail_task", "cancel_task", "fail_run"}, kinds(tr), "last attempt fails the run and cancels b")
	fr := tr.Actions[2].(FailRun)
	assert.Equal(t, CodeNodeFailed, fr.Error.Code)
	assert.Equal(t, "a", fr.Error.Node)
	assert.Contains(t, fr.Error.Message, "after 3 attempt(s): it broke")
	assert.Equal(t, TaskCancelled, s.task("b").State)
}

func TestJitterStaysInTheUpperHalfAndIsDeterministic(t *testing.T) {
	wf := dag.MustParse(`{"nodes":[{"id":"a","type":"noop","retry":{"max_attempts":5,"backoff":"8s"}}]}`)
	s := newSim(t, wf, "")
	s.step(RunStarted{})
	tr := s.fail("a", true)
	at := tr.Actions[0].(RetryTask).NotBefore
	assert.True(t, !at.Before(epoch.Add(4*time.Second)) && !at.After(epoch.Add(8*time.Second)), "retry at %s", at.Sub(epoch))

	again := Decide(wf, s.run, NodeFailed{NodeID: "a", TaskID: s.task("a").ID, Attempt: 2, Retryable: true}, epoch)
	twice := Decide(wf, s.run, NodeFailed{NodeID: "a", TaskID: s.task("a").ID, Attempt: 2, Retryable: true}, epoch)
	assert.Equal(t, again, twice)
}

func TestRetryAfterIsAFloorUnderTheBackoff(t *testing.T) {
	wf := dag.MustParse(`{"nodes":[{"id":"a","type":"noop","retry":{"max_attempts":2,"backoff":"1s","no_jitter":true}}]}`)
	s := newSim(t, wf, "")
	s.step(RunStarted{})
	tr := s.step(NodeFailed{NodeID: "a", TaskID: s.task("a").ID, Attempt: 1, Retryable: true, RetryAfter: time.Minute})
	assert.Equal(t, epoch.Add(time.Minute), tr.Actions[0].(RetryTask).NotBefore)
}

func TestNonRetryableFailureFailsAtOnce(t *testing.T) {
	s := newSim(t, dag.MustParse(`{"nodes":[{"id":"a","type":"noop","retry":{"max_attempts":5}}]}`), "")
	s.step(RunStarted{})
	tr := s.fail("a", false)
	assert.Equal(t, []string{"fail_task", "fail_run"}, kinds(tr))
	assert.Equal(t, RunFailed, tr.Status)
}

func TestDuplicateAndLateResultsAreIgnored(t *testing.T) {
	s := newSim(t, dag.MustParse(`{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"noop","depends_on":["a"]}]}`), "")
	s.step(RunStarted{})
	a := *s.task("a")
	ev := NodeCompleted{NodeID: "a", TaskID: a.ID, Attempt: 1, Output: json.RawMessage(`{"x":1}`)}
	require.False(t, s.step(ev).Ignored)
	dup := s.step(ev)
	assert.True(t, dup.Ignored)
	assert.Contains(t, dup.Reason, "already completed")
	assert.True(t, s.step(NodeFailed{NodeID: "a", TaskID: a.ID, Attempt: 1}).Ignored, "a failure after the success changes nothing")
	assert.True(t, s.step(NodeCompleted{NodeID: "a", TaskID: "someone-else", Attempt: 1}).Ignored, "wrong task id")
	assert.True(t, s.step(NodeCompleted{NodeID: "ghost", TaskID: a.ID, Attempt: 1}).Ignored, "unknown node")
	assert.JSONEq(t, `{"x":1}`, string(s.task("a").Output))
}

func TestCancelKeepsFinishedOutputsAndEndsOnce(t *testing.T) {
	s := newSim(t, dag.MustParse(`{"nodes":[
		{"id":"a","type":"noop"},
		{"id":"b","type":"noop","depends_on":["a"]},
		{"id":"c","type":"sleep","depends_on":["a"],"sleep":{"duration":"1h"}},
		{"id":"d","type":"noop","depends_on":["b","c"]}]}`), "")
	s.step(RunStarted{})
	s.complete("a", `{"kept": true}`)
	b := *s.task("b")
	tr := s.step(CancelRequested{Reason: "user asked"})
	assert.Equal(t, []string{"cancel_task", "cancel_task", "cancel_run"}, kinds(tr))
	assert.Equal(t, "user asked", tr.Actions[2].(CancelRun).Reason)
	assert.Equal(t, TaskCompleted, s.task("a").State)
	assert.JSONEq(t, `{"kept": true}`, string(s.task("a").Output))
	assert.Nil(t, s.run.Tasks["d"], "nothing new is scheduled")

	assert.True(t, s.step(CancelRequested{}).Ignored)
	assert.True(t, s.step(NodeCompleted{NodeID: "b", TaskID: b.ID, Attempt: 1}).Ignored, "a running task's late result is dropped")
	assert.True(t, s.fire(TimerSleep, "c").Ignored)
	assert.Equal(t, 1, s.terms)
}

func TestSleepCompletesWhenItsTimerFiresOnce(t *testing.T) {
	s := newSim(t, dag.MustParse(`{"nodes":[{"id":"nap","type":"sleep","sleep":{"duration":"2s"}},{"id":"after","type":"noop","depends_on":["nap"]}]}`), "")
	tr := s.step(RunStarted{})
	require.Equal(t, []string{"create_task", "schedule_timer"}, kinds(tr))
	assert.Equal(t, TaskWaiting, tr.Actions[0].(CreateTask).State)
	assert.Equal(t, "", tr.Actions[0].(CreateTask).Queue, "sleeps use no worker")
	assert.Equal(t, epoch.Add(2*time.Second), tr.Actions[1].(ScheduleTimer).FireAt)
	assert.True(t, s.complete("nap", `{}`).Ignored, "a worker cannot complete a sleep")
	tr = s.fire(TimerSleep, "nap")
	assert.Equal(t, []string{"complete_task", "create_task", "dispatch"}, kinds(tr))
	assert.True(t, s.fire(TimerSleep, "nap").Ignored, "a timer firing twice is ignored")
}

// TestSleepUntilAnInstant: a sleep until an instant from the input or an
// upstream output wakes at that instant; one already past wakes at once; a
// value that is not a timestamp, or too far away, fails the node.
func TestSleepUntilAnInstant(t *testing.T) {
	at := epoch.Add(90 * time.Minute).UTC()
	for name, c := range map[string]struct {
		input string
		want  time.Time
		fails string
	}{
		"rfc3339 string": {`{"at":"` + at.Format(time.RFC3339) + `"}`, at, ""},
		"past":           {`{"at":"` + epoch.Add(-time.Hour).UTC().Format(time.RFC3339) + `"}`, epoch, ""},
		"not a time":     {`{"at":"tomorrow"}`, time.Time{}, "not an RFC 3339 timestamp"},
		"a number":       {`{"at":5}`, time.Time{}, "not a timestamp"},
		"too far":        {`{"at":"` + epoch.Add(400*24*time.Hour).UTC().Format(time.RFC3339) + `"}`, time.Time{}, "more than"},
	} {
		s := newSim(t, dag.MustParse(`{"nodes":[{"id":"nap","type":"sleep","sleep":{"until":"input.at"}},{"id":"after","type":"noop","depends_on":["nap"]}]}`), c.input)
		tr := s.step(RunStarted{})
		if c.fails != "" {
			require.Equal(t, RunFailed, tr.Status, name)
			ct := tr.Actions[0].(CreateTask)
			require.NotNil(t, ct.Error, name)
			assert.Equal(t, CodeExpression, ct.Error.Code, name)
			assert.Contains(t, ct.Error.Message, c.fails, name)
			continue
		}
		require.Equal(t, []string{"create_task", "schedule_timer"}, kinds(tr), name)
		assert.Equal(t, c.want, tr.Actions[1].(ScheduleTimer).FireAt.UTC(), name)
	}

	// A CEL timestamp computed from an upstream output.
	s := newSim(t, dag.MustParse(`{"nodes":[{"id":"a","type":"noop"},
		{"id":"nap","type":"sleep","depends_on":["a"],"sleep":{"until":"timestamp(nodes.a.output.at) + duration('1h')"}}]}`), "")
	s.step(RunStarted{})
	tr := s.complete("a", `{"at":"`+at.Format(time.RFC3339)+`"}`)
	require.Equal(t, []string{"complete_task", "create_task", "schedule_timer"}, kinds(tr))
	assert.Equal(t, at.Add(time.Hour), tr.Actions[2].(ScheduleTimer).FireAt.UTC())
}

func TestWaitResolvedBySignal(t *testing.T) {
	wf := dag.MustParse(`{"nodes":[{"id":"w","type":"wait","wait":{"signal":"go","timeout":"1h"}},
		{"id":"x","type":"noop","depends_on":["w"],"input":{"who":"nodes.w.output.by"}}]}`)
	s := newSim(t, wf, "")
	tr := s.step(RunStarted{})
	assert.Equal(t, []string{"create_task", "schedule_timer"}, kinds(tr))
	assert.Equal(t, TimerWaitTimeout, tr.Actions[1].(ScheduleTimer).Kind)

	other := s.step(SignalReceived{Signal: Signal{ID: "s0", Name: "other"}})
	assert.Equal(t, []string{"record_signal"}, kinds(other), "a signal nobody waits for is kept")

	tr = s.step(SignalReceived{Signal: Signal{ID: "s1", Name: "go", Payload: json.RawMessage(`{"by":"ann"}`)}})
	assert.Equal(t, []string{"record_signal", "complete_task", "create_task", "dispatch"}, kinds(tr))
	assert.Equal(t, "w", tr.Actions[0].(RecordSignal).ConsumedBy)
	assert.JSONEq(t, `{"who":"ann"}`, string(tr.Actions[2].(CreateTask).Input))
	assert.True(t, s.fire(TimerWaitTimeout, "w").Ignored, "the timeout after resolution is ignored")
}

func TestSignalBeforeTheWaitIsConsumedWhenItIsReached(t *testing.T) {
	wf := dag.MustParse(`{"nodes":[{"id":"a","type":"noop"},{"id":"w","type":"wait","depends_on":["a"],"wait":{"signal":"go"}}]}`)
	s := newSim(t, wf, "")
	s.step(RunStarted{})
	s.step(SignalReceived{Signal: Signal{ID: "s1", Name: "go", Payload: json.RawMessage(`{"early":true}`)}})
	tr := s.complete("a", `{}`)
	assert.Equal(t, []string{"complete_task", "consume_signal", "create_task", "complete_run"}, kinds(tr))
	assert.Equal(t, TaskCompleted, tr.Actions[2].(CreateTask).State)
	assert.JSONEq(t, `{"early":true}`, string(s.task("w").Output))
	assert.Empty(t, s.run.Signals)
}

func TestApprovalRejectedFailsTheRun(t *testing.T) {
	wf := dag.MustParse(`{"nodes":[{"id":"ok","type":"wait","wait":{"signal":"approval","approval":true}}]}`)
	s := newSim(t, wf, "")
	s.step(RunStarted{})
	tr := s.step(SignalReceived{Signal: Signal{ID: "s1", Name: "approval", Payload: json.RawMessage(`{"approved":false,"comment":"no"}`)}})
	assert.Equal(t, []string{"record_signal", "fail_task", "fail_run"}, kinds(tr))
	assert.Equal(t, CodeApprovalRejected, s.task("ok").Error.Code)

	s2 := newSim(t, wf, "")
	s2.step(RunStarted{})
	tr = s2.step(SignalReceived{Signal: Signal{ID: "s1", Name: "approval", Payload: json.RawMessage(`{"approved":true}`)}})
	assert.Equal(t, RunCompleted, tr.Status)
}

func TestWaitTimeoutFailsTheRun(t *testing.T) {
	s := newSim(t, dag.MustParse(`{"nodes":[{"id":"w","type":"wait","wait":{"signal":"go","timeout":"2d"}}]}`), "")
	s.step(RunStarted{})
	tr := s.fire(TimerWaitTimeout, "w")
	assert.Equal(t, []string{"fail_task", "fail_run"}, kinds(tr))
	assert.Equal(t, CodeWaitTimeout, s.task("w").Error.Code)
	assert.True(t, s.step(SignalReceived{Signal: Signal{ID: "late", Name: "go"}}).Ignored, "signals to a finished run are ignored")
}

func TestScheduleToStartTimeoutRetriesOnlyUnstartedAttempts(t *testing.T) {
	wf := dag.MustParse(`{"nodes":[{"id":"a","type":"noop","schedule_to_start_timeout":"30s","retry":{"max_attempts":2,"no_jitter":true}}]}`)
	s := newSim(t, wf, "")
	tr := s.step(RunStarted{})
	assert.Equal(t, []string{"create_task", "dispatch", "schedule_timer"}, kinds(tr))
	tr = s.fire(TimerScheduleToStart, "a")
	require.Equal(t, []string{"retry_task", "schedule_timer"}, kinds(tr))
	assert.Equal(t, CodeScheduleToStart, tr.Actions[0].(RetryTask).Error.Code)
	assert.Equal(t, 2, tr.Actions[1].(ScheduleTimer).Attempt)

	// A worker leases attempt 2 before its timer fires: the timer is moot.
	s.task("a").State = TaskRunning
	assert.True(t, s.fire(TimerScheduleToStart, "a").Ignored)
}

func TestRunTimeout(t *testing.T) {
	wf := dag.MustParse(`{"timeout":"1m","nodes":[{"id":"a","type":"noop"}]}`)
	s := newSim(t, wf, "")
	tr := s.step(RunStarted{})
	assert.Equal(t, []string{"schedule_timer", "create_task", "dispatch"}, kinds(tr))
	tr = s.fire(TimerRunTimeout, "")
	assert.Equal(t, []string{"cancel_task", "fail_run"}, kinds(tr))
	assert.Equal(t, CodeRunTimeout, tr.Actions[1].(FailRun).Error.Code)

	done := newSim(t, wf, "")
	done.step(RunStarted{})
	done.complete("a", `{}`)
	assert.True(t, done.fire(TimerRunTimeout, "").Ignored)
}

func TestExpressionErrorFailsTheNodeClearly(t *testing.T) {
	wf := dag.MustParse(`{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"noop","depends_on":["a"],"input":{"x":"nodes.a.output.nope"}}]}`)
	s := newSim(t, wf, "")
	s.step(RunStarted{})
	tr := s.complete("a", `{}`)
	assert.Equal(t, []string{"complete_task", "create_task", "fail_run"}, kinds(tr))
	ct := tr.Actions[1].(CreateTask)
	assert.Equal(t, TaskFailed, ct.State)
	assert.Equal(t, CodeExpression, ct.Error.Code)
	assert.Contains(t, ct.Error.Message, "input.x")
}

func TestTemplatedRequestsAreRenderedPerTask(t *testing.T) {
	wf := dag.MustParse(`{"nodes":[
		{"id":"a","type":"noop"},
		{"id":"b","type":"http","depends_on":["a"],"http":{"url":"https://x.example/o/{{ nodes.a.output.id }}",
		 "headers":{"Authorization":"Bearer {{ secrets.T }}"}}},
		{"id":"c","type":"http","depends_on":["a"],"http":{"url":"https://x.example/{{ input.big }}"}},
		{"id":"d","type":"http","http":{"url":"https://x.example/static"}}]}`)
	s := newSim(t, wf, `{"big": "`+strings.Repeat("x", dag.MaxRenderedValue)+`"}`)
	tr := s.step(RunStarted{})
	for _, a := range tr.Actions {
		if ct, ok := a.(CreateTask); ok && ct.NodeID == "d" {
			assert.Nil(t, ct.Request, "an untemplated request is the definition's")
		}
	}
	tr = s.complete("a", `{"id": "o 1"}`)
	var b, c *CreateTask
	for _, a := range tr.Actions {
		if ct, ok := a.(CreateTask); ok {
			switch ct.NodeID {
			case "b":
				b = &ct
			case "c":
				c = &ct
			}
		}
	}
	require.NotNil(t, b)
	require.NotNil(t, b.Request)
	assert.Equal(t, "https://x.example/o/o%201", b.Request.URL.Text)
	assert.Equal(t, []dag.Part{{Text: "Bearer "}, {Secret: "secrets.T"}}, b.Request.Headers["Authorization"].Parts, "secrets stay for the executor")
	assert.Equal(t, []string{"T"}, b.Request.Secrets)
	require.NotNil(t, c)
	assert.Equal(t, TaskFailed, c.State, "a url rendered larger than the bound fails its node")
	assert.Equal(t, CodeValueTooLarge, c.Error.Code)
	assert.Contains(t, c.Error.Message, "http.url")
}

func TestRerunResetsUnfinishedNodesAndKeepsOutputs(t *testing.T) {
	wf := dag.MustParse(`{"nodes":[
		{"id":"a","type":"noop"},
		{"id":"b","type":"noop","depends_on":["a"],"retry":{"max_attempts":1}},
		{"id":"c","type":"noop","depends_on":["a"]},
		{"id":"d","type":"noop","depends_on":["b","c"]}]}`)
	s := newSim(t, wf, "")
	s.step(RunStarted{})
	s.complete("a", `{"a":1}`)
	oldB := s.task("b").ID
	s.fail("b", true) // fails the run, cancels c
	require.Equal(t, RunFailed, s.run.Status)

	tr := s.step(RerunRequested{})
	assert.Equal(t, []string{"reopen_run", "reset_node", "reset_node", "create_task", "dispatch", "create_task", "dispatch"}, kinds(tr))
	assert.NotEqual(t, oldB, s.task("b").ID, "a rerun gets a new task id")
	assert.Equal(t, TaskCompleted, s.task("a").State)
	assert.JSONEq(t, `{"a":1}`, string(s.task("a").Output))
	s.complete("b", `{}`)
	tr = s.complete("c", `{}`)
	assert.Equal(t, []string{"complete_task", "create_task", "dispatch"}, kinds(tr))
	tr = s.complete("d", `{}`)
	assert.Equal(t, RunCompleted, tr.Status)
	assert.True(t, s.step(RerunRequested{}).Ignored, "a completed run has nothing to re-run")
}

func TestMapStepsRenderTheirRequestPerElement(t *testing.T) {
	wf := dag.MustParse(`{"nodes":[{"id":"fan","type":"map","map":{"items":"input.ids","step":{"type":"http",
		"http":{"url":"https://x.example/{{ input.account }}/items/{{ item }}?n={{ index }}","headers":{"Authorization":"Bearer {{ secrets.T }}"}}}}}]}`)
	s := newSim(t, wf, `{"account":"acc","ids":["a/1","b"]}`)
	tr := s.step(RunStarted{})
	var urls []string
	for _, a := range tr.Actions {
		if ct, ok := a.(CreateTask); ok && ct.NodeID != "fan" {
			require.NotNil(t, ct.Request, ct.NodeID)
			urls = append(urls, ct.Request.URL.Text)
			assert.Equal(t, []string{"T"}, ct.Request.Secrets)
			assert.Equal(t, []dag.Part{{Text: "Bearer "}, {Secret: "secrets.T"}}, ct.Request.Headers["Authorization"].Parts)
		}
	}
	assert.Equal(t, []string{"https://x.example/acc/items/a%2F1?n=0", "https://x.example/acc/items/b?n=1"}, urls)

	_, err := dag.Parse([]byte(`{"nodes":[{"id":"fan","type":"map","map":{"items":"input.ids","step":{"type":"http",
		"http":{"url":"https://x.example/","headers":{"A":"{{ secrets.T + item }}"}}}}}]}`))
	require.ErrorContains(t, err, `node "fan": map.step.http.headers.A:`)
	require.ErrorContains(t, err, "may read nothing else")
}

// TestTheApproverIsTheSenderNotThePayload: an approval's output and its
// rejection name whoever sent the signal as the server authenticated it;
// a "by" in the payload is overwritten, and the steps after it read the
// real approver.
func TestTheApproverIsTheSenderNotThePayload(t *testing.T) {
	wf := dag.MustParse(`{"nodes":[{"id":"ok","type":"wait","wait":{"signal":"approval","approval":true}},
		{"id":"pay","type":"noop","depends_on":["ok"],"input":{"approver":"nodes.ok.output.by","kind":"nodes.ok.output.by_kind"}}]}`)
	ann := dag.Principal{Kind: dag.PrincipalUser, ID: "ann", Role: "admin"}
	s := newSim(t, wf, "")
	s.step(RunStarted{})
	tr := s.step(SignalReceived{Signal: Signal{ID: "s1", Name: "approval", By: ann,
		Payload: json.RawMessage(`{"approved":true,"by":"the-cfo","by_kind":"user","comment":"fine"}`)}})
	require.Equal(t, []string{"record_signal", "complete_task", "create_task", "dispatch"}, kinds(tr))
	assert.JSONEq(t, `{"approved":true,"by":"ann","by_kind":"user","comment":"fine"}`, string(s.task("ok").Output))
	assert.JSONEq(t, `{"approver":"ann","kind":"user"}`, string(tr.Actions[2].(CreateTask).Input))

	// A rejection records the rejecter too.
	s = newSim(t, wf, "")
	s.step(RunStarted{})
	key := dag.Principal{Kind: dag.PrincipalAPIKey, ID: "Ab12Cd34Ef56"}
	s.step(SignalReceived{Signal: Signal{ID: "s1", Name: "approval", By: key, Payload: json.RawMessage(`{"approved":false,"by":"someone-else"}`)}})
	e := s.task("ok").Error
	require.NotNil(t, e)
	assert.Equal(t, CodeApprovalRejected, e.Code)
	assert.Equal(t, `approval "approval" was rejected by api_key:Ab12Cd34Ef56`, e.Message)
	assert.JSONEq(t, `{"approved":false,"by":"Ab12Cd34Ef56","by_kind":"api_key"}`, string(e.Details))

	// An early approval is consumed with its sender when the wait is reached.
	early := dag.MustParse(`{"nodes":[{"id":"a","type":"noop"},{"id":"ok","type":"wait","depends_on":["a"],"wait":{"signal":"approval","approval":true}}]}`)
	s = newSim(t, early, "")
	s.step(RunStarted{})
	s.step(SignalReceived{Signal: Signal{ID: "s1", Name: "approval", By: ann, Payload: json.RawMessage(`{"approved":true,"by":"mallory"}`)}})
	s.complete("a", `{}`)
	assert.JSONEq(t, `{"approved":true,"by":"ann","by_kind":"user"}`, string(s.task("ok").Output))

	// Without a known sender (an internal caller), "by" is null, not the payload's.
	s = newSim(t, wf, "")
	s.step(RunStarted{})
	s.step(SignalReceived{Signal: Signal{ID: "s1", Name: "approval", Payload: json.RawMessage(`{"approved":true,"by":"mallory"}`)}})
	assert.JSONEq(t, `{"approved":true,"by":null,"by_kind":null}`, string(s.task("ok").Output))

	// A plain signal's payload is the sender's data, kept as sent.
	plain := dag.MustParse(`{"nodes":[{"id":"w","type":"wait","wait":{"signal":"go"}}]}`)
	s = newSim(t, plain, "")
	s.step(RunStarted{})
	s.step(SignalReceived{Signal: Signal{ID: "s1", Name: "go", By: ann, Payload: json.RawMessage(`{"by":"anyone"}`)}})
	assert.JSONEq(t, `{"by":"anyone"}`, string(s.task("w").Output))
}

// TestAnApprovalPolicyIsKeptByTheMachine: a signal its policy refuses
// changes nothing (the coordinator refuses it before; the machine would
// not take it either), whether the wait is reached already or not.
func TestAnApprovalPolicyIsKeptByTheMachine(t *testing.T) {
	wf := dag.MustParse(`{"nodes":[{"id":"a","type":"noop"},
		{"id":"ok","type":"wait","depends_on":["a"],"wait":{"signal":"approval","approval":true,"approvers":{"roles":["admin"],"not_starter":true}}}]}`)
	starter := dag.Principal{Kind: dag.PrincipalUser, ID: "sam", Role: "admin"}
	dev := dag.Principal{Kind: dag.PrincipalUser, ID: "dan", Role: "developer"}
	boss := dag.Principal{Kind: dag.PrincipalUser, ID: "bea", Role: "admin"}
	s := newSim(t, wf, "")
	s.run.StartedBy = starter
	s.step(RunStarted{})
	for _, by := range []dag.Principal{dev, starter, {}} {
		tr := s.step(SignalReceived{Signal: Signal{ID: "early-" + by.ID, Name: "approval", By: by, Payload: json.RawMessage(`{"approved":true}`)}})
		require.True(t, tr.Ignored, "%+v", by)
		assert.Contains(t, tr.Reason, "refused: approval \"approval\" of node ok")
	}
	assert.Empty(t, s.run.Signals, "nothing was kept")
	s.complete("a", `{}`)
	require.Equal(t, TaskWaiting, s.task("ok").State)
	assert.True(t, s.step(SignalReceived{Signal: Signal{ID: "s2", Name: "approval", By: starter, Payload: json.RawMessage(`{"approved":true}`)}}).Ignored)
	assert.True(t, s.step(SignalReceived{Signal: Signal{ID: "s3", Name: "approval", By: dev, Payload: json.RawMessage(`{"approved":false}`)}}).Ignored,
		"a refused rejection does not fail the run either")
	require.Equal(t, TaskWaiting, s.task("ok").State)
	tr := s.step(SignalReceived{Signal: Signal{ID: "s4", Name: "approval", By: boss, Payload: json.RawMessage(`{"approved":true}`)}})
	assert.Equal(t, RunCompleted, tr.Status)
	assert.JSONEq(t, `{"approved":true,"by":"bea","by_kind":"user"}`, string(s.task("ok").Output))

	// A signal kept without a sender (before senders were recorded) is
	// no approval of a node with a policy: it stays kept.
	s = newSim(t, wf, "")
	s.run.StartedBy = starter
	s.run.Signals = []Signal{{ID: "legacy", Name: "approval", Payload: json.RawMessage(`{"approved":true}`)}}
	s.step(RunStarted{})
	s.complete("a", `{}`)
	assert.Equal(t, TaskWaiting, s.task("ok").State)
	assert.Len(t, s.run.Signals, 1)
}
