package statemachine

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"time"

	"github.com/composer-dev/composer/engine/dag"
)

// Decide applies one event to a run and returns the transition. It never
// modifies run. now is the current time on the database clock.
func Decide(wf *dag.Workflow, run *Run, ev Event, now time.Time) Transition {
	m := &machine{wf: wf, now: now, run: run.clone()}
	switch e := ev.(type) {
	case RunStarted:
		m.start()
	case NodeCompleted:
		m.taskCompleted(e)
	case NodeFailed:
		m.taskFailed(e)
	case LeaseExpired:
		m.leaseExpired(e)
	case TimerFired:
		m.timerFired(e)
	case SignalReceived:
		m.signal(e.Signal)
	case EventReceived:
		m.event(e.Event)
	case ChildFinished:
		m.childFinished(e)
	case CancelRequested:
		m.cancel(e.Reason)
	case RerunRequested:
		m.rerun()
	default:
		m.ignore("unknown event %T", ev)
	}
	if m.ignored != "" {
		return Transition{Ignored: true, Reason: m.ignored, Status: run.Status}
	}
	return Transition{Actions: m.actions, Status: m.run.Status}
}

type machine struct {
	wf      *dag.Workflow
	run     *Run
	now     time.Time
	actions []Action
	ignored string
}

func (r *Run) clone() *Run {
	c := *r
	c.Tasks = make(map[string]*Task, len(r.Tasks))
	for k, t := range r.Tasks {
		tc := *t
		c.Tasks[k] = &tc
	}
	c.Signals = append([]Signal(nil), r.Signals...)
	return &c
}

func (m *machine) ignore(format string, args ...any) {
	m.ignored = fmt.Sprintf(format, args...)
}

func (m *machine) emit(a Action) { m.actions = append(m.actions, a) }

func (m *machine) start() {
	if m.run.Status != RunRunning {
		m.ignore("run is %s", m.run.Status)
		return
	}
	if len(m.run.Tasks) > 0 {
		m.ignore("run already started")
		return
	}
	if t := m.wf.Timeout.Std(); t > 0 {
		m.emit(ScheduleTimer{Kind: TimerRunTimeout, FireAt: m.now.Add(t)})
	}
	m.awaitCancelOn()
	m.advance()
}

// awaitCancelOn registers the workflow's cancel_on entries. An entry whose
// key cannot be evaluated over the input (a field it reads is missing)
// could never match, and is not registered.
func (m *machine) awaitCancelOn() {
	for i, c := range m.wf.CancelOn {
		expr, key, err := c.Key(m.run.Input)
		if err != nil {
			continue
		}
		m.emit(AwaitEvent{CancelOn: i, Name: c.Event, KeyExpr: expr, Key: key})
	}
}

// activeTask returns the node's task when the event's task id and attempt
// match it and it is still active; otherwise it ignores the event.
func (m *machine) activeTask(nodeID, taskID string, attempt int, states ...TaskState) *Task {
	t := m.run.Tasks[nodeID]
	switch {
	case t == nil || t.ID != taskID:
		m.ignore("no task %s for node %s", taskID, nodeID)
	case t.Attempt != attempt:
		m.ignore("stale attempt %d of %s (current attempt is %d)", attempt, nodeID, t.Attempt)
	case !t.State.Active():
		m.ignore("task of %s is already %s", nodeID, t.State)
	default:
		for _, s := range states {
			if t.State == s {
				return t
			}
		}
		m.ignore("task of %s is %s", nodeID, t.State)
	}
	return nil
}

func (m *machine) taskCompleted(e NodeCompleted) {
	t := m.activeTask(e.NodeID, e.TaskID, e.Attempt, TaskPending, TaskRunning)
	if t == nil {
		return
	}
	m.complete(t, e.Output)
	m.itemDone(t.NodeID)
	m.advance()
}

func (m *machine) childFinished(e ChildFinished) {
	t := m.activeTask(e.NodeID, e.TaskID, e.Attempt, TaskWaiting)
	if t == nil {
		return
	}
	if n := m.wf.Node(t.NodeID); n == nil || n.Type != dag.TypeWorkflow {
		m.ignore("node %s does not run a child workflow", t.NodeID)
		return
	}
	if e.Status == RunCompleted {
		m.complete(t, e.Output)
		m.itemDone(t.NodeID)
		m.advance()
		return
	}
	err := Error{Code: CodeChildFailed, Message: fmt.Sprintf("child run %s %s", e.ChildID, e.Status)}
	if e.Error != nil {
		if e.Error.Code == CodeChildRefused {
			err = *e.Error
		} else {
			err.Message += ": " + e.Error.Message
			err.Details = mustJSON(e.Error)
		}
	}
	m.failNode(t, err)
}

func (m *machine) complete(t *Task, out json.RawMessage) {
	out = payloadOrEmpty(out)
	m.emit(CompleteTask{NodeID: t.NodeID, TaskID: t.ID, Attempt: t.Attempt, Output: out})
	t.State, t.Output = TaskCompleted, out
}

func (m *machine) taskFailed(e NodeFailed) {
	t := m.activeTask(e.NodeID, e.TaskID, e.Attempt, TaskPending, TaskRunning)
	if t == nil {
		return
	}
	m.attemptFailed(t, e.Error, e.Retryable, e.RetryAfter)
}

func (m *machine) leaseExpired(e LeaseExpired) {
	t := m.activeTask(e.NodeID, e.TaskID, e.Attempt, TaskRunning)
	if t == nil {
		return
	}
	m.attemptFailed(t, Error{Code: CodeLeaseExpired, Message: fmt.Sprintf("the lease of attempt %d expired: the worker stopped renewing it", e.Attempt)}, true, 0)
}

// attemptFailed retries the task when it may, and fails it (and the run)
// when it may not.
func (m *machine) attemptFailed(t *Task, err Error, retryable bool, retryAfter time.Duration) {
	node := m.wf.Node(t.NodeID)
	policy := node.RetryPolicy()
	if err.Node == "" {
		err.Node = t.NodeID
	}
	if retryable && t.Attempt < policy.MaxAttempts {
		delay := policy.Delay(t.Attempt)
		if !policy.NoJitter {
			delay = jitter(delay, t.ID, t.Attempt)
		}
		delay = max(delay, retryAfter)
		at := m.now.Add(delay)
		m.emit(RetryTask{NodeID: t.NodeID, TaskID: t.ID, Attempt: t.Attempt, Error: err, NotBefore: at})
		t.State, t.Error = TaskPending, &err
		t.Attempt++
		m.scheduleToStart(node, t.NodeID, t.Attempt, at)
		return
	}
	m.failNode(t, err)
}

func (m *machine) failNode(t *Task, err Error) {
	if err.Node == "" {
		err.Node = t.NodeID
	}
	m.emit(FailTask{NodeID: t.NodeID, TaskID: t.ID, Attempt: t.Attempt, Error: err})
	t.State, t.Error = TaskFailed, &err
	m.failRun(Error{
		Code:    CodeNodeFailed,
		Node:    t.NodeID,
		Message: fmt.Sprintf("node %s failed after %d attempt(s): %s", t.NodeID, t.Attempt, err.Message),
		Details: mustJSON(err),
	})
}

func (m *machine) failRun(err Error) {
	m.cancelActive()
	m.emit(FailRun{Error: err})
	m.run.Status = RunFailed
}

func (m *machine) cancelActive() {
	for _, id := range m.taskOrder() {
		if t := m.run.Tasks[id]; t != nil && t.State.Active() {
			m.emit(CancelTask{NodeID: id, TaskID: t.ID})
			t.State = TaskCancelled
		}
	}
}

func (m *machine) timerFired(e TimerFired) {
	if e.Kind == TimerRunTimeout {
		if m.run.Status != RunRunning {
			m.ignore("run is %s", m.run.Status)
			return
		}
		m.failRun(Error{Code: CodeRunTimeout, Message: fmt.Sprintf("run exceeded its timeout of %s", m.wf.Timeout.Std())})
		return
	}
	switch e.Kind {
	case TimerSleep:
		if t := m.activeTask(e.NodeID, e.TaskID, e.Attempt, TaskWaiting); t != nil {
			m.complete(t, json.RawMessage(`{}`))
			m.advance()
		}
	case TimerWaitTimeout:
		if t := m.activeTask(e.NodeID, e.TaskID, e.Attempt, TaskWaiting); t != nil {
			w := m.wf.Node(t.NodeID).Wait
			what := fmt.Sprintf("%q signal", w.Signal)
			if w.Event != "" {
				what = fmt.Sprintf("matching %q event", w.Event)
			}
			m.failNode(t, Error{Code: CodeWaitTimeout, Message: fmt.Sprintf("no %s within %s", what, w.Timeout.Std())})
		}
	case TimerScheduleToStart:
		// Only an attempt no worker has leased yet times out this way; a
		// running attempt is bounded by its execution timeout and lease.
		if t := m.activeTask(e.NodeID, e.TaskID, e.Attempt, TaskPending); t != nil {
			d := m.wf.Node(t.NodeID).ScheduleToStartTimeout.Std()
			m.attemptFailed(t, Error{Code: CodeScheduleToStart, Message: fmt.Sprintf("no worker started attempt %d within %s", t.Attempt, d)}, true, 0)
		}
	default:
		m.ignore("unknown timer kind %q", e.Kind)
	}
}

func (m *machine) signal(s Signal) {
	if m.run.Status != RunRunning {
		m.ignore("run is %s", m.run.Status)
		return
	}
	if why := m.wf.ApprovalRefusal(s.Name, s.By, m.run.StartedBy); why != "" {
		// The coordinator refuses such a signal (FORBIDDEN) before it gets
		// here; an approval is never taken from whom its policy refuses.
		m.ignore("refused: %s", why)
		return
	}
	for _, id := range m.wf.Order() {
		n := m.wf.Node(id)
		if t := m.run.Tasks[id]; t != nil && t.State == TaskWaiting && n.Type == dag.TypeWait && n.Wait.Signal == s.Name {
			m.emit(RecordSignal{Signal: s, ConsumedBy: id})
			m.resolveWait(n, t, s)
			m.advance()
			return
		}
	}
	// No node waits for it yet: keep it for the first wait node that does.
	m.emit(RecordSignal{Signal: s})
	m.run.Signals = append(m.run.Signals, s)
}

// event applies a published event: a matching cancel_on entry cancels the
// run; otherwise every waiting event wait the event matches completes with
// it. A match that cannot be evaluated on this event (a field it reads is
// missing) does not match.
func (m *machine) event(e dag.EventData) {
	if m.run.Status != RunRunning {
		m.ignore("run is %s", m.run.Status)
		return
	}
	for _, c := range m.wf.CancelOn {
		if ok, err := c.Matches(m.run.Input, e); err == nil && ok {
			m.cancel(fmt.Sprintf("cancelled by event %s (%s)", e.Name, e.ID))
			return
		}
	}
	s := m.scope()
	resolved := false
	for _, id := range m.wf.Order() {
		n := m.wf.Node(id)
		t := m.run.Tasks[id]
		if t == nil || t.State != TaskWaiting || !n.IsEventWait() {
			continue
		}
		if ok, err := n.MatchesEvent(s, e); err == nil && ok {
			m.complete(t, e.Output())
			resolved = true
		}
	}
	if !resolved {
		m.ignore("nothing in the run waits for event %s (%s)", e.Name, e.ID)
		return
	}
	m.advance()
}

// resolveWait completes a wait node with a signal's payload, or fails it
// when the signal is a rejected approval.
func (m *machine) resolveWait(n *dag.Node, t *Task, s Signal) {
	if !n.Wait.Approval {
		m.complete(t, s.Payload)
		return
	}
	d := decision(s)
	if !approved(d) {
		m.failNode(t, rejected(n, s, d))
		return
	}
	m.complete(t, d)
}

// decision is an approval's output: the signal's payload with "by" and
// "by_kind" set to whoever sent it as the server authenticated them
// (null when unknown), so no payload can name another approver for the
// steps that read it.
func decision(s Signal) json.RawMessage {
	var d map[string]json.RawMessage
	if json.Unmarshal(s.Payload, &d) != nil || d == nil {
		d = map[string]json.RawMessage{}
	}
	d["by"], d["by_kind"] = json.RawMessage("null"), json.RawMessage("null")
	if s.By.Kind != "" {
		d["by"], d["by_kind"] = mustJSON(s.By.ID), mustJSON(s.By.Kind)
	}
	return mustJSON(d)
}

func rejected(n *dag.Node, s Signal, d json.RawMessage) Error {
	msg := fmt.Sprintf("approval %q was rejected", n.Wait.Signal)
	if s.By.Kind != "" {
		msg += " by " + s.By.String()
	}
	return Error{Code: CodeApprovalRejected, Message: msg, Details: d}
}

func payloadOrEmpty(p json.RawMessage) json.RawMessage {
	if len(p) == 0 {
		return json.RawMessage("{}")
	}
	return p
}

func approved(payload json.RawMessage) bool {
	var d struct {
		Approved bool `json:"approved"`
	}
	return json.Unmarshal(payload, &d) == nil && d.Approved
}

// taskOrder lists every task's node id deterministically: the nodes in
// topological order, each map node followed by its elements by index.
func (m *machine) taskOrder() []string {
	out := make([]string, 0, len(m.run.Tasks))
	var items map[string][]int
	for id := range m.run.Tasks {
		if base, i, ok := dag.ParseItemID(id); ok {
			if items == nil {
				items = map[string][]int{}
			}
			items[base] = append(items[base], i)
		}
	}
	for _, id := range m.wf.Order() {
		out = append(out, id)
		if idx := items[id]; len(idx) > 0 {
			slices.Sort(idx)
			for _, i := range idx {
				out = append(out, dag.ItemID(id, i))
			}
		}
	}
	return out
}

func (m *machine) cancel(reason string) {
	if m.run.Status != RunRunning {
		m.ignore("run is %s", m.run.Status)
		return
	}
	m.cancelActive()
	m.emit(CancelRun{Reason: reason})
	m.run.Status = RunCancelled
}

func (m *machine) rerun() {
	if m.run.Status != RunFailed && m.run.Status != RunCancelled {
		m.ignore("only failed or cancelled runs can be re-run; run is %s", m.run.Status)
		return
	}
	m.emit(ReopenRun{})
	m.run.Status = RunRunning
	for _, id := range m.taskOrder() {
		if t := m.run.Tasks[id]; t != nil && (t.State == TaskFailed || t.State == TaskCancelled) {
			m.emit(ResetNode{NodeID: id, TaskID: t.ID})
			delete(m.run.Tasks, id)
		}
	}
	if t := m.wf.Timeout.Std(); t > 0 {
		m.emit(ScheduleTimer{Kind: TimerRunTimeout, FireAt: m.now.Add(t)})
	}
	m.awaitCancelOn()
	m.advance()
}

// advance creates the tasks of every node that became ready, in
// topological order so that skips and immediately resolved waits cascade in
// one pass, then ends the run when nothing is left to do.
func (m *machine) advance() {
	if m.run.Status != RunRunning {
		return
	}
	for _, id := range m.wf.Order() {
		if m.run.Status != RunRunning {
			return
		}
		if _, has := m.run.Tasks[id]; has {
			continue
		}
		n := m.wf.Node(id)
		ready, allSkipped := true, len(n.DependsOn) > 0
		for _, d := range n.DependsOn {
			dt := m.run.Tasks[d]
			if dt == nil || !dt.State.Done() {
				ready = false
				break
			}
			allSkipped = allSkipped && dt.State == TaskSkipped
		}
		if ready {
			m.activate(n, allSkipped)
		}
	}
	m.finishIfDone()
}

func (m *machine) scope() dag.Scope {
	s := dag.Scope{Input: m.run.Input, Nodes: make(map[string]dag.NodeResult, len(m.run.Tasks))}
	for id, t := range m.run.Tasks {
		if t.State.Done() {
			s.Nodes[id] = dag.NodeResult{Status: string(t.State), Output: t.Output}
		}
	}
	return s
}

func (m *machine) activate(n *dag.Node, upstreamSkipped bool) {
	base := CreateTask{NodeID: n.ID, Type: n.Type, MaxAttempts: n.RetryPolicy().MaxAttempts}
	if n.Type.RunsOnWorker() {
		base.Queue = n.QueueName()
	}
	t := &Task{NodeID: n.ID, Attempt: 1}
	m.run.Tasks[n.ID] = t

	if upstreamSkipped {
		m.createFinal(base, t, TaskSkipped, "every dependency was skipped")
		return
	}
	s := m.scope()
	ok, err := n.EvalIf(s)
	if err != nil {
		m.createFailed(base, t, Error{Code: CodeExpression, Message: "if: " + err.Error()})
		return
	}
	if !ok {
		m.createFinal(base, t, TaskSkipped, "condition is false")
		return
	}
	in, err := n.EvalInput(s)
	if err != nil {
		m.createFailed(base, t, evalError(err))
		return
	}
	base.Input = in
	if n.Templated() {
		// The url, query and headers over input and upstream outputs; what
		// reads secrets stays an expression for the executor.
		req, err := n.EvalRequest(s)
		if err != nil {
			m.createFailed(base, t, evalError(err))
			return
		}
		base.Request = req
	}

	switch n.Type {
	case dag.TypeSleep:
		at, err := n.WakeAt(s, m.now)
		if err != nil {
			m.createFailed(base, t, Error{Code: CodeExpression, Message: err.Error()})
			return
		}
		m.createWaiting(base, t)
		m.emit(ScheduleTimer{Kind: TimerSleep, NodeID: n.ID, Attempt: 1, FireAt: at})
	case dag.TypeWait:
		if n.IsEventWait() {
			expr, key, err := n.EventKey(s)
			if err != nil {
				m.createFailed(base, t, Error{Code: CodeExpression, Message: err.Error()})
				return
			}
			m.createWaiting(base, t)
			m.emit(AwaitEvent{NodeID: n.ID, Name: n.Wait.Event, KeyExpr: expr, Key: key})
			m.waitTimeout(n)
			return
		}
		for i, sig := range m.run.Signals {
			if sig.Name != n.Wait.Signal {
				continue
			}
			if n.Wait.Approval && n.Wait.Approvers != nil && sig.By.Kind == "" {
				// Kept with no sender (before senders were recorded): no
				// approval of a node with a policy. (One with a sender was
				// held to every approval policy of its name when it came.)
				continue
			}
			// A signal that arrived earlier resolves the node as it is created.
			m.run.Signals = append(m.run.Signals[:i:i], m.run.Signals[i+1:]...)
			m.emit(ConsumeSignal{SignalID: sig.ID, NodeID: n.ID})
			out := payloadOrEmpty(sig.Payload)
			if n.Wait.Approval {
				out = decision(sig)
				if !approved(out) {
					m.createFailed(base, t, rejected(n, sig, out))
					return
				}
			}
			base.Output = out
			m.createFinal(base, t, TaskCompleted, "")
			return
		}
		m.createWaiting(base, t)
		m.waitTimeout(n)
	case dag.TypeWorkflow:
		m.createWaiting(base, t)
		m.emit(StartChild{NodeID: n.ID, Workflow: n.Workflow.Name, Version: n.Workflow.Version, Input: base.Input})
	case dag.TypeMap:
		items, err := n.EvalItems(s)
		if err != nil {
			m.createFailed(base, t, Error{Code: CodeExpression, Message: err.Error()})
			return
		}
		base.Input = mustJSON(map[string]int{"count": len(items), "max_parallelism": n.Map.Parallelism()})
		if m.itemsDone(n, items) {
			// No elements, or (re-run) every element completed before.
			out, err := m.mapOutput(n, items)
			if err != nil {
				m.createFailed(base, t, *err)
				return
			}
			base.Output = out
			m.createFinal(base, t, TaskCompleted, "")
			return
		}
		m.createWaiting(base, t)
		m.fillMap(n, items, s)
	default:
		key, limit, err := n.StepKey(s)
		if err != nil {
			m.createFailed(base, t, Error{Code: CodeExpression, Message: err.Error()})
			return
		}
		base.ConcurrencyKey, base.ConcurrencyLimit = key, limit
		rateKey, err := n.RateKey(s)
		if err != nil {
			m.createFailed(base, t, Error{Code: CodeExpression, Message: err.Error()})
			return
		}
		base.RateKey = rateKey
		base.Priority = m.run.Priority
		if n.Priority != nil {
			base.Priority = *n.Priority
		}
		base.State = TaskPending
		m.emit(base)
		t.State = TaskPending
		m.emit(Dispatch{NodeID: n.ID, Attempt: 1, NotBefore: m.now})
		m.scheduleToStart(n, n.ID, 1, m.now)
	}
}

// evalError is the error of a node whose input or request could not be
// evaluated.
func evalError(err error) Error {
	code := CodeExpression
	if errors.Is(err, dag.ErrValueTooLarge) {
		code = CodeValueTooLarge
	}
	return Error{Code: code, Message: err.Error()}
}

// itemDone moves the map an element of which just completed: the next
// elements start, or the map completes.
func (m *machine) itemDone(id string) {
	base, _, ok := dag.ParseItemID(id)
	if !ok {
		return
	}
	n := m.wf.Node(base)
	if n == nil || n.Map == nil {
		return
	}
	s := m.scope()
	items, err := n.EvalItems(s) // the scope it reads is upstream: unchanged since the map began
	if err != nil {
		if mt := m.run.Tasks[base]; mt != nil && mt.State == TaskWaiting {
			m.failNode(mt, Error{Code: CodeExpression, Message: err.Error()})
		}
		return
	}
	m.fillMap(n, items, s)
}

// fillMap starts the map's next elements (in order, while fewer than its
// parallelism run) and completes the map with its elements' outputs, in
// element order, once every element completed.
func (m *machine) fillMap(n *dag.Node, items []any, s dag.Scope) {
	mt := m.run.Tasks[n.ID]
	if mt == nil || mt.State != TaskWaiting {
		return
	}
	active := 0
	for i := range items {
		if t := m.run.Tasks[dag.ItemID(n.ID, i)]; t != nil && t.State.Active() {
			active++
		}
	}
	for i := 0; i < len(items) && active < n.Map.Parallelism(); i++ {
		id := dag.ItemID(n.ID, i)
		if m.run.Tasks[id] != nil {
			continue
		}
		if !m.createItem(n, id, i, items[i], s) {
			return
		}
		active++
	}
	if !m.itemsDone(n, items) {
		return
	}
	out, err := m.mapOutput(n, items)
	if err != nil {
		m.failNode(mt, *err)
		return
	}
	m.complete(mt, out)
}

func (m *machine) itemsDone(n *dag.Node, items []any) bool {
	for i := range items {
		if t := m.run.Tasks[dag.ItemID(n.ID, i)]; t == nil || !t.State.Done() {
			return false
		}
	}
	return true
}

// mapOutput is the list of the elements' outputs, in element order,
// within dag.MaxValueBytes.
func (m *machine) mapOutput(n *dag.Node, items []any) (json.RawMessage, *Error) {
	outs := make([]json.RawMessage, len(items))
	size := 2
	for i := range items {
		outs[i] = payloadOrEmpty(m.run.Tasks[dag.ItemID(n.ID, i)].Output)
		if size += len(outs[i]) + 1; size > dag.MaxValueBytes {
			return nil, &Error{Code: CodeValueTooLarge, Message: fmt.Sprintf("the outputs of the %d elements are more than %d bytes", len(items), dag.MaxValueBytes)}
		}
	}
	return mustJSON(outs), nil
}

// createItem creates (and dispatches, or starts the child of) element i;
// false when its input could not be evaluated, which failed the run.
func (m *machine) createItem(n *dag.Node, id string, i int, item any, s dag.Scope) bool {
	st := n.Map.Step
	base := CreateTask{NodeID: id, Type: st.Type, MaxAttempts: st.RetryPolicy().MaxAttempts}
	if st.Type.RunsOnWorker() {
		base.Queue = st.QueueName()
	}
	t := &Task{NodeID: id, Attempt: 1}
	m.run.Tasks[id] = t
	in, err := n.EvalItemInput(s, item, i)
	if err != nil {
		m.createFailed(base, t, evalError(err))
		return false
	}
	base.Input = in
	if st.Templated() {
		req, err := n.EvalItemRequest(s, item, i)
		if err != nil {
			m.createFailed(base, t, evalError(err))
			return false
		}
		base.Request = req
	}
	if st.Type.RunsOnWorker() {
		key, limit, err := n.ItemStepKey(s, item, i)
		if err != nil {
			m.createFailed(base, t, Error{Code: CodeExpression, Message: err.Error()})
			return false
		}
		base.ConcurrencyKey, base.ConcurrencyLimit = key, limit
		rateKey, err := n.ItemRateKey(s, item, i)
		if err != nil {
			m.createFailed(base, t, Error{Code: CodeExpression, Message: err.Error()})
			return false
		}
		base.RateKey = rateKey
		base.Priority = m.run.Priority
		if st.Priority != nil {
			base.Priority = *st.Priority
		}
	}
	if st.Type == dag.TypeWorkflow {
		m.createWaiting(base, t)
		m.emit(StartChild{NodeID: id, Workflow: st.Workflow.Name, Version: st.Workflow.Version, Input: in})
		return true
	}
	base.State = TaskPending
	m.emit(base)
	t.State = TaskPending
	m.emit(Dispatch{NodeID: id, Attempt: 1, NotBefore: m.now})
	m.scheduleToStart(st, id, 1, m.now)
	return true
}

func (m *machine) createWaiting(base CreateTask, t *Task) {
	base.State = TaskWaiting
	m.emit(base)
	t.State = TaskWaiting
}

func (m *machine) waitTimeout(n *dag.Node) {
	if d := n.Wait.Timeout.Std(); d > 0 {
		m.emit(ScheduleTimer{Kind: TimerWaitTimeout, NodeID: n.ID, Attempt: 1, FireAt: m.now.Add(d)})
	}
}

func (m *machine) scheduleToStart(n *dag.Node, id string, attempt int, dispatchedAt time.Time) {
	if d := n.ScheduleToStartTimeout.Std(); d > 0 {
		m.emit(ScheduleTimer{Kind: TimerScheduleToStart, NodeID: id, Attempt: attempt, FireAt: dispatchedAt.Add(d)})
	}
}

func (m *machine) createFinal(base CreateTask, t *Task, state TaskState, reason string) {
	base.State, base.Reason = state, reason
	m.emit(base)
	t.State, t.Output = state, base.Output
}

func (m *machine) createFailed(base CreateTask, t *Task, err Error) {
	err.Node = base.NodeID
	base.State, base.Error = TaskFailed, &err
	m.emit(base)
	t.State, t.Error = TaskFailed, &err
	m.failRun(Error{
		Code:    CodeNodeFailed,
		Node:    base.NodeID,
		Message: fmt.Sprintf("node %s failed: %s", base.NodeID, err.Message),
		Details: mustJSON(err),
	})
}

func (m *machine) finishIfDone() {
	if m.run.Status != RunRunning {
		return
	}
	for _, id := range m.wf.Order() {
		if t := m.run.Tasks[id]; t == nil || !t.State.Done() {
			return
		}
	}
	out, err := m.wf.EvalOutput(m.scope())
	if err != nil {
		code := CodeOutputExpression
		if errors.Is(err, dag.ErrValueTooLarge) {
			code = CodeValueTooLarge
		}
		m.emit(FailRun{Error: Error{Code: code, Message: err.Error()}})
		m.run.Status = RunFailed
		return
	}
	m.emit(CompleteRun{Output: out})
	m.run.Status = RunCompleted
}

// jitter spreads a retry delay over [d/2, d], deterministically from the
// task and attempt, so retries of many tasks failing together do not
// arrive together, and the same inputs always give the same schedule.
func jitter(d time.Duration, taskID string, attempt int) time.Duration {
	if d < 2 {
		return d
	}
	h := fnv.New64a()
	h.Write([]byte(taskID))
	h.Write([]byte(strconv.Itoa(attempt)))
	half := d / 2
	return half + time.Duration(h.Sum64()%uint64(d-half+1))
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("statemachine: marshal %T: %v", v, err))
	}
	return b
}
