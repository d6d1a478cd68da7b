// Package errs gives errors a stable kind that callers branch on and APIs
// map to error codes in one place. Messages are for people; kinds are for
// code: match with errors.Is(err, errs.NotFound), never on text.
//
// An error without a kind is INTERNAL — unless it says a store could not
// be reached (Unreachable): a lost or refused connection, a server
// shutting down. That is UNAVAILABLE, never INTERNAL, wherever it is
// answered.
package errs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"
)

// Kind is a stable class of error. A Kind is itself an error, so
// errors.Is(err, errs.NotFound) works on any wrapped *Error.
type Kind string

func (k Kind) Error() string { return string(k) }

// Kinds. Each maps to one API error code.
const (
	Invalid         Kind = "BAD_USER_INPUT"
	NotFound        Kind = "NOT_FOUND"
	Conflict        Kind = "CONFLICT"
	Unauthenticated Kind = "UNAUTHENTICATED"
	Forbidden       Kind = "FORBIDDEN"
	RateLimited     Kind = "RATE_LIMITED"
	QuotaExceeded   Kind = "QUOTA_EXCEEDED"
	// Unavailable: a store could not be reached and nothing was changed;
	// the same request may succeed after RetryAfter.
	Unavailable Kind = "UNAVAILABLE"
	// OutcomeUnknown: the request's commit was sent but its answer was
	// lost, so it may or may not have taken effect. Retrying with the
	// same idempotency key (or signal id, event id) is safe and finds out.
	OutcomeUnknown Kind = "OUTCOME_UNKNOWN"
	Internal       Kind = "INTERNAL"
)

// RetryAfterDefault is the hint given with UNAVAILABLE and
// OUTCOME_UNKNOWN when the error carries none of its own: about as long
// as a pool takes to replace its connections.
const RetryAfterDefault = time.Second

// Error is an error with a kind, a message safe to show the caller, and an
// optional cause that is logged but never shown.
type Error struct {
	Kind    Kind
	Message string
	// Fields carries structured detail safe to show (e.g. the node and field
	// of each validation problem).
	Fields []Field
	// RetryAfter hints when a RateLimited, Unavailable or OutcomeUnknown
	// call may be tried again (see RetryAfter).
	RetryAfter time.Duration
	Err        error
}

// Field is one structured detail of an error.
type Field struct {
	Node    string `json:"node,omitempty"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %v", e.Message, e.Err)
	}
	return e.Message
}

func (e *Error) Unwrap() error { return e.Err }

// Is makes errors.Is(err, kind) true for an *Error of that kind.
func (e *Error) Is(target error) bool {
	k, ok := target.(Kind)
	return ok && k == e.Kind
}

// E returns an error of the given kind with a message (fmt-style).
func E(kind Kind, format string, args ...any) *Error {
	return &Error{Kind: kind, Message: fmt.Sprintf(format, args...)}
}

// Wrap returns an error of the given kind whose cause is err; the message
// is shown, the cause only logged.
func Wrap(kind Kind, err error, format string, args ...any) *Error {
	return &Error{Kind: kind, Message: fmt.Sprintf(format, args...), Err: err}
}

// The messages of the kinds an unkinded error can be classified as.
const (
	lostMessage           = "the database could not be reached and nothing was changed: retry shortly"
	unreachableMessage    = "a store this request needs could not be reached: retry shortly"
	outcomeUnknownMessage = "outcome unknown: retry with the same idempotency key"
)

// Lost returns err as UNAVAILABLE: a store could not be reached, or its
// connection failed before anything was committed.
func Lost(err error) *Error {
	return &Error{Kind: Unavailable, Message: lostMessage, RetryAfter: RetryAfterDefault, Err: err}
}

// Unknown returns err as OUTCOME_UNKNOWN: a commit was sent and its answer
// lost.
func Unknown(err error) *Error {
	return &Error{Kind: OutcomeUnknown, Message: outcomeUnknownMessage, RetryAfter: RetryAfterDefault, Err: err}
}

// KindOf returns the kind of err: its own, Unavailable when it says a
// store could not be reached (Unreachable), or Internal.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	var k Kind
	if errors.As(err, &k) {
		return k
	}
	if Unreachable(err) {
		return Unavailable
	}
	return Internal
}

// RetryAfter is the hint of when err's request may be repeated: its own,
// or RetryAfterDefault for Unavailable and OutcomeUnknown; 0 for errors
// that repeating will not fix.
func RetryAfter(err error) time.Duration {
	var e *Error
	if errors.As(err, &e) && e.RetryAfter > 0 {
		return e.RetryAfter
	}
	if k := KindOf(err); err != nil && (k == Unavailable || k == OutcomeUnknown) {
		return RetryAfterDefault
	}
	return 0
}

// PublicMessage returns what may be shown to the caller: the message of an
// *Error of a non-internal kind, what to do about an unreachable store,
// or a generic text.
func PublicMessage(err error) string {
	var e *Error
	if errors.As(err, &e) && e.Kind != Internal {
		return e.Message
	}
	if e == nil && Unreachable(err) {
		return unreachableMessage
	}
	return "internal error"
}

// HTTPStatus is the HTTP status of an answer of kind k (the task API's and
// the events endpoint's): 503 for Unavailable and OutcomeUnknown, with a
// Retry-After; 500 for Internal and kinds it does not know.
func HTTPStatus(k Kind) int {
	switch k {
	case Invalid:
		return http.StatusBadRequest
	case NotFound:
		return http.StatusNotFound
	case Conflict:
		return http.StatusConflict
	case Unauthenticated:
		return http.StatusUnauthorized
	case Forbidden:
		return http.StatusForbidden
	case RateLimited, QuotaExceeded:
		return http.StatusTooManyRequests
	case Unavailable, OutcomeUnknown:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// sqlState is how a database driver's error names its SQLSTATE
// (pgconn.PgError has it), so this package links no driver.
type sqlState interface{ SQLState() string }

// Unreachable reports whether err says a store could not be reached or
// its connection was lost: a connection refused, reset or closed, a broken
// pipe, an end of stream in the middle of an answer, a network timeout, a
// request's deadline passing while it waited on a store, a driver that
// sent nothing (pgx's SafeToRetry, e.g. "conn closed"), or PostgreSQL
// ending the session or not taking it: admin_shutdown 57P01,
// crash_shutdown 57P02, cannot_connect_now 57P03, too_many_connections
// 53300 and the connection exceptions of class 08.
func Unreachable(err error) bool {
	if err == nil {
		return false
	}
	var st sqlState
	if errors.As(err, &st) {
		code := st.SQLState()
		switch {
		case code == "57P01", code == "57P02", code == "57P03", code == "53300":
			return true
		case strings.HasPrefix(code, "08") && code != "08P01": // (08P01 is a protocol violation: a bug, not an outage)
			return true
		}
	}
	var unsent interface{ SafeToRetry() bool }
	if errors.As(err, &unsent) && unsent.SafeToRetry() && !strings.Contains(err.Error(), "conn busy") {
		return true // (a busy connection is a caller's bug)
	}
	var netErr net.Error
	switch {
	case errors.As(err, &netErr):
		return true
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNABORTED),
		errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ETIMEDOUT), errors.Is(err, syscall.EHOSTUNREACH),
		errors.Is(err, syscall.ENETUNREACH):
		return true
	case errors.Is(err, net.ErrClosed), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, context.DeadlineExceeded):
		return true
	}
	return false
}
