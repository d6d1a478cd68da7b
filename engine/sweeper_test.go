package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	sm "github.com/composer-dev/composer/engine/statemachine"
	"github.com/composer-dev/composer/internal/pg"
)

func (f *fixture) lease(run uuid.UUID, node, owner string, ttl time.Duration) taskRow {
	f.t.Helper()
	tk := f.mustTask(run, node)
	ls, _, err := f.c.AcquireLeases(context.Background(), f.tenant, Holder{Worker: owner}, ttl, []LeaseRequest{{RunID: run, TaskID: tk.ID, Attempt: tk.Attempt}})
	require.NoError(f.t, err)
	require.True(f.t, ls[0].Acquired)
	return tk
}

func TestLeasesAreExclusiveAndRenewable(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	run := f.start(f.workflow(`{"nodes":[{"id":"a","type":"noop"}]}`), `{"x": 1}`)
	a := f.mustTask(run, "a")
	req := []LeaseRequest{{RunID: run, TaskID: a.ID, Attempt: 1}}

	got, _, err := f.c.AcquireLeases(ctx, f.tenant, Holder{Worker: "w1"}, 5*time.Second, append(req, req[0]))
	require.NoError(t, err)
	assert.True(t, got[0].Acquired)
	assert.False(t, got[1].Acquired, "a duplicate in the same batch gets no second lease")
	assert.JSONEq(t, `{"x": 1}`, string(got[0].Input), "the lease carries the task's input")
	again, _, err := f.c.AcquireLeases(ctx, f.tenant, Holder{Worker: "w2"}, 5*time.Second, req)
	require.NoError(t, err)
	assert.False(t, again[0].Acquired, "a leased task cannot be leased again")
	stale, _, err := f.c.AcquireLeases(ctx, f.tenant, Holder{Worker: "w2"}, 5*time.Second, []LeaseRequest{{RunID: run, TaskID: a.ID, Attempt: 2}})
	require.NoError(t, err)
	assert.False(t, stale[0].Acquired)

	ren, err := f.c.RenewLeases(ctx, f.tenant, Holder{Worker: "w1"}, 5*time.Second, req)
	require.NoError(t, err)
	assert.True(t, ren[0].Held)
	assert.True(t, ren[0].ExpiresAt.After(got[0].ExpiresAt.Add(-time.Second)))
	ren, err = f.c.RenewLeases(ctx, f.tenant, Holder{Worker: "w2"}, 5*time.Second, req)
	require.NoError(t, err)
	assert.False(t, ren[0].Held, "only the holder renews")

	_, err = f.c.CancelRun(ctx, f.tenant, run, "")
	require.NoError(t, err)
	ren, err = f.c.RenewLeases(ctx, f.tenant, Holder{Worker: "w1"}, 5*time.Second, req)
	require.NoError(t, err)
	assert.False(t, ren[0].Held, "a cancelled run's lease answers lost")

	_, _, err = f.c.AcquireLeases(ctx, f.tenant, Holder{Worker: ""}, time.Second, req)
	assert.Error(t, err)
	_, _, err = f.c.AcquireLeases(ctx, f.tenant, Holder{Worker: "w"}, time.Hour, req)
	assert.Error(t, err, "TTL is bounded")
}

// TestExpiredLeasesAreEventsOfTheStateMachine: the sweep applies an
// expired lease through the coordinator. The new attempt waits its
// backoff and gets a schedule-to-start timer; the transition hooks (where
// metering happens) see it inside its transaction and a live update
// follows; the old holder's report is fenced out; on the last attempt the
// node fails, once.
func TestExpiredLeasesAreEventsOfTheStateMachine(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	var mu sync.Mutex
	var hooked, live []string
	f.c = NewCoordinator(f.db, Options{
		Hooks: []TxHook{func(tr *TxTransition, q Queuer) {
			mu.Lock()
			defer mu.Unlock()
			hooked = append(hooked, tr.Event)
		}},
		OnTransition: func(tr Transition) {
			mu.Lock()
			defer mu.Unlock()
			live = append(live, tr.Event)
		}})
	sw := NewSweeper(f.c, f.db, SweeperConfig{}, nil)
	wf := f.workflow(`{"nodes":[{"id":"a","type":"noop","schedule_to_start_timeout":"1m","retry":{"max_attempts":2,"backoff":"30s","no_jitter":true}}]}`)
	run := f.start(wf, `{}`)
	f.lease(run, "a", "w1", time.Second)
	_, err := f.env.System.Exec(ctx, `UPDATE task_instances SET lease_expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	_, err = f.env.System.Exec(ctx, `DELETE FROM outbox`)
	require.NoError(t, err)

	st, err := sw.SweepOnce(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, st.Expired)
	a := f.mustTask(run, "a")
	assert.Equal(t, "pending", a.State)
	assert.Equal(t, 2, a.Attempt, "the expired attempt is fenced off by a new attempt number")
	var wait float64
	require.NoError(t, f.env.System.QueryRow(ctx, `SELECT extract(epoch FROM next_attempt_at - now()) FROM outbox WHERE task_id = $1 AND attempt = 2`, a.ID).Scan(&wait))
	assert.InDelta(t, 30, wait, 2, "the new attempt waits its backoff")
	assert.Equal(t, 1, f.count(`SELECT count(*) FROM timers WHERE task_id = $1 AND attempt = 2 AND kind = 'schedule_to_start'`, a.ID),
		"and gets a schedule-to-start timer")
	assert.Equal(t, 1, f.count(`SELECT count(*) FROM run_events WHERE kind = 'lease_expired'`))
	mu.Lock()
	assert.Contains(t, hooked, "lease_expired", "the transition hooks ran in its transaction")
	assert.Contains(t, live, "lease_expired", "a live update followed")
	mu.Unlock()

	st, err = sw.SweepOnce(ctx)
	require.NoError(t, err)
	assert.Zero(t, st.Expired, "applied once")

	// The old holder's report no longer applies.
	ack, err := f.c.CompleteTask(ctx, f.tenant, Report{RunID: run, TaskID: a.ID, NodeID: "a", Attempt: 1, LeaseOwner: "w1"})
	require.NoError(t, err)
	assert.True(t, ack.Ignored)

	// On the last attempt, an expired lease fails the node (and the run), once.
	f.lease(run, "a", "w2", time.Second)
	_, err = f.env.System.Exec(ctx, `UPDATE task_instances SET lease_expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	for range 3 {
		_, err = sw.SweepOnce(ctx)
		require.NoError(t, err)
	}
	assert.Equal(t, sm.RunFailed, f.runStatus(run))
	var code string
	require.NoError(t, f.env.System.QueryRow(ctx, `SELECT last_error->>'code' FROM task_instances WHERE id = $1`, a.ID).Scan(&code))
	assert.Equal(t, "lease_expired", code)
	assert.Equal(t, 2, f.count(`SELECT count(*) FROM run_events WHERE kind = 'lease_expired'`), "one per expired attempt")
	assert.Equal(t, 1, f.count(`SELECT count(*) FROM run_events e WHERE EXISTS (SELECT 1 FROM jsonb_array_elements(e.detail->'actions') x WHERE x->>'kind' = 'fail_task')`),
		"the node failed once")
}

// TestAReportBeforeTheExpiryWins: the sweep read a lease as
// expired, but the worker's report got in first; the expiry is ignored.
func TestAReportBeforeTheExpiryWins(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	wf := f.workflow(`{"nodes":[{"id":"a","type":"noop","retry":{"max_attempts":3}}]}`)
	run := f.start(wf, `{}`)
	a := f.lease(run, "a", "w1", time.Minute)
	ack, err := f.c.ExpireLease(ctx, f.tenant, ExpiredLease{RunID: run, TaskID: a.ID, NodeID: "a", Attempt: 1})
	require.NoError(t, err)
	assert.True(t, ack.Ignored, "a live lease is not expired")
	_, err = f.c.CompleteTask(ctx, f.tenant, Report{RunID: run, TaskID: a.ID, NodeID: "a", Attempt: 1, LeaseOwner: "w1"})
	require.NoError(t, err)
	ack, err = f.c.ExpireLease(ctx, f.tenant, ExpiredLease{RunID: run, TaskID: a.ID, NodeID: "a", Attempt: 1})
	require.NoError(t, err)
	assert.True(t, ack.Ignored, "a finished attempt is not expired")
	assert.Equal(t, sm.RunCompleted, f.runStatus(run))
}

func TestSweepRedispatchesLostMessagesOnly(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	sw := NewSweeper(f.c, f.db, SweeperConfig{LostDispatchAge: time.Minute}, nil)
	wf := f.workflow(`{"nodes":[{"id":"a","type":"noop"}]}`)
	lost, slow := f.start(wf, `{}`), f.start(wf, `{}`)
	// Both dispatches are old; only the first run's message is gone.
	_, err := f.env.System.Exec(ctx, `UPDATE task_instances SET dispatch_at = now() - interval '2 minutes', updated_at = now() - interval '2 minutes'`)
	require.NoError(t, err)
	_, err = f.env.System.Exec(ctx, `DELETE FROM outbox WHERE run_id = $1`, lost)
	require.NoError(t, err)

	st, err := sw.SweepOnce(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 1, st.Redispatched)
	assert.Equal(t, 1, f.count(`SELECT count(*) FROM outbox WHERE run_id = $1`, lost))
	assert.Equal(t, 1, f.count(`SELECT count(*) FROM outbox WHERE run_id = $1`, slow), "a task whose message still waits is left alone")

	st, err = sw.SweepOnce(ctx)
	require.NoError(t, err)
	assert.Zero(t, st.Redispatched, "a fresh dispatch is not swept again")
}

func TestTimersFireOnceAcrossReplicas(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	wf := f.workflow(`{"nodes":[{"id":"nap","type":"sleep","sleep":{"duration":"1s"}},{"id":"next","type":"noop","depends_on":["nap"]}]}`)
	var runs []uuid.UUID
	for i := 0; i < 20; i++ {
		runs = append(runs, f.start(wf, `{}`))
	}
	_, err := f.env.System.Exec(ctx, `UPDATE timers SET fire_at = now() - interval '1 second'`)
	require.NoError(t, err)
	// Three replicas fire due timers at once.
	errs := make(chan error, 3)
	for i := 0; i < 3; i++ {
		sw := NewSweeper(f.c, f.db, SweeperConfig{}, nil)
		go func() { _, err := sw.FireDueTimers(ctx); errs <- err }()
	}
	for i := 0; i < 3; i++ {
		require.NoError(t, <-errs)
	}
	for _, r := range runs {
		assert.Equal(t, "completed", f.mustTask(r, "nap").State)
		assert.Equal(t, 1, f.count(`SELECT count(*) FROM task_instances WHERE run_id = $1 AND node_id = 'next'`, r))
		assert.Equal(t, 1, f.count(`SELECT count(*) FROM run_events WHERE run_id = $1 AND kind = 'timer_fired'`, r), "each timer applied once")
	}
	assert.Zero(t, f.count(`SELECT count(*) FROM timers`))
}

// TestAFailedTimerFireIsRetriedPromptly: the first attempt to fire a due
// timer fails (the database refuses its statement); the timer is fired
// again within seconds — not after its claim of two sweep intervals (a
// minute here) lapses.
func TestAFailedTimerFireIsRetriedPromptly(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	wf := f.workflow(`{"nodes":[{"id":"nap","type":"sleep","sleep":{"duration":"1h"}},{"id":"next","type":"noop","depends_on":["nap"]}]}`)
	run := f.start(wf, `{}`)
	owner := f.env.Owner(t)
	// The first DELETE of a timer fails (a sequence is not rolled back
	// with the failed transaction, so only the first one does).
	_, err := owner.Exec(ctx, `CREATE SEQUENCE timer_failures;
		GRANT USAGE ON SEQUENCE timer_failures TO composer_system, composer_app;
		CREATE FUNCTION fail_first_timer() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF nextval('timer_failures') = 1 THEN RAISE EXCEPTION 'injected: the database refused the statement'; END IF;
			RETURN OLD;
		END $$;
		CREATE TRIGGER fail_first_timer BEFORE DELETE ON timers FOR EACH ROW EXECUTE FUNCTION fail_first_timer();`)
	require.NoError(t, err)
	_, err = f.env.System.Exec(ctx, `UPDATE timers SET fire_at = now() - interval '1 second'`)
	require.NoError(t, err)
	sw := NewSweeper(f.c, f.db, SweeperConfig{Interval: 30 * time.Second}, nil)
	_, err = sw.FireDueTimers(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, f.count(`SELECT count(*) FROM timers`), "the first fire failed")
	var claim time.Duration
	require.NoError(t, f.env.System.QueryRow(ctx, `SELECT extract(epoch FROM claimed_until - now())::float8 * interval '1 second' FROM timers`).Scan(&claim))
	assert.Less(t, claim, 5*time.Second, "the failed timer is released, not held for its whole claim")

	failedAt := time.Now()
	require.Eventually(t, func() bool {
		_, err := sw.FireDueTimers(ctx)
		return err == nil && f.count(`SELECT count(*) FROM timers`) == 0
	}, 10*time.Second, 50*time.Millisecond, "the timer was not fired again within seconds")
	t.Logf("fired again %s after the failure", time.Since(failedAt).Round(time.Millisecond))
	assert.Equal(t, "completed", f.mustTask(run, "nap").State)
	assert.Equal(t, 1, f.count(`SELECT count(*) FROM task_instances WHERE run_id = $1 AND node_id = 'next'`, run))
}

func TestMaintenanceDropsWholeOldMonths(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	owner := f.env.Owner(t)
	for _, tbl := range []string{"workflow_runs", "task_instances", "run_signals", "run_events"} {
		var ddl string
		require.NoError(t, owner.QueryRow(ctx, `SELECT format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)', $1::text || '_201901', $1::text,
			composer_uuid_floor('2019-01-01Z'), composer_uuid_floor('2019-02-01Z'))`, tbl).Scan(&ddl))
		_, err := owner.Exec(ctx, ddl)
		require.NoError(t, err)
	}
	// An old idempotency key and a fresh one.
	require.NoError(t, f.db.WithTenant(ctx, f.tenant, func(ctx context.Context, tx *pg.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO run_idempotency_keys (tenant_id, key, run_id, request_hash, created_at)
			VALUES ($1, 'old', $2, '\x00', '2019-01-15Z'), ($1, 'new', $2, '\x00', now())`, f.tenant, uuid.New())
		return err
	}))
	// An old event that started a run, and a fresh one.
	wf := f.workflow(triggered(`[{"event": "e"}]`))
	old := f.publish("e", "old", `{}`)
	fresh := f.publish("e", "fresh", `{}`)
	// (As the owner, bound by FORCE RLS: in a transaction of the tenant.)
	otx, err := owner.Begin(ctx)
	require.NoError(t, err)
	_, err = otx.Exec(ctx, `SELECT set_config('app.tenant_id', $1, true)`, f.tenant.String())
	require.NoError(t, err)
	tag, err := otx.Exec(ctx, `UPDATE events SET received_at = '2019-01-15Z' WHERE id = $1`, old.Key)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
	require.NoError(t, otx.Commit(ctx))
	require.NoError(t, NewSweeper(f.c, f.db, SweeperConfig{RetentionMonths: 3}, nil).Maintain(ctx))
	assert.Zero(t, f.count(`SELECT count(*) FROM pg_class WHERE relname LIKE '%\_201901'`))
	assert.Equal(t, 1, f.count(`SELECT count(*) FROM events`), "events older than the window are gone")
	assert.Equal(t, 1, f.count(`SELECT count(*) FROM events WHERE id = $1`, fresh.Key))
	assert.Equal(t, 1, f.count(`SELECT count(*) FROM event_runs WHERE workflow_id = $1`, wf), "with what they did")
	var keys []string
	rows, err := f.env.System.Query(ctx, `SELECT key FROM run_idempotency_keys WHERE key NOT LIKE 'event:%'`)
	require.NoError(t, err)
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		keys = append(keys, k)
	}
	assert.Equal(t, []string{"new"}, keys, "keys older than the retention window are gone")
	assert.Positive(t, f.count(`SELECT count(*) FROM pg_class WHERE relname LIKE 'workflow_runs\_%'`), "current months stay")
}

// TestReplicasSweepingAtOnceApplyEachExpiryOnce: three sweepers find the
// same 200 expired leases at once; each lease becomes exactly one new
// attempt and one timeline entry.
func TestReplicasSweepingAtOnceApplyEachExpiryOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	expiredLeases(t, f, 200)
	ctx := context.Background()
	var total atomic.Int64
	var wg sync.WaitGroup
	for range 3 {
		sw := NewSweeper(f.c, f.db, SweeperConfig{Batch: 50}, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				st, err := sw.SweepOnce(ctx)
				assert.NoError(t, err)
				total.Add(int64(st.Expired))
			}
		}()
	}
	wg.Wait()
	assert.EqualValues(t, 200, total.Load())
	assert.Equal(t, 200, f.count(`SELECT count(*) FROM task_instances WHERE state = 'pending' AND attempt = 2`))
	assert.Equal(t, 200, f.count(`SELECT count(*) FROM run_events WHERE kind = 'lease_expired'`))
}
