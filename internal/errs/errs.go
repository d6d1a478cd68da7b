// Package errs gives errors a stable kind that callers branch on and APIs
// map to error codes in one place. Messages are for people; kinds are for
// code: match with errors.Is(err, errs.NotFound), never on text.
package errs

import (
	"errors"
	"fmt"
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
	Unavailable     Kind = "UNAVAILABLE"
	Internal        Kind = "INTERNAL"
)

// Error is an error with a kind, a message safe to show the caller, and an
// optional cause that is logged but never shown.
type Error struct {
	Kind    Kind
	Message string
	// Fields carries structured detail safe to show (e.g. the node and field
	// of each validation problem).
	Fields []Field
	// RetryAfter hints when a RateLimited call may be tried again.
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

// KindOf returns the kind of err, or Internal when it has none.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	var k Kind
	if errors.As(err, &k) {
		return k
	}
	return Internal
}

// PublicMessage returns what may be shown to the caller: the message of an
// *Error of a non-internal kind, or a generic text.
func PublicMessage(err error) string {
	var e *Error
	if errors.As(err, &e) && e.Kind != Internal {
		return e.Message
	}
	return "internal error"
}
