package worker

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/composer-dev/composer/engine/taskapi"
)

// Causes of a handler's context being cancelled (context.Cause).
var (
	// ErrLeaseLost: the task is no longer this worker's (its lease
	// expired and another worker took it over, or the run was
	// cancelled). The result is discarded; stop and return.
	ErrLeaseLost = errors.New("composer: lease lost")
	// ErrShutdown: the worker is shutting down and the drain deadline
	// passed. The task is reported as a retryable failure.
	ErrShutdown = errors.New("composer: worker shutting down")
	// ErrUnauthorized: the server refused the worker's API key (revoked,
	// expired, or without the worker scope). Run returns it, wrapped.
	ErrUnauthorized = errors.New("composer: the server refused the API key")
)

// Error is a handler's failure, with how Composer should treat it. A
// handler may return any error: a plain one is retried (code
// "task_error") while the node has attempts left.
type Error struct {
	// Code is a short machine-readable reason, shown in the run.
	Code string
	// Message is shown in the run (do not put secrets in it).
	Message string
	// Retryable failures are retried with the node's backoff; others fail
	// the node at once.
	Retryable bool
	// RetryAfter sets a floor under the backoff before the next attempt.
	RetryAfter time.Duration
	// Details is optional JSON kept with the error.
	Details json.RawMessage
	// Err is the underlying error, if any (not sent).
	Err error
}

func (e *Error) Error() string {
	if e.Message == "" && e.Err != nil {
		return e.Code + ": " + e.Err.Error()
	}
	return e.Code + ": " + e.Message
}

func (e *Error) Unwrap() error { return e.Err }

// Permanent marks err as a failure retrying cannot fix: the node fails
// now, whatever attempts it has left.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &Error{Code: taskapi.CodePermanentError, Message: err.Error(), Err: err}
}

// RetryAfter marks err as retryable no sooner than d from now (e.g. a
// partner's Retry-After).
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &Error{Code: taskapi.CodeTaskError, Message: err.Error(), Retryable: true, RetryAfter: d, Err: err}
}

// Errorf returns a failure with a code; retryable says whether another
// attempt may succeed.
func Errorf(code string, retryable bool, format string, args ...any) error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...), Retryable: retryable}
}

// failure turns what a handler returned into the reported failure.
func failure(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		out := *e
		if out.Code == "" {
			out.Code = taskapi.CodeTaskError
		}
		if out.Message == "" && out.Err != nil {
			out.Message = out.Err.Error()
		}
		return &out
	}
	return &Error{Code: taskapi.CodeTaskError, Message: err.Error(), Retryable: true}
}
