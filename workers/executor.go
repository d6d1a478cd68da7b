package workers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/composer-dev/composer/engine/taskapi"
)

// Task is one leased attempt, as an executor sees it.
type Task struct {
	Tenant          uuid.UUID
	Run             uuid.UUID
	ID              uuid.UUID
	NodeID          string
	NodeType        string
	Attempt         int
	MaxAttempts     int
	WorkflowID      uuid.UUID
	WorkflowVersion int
	Input           json.RawMessage
	Config          taskapi.TaskConfig
}

// Executor runs the tasks of one node type. Execute must return promptly
// when ctx is cancelled (lease lost, timeout, shutdown).
type Executor interface {
	Execute(ctx context.Context, t Task) (json.RawMessage, error)
}

// ExecutorFunc adapts a function to Executor.
type ExecutorFunc func(ctx context.Context, t Task) (json.RawMessage, error)

// Execute calls f.
func (f ExecutorFunc) Execute(ctx context.Context, t Task) (json.RawMessage, error) { return f(ctx, t) }

// Failure is an executor's failed attempt. Any other error is treated as a
// retryable failure with code "task_error".
type Failure struct {
	Code       string
	Message    string
	Retryable  bool
	RetryAfter time.Duration
	Details    json.RawMessage
}

func (f *Failure) Error() string { return f.Code + ": " + f.Message }

// Retryable returns a failure that the node's retry policy may retry.
func Retryable(code, format string, args ...any) *Failure {
	return &Failure{Code: code, Message: fmt.Sprintf(format, args...), Retryable: true}
}

// Permanent returns a failure that fails the node at once.
func Permanent(code, format string, args ...any) *Failure {
	return &Failure{Code: code, Message: fmt.Sprintf(format, args...)}
}

func asFailure(err error) *Failure {
	var f *Failure
	if errors.As(err, &f) {
		return f
	}
	return &Failure{Code: "task_error", Message: err.Error(), Retryable: true}
}

// Noop completes at once with an empty output (benchmarks, tests).
var Noop = ExecutorFunc(func(context.Context, Task) (json.RawMessage, error) { return json.RawMessage(`{}`), nil })

// HandlerFunc is user code for a task node.
type HandlerFunc func(ctx context.Context, t Task) (json.RawMessage, error)

// Handlers runs task nodes by the handler name in their definition. It is
// safe for concurrent use.
type Handlers struct {
	mu sync.RWMutex
	m  map[string]HandlerFunc
}

// Register adds (or replaces) a handler.
func (h *Handlers) Register(name string, fn HandlerFunc) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = map[string]HandlerFunc{}
	}
	h.m[name] = fn
}

// Execute runs the handler the task names.
func (h *Handlers) Execute(ctx context.Context, t Task) (json.RawMessage, error) {
	if t.Config.Task == nil {
		return nil, Permanent("bad_config", "task node without a handler")
	}
	h.mu.RLock()
	fn := h.m[t.Config.Task.Handler]
	h.mu.RUnlock()
	if fn == nil {
		// Another worker may have it: let the retry policy try again.
		return nil, Retryable("no_handler", "no handler %q is registered on this worker", t.Config.Task.Handler)
	}
	return fn(ctx, t)
}
