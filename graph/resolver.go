// Package graph is Composer's GraphQL gateway for tenant dashboards:
// schema-first with gqlgen (graph/*.graphqls), thin resolvers over the
// engine, auth and tenants packages, no SQL of its own.
//
// Every resolver acts as the request's principal in its own tenant: it runs
// in a tenant-scoped transaction as the row-level-security-bound role and
// passes the one authorization check (Resolver.inTenant) first. An object
// of another tenant therefore does not exist for it (NOT_FOUND, never
// FORBIDDEN, which would leak existence).
package graph

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/engine/taskpoll"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/tenants"
	"github.com/composer-dev/composer/webhooks"
)

// Resolver is the root resolver; it carries the gateway's dependencies.
type Resolver struct {
	DB    *tenants.DB
	Coord *engine.Coordinator
	Authz *auth.Authorizer
	Live  *Live
	// Limiter shapes run starts per tenant; nil starts are not rate limited.
	Limiter *tenants.RateLimiter
	// Webhooks manages webhook endpoints and deliveries.
	Webhooks webhooks.Service
	// Workers knows the tenants' connected workers (nil: none are listed).
	Workers *taskpoll.Poller
	Log     *zap.Logger
}

func principal(ctx context.Context) (auth.Principal, error) {
	p, ok := auth.FromContext(ctx)
	if !ok {
		return auth.Principal{}, errs.E(errs.Unauthenticated, "authentication required")
	}
	return p, nil
}

// inTenant runs fn in the principal's tenant transaction once the principal
// may perform action: the one authorization gate of every resolver.
func (r *Resolver) inTenant(ctx context.Context, action auth.Action, fn func(ctx context.Context, tx *tenants.Tx) error) error {
	p, err := principal(ctx)
	if err != nil {
		return err
	}
	return r.DB.WithTenant(ctx, p.TenantID, func(ctx context.Context, tx *tenants.Tx) error {
		if err := r.Authz.Allowed(ctx, tx, p, action); err != nil {
			return err
		}
		return fn(ctx, tx)
	})
}

// authorize checks action in a transaction of its own, for mutations that
// the coordinator then applies in its own transaction.
func (r *Resolver) authorize(ctx context.Context, action auth.Action) (auth.Principal, error) {
	p, err := principal(ctx)
	if err != nil {
		return p, err
	}
	return p, r.inTenant(ctx, action, func(context.Context, *tenants.Tx) error { return nil })
}

// admitStart authorizes a run start and takes it from the tenant's
// token bucket: RATE_LIMITED with a retry-after hint when empty. If the
// limiter itself fails the start proceeds (the quota checks in the start's
// transaction still apply).
func (r *Resolver) admitStart(ctx context.Context) (auth.Principal, error) {
	p, err := principal(ctx)
	if err != nil {
		return p, err
	}
	var limits tenants.Limits
	err = r.inTenant(ctx, auth.ActionRunsWrite, func(ctx context.Context, tx *tenants.Tx) error {
		var err error
		limits, err = tenants.EffectiveLimits(ctx, tx)
		return err
	})
	if err != nil || r.Limiter == nil {
		return p, err
	}
	wait, err := r.Limiter.Allow(ctx, p.TenantID, limits.StartsPerSecond, limits.StartBurst)
	if err != nil {
		r.Log.Warn("rate limiter unavailable; admitting the start", zap.Error(err))
		return p, nil
	}
	if wait > 0 {
		return p, &errs.Error{Kind: errs.RateLimited, RetryAfter: wait,
			Message: fmt.Sprintf("run starts are limited to %g per second (burst %d); retry in %s", limits.StartsPerSecond, limits.StartBurst, wait.Round(time.Millisecond))}
	}
	return p, nil
}
