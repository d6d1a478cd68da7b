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
	"github.com/composer-dev/composer/internal/lifecycle"
)

// DB holds the connection pools of the two runtime roles.
type DB struct {
	// App connects as composer_app (NOBYPASSRLS).
	App *pgxpool.Pool
	// System connects as composer_system (BYPASSRLS).
	System *pgxpool.Pool
	// LocalOutbox marks this process's transactions as having an outbox
	// enqueuer in the same process that is woken after commit, so the
	// outbox trigger need not NOTIFY for them.
	LocalOutbox bool
}

// Tx is a transaction plus side effects (metrics, logs, wake-ups) that must
// happen only if it commits.
//
// The transaction opens lazily: BEGIN and the tenant's set_config travel in
// the same round trip as the first statement, so a short transaction costs
// one round trip for its work plus one for COMMIT. Results of Exec, Query,
// QueryRow and SendBatch are exactly those of the caller's statements.
type Tx struct {
	// Tenant is the transaction's tenant; uuid.Nil in a system transaction.
	Tenant      uuid.UUID
	localOutbox bool
	conn        *pgxpool.Conn
	begun       bool
	committed   bool
	failed      bool
	afterCommit []func()
}

// AfterCommit registers fn to run after a successful commit, in order,
// once the transaction's connection is back in the pool (fn must not use
// the transaction).
func (t *Tx) AfterCommit(fn func()) { t.afterCommit = append(t.afterCommit, fn) }

const (
	setTenantSQL      = "SELECT set_config('app.tenant_id', $1, true)"
	setTenantLocalSQL = "SELECT set_config('app.tenant_id', $1, true), set_config('composer.local_outbox', 'on', true)"
)

// prelude returns the statements that open the transaction, once.
func (t *Tx) prelude() []*pgx.QueuedQuery {
	if t.begun {
		return nil
	}
	t.begun = true
	q := []*pgx.QueuedQuery{{SQL: "BEGIN"}}
	if t.Tenant != uuid.Nil {
		sql := setTenantSQL
		if t.localOutbox {
			sql = setTenantLocalSQL
		}
		q = append(q, &pgx.QueuedQuery{SQL: sql, Arguments: []any{t.Tenant.String()}})
	}
	return q
}

// send runs b after the prelude (if still due) and returns its results
// positioned at the caller's first statement.
func (t *Tx) send(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	pre := t.prelude()
	if len(pre) == 0 {
		return t.conn.SendBatch(ctx, b)
	}
	all := &pgx.Batch{QueuedQueries: append(pre, b.QueuedQueries...)}
	br := t.conn.SendBatch(ctx, all)
	for range pre {
		if _, err := br.Exec(); err != nil {
			t.failed = true
			_ = br.Close()
			return failedBatch{err: fmt.Errorf("open transaction: %w", err)}
		}
	}
	return br
}

// CommitWith sends b followed by COMMIT in one round trip. If any statement
// of b fails, the pipeline stops before the COMMIT and the transaction is
// rolled back. Results are read through b's queued callbacks.
func (t *Tx) CommitWith(ctx context.Context, b *pgx.Batch) error {
	b.Queue("COMMIT")
	if err := t.send(ctx, b).Close(); err != nil {
		return err
	}
	if st := t.conn.Conn().PgConn().TxStatus(); st != 'I' {
		return fmt.Errorf("commit: transaction still open (status %q)", st)
	}
	t.committed = true
	return nil
}

// SendBatch sends a pipelined batch; read its results through the queued
// callbacks or in order, then Close.
func (t *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults { return t.send(ctx, b) }

// Exec runs one statement.
func (t *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.begun {
		return t.conn.Exec(ctx, sql, args...)
	}
	br := t.send(ctx, &pgx.Batch{QueuedQueries: []*pgx.QueuedQuery{{SQL: sql, Arguments: args}}})
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// Query runs one query; close the rows when done.
func (t *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.begun {
		return t.conn.Query(ctx, sql, args...)
	}
	br := t.send(ctx, &pgx.Batch{QueuedQueries: []*pgx.QueuedQuery{{SQL: sql, Arguments: args}}})
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// QueryRow runs a query expected to return at most one row.
func (t *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.begun {
		return t.conn.QueryRow(ctx, sql, args...)
	}
	rows, err := t.Query(ctx, sql, args...)
	if err != nil {
		return errRow{err}
	}
	return rowOf{rows}
}

// batchRows closes the batch that carried the prelude with the rows.
type batchRows struct {
	pgx.Rows
	br pgx.BatchResults
}

func (r *batchRows) Close() {
	r.Rows.Close()
	_ = r.br.Close()
}

// rowOf gives QueryRow semantics over rows (pgx's own adapter is private).
type rowOf struct{ rows pgx.Rows }

func (r rowOf) Scan(dest ...any) error {
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type failedBatch struct{ err error }

func (b failedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b failedBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b failedBatch) QueryRow() pgx.Row                { return errRow{b.err} }
func (b failedBatch) Close() error                     { return b.err }
func (b failedBatch) Tx() pgx.Tx                       { return nil }

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
	return run(ctx, db.App, tenant, db.LocalOutbox, fn)
}

// WithSystem runs fn in a transaction as composer_system. Only the
// cross-tenant background loops may use it.
func (db *DB) WithSystem(ctx context.Context, fn func(ctx context.Context, tx *Tx) error) error {
	return run(ctx, db.System, uuid.Nil, false, fn)
}

func run(ctx context.Context, pool *pgxpool.Pool, tenant uuid.UUID, localOutbox bool, fn func(ctx context.Context, tx *Tx) error) error {
	for attempt := 1; ; attempt++ {
		err := once(ctx, pool, tenant, localOutbox, fn)
		if err == nil || attempt == maxAttempts || !retryable(err) || ctx.Err() != nil {
			return err
		}
		lifecycle.Sleep(ctx, time.Duration(attempt)*5*time.Millisecond)
	}
}

func once(ctx context.Context, pool *pgxpool.Pool, tenant uuid.UUID, localOutbox bool, fn func(ctx context.Context, tx *Tx) error) (err error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire connection: %w", err)
	}
	tx := &Tx{Tenant: tenant, localOutbox: localOutbox, conn: conn}
	released := false
	release := func() {
		if !released {
			released = true
			conn.Release()
		}
	}
	defer func() {
		if tx.begun && !tx.committed && err != nil {
			// A connection left in a transaction is destroyed by the pool
			// on release, so a failed rollback cannot leak the tenant.
			_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		}
		release()
	}()
	if err := fn(ctx, tx); err != nil {
		return err
	}
	// (Unless nothing was sent, or fn committed with its last batch.)
	if tx.begun && !tx.committed {
		if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
		if st := conn.Conn().PgConn().TxStatus(); st != 'I' {
			return fmt.Errorf("commit: transaction still open (status %q)", st)
		}
	}
	// The after-commit hooks talk to Redis and the network, not to this
	// transaction: the connection goes back to the pool before they run.
	release()
	return runHooks(tx)
}

func isFKViolation(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == "23503"
}

func retryable(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && (pg.Code == "40001" || pg.Code == "40P01")
}

func runHooks(tx *Tx) error {
	for _, f := range tx.afterCommit {
		f()
	}
	return nil
}

// Pipeline runs b as one implicit transaction scoped to tenant, in one
// round trip: set_config and b's statements share a single Sync, so they
// commit together or not at all. For short write paths (leases) that need
// no decision between statements.
func (db *DB) Pipeline(ctx context.Context, tenant uuid.UUID, b *pgx.Batch) error {
	if tenant == uuid.Nil {
		return errs.E(errs.Unauthenticated, "no tenant")
	}
	all := &pgx.Batch{QueuedQueries: append([]*pgx.QueuedQuery{{SQL: setTenantSQL, Arguments: []any{tenant.String()}}}, b.QueuedQueries...)}
	return db.App.SendBatch(ctx, all).Close()
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
// operators, never through a tenant's own credentials. Each of then runs in
// the same transaction, scoped to the new tenant (tx.Tenant), so
// provisioning that goes with the tenant (its first API key) commits with it
// or not at all.
func (db *DB) Create(ctx context.Context, p CreateParams, then ...func(ctx context.Context, tx *Tx) error) (Tenant, error) {
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
		err := tx.QueryRow(ctx, `INSERT INTO tenants (id, name, plan, stream_shards) VALUES ($1, $2, $3, $4)
			RETURNING created_at`, t.ID, t.Name, t.Plan, t.StreamShards).Scan(&t.CreatedAt)
		if isFKViolation(err) {
			return errs.E(errs.Invalid, "no plan named %q", t.Plan)
		}
		if err != nil {
			return err
		}
		scoped := &Tx{Tenant: t.ID, conn: tx.conn, begun: tx.begun}
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

// Route is how a tenant's work is spread and weighed.
type Route struct {
	Shards int
	Weight int
}

// Routes returns each given tenant's shard count and scheduling weight
// (system role).
func (db *DB) Routes(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID]Route, error) {
	rows, err := db.System.Query(ctx, `SELECT id, stream_shards, coalesce(composer_tenant_limit(id, 'weight'), 1)
		FROM tenants WHERE id = ANY($1)`, ids)
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
