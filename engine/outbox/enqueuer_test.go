package outbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/engine/stream"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/internal/redisconn"
	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/tenants"
)

// The crash test re-runs this test binary as a child that publishes one
// batch and SIGKILLs itself between XADD and DELETE.
const childEnv = "COMPOSER_OUTBOX_CRASH_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		crashChild()
		return
	}
	os.Exit(m.Run())
}

func crashChild() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("SYSTEM_URL"))
	if err != nil {
		panic(err)
	}
	rdb, _, err := redisconn.Open(os.Getenv("REDIS_URL"))
	if err != nil {
		panic(err)
	}
	e := New(pg.New(nil, pool, false), os.Getenv("SYSTEM_URL"), rdb, stream.NewNames(os.Getenv("NAMESPACE")), Config{}, nil)
	e.afterPublish = func() { _ = syscall.Kill(os.Getpid(), syscall.SIGKILL) }
	_, err = e.Drain(ctx)
	panic(fmt.Sprintf("child survived the kill: %v", err))
}

type fixture struct {
	env    *testenv.Env
	db     *pg.DB
	tenant tenants.Tenant
}

func newFixture(t *testing.T) *fixture {
	env := testenv.New(t)
	db := pg.New(env.App, env.System, false)
	tn, err := tenants.Create(context.Background(), db, tenants.CreateParams{Name: "acme", StreamShards: 2})
	require.NoError(t, err)
	return &fixture{env: env, db: db, tenant: tn}
}

func (f *fixture) enqueuer(cfg Config) *Enqueuer {
	return New(f.db, f.env.SystemURL, f.env.Redis, stream.NewNames(f.env.Namespace), cfg, nil)
}

// insert adds outbox rows as the app role in a tenant transaction, the way
// the coordinator does, and commits or rolls back.
func (f *fixture) insert(t *testing.T, n int, commit bool) {
	t.Helper()
	err := f.db.WithTenant(context.Background(), f.tenant.ID, func(ctx context.Context, tx *pg.Tx) error {
		for i := 0; i < n; i++ {
			if _, err := tx.Exec(ctx, `INSERT INTO outbox (tenant_id, queue, run_id, task_id, node_id, node_type, attempt)
				VALUES ($1, 'default', $2, $3, 'n', 'noop', 1)`, f.tenant.ID, uuid.New(), uuid.New()); err != nil {
				return err
			}
		}
		if !commit {
			return errors.New("rolled back on purpose")
		}
		return nil
	})
	if commit {
		require.NoError(t, err)
	}
}

// published returns how often each outbox id appears across the tenant's
// stream shards.
func (f *fixture) published(t *testing.T) map[int64]int {
	t.Helper()
	out := map[int64]int{}
	for _, key := range stream.NewNames(f.env.Namespace).Streams(f.tenant.ID, "default", f.tenant.StreamShards) {
		msgs, err := f.env.Redis.XRange(context.Background(), key, "-", "+").Result()
		require.NoError(t, err)
		for _, m := range msgs {
			id, err := strconv.ParseInt(m.Values["o"].(string), 10, 64)
			require.NoError(t, err)
			out[id]++
		}
	}
	return out
}

func (f *fixture) outboxRows(t *testing.T) int {
	var n int
	require.NoError(t, f.env.System.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&n))
	return n
}

func TestRolledBackRowsAreNeverPublishedCommittedOnesOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	e := f.enqueuer(Config{})
	f.insert(t, 3, false)
	_, err := e.Drain(context.Background())
	require.NoError(t, err)
	assert.Empty(t, f.published(t), "a rolled-back transaction publishes nothing")

	f.insert(t, 3, true)
	_, err = e.Drain(context.Background())
	require.NoError(t, err)
	pub := f.published(t)
	assert.Len(t, pub, 3)
	for id, n := range pub {
		assert.Equal(t, 1, n, "row %d", id)
	}
	assert.Zero(t, f.outboxRows(t), "published rows are deleted")

	// The message is addressed right and the tenant is registered as active.
	active, err := f.env.Redis.ZRange(context.Background(), stream.NewNames(f.env.Namespace).Active("default"), 0, -1).Result()
	require.NoError(t, err)
	assert.Equal(t, []string{stream.ActiveMember(f.tenant.ID, 2, 1)}, active)
}

// TestKilledBetweenPublishAndDeleteDuplicatesNeverLoses kills a real
// enqueuer process after its XADDs and before its DELETE commits.
func TestKilledBetweenPublishAndDeleteDuplicatesNeverLoses(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.insert(t, 5, true)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", "SYSTEM_URL="+f.env.SystemURL, "REDIS_URL="+f.env.RedisURL, "NAMESPACE="+f.env.Namespace)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "child output: %s", out)
	status := exit.Sys().(syscall.WaitStatus)
	require.True(t, status.Signaled() && status.Signal() == syscall.SIGKILL, "child was not killed: %v\n%s", err, out)

	pub := f.published(t)
	require.Len(t, pub, 5, "the child published before it died")
	assert.Equal(t, 5, f.outboxRows(t), "its delete never committed: the rows are still there")

	// The killed child's backend lets go of its claimed rows once
	// PostgreSQL notices the closed connection (SKIP LOCKED passes over
	// them until then): drain until they are gone.
	e := f.enqueuer(Config{})
	require.Eventually(t, func() bool {
		var left int
		_, err := e.Drain(context.Background())
		return err == nil && f.env.System.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&left) == nil && left == 0
	}, 20*time.Second, 10*time.Millisecond, "the rows are published again and deleted")
	pub = f.published(t)
	assert.Len(t, pub, 5, "no row was lost")
	for id, n := range pub {
		assert.Equal(t, 2, n, "row %d is published twice: a duplicate, not a loss", id)
	}
	assert.Zero(t, f.outboxRows(t))
}

func TestTwoEnqueuersDrainTenThousandRows(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	_, err := f.env.System.Exec(ctx, `INSERT INTO outbox (tenant_id, queue, run_id, task_id, node_id, node_type, attempt)
		SELECT $1, 'default', gen_random_uuid(), gen_random_uuid(), 'n', 'noop', 1 FROM generate_series(1, 10000)`, f.tenant.ID)
	require.NoError(t, err)
	var ids []int64
	rows, err := f.env.System.Query(ctx, `SELECT id FROM outbox`)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.Len(t, ids, 10000)

	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		e := f.enqueuer(Config{BatchSize: 200})
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.Drain(ctx)
			assert.NoError(t, err)
		}()
	}
	wg.Wait()
	assert.Zero(t, f.outboxRows(t), "the table is empty")
	pub := f.published(t)
	for _, id := range ids {
		require.GreaterOrEqual(t, pub[id], 1, "row %d was never published", id)
	}
	total := 0
	for _, n := range pub {
		total += n
	}
	t.Logf("10000 rows published as %d messages by two enqueuers", total)
}

func TestFailingPublishBacksOffThenDeadLetters(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	f.insert(t, 1, true)
	// Make every shard key the wrong type so XADD fails.
	for _, key := range stream.NewNames(f.env.Namespace).Streams(f.tenant.ID, "default", f.tenant.StreamShards) {
		require.NoError(t, f.env.Redis.Set(ctx, key, "not a stream", 0).Err())
	}
	e := f.enqueuer(Config{MaxAttempts: 3, BaseBackoff: 20 * time.Millisecond, MaxBackoff: 40 * time.Millisecond})
	next, err := e.Drain(ctx)
	require.NoError(t, err)
	assert.False(t, next.IsZero(), "the failed row is due again later")
	var attempts int
	var lastErr string
	require.NoError(t, f.env.System.QueryRow(ctx, `SELECT attempts, last_error FROM outbox`).Scan(&attempts, &lastErr))
	assert.Equal(t, 1, attempts)
	assert.Contains(t, lastErr, "WRONGTYPE")

	deadline := time.Now().Add(10 * time.Second)
	for f.outboxRows(t) > 0 && time.Now().Before(deadline) {
		next, err := e.Drain(ctx)
		require.NoError(t, err)
		if !next.IsZero() {
			time.Sleep(time.Until(next))
		}
	}
	var dead int
	require.NoError(t, f.env.System.QueryRow(ctx, `SELECT count(*) FROM outbox_dead_letters WHERE attempts = 3`).Scan(&dead))
	assert.Equal(t, 1, dead, "after MaxAttempts the row is dead-lettered")
	assert.Zero(t, f.outboxRows(t))
}

func TestRunWakesOnNotifyAndInProcess(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// A poll interval far beyond the test: only a wake-up can publish in time.
	e := f.enqueuer(Config{PollInterval: time.Hour})
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	f.insert(t, 1, true)
	waitFor(t, "NOTIFY to publish the row", func() bool { return len(f.published(t)) == 1 })
	f.insert(t, 1, true)
	e.Wake()
	waitFor(t, "the second row", func() bool { return len(f.published(t)) == 2 })
	cancel()
	assert.ErrorIs(t, <-done, context.Canceled)
}

func TestBackoffGrowsWithFullJitterWithinBounds(t *testing.T) {
	base, ceiling := time.Second, 30*time.Second
	for n := 1; n <= 20; n++ {
		window := min(base<<min(n-1, 10), ceiling)
		for i := 0; i < 200; i++ {
			d := Backoff(base, ceiling, n)
			require.GreaterOrEqual(t, d, base/2)
			require.LessOrEqual(t, d, window)
		}
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
