package graph

import (
	"context"
	"errors"
	"fmt"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/gqlerror"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/obs"
)

// presentError maps every error to one stable code in extensions.code and a
// message safe to show; internal causes are logged, never returned.
// Errors gqlgen raises before execution (parse, validation, limits) keep
// their own codes.
func presentError(log *zap.Logger) graphql.ErrorPresenterFunc {
	return func(ctx context.Context, err error) *gqlerror.Error {
		var ge *gqlerror.Error
		if errors.As(err, &ge) && ge.Err == nil && ge.Extensions != nil && ge.Extensions["code"] != nil {
			return ge // a pre-execution error with its code
		}
		if ge != nil && ge.Err == nil && len(ge.Path) == 0 {
			// gqlgen refusing the request itself (a body it cannot decode):
			// the client's mistake, with gqlgen's description.
			log.Info("graphql request refused", append(obs.LogFields(ctx), zap.String("reason", ge.Message))...)
			return &gqlerror.Error{Message: ge.Message, Locations: ge.Locations, Extensions: map[string]any{"code": string(errs.Invalid)}}
		}
		// The cause, as it is before the message is replaced for the client
		// (DefaultErrorPresenter may return err itself).
		cause := err
		if ge != nil && ge.Err != nil {
			cause = ge.Err
		}
		causeText := cause.Error()
		out := graphql.DefaultErrorPresenter(ctx, err)
		kind := errs.KindOf(err)
		out.Message = errs.PublicMessage(err)
		out.Extensions = map[string]any{"code": string(kind)}
		var e *errs.Error
		if errors.As(err, &e) && len(e.Fields) > 0 {
			out.Extensions["problems"] = e.Fields
		}
		if after := errs.RetryAfter(err); after > 0 {
			out.Extensions["retryAfterSeconds"] = int(after.Seconds() + 0.999)
		}
		switch kind {
		case errs.Internal:
			log.Error("graphql resolver failed", append(obs.LogFields(ctx), zap.String("path", out.Path.String()), zap.String("error", causeText))...)
		case errs.Unavailable, errs.OutcomeUnknown:
			log.Warn("graphql resolver met a store fault", append(obs.LogFields(ctx), zap.String("path", out.Path.String()),
				zap.String("code", string(kind)), zap.String("error", causeText))...)
		}
		return out
	}
}

// recoverPanic turns a resolver panic into an INTERNAL error and logs it.
func recoverPanic(log *zap.Logger) graphql.RecoverFunc {
	return func(ctx context.Context, p any) error {
		log.Error("graphql resolver panicked", append(obs.LogFields(ctx), zap.String("panic", fmt.Sprint(p)), zap.Stack("stack"))...)
		return errs.E(errs.Internal, "internal error")
	}
}

var errLiveDown = errs.E(errs.Unavailable, "live updates are not available")
