package workers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	// Secrets reads the current values of the secrets the task's request
	// names, for this attempt's lease (nil: the worker cannot read any).
	Secrets func(ctx context.Context) (map[string]string, error)
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
	return &Failure{Code: taskapi.CodeTaskError, Message: err.Error(), Retryable: true}
}

// Noop completes at once with an empty output (benchmarks, tests).
var Noop = ExecutorFunc(func(context.Context, Task) (json.RawMessage, error) { return json.RawMessage(`{}`), nil })
