package errs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/internal/testenv"
)

func TestKindsSurviveWrapping(t *testing.T) {
	base := E(NotFound, "run %s not found", "r1")
	wrapped := fmt.Errorf("load: %w", base)
	assert.True(t, errors.Is(wrapped, NotFound))
	assert.False(t, errors.Is(wrapped, Forbidden))
	assert.Equal(t, NotFound, KindOf(wrapped))
	assert.Equal(t, "run r1 not found", PublicMessage(wrapped))
}

func TestCausesAreNotShown(t *testing.T) {
	err := Wrap(Internal, errors.New("pq: password authentication failed for user x"), "could not start run")
	assert.Equal(t, "internal error", PublicMessage(err))
	assert.Equal(t, Internal, KindOf(errors.New("plain")))
	assert.Equal(t, "internal error", PublicMessage(errors.New("secret detail")))
	shown := Wrap(Conflict, errors.New("unique_violation on idx"), "key already used")
	assert.Equal(t, "key already used", PublicMessage(shown))
}

// TestLostStoresAreUnavailable: every way a store's connection fails is
// UNAVAILABLE with a retry hint, never INTERNAL; what repeating cannot
// fix stays what it was. The errors are the drivers' own.
func TestLostStoresAreUnavailable(t *testing.T) {
	t.Parallel()
	refused := func() error {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := ln.Addr().String()
		require.NoError(t, ln.Close())
		_, err = net.Dial("tcp", addr)
		require.Error(t, err)
		return err
	}()
	env := testenv.NewPG(t)
	ctx := context.Background()
	conn, err := pgconn.Connect(ctx, env.AppURL)
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))
	_, closedErr := conn.Exec(ctx, "SELECT 1").ReadAll()
	require.Error(t, closedErr)
	deadline, cancel := context.WithTimeout(ctx, time.Nanosecond)
	defer cancel()
	<-deadline.Done()
	_, timedOut := env.App.Exec(deadline, "SELECT 1")
	require.Error(t, timedOut)

	for name, err := range map[string]error{
		"connection refused":      fmt.Errorf("acquire: %w", refused),
		"connection reset":        fmt.Errorf("read: %w", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}),
		"broken pipe":             fmt.Errorf("write: %w", syscall.EPIPE),
		"pgconn conn closed":      fmt.Errorf("query: %w", closedErr),
		"end of stream mid-reply": fmt.Errorf("receive: %w", io.ErrUnexpectedEOF),
		"admin_shutdown":          fmt.Errorf("query: %w", &pgconn.PgError{Severity: "FATAL", Code: "57P01"}),
		"crash_shutdown":          &pgconn.PgError{Severity: "FATAL", Code: "57P02"},
		"cannot_connect_now":      &pgconn.PgError{Severity: "FATAL", Code: "57P03"},
		"too_many_connections":    &pgconn.PgError{Severity: "FATAL", Code: "53300"},
		"connection_failure":      &pgconn.PgError{Code: "08006"},
		"a deadline on a store":   timedOut,
	} {
		assert.True(t, Unreachable(err), name)
		assert.Equal(t, Unavailable, KindOf(err), name)
		assert.NotEqual(t, "internal error", PublicMessage(err), name)
		assert.Equal(t, RetryAfterDefault, RetryAfter(err), name)
		assert.Equal(t, http.StatusServiceUnavailable, HTTPStatus(KindOf(err)), name)
	}
	for name, err := range map[string]error{
		"a plain error":        errors.New("boom"),
		"a unique violation":   &pgconn.PgError{Code: "23505"},
		"a protocol violation": &pgconn.PgError{Code: "08P01"},
		"a cancelled request":  context.Canceled,
		"nil":                  nil,
	} {
		assert.False(t, Unreachable(err), name)
		assert.Zero(t, RetryAfter(err), name)
	}
	// A kind given on purpose wins over the cause's classification.
	assert.Equal(t, Unauthenticated, KindOf(Wrap(Unauthenticated, refused, "invalid API key")))
}

// TestOutcomeUnknownSaysWhatToDo: a lost commit answer has its own code,
// message and retry hint, and is a 503 on HTTP.
func TestOutcomeUnknownSaysWhatToDo(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("start run: %w", Unknown(io.ErrUnexpectedEOF))
	assert.Equal(t, OutcomeUnknown, KindOf(err))
	assert.True(t, errors.Is(err, OutcomeUnknown))
	assert.Equal(t, "outcome unknown: retry with the same idempotency key", PublicMessage(err))
	assert.Equal(t, RetryAfterDefault, RetryAfter(err))
	assert.Equal(t, http.StatusServiceUnavailable, HTTPStatus(OutcomeUnknown))
	lost := Lost(io.ErrUnexpectedEOF)
	assert.Equal(t, Unavailable, KindOf(lost))
	assert.Contains(t, PublicMessage(lost), "nothing was changed")
	assert.Equal(t, http.StatusInternalServerError, HTTPStatus(Internal))
}
