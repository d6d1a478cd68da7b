// Package pg is Composer's database layer: the two runtime roles' pools
// and the transactions every query runs in.
//
// WithTenant runs a function in a transaction as composer_app — the role
// bound by row-level security — with app.tenant_id set for that
// transaction only (set_config(..., true)), so a pooled connection never
// carries a tenant into its next use, and a query that forgets the tenant
// sees no rows rather than another tenant's. The pools are not exported:
// request-path SQL can only run inside such a tenant transaction (or a
// tenant-scoped Pipeline). WithSystem and System are for the cross-tenant
// loops only (outbox, sweeps, timers, rollups) and run as composer_system;
// Unscoped is the one way to the app role without a tenant, for the
// security-definer lookups that find a credential's tenant.
//
// A connection that fails is handled by what it proves. A transaction
// whose connection died before its COMMIT was sent never committed, so it
// runs again on a fresh connection (fn must be safe to repeat, as for
// deadlocks); so does a pipeline whose connection failed before anything
// of it ran. A connection that died after COMMIT was sent leaves the
// outcome unknown: that is errs.OutcomeUnknown, never retried here. What
// cannot reach the database is errs.Unavailable.
//
// A DB is safe for concurrent use.
package pg

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/lifecycle"
)

// DB holds the connection pools of the two runtime roles.
type DB struct {
	app    *pgxpool.Pool // composer_app (NOBYPASSRLS)
	system *pgxpool.Pool // composer_system (BYPASSRLS)
	// localOutbox marks this process's transactions as having an outbox
	// enqueuer in the same process that is woken after commit, so the
	// outbox trigger need not NOTIFY for them.
	localOutbox bool
}

// New returns a DB over the app role's and the system role's pools.
// localOutbox says an outbox enqueuer in this process is woken after its
// commits (so the outbox trigger need not NOTIFY for them).
func New(app, system *pgxpool.Pool, localOutbox bool) *DB {
	return &DB{app: app, system: system, localOutbox: localOutbox}
}

// MarkLocalOutbox says an outbox enqueuer in this process is woken after
// its commits, so the outbox trigger need not NOTIFY for them. Call it
// before the DB is used.
func (db *DB) MarkLocalOutbox() { db.localOutbox = true }

// Querier runs statements outside a transaction of this package's.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// System is the system role (BYPASSRLS), for the cross-tenant loops'
// single statements. Nothing on a request's path may use it.
func (db *DB) System() Querier { return db.system }

// Unscoped is the app role with no tenant: row-level security shows it
// nothing but what security-definer functions hand out. It exists for the
// lookups that find a presented credential's tenant (API keys). Its
// statements must be safe to repeat (lookups, stamps): an Exec or QueryRow
// whose connection was lost runs again on a fresh connection.
func (db *DB) Unscoped() Querier { return repeatable{db.app} }

// Ping checks both pools reach the database.
func (db *DB) Ping(ctx context.Context) error {
	return errors.Join(db.app.Ping(ctx), db.system.Ping(ctx))
}

// Reset closes the pools' idle connections (the next use opens new ones).
func (db *DB) Reset() {
	db.app.Reset()
	db.system.Reset()
}

// Close closes both pools.
func (db *DB) Close() {
	if db.app != nil {
		db.app.Close()
	}
	if db.system != nil {
		db.system.Close()
	}
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
	began       time.Time
	committed   bool
	// commitSent is set once COMMIT may have reached the server: a
	// connection lost after it leaves the outcome unknown.
	commitSent   bool
	failed       bool
	afterCommit  []func()
	beforeCommit []func(b *pgx.Batch)
	readFirst    []readThenWrite
}

// readThenWrite is a before-commit step that reads before it writes (see
// BeforeCommitRead).
type readThenWrite struct{ read, write func(b *pgx.Batch) }

// As is the transaction seen as scoped to tenant (tx.Tenant), for work a
// system transaction does on a tenant's behalf — provisioning a tenant
// with its first key. It shares the transaction: its statements commit or
// roll back with tx's.
func (t *Tx) As(tenant uuid.UUID) *Tx {
	return &Tx{Tenant: tenant, conn: t.conn, begun: t.begun}
}

// Began is when the transaction's first statement was sent (zero before).
func (t *Tx) Began() time.Time { return t.began }

// AfterCommit registers fn to run after a successful commit, in order,
// once the transaction's connection is back in the pool (fn must not use
// the transaction).
func (t *Tx) AfterCommit(fn func()) { t.afterCommit = append(t.afterCommit, fn) }

// BeforeCommit registers fn to queue statements that run last in the
// transaction, in the round trip that commits it (after every statement of
// the transaction's own work, CommitWith's batch included). A failure of
// one of them rolls the whole transaction back; a lock they take is held
// only for that round trip.
func (t *Tx) BeforeCommit(fn func(b *pgx.Batch)) { t.beforeCommit = append(t.beforeCommit, fn) }

// BeforeCommitRead registers a before-commit step that must read before
// it writes: read queues statements (reading their results through the
// queued callbacks) into the round trip before the one that commits, after
// every statement of the transaction's own work; write then queues what
// goes with COMMIT. The audit log's keyed chain locks and reads the
// tenant's chain head this way, computes the record's MAC in Go (the key
// never reaches the database) and writes it, so the head's lock is held
// for one round trip and the commit.
func (t *Tx) BeforeCommitRead(read, write func(b *pgx.Batch)) {
	t.readFirst = append(t.readFirst, readThenWrite{read: read, write: write})
}

// pendingBeforeCommit says whether before-commit steps are registered.
func (t *Tx) pendingBeforeCommit() bool { return len(t.beforeCommit) > 0 || len(t.readFirst) > 0 }

// queueBeforeCommit queues the registered before-commit statements into b,
// once.
func (t *Tx) queueBeforeCommit(b *pgx.Batch) {
	hooks := t.beforeCommit
	t.beforeCommit = nil
	for _, fn := range hooks {
		fn(b)
	}
}

const (
	setTenantSQL      = "SELECT set_config('app.tenant_id', $1, true)"
	setTenantLocalSQL = "SELECT set_config('app.tenant_id', $1, true), set_config('composer.local_outbox', 'on', true)"
)

// prelude returns the statements that open the transaction, once.
func (t *Tx) prelude() []*pgx.QueuedQuery {
	if t.begun {
		return nil
	}
	t.begun, t.began = true, time.Now()
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

// CommitWith sends b followed by COMMIT in one round trip (two when
// BeforeCommitRead steps are registered: b with their reads, then their
// writes with COMMIT). If any statement of b fails, the pipeline stops
// before the COMMIT and the transaction is rolled back. Results are read
// through b's queued callbacks.
//
// When the connection fails after the round trip carrying COMMIT was sent,
// whether it committed is unknown: the error is then of kind
// errs.OutcomeUnknown.
func (t *Tx) CommitWith(ctx context.Context, b *pgx.Batch) error {
	if steps := t.readFirst; len(steps) > 0 {
		t.readFirst = nil
		for _, s := range steps {
			s.read(b)
		}
		if err := t.send(ctx, b).Close(); err != nil {
			return err
		}
		b = &pgx.Batch{}
		for _, s := range steps {
			s.write(b)
		}
	}
	t.queueBeforeCommit(b)
	b.Queue("COMMIT")
	closed := t.conn.Conn().IsClosed()
	t.commitSent = true
	if err := t.send(ctx, b).Close(); err != nil {
		return t.commitFailed(err, closed)
	}
	if st := t.conn.Conn().PgConn().TxStatus(); st != 'I' {
		return fmt.Errorf("commit: transaction still open (status %q)", st)
	}
	t.committed = true
	return nil
}

// commitFailed classifies the failure of the round trip that carried
// COMMIT: nothing of it was sent (the connection was closed before it, or
// the batch failed while being prepared), it failed on the server (the
// transaction rolled back, the connection is fine), or the connection
// died with the answer outstanding — the outcome is unknown.
func (t *Tx) commitFailed(err error, closedBefore bool) error {
	switch {
	case closedBefore || unprepared(err):
		t.commitSent = false
		return err
	case t.conn.Conn().IsClosed():
		return errs.Unknown(err)
	}
	return err
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

// maxAttempts bounds the attempts of a transaction that lost a deadlock
// or a serialization conflict; those are safe to retry from the start.
const maxAttempts = 4

// connAttempts bounds the attempts of work whose connection was lost
// before any of it could have committed: the first on whatever connection
// the pool gives, the others on connections checked alive.
const connAttempts = 3

// again says whether a failed attempt may run again, and why.
type again int

const (
	final    again = iota
	conflict       // a deadlock or serialization failure: PostgreSQL rolled it back
	lost           // the connection died before anything could commit
)

// WithTenant runs fn in a transaction as composer_app scoped to tenant.
// fn may be called again if the transaction hits a deadlock or a
// serialization failure, or loses its connection before COMMIT, so it
// must not have effects outside the transaction (use AfterCommit for
// those).
func (db *DB) WithTenant(ctx context.Context, tenant uuid.UUID, fn func(ctx context.Context, tx *Tx) error) error {
	if tenant == uuid.Nil {
		return errs.E(errs.Unauthenticated, "no tenant")
	}
	return run(ctx, db.app, tenant, db.localOutbox, fn)
}

// WithSystem runs fn in a transaction as composer_system. Only the
// cross-tenant background loops may use it.
func (db *DB) WithSystem(ctx context.Context, fn func(ctx context.Context, tx *Tx) error) error {
	return run(ctx, db.system, uuid.Nil, false, fn)
}

func run(ctx context.Context, pool *pgxpool.Pool, tenant uuid.UUID, localOutbox bool, fn func(ctx context.Context, tx *Tx) error) error {
	losses := 0
	for attempt := 1; ; attempt++ {
		why, err := once(ctx, pool, tenant, localOutbox, losses > 0, fn)
		if err == nil || ctx.Err() != nil {
			return err
		}
		switch why {
		case conflict:
			if attempt >= maxAttempts {
				return err
			}
		case lost:
			if losses++; losses >= connAttempts {
				return err
			}
		default:
			return err
		}
		lifecycle.Sleep(ctx, time.Duration(attempt)*5*time.Millisecond)
	}
}

func once(ctx context.Context, pool *pgxpool.Pool, tenant uuid.UUID, localOutbox, fresh bool, fn func(ctx context.Context, tx *Tx) error) (why again, err error) {
	conn, err := acquire(ctx, pool, fresh)
	if err != nil {
		return lost, errs.Lost(fmt.Errorf("acquire connection: %w", err))
	}
	tx := &Tx{Tenant: tenant, localOutbox: localOutbox, conn: conn}
	// A transaction made while a recording span is in the context (a
	// request, a worker's report) is a span of its own; the coordinator
	// names it for the transition it commits. Background loops start none.
	if trace.SpanFromContext(ctx).IsRecording() {
		var span trace.Span
		ctx, span = otel.Tracer("github.com/composer-dev/composer/internal/pg").Start(ctx, "db.transaction",
			trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attribute.String("db.system.name", "postgresql")))
		defer func() {
			if err != nil {
				span.SetStatus(codes.Error, err.Error())
			}
			span.End()
		}()
	}
	released := false
	release := func() {
		if !released {
			released = true
			conn.Release()
		}
	}
	defer func() {
		if tx.begun && !tx.committed && err != nil && !conn.Conn().IsClosed() {
			// A connection left in a transaction is destroyed by the pool
			// on release, so a failed rollback cannot leak the tenant.
			_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		}
		release()
	}()
	if err := fn(ctx, tx); err != nil {
		return tx.failure(ctx, err)
	}
	if tx.pendingBeforeCommit() && !tx.committed {
		if err := tx.CommitWith(ctx, &pgx.Batch{}); err != nil {
			return tx.failure(ctx, fmt.Errorf("commit: %w", err))
		}
	}
	// (Unless nothing was sent, or fn committed with its last batch.)
	if tx.begun && !tx.committed {
		closed := conn.Conn().IsClosed()
		tx.commitSent = true
		if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
			return tx.failure(ctx, tx.commitFailed(fmt.Errorf("commit: %w", err), closed))
		}
		if st := conn.Conn().PgConn().TxStatus(); st != 'I' {
			return final, fmt.Errorf("commit: transaction still open (status %q)", st)
		}
	}
	// The after-commit hooks talk to Redis and the network, not to this
	// transaction: the connection goes back to the pool before they run.
	release()
	return final, runHooks(tx)
}

// failure says what a failed attempt's error means and whether the
// attempt may run again.
func (t *Tx) failure(ctx context.Context, err error) (again, error) {
	switch {
	case t.committed || errs.KindOf(err) == errs.OutcomeUnknown:
		return final, err
	case !t.commitSent && t.conn.Conn().IsClosed():
		// The connection died with the transaction open: PostgreSQL
		// rolled it back, so nothing of it happened.
		var kinded *errs.Error
		if !errors.As(err, &kinded) && ctx.Err() == nil {
			err = errs.Lost(err)
		}
		return lost, err
	case rolledBack(err):
		return conflict, err
	}
	return final, err
}

// acquire takes a connection from pool; fresh (a retry after a lost
// connection) checks it is alive first, replacing dead ones — after a
// server restart or a mass termination every idle connection may be dead.
func acquire(ctx context.Context, pool *pgxpool.Pool, fresh bool) (*pgxpool.Conn, error) {
	for tries := 0; ; tries++ {
		conn, err := pool.Acquire(ctx)
		if err != nil || !fresh {
			return conn, err
		}
		perr := conn.Ping(ctx)
		if perr == nil {
			return conn, nil
		}
		conn.Release() // (the pool destroys a closed connection)
		if ctx.Err() != nil || tries >= int(pool.Stat().MaxConns()) {
			return nil, perr
		}
	}
}

// rolledBack reports a deadlock or serialization failure: the server
// rolled the transaction back and it may run again from the start.
func rolledBack(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && (pg.Code == "40001" || pg.Code == "40P01")
}

// unprepared reports a batch that failed while being prepared: pgx sends
// its statements' executions only after that, so none of them ran.
// (pgconn.SafeToRetry is no such proof: a connection that breaks while
// an answer is read can report "conn closed", which claims it.)
func unprepared(err error) bool {
	var pre pgx.ErrPreprocessingBatch
	return errors.As(err, &pre)
}

// terminated reports PostgreSQL's notice that the backend was terminated
// (pg_terminate_backend, a fast shutdown: admin_shutdown). Sent in place
// of an answer, it says the backend did not get past that statement: it
// sends results in order and flushes them before the notice.
func terminated(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == "57P01"
}

func runHooks(tx *Tx) error {
	for _, f := range tx.afterCommit {
		f()
	}
	return nil
}

// TenantBatch is one tenant's statements in PipelineTenants.
type TenantBatch struct {
	Tenant uuid.UUID
	Batch  *pgx.Batch
}

// PipelineTenants runs the batches of several tenants as one implicit
// transaction in one round trip: each tenant's statements follow a
// set_config of that tenant, so row-level security scopes every statement
// to its own tenant exactly as in that tenant's transaction alone. They
// commit together or not at all. For the platform's batched write paths
// (a worker's leases across the tenants of one fill) that need no
// decision between statements; a tenant's request never uses it. Failures
// are as Pipeline's.
func (db *DB) PipelineTenants(ctx context.Context, parts []TenantBatch) error {
	all := &pgx.Batch{}
	for _, p := range parts {
		if p.Tenant == uuid.Nil {
			return errs.E(errs.Unauthenticated, "no tenant")
		}
		all.QueuedQueries = append(all.QueuedQueries, &pgx.QueuedQuery{SQL: setTenantSQL, Arguments: []any{p.Tenant.String()}})
		all.QueuedQueries = append(all.QueuedQueries, p.Batch.QueuedQueries...)
	}
	if len(all.QueuedQueries) == 0 {
		return nil
	}
	return pipeline(ctx, db.app, all)
}

// Pipeline runs b as one implicit transaction scoped to tenant, in one
// round trip: set_config and b's statements share a single Sync, so they
// commit together or not at all. For short write paths (leases) that need
// no decision between statements.
//
// A pipeline whose connection failed before any of it ran (nothing was
// sent, or the backend had been terminated and answered its first
// statement with that) runs again on a fresh connection; one whose
// connection failed later may have committed: errs.OutcomeUnknown.
func (db *DB) Pipeline(ctx context.Context, tenant uuid.UUID, b *pgx.Batch) error {
	if tenant == uuid.Nil {
		return errs.E(errs.Unauthenticated, "no tenant")
	}
	all := &pgx.Batch{QueuedQueries: append([]*pgx.QueuedQuery{{SQL: setTenantSQL, Arguments: []any{tenant.String()}}}, b.QueuedQueries...)}
	return pipeline(ctx, db.app, all)
}

// pipeline sends b, whose first statement is a set_config of this
// package's (no callback), until it runs or cannot be known to have not.
func pipeline(ctx context.Context, pool *pgxpool.Pool, b *pgx.Batch) error {
	for attempt := 1; ; attempt++ {
		// A batch remembers the statements it prepared on the connection
		// it was sent on: each attempt sends a copy.
		fresh := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, len(b.QueuedQueries))}
		for i, q := range b.QueuedQueries {
			fresh.QueuedQueries[i] = &pgx.QueuedQuery{SQL: q.SQL, Arguments: q.Arguments, Fn: q.Fn}
		}
		why, err := pipelineOnce(ctx, pool, fresh, attempt > 1)
		if err == nil || why != lost || attempt >= connAttempts || ctx.Err() != nil {
			return err
		}
		lifecycle.Sleep(ctx, time.Duration(attempt)*5*time.Millisecond)
	}
}

func pipelineOnce(ctx context.Context, pool *pgxpool.Pool, b *pgx.Batch, fresh bool) (again, error) {
	conn, err := acquire(ctx, pool, fresh)
	if err != nil {
		return lost, errs.Lost(fmt.Errorf("acquire connection: %w", err))
	}
	defer conn.Release()
	closed := conn.Conn().IsClosed()
	br := conn.SendBatch(ctx, b)
	// The first answer is read here: it is the set_config's, so no
	// caller's callback has run when it fails.
	_, err = br.Exec()
	first := err != nil
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	switch {
	case err == nil:
		return final, nil
	case !conn.Conn().IsClosed():
		return final, err // a statement failed: the implicit transaction rolled back
	case closed, unprepared(err), first && terminated(err):
		return lost, errs.Lost(err)
	case ctx.Err() != nil:
		return final, err
	}
	return final, errs.Unknown(err)
}

// repeatable is a pool whose Exec and QueryRow run again on a fresh
// connection when theirs was lost (Unscoped's idempotent lookups).
type repeatable struct{ pool *pgxpool.Pool }

func (q repeatable) Exec(ctx context.Context, sql string, args ...any) (tag pgconn.CommandTag, err error) {
	for attempt := 1; ; attempt++ {
		var conn *pgxpool.Conn
		if conn, err = acquire(ctx, q.pool, attempt > 1); err == nil {
			tag, err = conn.Exec(ctx, sql, args...)
			conn.Release()
		}
		if err == nil || attempt >= connAttempts || ctx.Err() != nil || !errs.Unreachable(err) {
			return tag, err
		}
	}
}

func (q repeatable) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return repeatableRow{q: q, ctx: ctx, sql: sql, args: args}
}

func (q repeatable) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return q.pool.Query(ctx, sql, args...)
}

func (q repeatable) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return q.pool.SendBatch(ctx, b)
}

type repeatableRow struct {
	q    repeatable
	ctx  context.Context
	sql  string
	args []any
}

func (r repeatableRow) Scan(dest ...any) (err error) {
	for attempt := 1; ; attempt++ {
		var conn *pgxpool.Conn
		if conn, err = acquire(r.ctx, r.q.pool, attempt > 1); err == nil {
			err = conn.QueryRow(r.ctx, r.sql, r.args...).Scan(dest...)
			conn.Release()
		}
		if err == nil || attempt >= connAttempts || r.ctx.Err() != nil || !errs.Unreachable(err) {
			return err
		}
	}
}
