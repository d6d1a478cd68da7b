package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"

	"github.com/google/uuid"

	"github.com/composer-dev/composer/engine/taskapi"
)

// RawHandler runs one attempt of a task node with its input as JSON and
// returns its output as JSON (nil: no output).
type RawHandler func(ctx context.Context, input json.RawMessage) (json.RawMessage, error)

var handlerName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// HandleRaw registers fn under name: a workflow's task node with
// `"task": {"handler": name}` runs it. Register every handler before Run;
// registering an invalid or duplicate name, or after Run started, panics
// (as http.HandleFunc does), since it is a mistake in the program.
func (w *Worker) HandleRaw(name string, fn RawHandler) {
	if !handlerName.MatchString(name) {
		panic(fmt.Sprintf("composer worker: invalid handler name %q (letters, digits and _, at most 64)", name))
	}
	if fn == nil {
		panic("composer worker: nil handler for " + name)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		panic("composer worker: register handlers before Run")
	}
	if _, dup := w.handlers[name]; dup {
		panic("composer worker: handler " + name + " registered twice")
	}
	w.handlers[name] = fn
}

// Handle registers a typed handler: the task's input is decoded into In
// (a failure to decode fails the node, since retrying cannot fix it) and
// the returned Out is encoded as its output.
func Handle[In, Out any](w *Worker, name string, fn func(ctx context.Context, in In) (Out, error)) {
	w.HandleRaw(name, func(ctx context.Context, raw json.RawMessage) (json.RawMessage, error) {
		var in In
		if len(raw) > 0 && string(raw) != "null" {
			if err := json.Unmarshal(raw, &in); err != nil {
				return nil, &Error{Code: taskapi.CodeBadInput, Message: fmt.Sprintf("the task input does not fit the handler's input type: %v", err), Err: err}
			}
		}
		out, err := fn(ctx, in)
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(out)
		if err != nil {
			return nil, &Error{Code: taskapi.CodeBadOutput, Message: fmt.Sprintf("the handler's output cannot be encoded as JSON: %v", err), Err: err}
		}
		return b, nil
	})
}

// Task describes the attempt a handler runs; TaskFrom reads it from the
// handler's context.
type Task struct {
	Tenant uuid.UUID
	Run    uuid.UUID
	// ID is the task's id: stable across its attempts, so it is the
	// idempotency key to give services that take one.
	ID              uuid.UUID
	NodeID          string
	Handler         string
	Queue           string
	Attempt         int
	MaxAttempts     int
	WorkflowID      uuid.UUID
	WorkflowVersion int
}

type taskKey struct{}

// TaskFrom returns the task a handler's context belongs to.
func TaskFrom(ctx context.Context) (Task, bool) {
	t, ok := ctx.Value(taskKey{}).(Task)
	return t, ok
}
