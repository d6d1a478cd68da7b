// Package tenants is the tenant domain: tenants and their plans, limits
// and stream shards, and the quotas enforced on them (the running-task
// semaphore and the start rate limiter, in Redis). The database layer
// they are stored through is internal/pg.
package tenants

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
)

// Tenant is a customer of the service.
type Tenant struct {
	ID           uuid.UUID
	Name         string
	Plan         string
	StreamShards int
	CreatedAt    time.Time
}

// CreateParams are the settings of a new tenant.
type CreateParams struct {
	Name string
	Plan string
	// StreamShards is the number of stream shards per queue (0 = DefaultShards).
	StreamShards int
}

// DefaultShards is the stream shard count of a tenant created without one.
var DefaultShards = 4

var planPattern = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`)

// Create adds a tenant. It runs as the system role: tenants are created by
// operators, never through a tenant's own credentials. Each of then runs in
// the same transaction, scoped to the new tenant (tx.Tenant), so
// provisioning that goes with the tenant (its first API key) commits with it
// or not at all.
func Create(ctx context.Context, db *pg.DB, p CreateParams, then ...func(ctx context.Context, tx *pg.Tx) error) (Tenant, error) {
	if p.Name == "" || len(p.Name) > 200 {
		return Tenant{}, errs.E(errs.Invalid, "tenant name must be 1-200 characters")
	}
	if p.Plan == "" {
		p.Plan = "free"
	}
	if !planPattern.MatchString(p.Plan) {
		return Tenant{}, errs.E(errs.Invalid, "plan %q is not a valid plan name", p.Plan)
	}
	if p.StreamShards == 0 {
		p.StreamShards = DefaultShards
	}
	if p.StreamShards < 1 || p.StreamShards > 256 {
		return Tenant{}, errs.E(errs.Invalid, "stream shards must be between 1 and 256")
	}
	t := Tenant{ID: uuid.Must(uuid.NewV7()), Name: p.Name, Plan: p.Plan, StreamShards: p.StreamShards}
	err := db.WithSystem(ctx, func(ctx context.Context, tx *pg.Tx) error {
		err := tx.QueryRow(ctx, qInsertTenant, t.ID, t.Name, t.Plan, t.StreamShards).Scan(&t.CreatedAt)
		if isFKViolation(err) {
			return errs.E(errs.Invalid, "no plan named %q", t.Plan)
		}
		if err != nil {
			return err
		}
		scoped := tx.As(t.ID)
		for _, fn := range then {
			if err := fn(ctx, scoped); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return Tenant{}, fmt.Errorf("create tenant: %w", err)
	}
	return t, nil
}

// Get returns the tenant of the transaction's scope.
func Get(ctx context.Context, tx *pg.Tx) (Tenant, error) {
	var t Tenant
	err := tx.QueryRow(ctx, qGetTenant, tx.Tenant).
		Scan(&t.ID, &t.Name, &t.Plan, &t.StreamShards, &t.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Tenant{}, errs.E(errs.NotFound, "tenant not found")
	}
	if err != nil {
		return Tenant{}, fmt.Errorf("get tenant: %w", err)
	}
	return t, nil
}

// Route is how a tenant's work is spread and weighed.
type Route struct {
	Shards int
	Weight int
}

// Routes returns each given tenant's shard count and scheduling weight
// (system role).
func Routes(ctx context.Context, db *pg.DB, ids []uuid.UUID) (map[uuid.UUID]Route, error) {
	rows, err := db.System().Query(ctx, qRoutes, ids)
	if err != nil {
		return nil, fmt.Errorf("tenant routes: %w", err)
	}
	out := make(map[uuid.UUID]Route, len(ids))
	var id uuid.UUID
	var r Route
	_, err = pgx.ForEachRow(rows, []any{&id, &r.Shards, &r.Weight}, func() error { out[id] = r; return nil })
	if err != nil {
		return nil, fmt.Errorf("tenant routes: %w", err)
	}
	return out, nil
}

func isFKViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23503"
}
