package dag

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// NodeType says what runs a node.
type NodeType string

// Node types.
const (
	// TypeHTTP calls an HTTP endpoint; run by platform workers.
	TypeHTTP NodeType = "http"
	// TypeTask runs user code registered under a handler name on a worker.
	TypeTask NodeType = "task"
	// TypeSleep waits for a duration; a durable timer, no worker.
	TypeSleep NodeType = "sleep"
	// TypeWait waits for a named signal or an approval; no worker.
	TypeWait NodeType = "wait"
	// TypeNoop completes at once on a worker; for benchmarks and tests.
	TypeNoop NodeType = "noop"
	// TypeWorkflow starts a child run of another workflow and completes
	// with its output; no worker.
	TypeWorkflow NodeType = "workflow"
	// TypeMap runs a step (or a child workflow) for each element of a
	// list, at most MaxParallelism at once; no worker of its own.
	TypeMap NodeType = "map"
)

// RunsOnWorker reports whether nodes of this type are dispatched to workers
// (as opposed to being resolved by timers and signals).
func (t NodeType) RunsOnWorker() bool {
	return t == TypeHTTP || t == TypeTask || t == TypeNoop
}

// Limits bound what one definition may hold.
const (
	MaxNodes           = 500
	MaxDefinitionBytes = 256 << 10
	MaxExpressionBytes = 4 << 10
	MaxAttempts        = 100
	MaxDuration        = 366 * 24 * time.Hour
	DefaultQueue       = "default"
)

// DefaultRetry is the policy of a node that names none: three attempts,
// backing off from one second up to five minutes, with jitter.
var DefaultRetry = RetryPolicy{MaxAttempts: 3, Backoff: Duration(time.Second), MaxBackoff: Duration(5 * time.Minute)}

// Workflow is a parsed, validated and compiled definition.
type Workflow struct {
	Name        string            `json:"name,omitempty"`
	Description string            `json:"description,omitempty"`
	Timeout     Duration          `json:"timeout,omitempty"`
	Output      map[string]string `json:"output,omitempty"`
	// Metadata maps run metadata keys to expressions over the run input
	// (`input.customer_id`), evaluated when a run starts.
	Metadata map[string]string `json:"metadata,omitempty"`
	// Triggers start a run for each published event they match.
	Triggers []*Trigger `json:"triggers,omitempty"`
	// CancelOn cancels a running run when a matching event is published.
	CancelOn []*CancelOn `json:"cancel_on,omitempty"`
	// Concurrency limits the runs running at once per key.
	Concurrency *ConcurrencySpec `json:"concurrency,omitempty"`
	Nodes       []*Node          `json:"nodes"`

	byID     map[string]*Node
	order    []string            // topological
	deps     map[string][]string // node -> dependents
	sinks    []string
	output   map[string]*program
	metadata map[string]*program
	// secretDerived holds the nodes whose values may hold what a step
	// that reads a secret produced (secrets.go).
	secretDerived map[string]bool
}

// Node is one step of a workflow.
type Node struct {
	ID        string       `json:"id"`
	Type      NodeType     `json:"type"`
	DependsOn []string     `json:"depends_on,omitempty"`
	Queue     string       `json:"queue,omitempty"`
	Retry     *RetryPolicy `json:"retry,omitempty"`
	Timeout   Duration     `json:"timeout,omitempty"`
	// ScheduleToStartTimeout bounds how long a dispatched attempt may wait
	// for a worker before it counts as failed.
	ScheduleToStartTimeout Duration          `json:"schedule_to_start_timeout,omitempty"`
	If                     string            `json:"if,omitempty"`
	Input                  map[string]string `json:"input,omitempty"`
	HTTP                   *HTTPSpec         `json:"http,omitempty"`
	Task                   *TaskSpec         `json:"task,omitempty"`
	Sleep                  *SleepSpec        `json:"sleep,omitempty"`
	Wait                   *WaitSpec         `json:"wait,omitempty"`
	Workflow               *WorkflowSpec     `json:"workflow,omitempty"`
	Map                    *MapSpec          `json:"map,omitempty"`
	// Concurrency limits this step's tasks per key across runs.
	Concurrency *StepConcurrency `json:"concurrency,omitempty"`
	// Priority, when set, is the priority of this node's tasks
	// (MinPriority..MaxPriority); otherwise they take the run's.
	Priority *int `json:"priority,omitempty"`
	// RateLimit names one of the tenant's rate limits this node's
	// attempts take a token from, per key.
	RateLimit *RateLimitRef `json:"rate_limit,omitempty"`

	cond  *program
	input map[string]*program
}

// WorkflowSpec names the workflow a workflow node starts a child run of:
// its latest version, or Version.
type WorkflowSpec struct {
	Name    string `json:"name"`
	Version int    `json:"version,omitempty"`
}

// MapSpec configures a map node: Items (a CEL expression over the run
// input and upstream outputs giving a list) has one element per execution
// of Step (an http, task, noop or workflow step without id, depends_on or
// if; its input mapping also sees `item` and `index`, and without one its
// input is {"item": <element>, "index": <i>}), at most MaxParallelism at
// once (default DefaultMapParallelism), started in element order. The map
// completes with the list of the steps' outputs in element order.
type MapSpec struct {
	Items          string `json:"items"`
	MaxParallelism int    `json:"max_parallelism,omitempty"`
	Step           *Node  `json:"step"`

	items *program
}

// Map bounds.
const (
	MaxMapItems           = 10_000
	MaxMapParallelism     = 1_000
	DefaultMapParallelism = 10
	// MaxChildDepth bounds how deeply child runs nest (a run's depth is
	// its parent's plus one; a top-level run has depth 0).
	MaxChildDepth = 8
)

// Priorities: a run's (startRun) or a node's, higher first; 0 is the
// default. Within a tenant's share of the workers, a task of a higher
// priority is read before one of a lower priority published up to
// (difference × stream.PriorityAging, a minute) earlier: the lower one
// ages, so it is never starved.
const (
	MinPriority = -2
	MaxPriority = 2
)

// RateLimitRef makes a worker node's attempts wait for a token of the
// tenant's rate limit Name, in the bucket of the value of Key — an
// expression over the run input and upstream outputs giving a string, a
// number or a boolean, evaluated when the task is created. An empty Key
// is one bucket for the whole limit.
type RateLimitRef struct {
	Name string `json:"name"`
	Key  string `json:"key,omitempty"`

	key *program
}

// MaxRateKeyChars bounds the value a rate-limit key evaluates to.
const MaxRateKeyChars = 256

// RateLimitName is what a rate limit's name looks like.
var RateLimitName = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,63}$`)

// HTTPSpec configures an http node. When Body is empty, POST, PUT and
// PATCH send the node's input as the JSON body; GET, HEAD, DELETE and
// OPTIONS send none (carry input in the query instead). URL, Query values
// and Header values are templates with {{ expression }} segments over
// input, nodes and secrets (see template.go).
type HTTPSpec struct {
	Method string `json:"method"`
	URL    string `json:"url"`
	// Query parameters are added to the URL's own.
	Query   map[string]string `json:"query,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    json.RawMessage   `json:"body,omitempty"`
	Timeout Duration          `json:"timeout,omitempty"`

	templates *httpTemplates
}

// TaskSpec names the worker handler that runs a task node.
type TaskSpec struct {
	Handler string `json:"handler"`
}

// SleepSpec configures a sleep node: for a Duration, or until the instant
// Until evaluates to — an expression over the run input and upstream
// outputs giving a timestamp (`timestamp("2026-12-24T09:00:00Z")`) or an
// RFC 3339 string (`input.deliver_at`). An instant already past wakes the
// node at once; one more than MaxDuration away fails it.
type SleepSpec struct {
	Duration Duration `json:"duration,omitempty"`
	Until    string   `json:"until,omitempty"`

	until *program
}

// WaitSpec configures a wait node: it completes when the named signal
// arrives (its payload becomes the output) and fails when Timeout passes
// first. With Approval the payload is a decision: {"approved": bool, ...};
// a rejection fails the node. The decision's "by" and "by_kind" are the
// principal that sent it, as the server authenticated it (whatever the
// payload said), and Approvers, when set, says who may send it.
//
// With Event instead of Signal the node waits for a published event of
// that name for which Match — a CEL expression over `event` ({"id",
// "name", "payload"}), `input` and upstream `nodes` — holds (every event of
// the name when Match is empty); its output is the event. Only events
// published while the node waits count. A match of the form
// `event.payload.order_id == input.order_id` (alone or as a term of a
// top-level &&) is indexed: a publish finds the waits for its value
// directly; any other match is tried against every waiting run of the
// event's name.
type WaitSpec struct {
	Signal   string   `json:"signal,omitempty"`
	Event    string   `json:"event,omitempty"`
	Match    string   `json:"match,omitempty"`
	Timeout  Duration `json:"timeout,omitempty"`
	Approval bool     `json:"approval,omitempty"`
	// Approvers is who may answer an approval (nil: anyone who may
	// write runs).
	Approvers *ApprovalPolicy `json:"approvers,omitempty"`

	match *eventMatch
}

// RetryPolicy says how often and how soon a failed attempt is retried.
type RetryPolicy struct {
	MaxAttempts int      `json:"max_attempts"`
	Backoff     Duration `json:"backoff,omitempty"`
	MaxBackoff  Duration `json:"max_backoff,omitempty"`
	// NoJitter turns off jitter, for exact schedules.
	NoJitter bool `json:"no_jitter,omitempty"`
}

// Delay is the backoff before the retry that follows failed attempt n
// (1-based): Backoff·2^(n-1), capped at MaxBackoff (or MaxDuration), without
// overflow however large n is.
func (r RetryPolicy) Delay(n int) time.Duration {
	base := time.Duration(r.Backoff)
	if base <= 0 || n < 1 {
		return 0
	}
	ceiling := time.Duration(r.MaxBackoff)
	if ceiling <= 0 || ceiling > MaxDuration {
		ceiling = MaxDuration
	}
	d := base
	for i := 1; i < n; i++ {
		if d >= ceiling/2 {
			return ceiling
		}
		d *= 2
	}
	return min(d, ceiling)
}

// Duration is a time.Duration written as a string ("250ms", "30s", "2h",
// "1d").
type Duration time.Duration

// Std returns the duration as a time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads "90s"-style strings, with "d" for days.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string like \"30s\" or \"2h\"")
	}
	v, err := ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// ParseDuration parses Go durations plus a whole-day suffix ("2d").
func ParseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if n, ok := strings.CutSuffix(s, "d"); ok && n != "" && !strings.ContainsAny(n, "hmsuµn") {
		var days int64
		if _, err := fmt.Sscanf(n, "%d", &days); err != nil || fmt.Sprint(days) != n || days < 0 || days > 366 {
			return 0, fmt.Errorf("invalid duration %q", s)
		}
		return time.Duration(days) * 24 * time.Hour, nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q (use e.g. \"500ms\", \"30s\", \"2h\", \"1d\")", s)
	}
	return v, nil
}

// Node returns the node with the given id, or nil. The id of a map
// element ("fan[3]") names the map's step.
func (w *Workflow) Node(id string) *Node {
	if n := w.byID[id]; n != nil {
		return n
	}
	if base, _, ok := ParseItemID(id); ok {
		if m := w.byID[base]; m != nil && m.Map != nil {
			return m.Map.Step
		}
	}
	return nil
}

// ItemID is the task id of element i of map node id.
func ItemID(id string, i int) string { return id + "[" + strconv.Itoa(i) + "]" }

// ParseItemID splits a map element's id into its map node and index.
func ParseItemID(id string) (string, int, bool) {
	if !strings.HasSuffix(id, "]") {
		return "", 0, false
	}
	open := strings.LastIndexByte(id, '[')
	if open < 1 {
		return "", 0, false
	}
	i, err := strconv.Atoi(id[open+1 : len(id)-1])
	if err != nil || i < 0 || strconv.Itoa(i) != id[open+1:len(id)-1] {
		return "", 0, false
	}
	return id[:open], i, true
}

// Parallelism is a map node's MaxParallelism or its default.
func (m *MapSpec) Parallelism() int {
	if m.MaxParallelism <= 0 {
		return DefaultMapParallelism
	}
	return m.MaxParallelism
}

// Order returns the node ids in a topological order (dependencies first).
func (w *Workflow) Order() []string { return w.order }

// Dependents returns the ids of the nodes that depend directly on id.
func (w *Workflow) Dependents(id string) []string { return w.deps[id] }

// Sinks returns the ids of nodes nothing depends on.
func (w *Workflow) Sinks() []string { return w.sinks }

// RetryPolicy returns the node's policy, or DefaultRetry.
func (n *Node) RetryPolicy() RetryPolicy {
	if n.Retry == nil {
		return DefaultRetry
	}
	return *n.Retry
}

// QueueName returns the node's queue, or DefaultQueue.
func (n *Node) QueueName() string {
	if n.Queue == "" {
		return DefaultQueue
	}
	return n.Queue
}

// HandlerName returns a task node's handler ("" for other node types).
func (n *Node) HandlerName() string {
	if n.Type != TypeTask || n.Task == nil {
		return ""
	}
	return n.Task.Handler
}

// HasWaits reports whether any node waits for a signal (the coordinator
// reads a run's pending signals only then).
func (w *Workflow) HasWaits() bool {
	for _, n := range w.Nodes {
		if n.Type == TypeWait {
			return true
		}
	}
	return false
}

// HasCondition reports whether the node has an `if` expression.
func (n *Node) HasCondition() bool { return n.cond != nil }
