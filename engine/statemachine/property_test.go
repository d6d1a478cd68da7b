package statemachine

import (
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/composer-dev/composer/engine/dag"
)

// TestMain runs the property tests with at least 1,000 cases each unless
// RAPID_CHECKS or -rapid.checks asks for another number.
func TestMain(m *testing.M) {
	flag.Parse()
	explicit := os.Getenv("RAPID_CHECKS") != ""
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "rapid.checks" })
	if !explicit {
		_ = flag.Set("rapid.checks", "1000")
	}
	os.Exit(m.Run())
}

// genWorkflow draws a random DAG: each node depends on a random subset of
// earlier nodes, with a mix of worker nodes (with retries and
// schedule-to-start timeouts), sleeps, waits and approvals, and conditions
// over random input flags.
func genWorkflow(t *rapid.T) (*dag.Workflow, string) {
	n := rapid.IntRange(1, 9).Draw(t, "nodes")
	var nodes []map[string]any
	flags := map[string]bool{}
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("n%d", i)
		node := map[string]any{"id": id}
		var deps []string
		for j := 0; j < i; j++ {
			if rapid.IntRange(0, 2).Draw(t, "dep") == 0 {
				deps = append(deps, fmt.Sprintf("n%d", j))
			}
		}
		if len(deps) > 0 {
			node["depends_on"] = deps
		}
		switch rapid.SampledFrom([]string{"noop", "noop", "noop", "sleep", "wait", "event", "workflow", "map"}).Draw(t, "type") {
		case "noop":
			node["type"] = "noop"
			node["retry"] = map[string]any{"max_attempts": rapid.IntRange(1, 3).Draw(t, "attempts"), "backoff": "1s"}
			if rapid.IntRange(0, 3).Draw(t, "s2s") == 0 {
				node["schedule_to_start_timeout"] = "30s"
			}
		case "sleep":
			node["type"] = "sleep"
			node["sleep"] = map[string]any{"duration": "5s"}
		case "wait":
			node["type"] = "wait"
			w := map[string]any{"signal": fmt.Sprintf("sig%d", rapid.IntRange(0, 1).Draw(t, "signal")), "approval": rapid.Bool().Draw(t, "approval")}
			if w["approval"] == true {
				switch rapid.IntRange(0, 3).Draw(t, "approvers") {
				case 0:
					w["approvers"] = map[string]any{"roles": []string{"admin"}, "not_starter": true}
				case 1:
					w["approvers"] = map[string]any{"members": []string{"bea"}, "api_keys": []string{"k1"}}
				}
			}
			if rapid.Bool().Draw(t, "wait timeout") {
				w["timeout"] = "1h"
			}
			node["wait"] = w
		case "workflow":
			node["type"] = "workflow"
			node["workflow"] = map[string]any{"name": "child"}
		case "map":
			node["type"] = "map"
			step := map[string]any{"type": "noop", "retry": map[string]any{"max_attempts": rapid.IntRange(1, 2).Draw(t, "item attempts"), "backoff": "1s"}}
			if rapid.IntRange(0, 2).Draw(t, "child step") == 0 {
				step = map[string]any{"type": "workflow", "workflow": map[string]any{"name": "child"}}
			}
			node["map"] = map[string]any{"items": "input.list", "max_parallelism": rapid.IntRange(1, 3).Draw(t, "parallelism"), "step": step}
		case "event":
			node["type"] = "wait"
			w := map[string]any{"event": fmt.Sprintf("ev%d", rapid.IntRange(0, 1).Draw(t, "event"))}
			switch rapid.IntRange(0, 2).Draw(t, "match") {
			case 0: // keyed
				w["match"] = "event.payload.k == input.key"
			case 1: // keyed, with another term
				w["match"] = "input.key == event.payload.k && event.payload.ok"
			}
			if rapid.Bool().Draw(t, "wait timeout") {
				w["timeout"] = "1h"
			}
			node["wait"] = w
		}
		if rapid.IntRange(0, 3).Draw(t, "cond") == 0 {
			f := fmt.Sprintf("f%d", i)
			node["if"] = "input.flags." + f
			flags[f] = rapid.Bool().Draw(t, "flag")
		}
		nodes = append(nodes, node)
	}
	def := map[string]any{"nodes": nodes}
	if rapid.IntRange(0, 3).Draw(t, "cancel_on") == 0 {
		def["cancel_on"] = []map[string]any{{"event": "stop", "match": "event.payload.k == input.key"}}
	}
	if rapid.IntRange(0, 4).Draw(t, "run timeout") == 0 {
		def["timeout"] = "10h"
	}
	b, _ := json.Marshal(def)
	wf, err := dag.Parse(b)
	if err != nil {
		t.Fatalf("generated an invalid workflow: %v\n%s", err, b)
	}
	list := make([]int, rapid.IntRange(0, 5).Draw(t, "items"))
	for i := range list {
		list[i] = i * 10
	}
	in, _ := json.Marshal(map[string]any{"key": "k1", "flags": flags, "list": list})
	return wf, string(in)
}

// TestPropertiesUnderRandomEventOrders drives random workflows through
// random interleavings of results, failures, timers, signals, cancels,
// duplicates and stale reports, and checks after every step:
//   - no node's task is created before its dependencies finished (sim.persist);
//   - every action would pass the SQL fencing guards (sim.persist);
//   - a node completes at most once;
//   - re-applying a delivered event changes nothing;
//   - a report for an older attempt is always ignored;
//   - Decide never modifies its input (sim.step);
//   - an approval is answered only by a sender its policy allows, and
//     records that sender (checkApprovers);
//
// and at the end, once every task has reported, that the run reached exactly
// one terminal state and nothing is left active.
func TestPropertiesUnderRandomEventOrders(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		wf, input := genWorkflow(rt)
		s := newSim(rt, wf, input)
		s.run.StartedBy = starter
		var delivered []Event
		signals, events := 0, 0
		deliver := func(ev Event) Transition {
			tr := s.step(ev)
			if !tr.Ignored {
				delivered = append(delivered, ev)
			}
			return tr
		}
		deliver(RunStarted{})

		steps := rapid.IntRange(0, 60).Draw(rt, "steps")
		for i := 0; i < steps; i++ {
			switch rapid.IntRange(0, 12).Draw(rt, "what") {
			case 0, 1, 2, 3: // a worker reports on an active task
				if t := pickTask(rt, s, TaskPending, TaskRunning); t != nil {
					if rapid.IntRange(0, 2).Draw(rt, "ok") > 0 {
						deliver(NodeCompleted{NodeID: t.NodeID, TaskID: t.ID, Attempt: t.Attempt, Output: json.RawMessage(fmt.Sprintf(`{"from":%q}`, t.NodeID))})
					} else {
						deliver(NodeFailed{NodeID: t.NodeID, TaskID: t.ID, Attempt: t.Attempt, Retryable: rapid.Bool().Draw(rt, "retryable"), Error: Error{Code: "x", Message: "x"}})
					}
				}
			case 4: // a duplicate delivery of something already applied
				if len(delivered) > 0 {
					ev := rapid.SampledFrom(delivered).Draw(rt, "replay")
					switch ev.(type) {
					case SignalReceived, EventReceived:
						continue // the coordinator drops repeated signal ids, a publish repeated event ids, before Decide
					}
					if tr := s.step(ev); !tr.Ignored {
						rt.Fatalf("re-applying %#v changed the run: %v", ev, kinds(tr))
					}
				}
			case 5: // a stale report, or a stale lease expiry, from an earlier attempt
				if t := pickTask(rt, s, TaskPending, TaskRunning); t != nil && t.Attempt > 1 {
					if tr := s.step(NodeCompleted{NodeID: t.NodeID, TaskID: t.ID, Attempt: t.Attempt - 1}); !tr.Ignored {
						rt.Fatalf("stale attempt %d of %s was applied", t.Attempt-1, t.NodeID)
					}
					if tr := s.step(LeaseExpired{NodeID: t.NodeID, TaskID: t.ID, Attempt: t.Attempt - 1}); !tr.Ignored {
						rt.Fatalf("the expiry of stale attempt %d of %s was applied", t.Attempt-1, t.NodeID)
					}
				}
			case 6: // any timer ever scheduled fires (maybe twice, maybe late)
				if len(s.timers) > 0 {
					tm := rapid.SampledFrom(s.timers).Draw(rt, "timer")
					s.now = maxTime(s.now, tm.FireAt)
					deliver(TimerFired{Kind: tm.Kind, NodeID: tm.NodeID, TaskID: tm.TaskID, Attempt: tm.Attempt})
				}
			case 7: // a signal
				signals++
				payload := fmt.Sprintf(`{"approved":%v,"by":"bea"}`, rapid.Bool().Draw(rt, "approve"))
				deliver(SignalReceived{Signal: Signal{ID: fmt.Sprint("sg", signals), Name: fmt.Sprintf("sig%d", rapid.IntRange(0, 1).Draw(rt, "name")),
					Payload: json.RawMessage(payload), By: rapid.SampledFrom(senders).Draw(rt, "sender")}})
			case 8: // a worker leases a pending task
				if t := pickTask(rt, s, TaskPending); t != nil {
					t.State = TaskRunning
				}
			case 9:
				if rapid.IntRange(0, 4).Draw(rt, "cancel") == 0 {
					deliver(CancelRequested{Reason: "test"})
				}
			case 10: // a running attempt's lease expires (a pending one has no lease)
				if t := pickTask(rt, s, TaskPending, TaskRunning); t != nil {
					checkLeaseExpiry(rt, s, wf, t, deliver)
				}
			case 11: // a published event, maybe for another key
				events++
				e := dag.EventData{ID: fmt.Sprint("ev", events), Name: rapid.SampledFrom([]string{"ev0", "ev1", "stop"}).Draw(rt, "event name"),
					Payload: json.RawMessage(fmt.Sprintf(`{"k":%q,"ok":%v}`, rapid.SampledFrom([]string{"k1", "k2"}).Draw(rt, "key"), rapid.Bool().Draw(rt, "ok")))}
				deliverEvent(rt, s, e, deliver)
			case 12: // a child run ends, any way
				if t := pickTask(rt, s, TaskWaiting); t != nil && wf.Node(t.NodeID).Type == dag.TypeWorkflow {
					st := rapid.SampledFrom([]RunStatus{RunCompleted, RunCompleted, RunFailed, RunCancelled}).Draw(rt, "child status")
					ev := ChildFinished{NodeID: t.NodeID, TaskID: t.ID, Attempt: t.Attempt, ChildID: "c-" + t.ID, Status: st}
					if st == RunCompleted {
						ev.Output = json.RawMessage(fmt.Sprintf(`{"child_of":%q}`, t.NodeID))
					} else {
						ev.Error = &Error{Code: "x", Message: "child failed"}
					}
					deliver(ev)
				}
			}
			checkCompletesOnce(rt, s)
			checkMaps(rt, s)
			checkApprovers(rt, s)
		}

		// Let every remaining task report, resolving whatever is active.
		for guard := 0; s.run.Status == RunRunning; guard++ {
			if guard > 2000 {
				rt.Fatalf("run still running after every task reported: %+v", s.run.Tasks)
			}
			t := pickTask(rt, s, TaskPending, TaskRunning, TaskWaiting)
			if t == nil {
				rt.Fatalf("run is running with no active task: %+v", s.run.Tasks)
			}
			n := wf.Node(t.NodeID)
			switch n.Type {
			case dag.TypeMap:
				continue // it ends when its elements do
			case dag.TypeWorkflow:
				deliver(ChildFinished{NodeID: t.NodeID, TaskID: t.ID, Attempt: t.Attempt, ChildID: "c-" + t.ID, Status: RunCompleted,
					Output: json.RawMessage(fmt.Sprintf(`{"child_of":%q}`, t.NodeID))})
			case dag.TypeSleep:
				deliver(TimerFired{Kind: TimerSleep, NodeID: t.NodeID, TaskID: t.ID, Attempt: t.Attempt})
			case dag.TypeWait:
				if n.IsEventWait() {
					events++
					deliverEvent(rt, s, dag.EventData{ID: fmt.Sprint("ev", events), Name: n.Wait.Event, Payload: json.RawMessage(`{"k":"k1","ok":true}`)}, deliver)
					break
				}
				signals++
				deliver(SignalReceived{Signal: Signal{ID: fmt.Sprint("sg", signals), Name: n.Wait.Signal, Payload: json.RawMessage(`{"approved":true}`), By: boss}})
			default:
				deliver(NodeCompleted{NodeID: t.NodeID, TaskID: t.ID, Attempt: t.Attempt})
			}
			checkCompletesOnce(rt, s)
		}
		if s.terms != 1 {
			rt.Fatalf("run reached %d terminal states", s.terms)
		}
		checkMaps(rt, s)
		for id, t := range s.run.Tasks {
			if t.State.Active() {
				rt.Fatalf("task of %s is still %s after the run ended %s", id, t.State, s.run.Status)
			}
		}
		// After the end, every event is ignored.
		for _, ev := range delivered {
			if _, isSignal := ev.(SignalReceived); isSignal {
				continue
			}
			if tr := s.step(ev); !tr.Ignored {
				rt.Fatalf("%#v applied to a %s run", ev, s.run.Status)
			}
		}
	})
}

// Who sends the property test's signals: the run's starter, members of
// other roles, an API key, and an unknown sender. boss passes every policy
// genWorkflow writes.
var (
	starter = dag.Principal{Kind: dag.PrincipalUser, ID: "sam", Role: "admin"}
	boss    = dag.Principal{Kind: dag.PrincipalUser, ID: "bea", Role: "admin"}
	senders = []dag.Principal{starter, boss, {Kind: dag.PrincipalUser, ID: "dan", Role: "developer"}, {Kind: dag.PrincipalAPIKey, ID: "k1"},
		{Kind: dag.PrincipalAPIKey, ID: "k2"}, {}}
)

// checkApprovers checks that every approval that was answered records a
// sender its policy allows, never the payload's "by".
func checkApprovers(rt *rapid.T, s *sim) {
	byID := map[string]dag.Principal{}
	for _, p := range senders {
		byID[p.ID] = p
	}
	for id, t := range s.run.Tasks {
		n := s.wf.Node(id)
		if n.Type != dag.TypeWait || !n.Wait.Approval {
			continue
		}
		var d json.RawMessage
		switch {
		case t.State == TaskCompleted:
			d = t.Output
		case t.State == TaskFailed && t.Error != nil && t.Error.Code == CodeApprovalRejected:
			d = t.Error.Details
		default:
			continue
		}
		var got struct {
			By *string `json:"by"`
		}
		if err := json.Unmarshal(d, &got); err != nil {
			rt.Fatalf("approval %s answered with %s", id, d)
		}
		var by dag.Principal
		if got.By != nil {
			by = byID[*got.By]
		}
		if why := n.Wait.Approvers.Refusal(by, starter); why != "" {
			rt.Fatalf("approval %s was answered by %+v, whom its policy refuses: %s", id, by, why)
		}
	}
}

// deliverEvent delivers a published event and checks that whatever it
// resolved or cancelled was registered where the publish's index lookup
// finds it (the index never hides a run the state machine would resume),
// and that it resolved every waiting match.
func deliverEvent(rt *rapid.T, s *sim, e dag.EventData, deliver func(Event) Transition) {
	found := s.indexed(e)
	waiting := map[string]bool{}
	for id, t := range s.run.Tasks {
		if t.State == TaskWaiting && s.wf.Node(id).IsEventWait() {
			waiting[id] = true
		}
	}
	tr := deliver(EventReceived{Event: e})
	cancelled := false
	for _, a := range tr.Actions {
		switch a := a.(type) {
		case CompleteTask:
			if waiting[a.NodeID] && !found[a.NodeID] {
				rt.Fatalf("event %+v resolved %s, which the index lookup would not find (registrations %+v)", e, a.NodeID, s.awaits)
			}
		case CancelRun:
			cancelled = true
		}
	}
	if cancelled && !found["cancel_on/0"] {
		rt.Fatalf("event %+v cancelled the run through a cancel_on the index lookup would not find", e)
	}
	if !tr.Ignored && !cancelled {
		for id := range waiting {
			n := s.wf.Node(id)
			scope := dag.Scope{Input: s.run.Input, Nodes: map[string]dag.NodeResult{}}
			if ok, _ := n.MatchesEvent(scope, e); ok && s.run.Tasks[id].State == TaskWaiting {
				rt.Fatalf("event %+v matched %s but left it waiting", e, id)
			}
		}
	}
}

// checkLeaseExpiry delivers a lease expiry for t's attempt and checks what
// it did: nothing to a task that is not running; to a running one, a
// retry after its backoff (with a schedule-to-start timer when the node
// has one) while attempts remain, else the node's failure.
func checkLeaseExpiry(rt *rapid.T, s *sim, wf *dag.Workflow, t *Task, deliver func(Event) Transition) {
	state, attempt, node := t.State, t.Attempt, wf.Node(t.NodeID)
	tr := deliver(LeaseExpired{NodeID: t.NodeID, TaskID: t.ID, Attempt: attempt})
	if state != TaskRunning {
		if !tr.Ignored {
			rt.Fatalf("a lease expiry applied to a %s task", state)
		}
		return
	}
	if tr.Ignored {
		rt.Fatalf("the expiry of the running attempt %d of %s was ignored: %s", attempt, t.NodeID, tr.Reason)
	}
	policy := node.RetryPolicy()
	var retried, failed, s2s bool
	for _, a := range tr.Actions {
		switch a := a.(type) {
		case RetryTask:
			retried = a.NodeID == t.NodeID
			if !a.NotBefore.After(s.now) {
				rt.Fatalf("the retry of an expired lease does not wait its backoff (%s, now %s)", a.NotBefore, s.now)
			}
			if a.Error.Code != CodeLeaseExpired {
				rt.Fatalf("the retry records %q, not %q", a.Error.Code, CodeLeaseExpired)
			}
		case FailTask:
			failed = a.NodeID == t.NodeID
		case ScheduleTimer:
			s2s = s2s || (a.Kind == TimerScheduleToStart && a.NodeID == t.NodeID && a.Attempt == attempt+1)
		}
	}
	switch {
	case attempt < policy.MaxAttempts && !retried:
		rt.Fatalf("attempt %d of %d expired without a retry: %v", attempt, policy.MaxAttempts, kinds(tr))
	case attempt >= policy.MaxAttempts && !failed:
		rt.Fatalf("the last attempt expired without failing the node: %v", kinds(tr))
	case retried && node.ScheduleToStartTimeout.Std() > 0 && !s2s:
		rt.Fatalf("the retry of an expired lease got no schedule-to-start timer: %v", kinds(tr))
	}
}

// checkMaps checks every map node: no more elements active than its
// parallelism, elements started in order, and a completed map's output is
// its elements' outputs in element order.
func checkMaps(rt *rapid.T, s *sim) {
	for _, id := range s.wf.Order() {
		n := s.wf.Node(id)
		mt := s.run.Tasks[id]
		if n.Map == nil || mt == nil {
			continue
		}
		var list []any
		_ = json.Unmarshal(s.run.Input, &struct{ List *[]any }{&list})
		active, gap := 0, false
		for i := range list {
			t := s.run.Tasks[dag.ItemID(id, i)]
			if t == nil {
				gap = true
				continue
			}
			if gap && mt.State == TaskWaiting {
				rt.Fatalf("element %d of %s started before an earlier one", i, id)
			}
			if t.State.Active() {
				active++
			}
		}
		if active > n.Map.Parallelism() {
			rt.Fatalf("%d elements of %s active; its parallelism is %d", active, id, n.Map.Parallelism())
		}
		if mt.State == TaskCompleted {
			var outs []json.RawMessage
			if err := json.Unmarshal(mt.Output, &outs); err != nil || len(outs) != len(list) {
				rt.Fatalf("map %s completed with %s for %d elements", id, mt.Output, len(list))
			}
			for i := range list {
				if want := s.run.Tasks[dag.ItemID(id, i)].Output; string(outs[i]) != string(want) {
					rt.Fatalf("map %s output[%d] is %s, element %d output %s", id, i, outs[i], i, want)
				}
			}
		}
	}
}

// pickTask draws one task in one of the given states, or nil.
func pickTask(rt *rapid.T, s *sim, states ...TaskState) *Task {
	var ts []*Task
	ids := slices.Sorted(maps.Keys(s.run.Tasks))
	for _, id := range ids {
		if t := s.run.Tasks[id]; t != nil {
			for _, st := range states {
				if t.State == st {
					ts = append(ts, t)
				}
			}
		}
	}
	if len(ts) == 0 {
		return nil
	}
	return rapid.SampledFrom(ts).Draw(rt, "task")
}

func checkCompletesOnce(rt *rapid.T, s *sim) {
	seen := map[string]int{}
	for _, a := range s.history {
		switch a := a.(type) {
		case CompleteTask:
			seen[a.NodeID]++
		case CreateTask:
			if a.State == TaskCompleted {
				seen[a.NodeID]++
			}
		}
	}
	for id, n := range seen {
		if n > 1 {
			rt.Fatalf("node %s completed %d times", id, n)
		}
	}
}

// TestDecideIsDeterministic checks that the same inputs always give the same
// transition (no hidden clock, randomness or map-order dependence).
func TestDecideIsDeterministic(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		wf, input := genWorkflow(rt)
		s := newSim(rt, wf, input)
		s.run.StartedBy = starter
		first := Decide(wf, s.run, RunStarted{}, epoch)
		for i := 0; i < 5; i++ {
			if again := Decide(wf, s.run, RunStarted{}, epoch); !reflect.DeepEqual(first, again) {
				rt.Fatalf("Decide gave different transitions for the same input")
			}
		}
	})
}
