package graph

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/composer-dev/composer/internal/errs"
)

func TestErrorPresenterMapsKindsAndHidesInternals(t *testing.T) {
	core, logs := observer.New(zap.ErrorLevel)
	present := presentError(zap.New(core))
	ctx := graphql.WithResponseContext(context.Background(), graphql.DefaultErrorPresenter, graphql.DefaultRecover)

	cases := []struct {
		err  error
		code string
		msg  string
	}{
		{errs.E(errs.NotFound, "run r1 not found"), "NOT_FOUND", "run r1 not found"},
		{fmt.Errorf("wrapped: %w", errs.E(errs.Forbidden, "no")), "FORBIDDEN", "no"},
		{errs.E(errs.Unauthenticated, "who?"), "UNAUTHENTICATED", "who?"},
		{errs.E(errs.QuotaExceeded, "over"), "QUOTA_EXCEEDED", "over"},
		{errors.New("pq: connection refused to 10.0.0.5 password=hunter2"), "INTERNAL", "internal error"},
	}
	for _, c := range cases {
		got := present(ctx, c.err)
		assert.Equal(t, c.code, got.Extensions["code"], c.err.Error())
		assert.Equal(t, c.msg, got.Message)
	}
	assert.Equal(t, 1, logs.Len(), "only the internal error is logged")

	limited := present(ctx, &errs.Error{Kind: errs.RateLimited, Message: "slow down", RetryAfter: 1500 * time.Millisecond})
	assert.Equal(t, 2, limited.Extensions["retryAfterSeconds"])
	invalid := present(ctx, &errs.Error{Kind: errs.Invalid, Message: "bad", Fields: []errs.Field{{Node: "a", Field: "if", Message: "x"}}})
	assert.Equal(t, []errs.Field{{Node: "a", Field: "if", Message: "x"}}, invalid.Extensions["problems"])
}

func TestPanicsBecomeInternalErrors(t *testing.T) {
	core, logs := observer.New(zap.ErrorLevel)
	err := recoverPanic(zap.New(core))(context.Background(), "boom: secret detail")
	assert.Equal(t, errs.Internal, errs.KindOf(err))
	assert.NotContains(t, errs.PublicMessage(err), "secret")
	assert.Equal(t, 1, logs.Len())
}

// TestInternalErrorsAreLoggedWithTheirCause: gqlgen hands the presenter
// the resolver's error wrapped in a gqlerror whose message the presenter
// replaces for the client; the log line keeps the cause.
func TestInternalErrorsAreLoggedWithTheirCause(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	present := presentError(zap.New(core))
	ctx := graphql.WithResponseContext(context.Background(), graphql.DefaultErrorPresenter, graphql.DefaultRecover)
	cause := errors.New("insert run: ERROR: could not serialize access (SQLSTATE 40001)")
	wrapped := gqlerror.WrapPath(ast.Path{ast.PathName("startRun")}, cause)
	got := present(ctx, wrapped)
	assert.Equal(t, "internal error", got.Message, "the client sees no cause")
	entries := logs.FilterLevelExact(zap.ErrorLevel).All()
	require.Len(t, entries, 1)
	assert.Contains(t, entries[0].ContextMap()["error"], "could not serialize access", "the log keeps the cause")
	assert.Equal(t, "startRun", entries[0].ContextMap()["path"])
}
