package statemachine

import (
	"encoding/json"
	"fmt"
	"reflect"
	"time"

	"github.com/composer-dev/composer/engine/dag"
)

// sim persists transitions the way the coordinator does, so tests can drive
// a run through many events. It fails the test when the machine emits an
// action the SQL guards would reject (a broken fencing promise).
type sim struct {
	t       failer
	wf      *dag.Workflow
	run     *Run
	now     time.Time
	nextID  int
	timers  []timer
	history []Action
	terms   int // terminal run actions seen
	// awaits is the index of event waits as the persister keeps it: by
	// node id, or "cancel_on/<i>".
	awaits map[string]AwaitEvent
	// children counts child runs started.
	children int
}

func awaitKey(a AwaitEvent) string {
	if a.NodeID != "" {
		return a.NodeID
	}
	return fmt.Sprint("cancel_on/", a.CancelOn)
}

// indexed lists the registrations a publish of e would look up: those on
// its name that are unkeyed or whose key the event side gives.
func (s *sim) indexed(e dag.EventData) map[string]bool {
	out := map[string]bool{}
	for k, a := range s.awaits {
		if a.Name != e.Name {
			continue
		}
		if a.KeyExpr == "" {
			out[k] = true
			continue
		}
		if v, err := dag.EventKeyValue(a.KeyExpr, e); err == nil && v == a.Key {
			out[k] = true
		}
	}
	return out
}

// failer is what sim needs of *testing.T and *rapid.T.
type failer interface {
	Helper()
	Fatalf(format string, args ...any)
}

type timer struct {
	Kind    TimerKind
	NodeID  string
	TaskID  string
	Attempt int
	FireAt  time.Time
}

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newSim(t failer, wf *dag.Workflow, input string) *sim {
	if input == "" {
		input = "{}"
	}
	return &sim{t: t, wf: wf, now: epoch, run: &Run{ID: "run-1", Status: RunRunning, Input: json.RawMessage(input), Tasks: map[string]*Task{}},
		awaits: map[string]AwaitEvent{}}
}

// step decides ev, checks that Decide left its input alone, and persists
// the transition.
func (s *sim) step(ev Event) Transition {
	s.t.Helper()
	before := s.run.clone()
	tr := Decide(s.wf, s.run, ev, s.now)
	if !reflect.DeepEqual(before, s.run.clone()) {
		s.t.Fatalf("Decide modified its input run on %#v", ev)
	}
	if tr.Ignored {
		if len(tr.Actions) > 0 {
			s.t.Fatalf("ignored transition carries actions: %#v", tr)
		}
		if tr.Reason == "" {
			s.t.Fatalf("ignored transition without a reason for %#v", ev)
		}
		return tr
	}
	for _, a := range tr.Actions {
		s.persist(a)
	}
	if tr.Status != s.run.Status {
		s.t.Fatalf("transition says status %s, persisted state is %s", tr.Status, s.run.Status)
	}
	return tr
}

func (s *sim) task(node string) *Task {
	t := s.run.Tasks[node]
	if t == nil {
		s.t.Fatalf("node %s has no task", node)
	}
	return t
}

func (s *sim) guard(node, taskID string, attempt int) *Task {
	s.t.Helper()
	t := s.run.Tasks[node]
	if t == nil || t.ID != taskID || t.Attempt != attempt || !t.State.Active() {
		s.t.Fatalf("action on %s task %s attempt %d would fail the SQL guard (task: %+v)", node, taskID, attempt, t)
	}
	return t
}

func (s *sim) persist(a Action) {
	s.t.Helper()
	s.history = append(s.history, a)
	switch a := a.(type) {
	case CreateTask:
		if s.run.Tasks[a.NodeID] != nil {
			s.t.Fatalf("second task for node %s (unique (run_id, node_id) would reject it)", a.NodeID)
		}
		if base, _, ok := dag.ParseItemID(a.NodeID); ok {
			if mt := s.run.Tasks[base]; mt == nil || mt.State != TaskWaiting {
				s.t.Fatalf("element %s created while its map is not waiting (%+v)", a.NodeID, mt)
			}
		}
		for _, d := range s.wf.Node(a.NodeID).DependsOn {
			if dt := s.run.Tasks[d]; dt == nil || !dt.State.Done() {
				s.t.Fatalf("node %s created before its dependency %s finished", a.NodeID, d)
			}
		}
		s.nextID++
		s.run.Tasks[a.NodeID] = &Task{ID: fmt.Sprintf("t%d", s.nextID), NodeID: a.NodeID, State: a.State, Attempt: 1, Output: a.Output, Error: a.Error}
	case Dispatch:
		if t := s.task(a.NodeID); t.State != TaskPending || t.Attempt != a.Attempt {
			s.t.Fatalf("dispatch of %s attempt %d but task is %s attempt %d", a.NodeID, a.Attempt, t.State, t.Attempt)
		}
	case ScheduleTimer:
		tm := timer{Kind: a.Kind, NodeID: a.NodeID, Attempt: a.Attempt, FireAt: a.FireAt}
		if a.NodeID != "" {
			tm.TaskID = s.task(a.NodeID).ID
		}
		s.timers = append(s.timers, tm)
	case CompleteTask:
		t := s.guard(a.NodeID, a.TaskID, a.Attempt)
		t.State, t.Output = TaskCompleted, a.Output
		delete(s.awaits, a.NodeID)
	case RetryTask:
		t := s.guard(a.NodeID, a.TaskID, a.Attempt)
		t.State, t.Attempt, t.Error = TaskPending, t.Attempt+1, &a.Error
	case FailTask:
		t := s.guard(a.NodeID, a.TaskID, a.Attempt)
		t.State, t.Error = TaskFailed, &a.Error
		delete(s.awaits, a.NodeID)
	case CancelTask:
		t := s.task(a.NodeID)
		if !t.State.Active() {
			s.t.Fatalf("cancel of %s which is %s", a.NodeID, t.State)
		}
		t.State = TaskCancelled
		delete(s.awaits, a.NodeID)
	case StartChild:
		if t := s.task(a.NodeID); t.State != TaskWaiting || s.wf.Node(a.NodeID).Type != dag.TypeWorkflow {
			s.t.Fatalf("start_child for %s, which is %s", a.NodeID, t.State)
		}
		s.children++
	case AwaitEvent:
		if a.NodeID != "" {
			if t := s.task(a.NodeID); t.State != TaskWaiting || !s.wf.Node(a.NodeID).IsEventWait() {
				s.t.Fatalf("await_event for %s, which is %s", a.NodeID, t.State)
			}
		}
		if _, dup := s.awaits[awaitKey(a)]; dup {
			s.t.Fatalf("second registration of %s", awaitKey(a))
		}
		s.awaits[awaitKey(a)] = a
	case ResetNode:
		delete(s.run.Tasks, a.NodeID)
	case RecordSignal:
		if a.ConsumedBy == "" {
			s.run.Signals = append(s.run.Signals, a.Signal)
		}
	case ConsumeSignal:
		for i, sg := range s.run.Signals {
			if sg.ID == a.SignalID {
				s.run.Signals = append(s.run.Signals[:i:i], s.run.Signals[i+1:]...)
				return
			}
		}
		s.t.Fatalf("consume of unknown signal %s", a.SignalID)
	case CompleteRun, FailRun, CancelRun:
		if s.run.Status != RunRunning {
			s.t.Fatalf("second terminal action %#v on a %s run", a, s.run.Status)
		}
		s.terms++
		clear(s.awaits)
		switch a.(type) {
		case CompleteRun:
			s.run.Status = RunCompleted
		case FailRun:
			s.run.Status = RunFailed
		default:
			s.run.Status = RunCancelled
		}
	case ReopenRun:
		s.run.Status = RunRunning
	default:
		s.t.Fatalf("unknown action %T", a)
	}
}

// kinds lists the action kinds of a transition, for compact assertions.
func kinds(tr Transition) []string {
	out := make([]string, len(tr.Actions))
	for i, a := range tr.Actions {
		out[i] = ActionKind(a)
	}
	return out
}

func (s *sim) complete(node string, output string) Transition {
	s.t.Helper()
	t := s.task(node)
	return s.step(NodeCompleted{NodeID: node, TaskID: t.ID, Attempt: t.Attempt, Output: json.RawMessage(output)})
}

func (s *sim) fail(node string, retryable bool) Transition {
	s.t.Helper()
	t := s.task(node)
	return s.step(NodeFailed{NodeID: node, TaskID: t.ID, Attempt: t.Attempt, Retryable: retryable, Error: Error{Code: "boom", Message: "it broke"}})
}

func (s *sim) fire(kind TimerKind, node string) Transition {
	s.t.Helper()
	for i := len(s.timers) - 1; i >= 0; i-- { // the newest such timer
		tm := s.timers[i]
		if tm.Kind == kind && tm.NodeID == node {
			s.now = maxTime(s.now, tm.FireAt)
			return s.step(TimerFired{Kind: tm.Kind, NodeID: tm.NodeID, TaskID: tm.TaskID, Attempt: tm.Attempt})
		}
	}
	s.t.Fatalf("no %s timer for %q", kind, node)
	return Transition{}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
