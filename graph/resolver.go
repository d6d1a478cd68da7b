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

	"github.com/composer-dev/composer/audit"
	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/engine/dag"
	"github.com/composer-dev/composer/engine/taskpoll"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/obs"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/schedules"
	"github.com/composer-dev/composer/secrets"
	"github.com/composer-dev/composer/tenants"
	"github.com/composer-dev/composer/webhooks"
)

// Resolver is the root resolver; it carries the gateway's dependencies.
type Resolver struct {
	DB    *pg.DB
	Coord *engine.Coordinator
	Authz *auth.Authorizer
	Live  *Live
	// Limiter shapes run starts per tenant; nil starts are not rate limited.
	Limiter *tenants.RateLimiter
	// AuditKeys key the audit log's chain: mutations are recorded under
	// the first, auditVerify checks under all.
	AuditKeys *audit.Keyring
	limits    tenants.LimitsCache // the limiter's limits
	// Webhooks manages webhook endpoints and deliveries.
	Webhooks webhooks.Service
	// Secrets seals the tenants' secrets.
	Secrets secrets.Service
	// Schedules fires schedules and backfills them (schedules.Service
	// manages them in the resolvers' transactions).
	Schedules *schedules.Firer
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
// may perform action: the one authorization gate of every resolver. In a
// mutation, the transaction also carries the mutation's audit record
// (appended last, before its COMMIT; see auditMutations).
func (r *Resolver) inTenant(ctx context.Context, action auth.Action, fn func(ctx context.Context, tx *pg.Tx) error) error {
	p, err := principal(ctx)
	if err != nil {
		return err
	}
	return r.DB.WithTenant(ctx, p.TenantID, func(ctx context.Context, tx *pg.Tx) error {
		if err := r.allowed(ctx, tx, p, action); err != nil {
			return err
		}
		return fn(ctx, tx)
	})
}

// reading is inTenant for a read a mutation makes after its change (its
// answer read back): the read carries no audit record, whatever its
// transaction, so a change that committed nothing is not recorded "ok"
// by the read that follows it.
func (r *Resolver) reading(ctx context.Context, action auth.Action, fn func(ctx context.Context, tx *pg.Tx) error) error {
	return r.inTenant(audit.With(ctx, nil), action, fn)
}

// allowed is the authorization check of a transaction that does a
// mutation's work: once it passes, the transaction carries the
// mutation's audit record.
func (r *Resolver) allowed(ctx context.Context, tx *pg.Tx, p auth.Principal, action auth.Action) error {
	if err := r.Authz.Allowed(ctx, tx, p, action); err != nil {
		return err
	}
	audit.Seal(ctx, tx)
	return nil
}

// authorize checks action in a transaction of its own, for operations
// whose work is not a transaction at all (subscriptions). The check's
// transaction changes nothing, so it carries no audit record.
func (r *Resolver) authorize(ctx context.Context, action auth.Action) (auth.Principal, error) {
	p, err := principal(ctx)
	if err != nil {
		return p, err
	}
	return p, r.DB.WithTenant(ctx, p.TenantID, func(ctx context.Context, tx *pg.Tx) error {
		return r.Authz.Allowed(ctx, tx, p, action)
	})
}

// gated returns ctx carrying the principal's authorization for action,
// which the coordinator decides first in the mutation's own transaction
// (engine.WithGate): one transaction for the check and the change. A
// credential that cannot allow action at all (its scopes or role) is
// refused before anything else is done.
func (r *Resolver) gated(ctx context.Context, action auth.Action) (context.Context, auth.Principal, error) {
	p, err := principal(ctx)
	if err != nil {
		return ctx, p, err
	}
	if !auth.PowerOf(p).Can(action) {
		return ctx, p, errs.E(errs.Forbidden, "not allowed to %s", action)
	}
	// The principal is who the change is by: the starter of the runs it
	// starts, the sender (approver) of its signal.
	ctx = engine.WithActor(ctx, Actor(p))
	return engine.WithGate(ctx, func(ctx context.Context, tx *pg.Tx) error { return r.allowed(ctx, tx, p, action) }), p, nil
}

// Actor is the principal as the engine records it: who a change is by.
func Actor(p auth.Principal) dag.Principal {
	switch p.Kind {
	case auth.KindUser:
		return dag.Principal{Kind: dag.PrincipalUser, ID: p.Subject, Role: string(p.Role)}
	case auth.KindAPIKey:
		return dag.Principal{Kind: dag.PrincipalAPIKey, ID: p.Subject}
	}
	return dag.Principal{}
}

// admitStart gates a run start (see gated) and takes it from the tenant's
// token bucket: RATE_LIMITED with a retry-after hint when empty. The
// bucket's limits come from a short cache, so a start is one transaction;
// if the limiter itself fails the start proceeds (the quota checks in the
// start's transaction still apply).
func (r *Resolver) admitStart(ctx context.Context) (context.Context, auth.Principal, error) {
	return r.admit(ctx, auth.ActionRunsWrite)
}

// admit is admitStart for an action that starts runs (runs:write, or
// events:write for a publish, which takes one token however many runs it
// starts).
func (r *Resolver) admit(ctx context.Context, action auth.Action) (context.Context, auth.Principal, error) {
	ctx, p, err := r.gated(ctx, action)
	if err != nil || r.Limiter == nil {
		return ctx, p, err
	}
	limits, err := r.limits.Get(ctx, r.DB, p.TenantID)
	if err != nil {
		return ctx, p, err
	}
	wait, err := r.Limiter.Allow(ctx, p.TenantID, limits.StartsPerSecond, limits.StartBurst)
	if err != nil {
		r.Log.Warn("rate limiter unavailable; admitting the start", append(obs.LogFields(ctx), zap.Error(err))...)
		return ctx, p, nil
	}
	if wait > 0 {
		return ctx, p, &errs.Error{Kind: errs.RateLimited, RetryAfter: wait,
			Message: fmt.Sprintf("run starts are limited to %g per second (burst %d); retry in %s", limits.StartsPerSecond, limits.StartBurst, wait.Round(time.Millisecond))}
	}
	return ctx, p, nil
}
