package pg_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/internal/pguuid"
	"github.com/composer-dev/composer/internal/testenv"
)

const insertMember = `INSERT INTO memberships (tenant_id, subject, role) VALUES ($1, $2, 'viewer')`

// sent counts the statements and batches a pool sent whose SQL holds a
// marker, attempts included.
type sent struct {
	mu     sync.Mutex
	marker string
	n      int
}

func (s *sent) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.count(d.SQL)
	return ctx
}
func (s *sent) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (s *sent) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	for _, q := range d.Batch.QueuedQueries {
		if strings.Contains(q.SQL, s.marker) {
			s.count(q.SQL)
			break
		}
	}
	return ctx
}
func (s *sent) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (s *sent) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

func (s *sent) count(sql string) {
	if strings.Contains(sql, s.marker) {
		s.mu.Lock()
		s.n++
		s.mu.Unlock()
	}
}

func (s *sent) times() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// busyPool is a pool that hands out an idle connection without pinging it
// first, as a busy server's pool does (pgxpool pings only connections idle
// for over a second): a connection whose backend died is used.
func busyPool(t *testing.T, url string, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 4
	cfg.AfterConnect = pguuid.AfterConnect
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	if tracer != nil {
		cfg.ConnConfig.Tracer = tracer
	}
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// proxied is a test database with a tenant, and a DB whose app role
// reaches it through a proxy the test breaks.
func proxied(t *testing.T) (*testenv.Env, uuid.UUID, *testenv.Proxy, *pg.DB) {
	t.Helper()
	env := testenv.NewPG(t)
	proxy, url := testenv.ProxyURL(t, env.AppURL)
	return env, newTenant(t, env), proxy, pg.New(busyPool(t, url, nil), busyPool(t, env.SystemURL, nil), false)
}

// newTenant makes a tenant row to scope transactions to.
func newTenant(t *testing.T, env *testenv.Env) uuid.UUID {
	t.Helper()
	id := uuid.New()
	_, err := env.System.Exec(context.Background(), `INSERT INTO tenants (id, name) VALUES ($1, 'faults')`, id)
	require.NoError(t, err)
	return id
}

func members(t *testing.T, env *testenv.Env, tenant uuid.UUID, subject string) int {
	t.Helper()
	var n int
	require.NoError(t, pg.New(env.App, env.System, false).WithTenant(context.Background(), tenant, func(ctx context.Context, tx *pg.Tx) error {
		return tx.QueryRow(ctx, `SELECT count(*) FROM memberships WHERE tenant_id = $1 AND subject = $2`, tenant, subject).Scan(&n)
	}))
	return n
}

// insertCounted inserts member subject in a transaction of db and counts
// the attempts it took.
func insertCounted(ctx context.Context, db *pg.DB, tenant uuid.UUID, subject string) (calls int, err error) {
	err = db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		calls++
		_, err := tx.Exec(ctx, insertMember, tenant, subject)
		return err
	})
	return calls, err
}

// TestATransactionOnADeadConnectionRunsAgainOnAFreshOne: the backends of
// the pool's idle connections are terminated between two transactions;
// the next transaction meets a dead connection, and runs again — once —
// on a fresh one: the caller sees success, and its row exists once.
func TestATransactionOnADeadConnectionRunsAgainOnAFreshOne(t *testing.T) {
	t.Parallel()
	env := testenv.NewPG(t)
	ctx := context.Background()
	tenant := newTenant(t, env)
	db := pg.New(busyPool(t, env.AppURL, nil), busyPool(t, env.SystemURL, nil), false)

	require.NoError(t, db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		_, err := tx.Exec(ctx, "SELECT 1")
		return err
	}))
	require.Positive(t, testenv.TerminateBackends(t, env.AppURL, "%"), "the pool's connection had a backend to terminate")

	calls, err := insertCounted(ctx, db, tenant, "ada")
	require.NoError(t, err)
	assert.Equal(t, 2, calls, "the first attempt met the dead connection, the second ran on a fresh one")
	assert.Equal(t, 1, members(t, env, tenant, "ada"))

	// The same for the system role's transactions (tenants create).
	require.NoError(t, db.WithSystem(ctx, func(ctx context.Context, tx *pg.Tx) error {
		_, err := tx.Exec(ctx, "SELECT 1")
		return err
	}))
	require.Positive(t, testenv.TerminateBackends(t, env.SystemURL, "%"))
	calls = 0
	require.NoError(t, db.WithSystem(ctx, func(ctx context.Context, tx *pg.Tx) error {
		calls++
		_, err := tx.Exec(ctx, `UPDATE tenants SET name = 'renamed' WHERE id = $1`, tenant)
		return err
	}))
	assert.Equal(t, 2, calls)
}

// TestATransactionKilledInFlightRunsAgain: a backend terminated while it
// runs the transaction's statement (after the transaction wrote a row)
// rolls the transaction back; it runs again and its row exists once.
func TestATransactionKilledInFlightRunsAgain(t *testing.T) {
	t.Parallel()
	env := testenv.NewPG(t)
	ctx := context.Background()
	tenant := newTenant(t, env)
	db := pg.New(busyPool(t, env.AppURL, nil), busyPool(t, env.SystemURL, nil), false)

	killed := testenv.When(t, env.AppURL, "state = 'active' AND query LIKE '%pg_sleep(30)%'", func(c *pgx.Conn) {
		_, _ = c.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE '%pg_sleep(30)%'`)
	})
	calls := 0
	err := db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		calls++
		if _, err := tx.Exec(ctx, insertMember, tenant, "lovelace"); err != nil {
			return err
		}
		if calls == 1 {
			_, err := tx.Exec(ctx, "SELECT pg_sleep(30)")
			return err
		}
		return nil
	})
	<-killed
	require.NoError(t, err)
	assert.Equal(t, 2, calls)
	assert.Equal(t, 1, members(t, env, tenant, "lovelace"), "the killed attempt's row was rolled back")
}

// TestALostCommitAnswerIsOutcomeUnknown: the connection dies after the
// server committed and before its answer arrived. The caller is told the
// outcome is unknown (never a plain error, never retried here: it
// committed), for a COMMIT of its own and one in CommitWith's round trip.
func TestALostCommitAnswerIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	env, tenant, proxy, db := proxied(t)
	ctx := context.Background()

	proxy.LoseCommitAnswer("")
	calls, err := insertCounted(ctx, db, tenant, "grace")
	require.Error(t, err)
	assert.Equal(t, errs.OutcomeUnknown, errs.KindOf(err), "%v", err)
	assert.Equal(t, "outcome unknown: retry with the same idempotency key", errs.PublicMessage(err))
	assert.Positive(t, errs.RetryAfter(err))
	assert.Equal(t, 1, calls, "a transaction that may have committed never runs again")
	assert.Equal(t, 1, proxy.LostAnswers())
	assert.Equal(t, 1, members(t, env, tenant, "grace"), "it had committed")

	proxy.LoseCommitAnswer("")
	err = db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		b := &pgx.Batch{}
		b.Queue(insertMember, tenant, "hopper")
		return tx.CommitWith(ctx, b)
	})
	assert.Equal(t, errs.OutcomeUnknown, errs.KindOf(err), "%v", err)
	assert.Equal(t, 1, members(t, env, tenant, "hopper"))

	// A pipeline commits with its Sync: the answer lost after it is as
	// unknown.
	proxy.LoseAnswer("", "INSERT 0 1")
	b := &pgx.Batch{}
	b.Queue(insertMember, tenant, "liskov")
	err = db.Pipeline(ctx, tenant, b)
	assert.Equal(t, errs.OutcomeUnknown, errs.KindOf(err), "%v", err)
	assert.Equal(t, 1, members(t, env, tenant, "liskov"))
	assert.Equal(t, 3, proxy.LostAnswers())
}

// TestAPipelineOnADeadConnectionRunsAgain: a pipeline whose connection's
// backend was terminated while idle is answered with that termination in
// place of its first statement's result: nothing of it ran, and it runs
// again on a fresh connection, once.
func TestAPipelineOnADeadConnectionRunsAgain(t *testing.T) {
	t.Parallel()
	env := testenv.NewPG(t)
	ctx := context.Background()
	tenant := newTenant(t, env)
	tracer := &sent{marker: "INSERT INTO memberships"}
	db := pg.New(busyPool(t, env.AppURL, tracer), busyPool(t, env.SystemURL, nil), false)

	warm := &pgx.Batch{}
	warm.Queue(insertMember, tenant, "warm")
	require.NoError(t, db.Pipeline(ctx, tenant, warm))
	require.Positive(t, testenv.TerminateBackends(t, env.AppURL, "%"))

	b := &pgx.Batch{}
	var tag string
	b.Queue(insertMember, tenant, "turing").Exec(func(ct pgconn.CommandTag) error { tag = ct.String(); return nil })
	require.NoError(t, db.Pipeline(ctx, tenant, b))
	assert.Equal(t, 3, tracer.times(), "the warm-up, the attempt on the dead connection, the one on a fresh one")
	assert.Equal(t, "INSERT 0 1", tag, "the caller's callback ran once, on the attempt that ran")
	assert.Equal(t, 1, members(t, env, tenant, "turing"))
}

// TestUnscopedLookupsRunAgainOnAFreshConnection: the credential lookups
// (idempotent) meet a dead connection and run again.
func TestUnscopedLookupsRunAgainOnAFreshConnection(t *testing.T) {
	t.Parallel()
	env := testenv.NewPG(t)
	ctx := context.Background()
	tracer := &sent{marker: "SELECT $1::int"}
	db := pg.New(busyPool(t, env.AppURL, tracer), busyPool(t, env.SystemURL, nil), false)

	var n int
	require.NoError(t, db.Unscoped().QueryRow(ctx, "SELECT $1::int", 1).Scan(&n))
	require.Positive(t, testenv.TerminateBackends(t, env.AppURL, "%"))
	require.NoError(t, db.Unscoped().QueryRow(ctx, "SELECT $1::int", 2).Scan(&n))
	assert.Equal(t, 2, n)
	assert.Equal(t, 3, tracer.times())

	require.Positive(t, testenv.TerminateBackends(t, env.AppURL, "%"))
	_, err := db.Unscoped().Exec(ctx, "SELECT $1::int", 3)
	require.NoError(t, err)
	// A lookup that finds nothing is not a lost connection.
	assert.ErrorIs(t, db.Unscoped().QueryRow(ctx, "SELECT 1 WHERE false").Scan(&n), pgx.ErrNoRows)
}

// TestADatabaseThatIsDownIsUnavailable: with the database unreachable
// (connections cut and refused), a transaction — new, or in flight when
// it went — answers UNAVAILABLE with a retry hint, never INTERNAL; when it
// is back, the next succeeds.
func TestADatabaseThatIsDownIsUnavailable(t *testing.T) {
	t.Parallel()
	env, tenant, proxy, db := proxied(t)
	ctx := context.Background()
	read := func(ctx context.Context, tx *pg.Tx) error {
		_, err := tx.Exec(ctx, "SELECT 1")
		return err
	}
	require.NoError(t, db.WithTenant(ctx, tenant, read))

	// In flight: the connection is cut under a running statement.
	went := testenv.When(t, env.AppURL, "state = 'active' AND query LIKE '%pg_sleep(5)%'", func(*pgx.Conn) { proxy.Down() })
	err := db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		_, err := tx.Exec(ctx, "SELECT pg_sleep(5)")
		return err
	})
	<-went
	require.Error(t, err)
	assert.Equal(t, errs.Unavailable, errs.KindOf(err), "%v", err)
	assert.Positive(t, errs.RetryAfter(err))
	assert.NotEqual(t, "internal error", errs.PublicMessage(err))

	// New work while it is down.
	err = db.WithTenant(ctx, tenant, read)
	assert.Equal(t, errs.Unavailable, errs.KindOf(err), "%v", err)
	b := &pgx.Batch{}
	b.Queue(insertMember, tenant, "dijkstra")
	err = db.Pipeline(ctx, tenant, b)
	assert.Equal(t, errs.Unavailable, errs.KindOf(err), "%v", err)
	var n int
	err = db.Unscoped().QueryRow(ctx, "SELECT $1::int", 1).Scan(&n)
	assert.Equal(t, errs.Unavailable, errs.KindOf(err), "%v", err)

	proxy.Up()
	require.NoError(t, db.WithTenant(ctx, tenant, read))
	assert.Zero(t, members(t, env, tenant, "dijkstra"), "the refused pipeline wrote nothing")
}
