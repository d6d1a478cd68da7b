// Package tenants owns tenants and the tenant-scoped transaction every
// request-path and per-run query runs in.
//
// WithTenant runs a function in a transaction as composer_app — the role
// bound by row-level security — with app.tenant_id set for that
// transaction only (set_config(..., true)), so a pooled connection never
// carries a tenant into its next use, and a query that forgets the tenant
// sees no rows rather than another tenant's. WithSystem is for the
// cross-tenant loops only (outbox, sweeps, timers) and runs as
// composer_system.
//
// A DB is safe for concurrent use.
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
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/composer-dev/composer/internal/errs"
)

// DB holds the connection pools of the two runtime roles.
type DB struct {
	// App connects as composer_app (NOBYPASSRLS).
	App *pgxpool.Pool
	// System connects as composer_system (BYPASSRLS).
	System *pgxpool.Pool
}

// Tx is a transaction plus side effects (metrics, logs, wake-ups) that must
// happen only if it commits.
type Tx struct {
	pgx.Tx
	// Tenant is the transaction's tenant; uuid.Nil in a system transaction.
	Tenant      uuid.UUID
	afterCommit []func()
}

// AfterCommit registers fn to run after a successful commit, in order.
func (t *Tx) AfterCommit(fn func()) { t.afterCommit = append(t.afterCommit, fn) }

// maxAttempts bounds retries of transactions that lost a deadlock or a
// serialization conflict; those are safe to retry from the start.
const maxAttempts = 4

// WithTenant runs fn in a transaction as composer_app scoped to tenant.
// fn may be called again if the transaction hits a deadlock or a
// serialization failure, so it must not have effects outside the
// transaction (use AfterCommit for those).
func (db *DB) WithTenant(ctx context.Context, tenant uuid.UUID, fn func(ctx context.Context, tx *Tx) error) error {
	if tenant == uuid.Nil {
		return errs.E(errs.Unauthenticated, "no tenant")
	}
	return run(ctx, db.App, tenant, fn)
}

// WithSystem runs fn in a transaction as composer_system. Only the
// cross-tenant background loops may use it.
func (db *DB) WithSystem(ctx context.Context, fn func(ctx context.Context, tx *Tx) error) error {
	return run(ctx, db.System, uuid.Nil, fn)
}

func run(ctx context.Context, pool *pgxpool.Pool, tenant uuid.UUID, fn func(ctx context.Context, tx *Tx) error) error {
	for attempt := 1; ; attempt++ {
		err := once(ctx, pool, tenant, fn)
		if err == nil || attempt == maxAttempts || !retryable(err) || ctx.Err() != nil {
			return err
		}
		time.Sleep(time.Duration(attempt) * 5 * time.Millisecond)
	}
}

func once(ctx context.Context, pool *pgxpool.Pool, tenant uuid.UUID, fn func(ctx context.Context, tx *Tx) error) error {
	ptx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer ptx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if tenant != uuid.Nil {
		if _, err := ptx.Exec(ctx, "SELECT set_config('app.tenant_id', $1, true)", tenant.String()); err != nil {
			return fmt.Errorf("set tenant: %w", err)
		}
	}
	tx := &Tx{Tx: ptx, Tenant: tenant}
	if err := fn(ctx, tx); err != nil {
		return err
	}
	if err := ptx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	for _, f := range tx.afterCommit {
		f()
	}
	return nil
}

func retryable(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && (pg.Code == "40001" || pg.Code == "40P01")
}

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
// operators, never through a tenant's own credentials.
func (db *DB) Create(ctx context.Context, p CreateParams) (Tenant, error) {
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
	err := db.WithSystem(ctx, func(ctx context.Context, tx *Tx) error {
		return tx.QueryRow(ctx, `INSERT INTO tenants (id, name, plan, stream_shards) VALUES ($1, $2, $3, $4)
			RETURNING created_at`, t.ID, t.Name, t.Plan, t.StreamShards).Scan(&t.CreatedAt)
	})
	if err != nil {
		return Tenant{}, fmt.Errorf("create tenant: %w", err)
	}
	return t, nil
}

// Get returns the tenant of the transaction's scope.
func Get(ctx context.Context, tx *Tx) (Tenant, error) {
	var t Tenant
	err := tx.QueryRow(ctx, `SELECT id, name, plan, stream_shards, created_at FROM tenants WHERE id = $1`, tx.Tenant).
		Scan(&t.ID, &t.Name, &t.Plan, &t.StreamShards, &t.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Tenant{}, errs.E(errs.NotFound, "tenant not found")
	}
	if err != nil {
		return Tenant{}, fmt.Errorf("get tenant: %w", err)
	}
	return t, nil
}

// StreamShards returns the shard count of each given tenant (system role).
func (db *DB) StreamShards(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID]int, error) {
	rows, err := db.System.Query(ctx, `SELECT id, stream_shards FROM tenants WHERE id = ANY($1)`, ids)
	if err != nil {
		return nil, fmt.Errorf("tenant shards: %w", err)
	}
	out := make(map[uuid.UUID]int, len(ids))
	var id uuid.UUID
	var n int
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil })
	if err != nil {
		return nil, fmt.Errorf("tenant shards: %w", err)
	}
	return out, nil
}
