// Package statemachine decides every transition of a workflow run. It is
// pure: given the definition, the run's current state, one event and the
// current time, Decide returns the actions to persist, or says why the event
// is ignored. It does no I/O and reads no clock, so the same inputs always
// give the same transition; the coordinator (package engine) feeds it and
// persists what it returns in one transaction.
//
// Semantics, in short:
//   - a node becomes ready when every dependency has completed or been
//     skipped; if all of its dependencies were skipped it is skipped too,
//     and if its `if` is false it is skipped;
//   - a worker node failing with attempts left is retried after a capped
//     exponential backoff (with deterministic jitter); after its last
//     attempt it fails the run, and everything still active is cancelled;
//   - results are fenced by task id and attempt: a stale, duplicate or
//     late result (for a task that is no longer active) is ignored;
//   - cancellation keeps finished outputs and schedules nothing new;
//   - a run reaches one terminal state, once.
package statemachine

import (
	"encoding/json"
	"time"

	"github.com/composer-dev/composer/engine/dag"
)

// RunStatus is the state of a run.
type RunStatus string

// Run statuses. A run is created running; the other three are terminal.
const (
	RunRunning   RunStatus = "running"
	RunCompleted RunStatus = "completed"
	RunFailed    RunStatus = "failed"
	RunCancelled RunStatus = "cancelled"
)

// Terminal reports whether the status is final.
func (s RunStatus) Terminal() bool { return s != RunRunning }

// TaskState is the state of one node's task.
type TaskState string

// Task states. pending, running and waiting are active; the rest are final.
const (
	TaskPending   TaskState = "pending"   // dispatched, waiting for a worker's lease
	TaskRunning   TaskState = "running"   // leased by a worker
	TaskWaiting   TaskState = "waiting"   // a sleep or wait node waiting for its timer or signal
	TaskCompleted TaskState = "completed" // finished with an output
	TaskFailed    TaskState = "failed"    // failed after its last attempt
	TaskSkipped   TaskState = "skipped"   // its condition was false or its upstream was skipped
	TaskCancelled TaskState = "cancelled" // the run ended before it finished
)

// Active reports whether the task may still change.
func (s TaskState) Active() bool { return s == TaskPending || s == TaskRunning || s == TaskWaiting }

// Done reports whether the task lets its dependents run.
func (s TaskState) Done() bool { return s == TaskCompleted || s == TaskSkipped }

// Error describes why a task or a run failed.
type Error struct {
	Code    string          `json:"code"`
	Message string          `json:"message"`
	Node    string          `json:"node,omitempty"`
	Details json.RawMessage `json:"details,omitempty"`
}

// Error codes set by the engine (workers report their own: taskapi's
// Code constants, and executors' such as "http_status").
const (
	CodeNodeFailed        = "node_failed"
	CodeExpression        = "expression_error"
	CodeValueTooLarge     = "value_too_large"
	CodeRunTimeout        = "run_timeout"
	CodeWaitTimeout       = "wait_timeout"
	CodeScheduleToStart   = "schedule_to_start_timeout"
	CodeApprovalRejected  = "approval_rejected"
	CodeLeaseExpired      = "lease_expired"
	CodeOutputTooLarge    = "output_too_large"
	CodeCancelled         = "cancelled"
	CodeOutputExpression  = "output_expression_error"
	CodeInvalidDefinition = "invalid_definition"
	CodeChildFailed       = "child_failed"
	CodeChildRefused      = "child_start_refused"
)

// Run is the state of a run as the coordinator loaded it.
type Run struct {
	ID     string
	Status RunStatus
	Input  json.RawMessage
	// Tasks holds the task of every node that has one, by node id. Nodes
	// that have not become ready have none.
	Tasks map[string]*Task
	// Signals are received signals no wait node has consumed yet, oldest first.
	Signals []Signal
	// Priority is the run's priority (dag.MinPriority..dag.MaxPriority),
	// the priority of its tasks whose node sets none.
	Priority int
	// StartedBy is who started the run (the zero Principal when unknown),
	// for approval policies' not_starter.
	StartedBy dag.Principal
}

// Task is one node's task.
type Task struct {
	ID      string
	NodeID  string
	State   TaskState
	Attempt int
	Output  json.RawMessage
	Error   *Error
}

// Signal is a named message sent to a run; a wait node for its name
// consumes it.
type Signal struct {
	ID      string
	Name    string
	Payload json.RawMessage
	// By is who sent it, as the server authenticated it: the approver an
	// approval wait records, whatever the payload says, and whom its
	// policy must allow.
	By dag.Principal
}

// TimerKind names what a timer is for.
type TimerKind string

// Timer kinds.
const (
	TimerSleep           TimerKind = "sleep"             // a sleep node's duration is over
	TimerWaitTimeout     TimerKind = "wait_timeout"      // a wait node waited too long
	TimerScheduleToStart TimerKind = "schedule_to_start" // an attempt waited too long for a worker
	TimerRunTimeout      TimerKind = "run_timeout"       // the whole run took too long
)

// Event is one input to a run.
type Event interface{ eventKind() string }

// Kind returns a short name of the event's type, for logs and the timeline.
func Kind(e Event) string { return e.eventKind() }

// RunStarted starts a newly created run.
type RunStarted struct{}

// NodeCompleted is a worker's successful result.
type NodeCompleted struct {
	NodeID  string
	TaskID  string
	Attempt int
	Output  json.RawMessage
}

// NodeFailed is a failed attempt. Retryable failures are retried while the
// node has attempts left; RetryAfter (e.g. from an HTTP Retry-After header)
// sets a floor under the backoff.
type NodeFailed struct {
	NodeID     string
	TaskID     string
	Attempt    int
	Error      Error
	Retryable  bool
	RetryAfter time.Duration
}

// LeaseExpired is a running attempt whose worker stopped renewing its
// lease (the sweep found it expired). The attempt failed: it is retried
// with the node's backoff while attempts remain, else the node fails. It
// applies only to the running attempt it names.
type LeaseExpired struct {
	NodeID  string
	TaskID  string
	Attempt int
}

// TimerFired is a due timer. Run timeouts carry no node.
type TimerFired struct {
	Kind    TimerKind
	NodeID  string
	TaskID  string
	Attempt int
}

// SignalReceived delivers a new signal (the coordinator has already dropped
// repeats of the same signal id).
type SignalReceived struct{ Signal Signal }

// EventReceived delivers a published event to a running run: it cancels
// the run when a cancel_on entry matches, and otherwise resolves every
// waiting event wait it matches. An event that matches nothing is ignored
// (events are not kept for waits not yet reached).
type EventReceived struct{ Event dag.EventData }

// ChildFinished is the end of the child run a workflow node (or a map
// element of a workflow step) started: its status, and its output or error.
// The child start being refused is a failed ChildFinished (code
// CodeChildRefused).
type ChildFinished struct {
	NodeID  string
	TaskID  string
	Attempt int
	ChildID string
	Status  RunStatus
	Output  json.RawMessage
	Error   *Error
}

// CancelRequested cancels the run.
type CancelRequested struct{ Reason string }

// RerunRequested re-runs a failed or cancelled run from the nodes that did
// not finish; completed nodes keep their outputs.
type RerunRequested struct{}

// Event kinds: what Kind returns, the timeline's kind column and what
// transition hooks and observers see.
const (
	KindRunStarted      = "run_started"
	KindNodeCompleted   = "node_completed"
	KindNodeFailed      = "node_failed"
	KindLeaseExpired    = "lease_expired"
	KindTimerFired      = "timer_fired"
	KindSignalReceived  = "signal_received"
	KindEventReceived   = "event_received"
	KindChildFinished   = "child_finished"
	KindCancelRequested = "cancel_requested"
	KindRerunRequested  = "rerun_requested"
)

func (RunStarted) eventKind() string      { return KindRunStarted }
func (NodeCompleted) eventKind() string   { return KindNodeCompleted }
func (NodeFailed) eventKind() string      { return KindNodeFailed }
func (LeaseExpired) eventKind() string    { return KindLeaseExpired }
func (TimerFired) eventKind() string      { return KindTimerFired }
func (SignalReceived) eventKind() string  { return KindSignalReceived }
func (EventReceived) eventKind() string   { return KindEventReceived }
func (ChildFinished) eventKind() string   { return KindChildFinished }
func (CancelRequested) eventKind() string { return KindCancelRequested }
func (RerunRequested) eventKind() string  { return KindRerunRequested }

// Action is one change the coordinator must persist. Actions are ordered:
// persist them in the order given.
type Action interface{ actionKind() string }

// ActionKind returns a short name of the action's type.
func ActionKind(a Action) string { return a.actionKind() }

// CreateTask creates the task of a node that became ready. State is pending
// for worker nodes (a Dispatch follows), waiting for sleep and wait nodes,
// or already final (skipped; completed by a buffered signal; failed when its
// expressions could not be evaluated).
type CreateTask struct {
	NodeID      string
	Type        dag.NodeType
	Queue       string
	State       TaskState
	MaxAttempts int
	Input       json.RawMessage
	// Request is an http node's url, query and headers rendered for this
	// task, when its definition templates them (nil: the definition's).
	Request *dag.Request
	Output  json.RawMessage
	Error   *Error
	// Reason says why a task was created already skipped.
	Reason string
	// ConcurrencyKey and ConcurrencyLimit are a worker node's step
	// concurrency key and limit: its Dispatch waits for one of the key's
	// slots ("" and 0 without one).
	ConcurrencyKey   string
	ConcurrencyLimit int
	// Priority is a worker task's priority: its node's, else the run's.
	Priority int
	// RateKey is the value of the node's rate-limit key (its node names
	// the limit), evaluated as the task is created.
	RateKey string
}

// Dispatch sends a worker node's attempt to its queue, no earlier than
// NotBefore.
type Dispatch struct {
	NodeID    string
	Attempt   int
	NotBefore time.Time
}

// ScheduleTimer schedules a timer. NodeID and Attempt are empty for a run
// timeout.
type ScheduleTimer struct {
	Kind    TimerKind
	NodeID  string
	Attempt int
	FireAt  time.Time
}

// CompleteTask records an active task's output.
type CompleteTask struct {
	NodeID  string
	TaskID  string
	Attempt int
	Output  json.RawMessage
}

// RetryTask resets a failed attempt to pending with the next attempt number
// (in the same statement, so the old attempt can never match again) and
// dispatches it at NotBefore.
type RetryTask struct {
	NodeID    string
	TaskID    string
	Attempt   int // the attempt that failed
	Error     Error
	NotBefore time.Time
}

// FailTask fails a task for good.
type FailTask struct {
	NodeID  string
	TaskID  string
	Attempt int
	Error   Error
}

// CancelTask cancels an active task; a running one loses its lease.
type CancelTask struct {
	NodeID string
	TaskID string
}

// ResetNode removes a node's unfinished task so that a rerun creates a new
// one (with a new id, so receivers do not replay an old attempt's answer).
type ResetNode struct {
	NodeID string
	TaskID string
}

// RecordSignal stores a received signal; ConsumedBy names the wait node it
// resolved, or is empty when it is kept for a wait node not yet reached.
type RecordSignal struct {
	Signal     Signal
	ConsumedBy string
}

// ConsumeSignal marks a stored signal as consumed by a wait node.
type ConsumeSignal struct {
	SignalID string
	NodeID   string
}

// AwaitEvent registers what the run waits for in the index of waits a
// publish looks up: an event wait node that started waiting (NodeID set)
// or a cancel_on entry (CancelOn its position, NodeID empty), with the key
// its match needs (KeyExpr and Key "" when unkeyed). The registration
// lasts while the node waits and, for cancel_on, while the run runs.
type AwaitEvent struct {
	NodeID   string
	CancelOn int
	Name     string
	KeyExpr  string
	Key      string
}

// StartChild starts a child run of the named workflow (its latest version
// unless Version) with Input, for the waiting task of NodeID, in the
// transition's transaction; its end comes back as ChildFinished. A task
// cancelled while its child runs cancels the child.
type StartChild struct {
	NodeID   string
	Workflow string
	Version  int
	Input    json.RawMessage
}

// CompleteRun ends the run successfully.
type CompleteRun struct{ Output json.RawMessage }

// FailRun ends the run with an error.
type FailRun struct{ Error Error }

// CancelRun ends the run as cancelled.
type CancelRun struct{ Reason string }

// ReopenRun puts a failed or cancelled run back to running for a rerun.
type ReopenRun struct{}

func (CreateTask) actionKind() string    { return "create_task" }
func (Dispatch) actionKind() string      { return "dispatch" }
func (ScheduleTimer) actionKind() string { return "schedule_timer" }
func (CompleteTask) actionKind() string  { return "complete_task" }
func (RetryTask) actionKind() string     { return "retry_task" }
func (FailTask) actionKind() string      { return "fail_task" }
func (CancelTask) actionKind() string    { return "cancel_task" }
func (ResetNode) actionKind() string     { return "reset_node" }
func (RecordSignal) actionKind() string  { return "record_signal" }
func (ConsumeSignal) actionKind() string { return "consume_signal" }
func (AwaitEvent) actionKind() string    { return "await_event" }
func (StartChild) actionKind() string    { return "start_child" }
func (CompleteRun) actionKind() string   { return "complete_run" }
func (FailRun) actionKind() string       { return "fail_run" }
func (CancelRun) actionKind() string     { return "cancel_run" }
func (ReopenRun) actionKind() string     { return "reopen_run" }

// Transition is Decide's answer.
type Transition struct {
	// Actions to persist, in order. Empty when Ignored.
	Actions []Action
	// Ignored is set for stale, duplicate or irrelevant events; Reason says why.
	Ignored bool
	Reason  string
	// Status is the run's status after the transition.
	Status RunStatus
}
