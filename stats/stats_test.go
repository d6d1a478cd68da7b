package stats_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/stats"
)

type fixture struct {
	t      *testing.T
	env    *testenv.Env
	db     *pg.DB
	base   time.Time // an hour boundary six hours ago
	tenant uuid.UUID
	w1, w2 uuid.UUID
}

func newFixture(t *testing.T) *fixture {
	env := testenv.NewPG(t)
	f := &fixture{t: t, env: env, db: pg.New(env.App, env.System, false),
		base: time.Now().UTC().Truncate(time.Hour).Add(-6 * time.Hour)}
	f.tenant, f.w1, f.w2 = f.newTenant()
	return f
}

// newTenant makes a tenant with two workflows.
func (f *fixture) newTenant() (tenant, w1, w2 uuid.UUID) {
	tenant, w1, w2 = uuid.New(), uuid.New(), uuid.New()
	f.owner(tenant, `INSERT INTO tenants (id, name) VALUES ($1, 'stats')`, tenant)
	for i, w := range []uuid.UUID{w1, w2} {
		f.owner(tenant, `INSERT INTO workflow_definitions (tenant_id, id, name, latest_version) VALUES ($1, $2, $3, 1)`, tenant, w, []string{"one", "two"}[i])
		f.owner(tenant, `INSERT INTO workflow_versions (tenant_id, workflow_id, version, definition) VALUES ($1, $2, 1, '{}')`, tenant, w)
	}
	return
}

// owner runs one statement as the owner in tenant's scope.
func (f *fixture) owner(tenant uuid.UUID, sql string, args ...any) {
	ctx := context.Background()
	tx, err := f.env.Owner(f.t).Begin(ctx)
	require.NoError(f.t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `SELECT set_config('app.tenant_id', $1, true)`, tenant.String())
	require.NoError(f.t, err)
	_, err = tx.Exec(ctx, sql, args...)
	require.NoError(f.t, err, sql)
	require.NoError(f.t, tx.Commit(ctx))
}

// run inserts a run created at base+created, finished after took with
// status (took < 0: still running).
func (f *fixture) run(tenant, wf uuid.UUID, created, took time.Duration, status string) {
	at := f.base.Add(created)
	var fin *time.Time
	if took >= 0 {
		x := at.Add(took)
		fin = &x
	}
	f.owner(tenant, `INSERT INTO workflow_runs (tenant_id, id, workflow_id, workflow_version, status, created_at, updated_at, finished_at)
		VALUES ($1, composer_uuidv7($3), $2, 1, $4, $3, $3, $5)`, tenant, wf, at, status, fin)
}

// seed writes the known data set: four runs of w1 finished in the first
// hour (one failed), a run of w2 cancelled after a minute, a run of w2
// created in the first hour and failed in the third (a late finish), and a
// run of w1 created in the second hour, still running.
func (f *fixture) seed() {
	m := time.Minute
	f.run(f.tenant, f.w1, 10*m, 100*time.Millisecond, "completed")
	f.run(f.tenant, f.w1, 20*m, 200*time.Millisecond, "completed")
	f.run(f.tenant, f.w1, 25*m, 400*time.Millisecond, "completed")
	f.run(f.tenant, f.w1, 26*m, 800*time.Millisecond, "failed")
	f.run(f.tenant, f.w2, 40*m, time.Minute, "cancelled")
	f.run(f.tenant, f.w2, 30*m, 105*m, "failed")
	f.run(f.tenant, f.w1, 65*m, -1, "running")
}

func (f *fixture) stats(tenant uuid.UUID, wf *uuid.UUID, from, to time.Time, iv stats.Interval) (stats.RunStats, error) {
	var st stats.RunStats
	err := f.db.WithTenant(context.Background(), tenant, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		st, err = stats.Runs(ctx, tx, wf, from, to, iv)
		return err
	})
	return st, err
}

func (f *fixture) counts(tenant uuid.UUID, filter engine.RunFilter) (got, live map[string]int64) {
	err := f.db.WithTenant(context.Background(), tenant, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		if got, err = stats.Counts(ctx, tx, filter); err != nil {
			return err
		}
		live, err = engine.CountRuns(ctx, tx, filter)
		return err
	})
	require.NoError(f.t, err)
	return got, live
}

func (f *fixture) fold(until time.Time) {
	_, err := (&stats.Folder{DB: f.db, Step: 10 * time.Minute}).FoldUntil(context.Background(), until)
	require.NoError(f.t, err)
}

func est(d time.Duration) float64 { return stats.BucketValue(stats.BucketOf(d)) }

func ptr[T any](v T) *T { return &v }

// hourly is what the data set's hours must read, all workflows.
func (f *fixture) checkHourly(st stats.RunStats) {
	t := f.t
	require.Len(t, st.Buckets, 4)
	for i, b := range st.Buckets {
		assert.Equal(t, f.base.Add(time.Duration(i)*time.Hour), b.Start.UTC(), "bucket %d start", i)
	}
	h0, h1, h2, h3 := st.Buckets[0], st.Buckets[1], st.Buckets[2], st.Buckets[3]
	assert.Equal(t, []int64{6, 3, 1, 1}, []int64{h0.Started, h0.Completed, h0.Failed, h0.Cancelled}, "first hour")
	assert.InDelta(t, 0.25, h0.FailureRate, 1e-9)
	// Durations 100, 200, 400, 800 ms and 60 s: the median is the third,
	// the 95th percentile the fifth (nearest rank).
	require.NotNil(t, h0.P50Ms)
	assert.Equal(t, est(400*time.Millisecond), *h0.P50Ms)
	assert.InEpsilon(t, 400, *h0.P50Ms, stats.MaxRelativeError)
	assert.Equal(t, est(time.Minute), *h0.P95Ms)
	assert.InEpsilon(t, 60000, *h0.P95Ms, stats.MaxRelativeError)
	assert.Equal(t, []int64{1, 0, 0, 0}, []int64{h1.Started, h1.Completed, h1.Failed, h1.Cancelled}, "second hour")
	assert.Nil(t, h1.P50Ms)
	assert.Nil(t, h1.P95Ms)
	assert.Zero(t, h1.FailureRate)
	// The late failure: started in the first hour, failed in the third.
	assert.Equal(t, []int64{0, 0, 1, 0}, []int64{h2.Started, h2.Completed, h2.Failed, h2.Cancelled}, "third hour")
	assert.Equal(t, 1.0, h2.FailureRate)
	assert.Equal(t, est(105*time.Minute), *h2.P50Ms)
	assert.Equal(t, stats.Bucket{Start: h3.Start}, h3, "an empty bucket")
}

func TestRunStatsOnAKnownDataSet(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seed()
	from, to := f.base, f.base.Add(4*time.Hour)

	// Before any fold every answer is live; then with the watermark in the
	// middle of the first hour; then with everything folded: the same.
	st, err := f.stats(f.tenant, nil, from, to, stats.Hour)
	require.NoError(t, err)
	f.checkHourly(st)
	f.fold(f.base.Add(35 * time.Minute))
	st, err = f.stats(f.tenant, nil, from, to, stats.Hour)
	require.NoError(t, err)
	f.checkHourly(st)
	f.fold(time.Time{})
	st, err = f.stats(f.tenant, nil, from, to, stats.Hour)
	require.NoError(t, err)
	f.checkHourly(st)
	assert.Equal(t, from, st.From.UTC())
	assert.Equal(t, to, st.To.UTC())

	// One workflow.
	st, err = f.stats(f.tenant, &f.w2, from, to, stats.Hour)
	require.NoError(t, err)
	assert.Equal(t, []int64{2, 0, 0, 1}, []int64{st.Buckets[0].Started, st.Buckets[0].Completed, st.Buckets[0].Failed, st.Buckets[0].Cancelled})
	assert.Equal(t, int64(1), st.Buckets[2].Failed)
	assert.Equal(t, &f.w2, st.WorkflowID)

	// Minutes, rounded out: [0:09:30, 0:12:10) covers 0:09 to 0:13.
	st, err = f.stats(f.tenant, &f.w1, from.Add(9*time.Minute+30*time.Second), from.Add(12*time.Minute+10*time.Second), stats.Minute)
	require.NoError(t, err)
	require.Len(t, st.Buckets, 4)
	assert.Equal(t, from.Add(9*time.Minute), st.From.UTC())
	assert.Equal(t, from.Add(13*time.Minute), st.To.UTC())
	assert.Equal(t, from.Add(10*time.Minute), st.Buckets[1].Start.UTC())
	assert.Equal(t, []int64{0, 1, 0, 0}, []int64{st.Buckets[0].Started, st.Buckets[1].Started, st.Buckets[2].Started, st.Buckets[3].Started})
	assert.Equal(t, est(100*time.Millisecond), *st.Buckets[1].P50Ms)

	// Days: the day (or two) holding the data has all of it.
	st, err = f.stats(f.tenant, nil, from, to, stats.Day)
	require.NoError(t, err)
	var started, failed int64
	for _, b := range st.Buckets {
		assert.Equal(t, b.Start.UTC(), b.Start.UTC().Truncate(24*time.Hour), "aligned to UTC days")
		started, failed = started+b.Started, failed+b.Failed
	}
	assert.Equal(t, []int64{7, 2}, []int64{started, failed})
}

func TestRunStatsRefusesBadRanges(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for name, c := range map[string]struct {
		from, to time.Time
		iv       stats.Interval
	}{
		"from after to":    {f.base.Add(time.Hour), f.base, stats.Hour},
		"from equal to":    {f.base, f.base, stats.Hour},
		"too many buckets": {f.base, f.base.Add(501 * time.Minute), stats.Minute},
		"a year in hours":  {f.base, f.base.Add(365 * 24 * time.Hour), stats.Hour},
		"unknown interval": {f.base, f.base.Add(time.Hour), stats.Interval(time.Second)},
	} {
		_, err := f.stats(f.tenant, nil, c.from, c.to, c.iv)
		assert.ErrorIs(t, err, errs.Invalid, name)
	}
	st, err := f.stats(f.tenant, nil, f.base, f.base.Add(500*time.Minute), stats.Minute)
	require.NoError(t, err, "500 buckets are allowed")
	assert.Len(t, st.Buckets, 500)
}

func TestFoldIsIdempotentAndSafeConcurrently(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seed()
	from, to := f.base, f.base.Add(4*time.Hour)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := (&stats.Folder{DB: f.db, Step: 7 * time.Minute}).Fold(context.Background())
			assert.NoError(t, err)
		}()
	}
	wg.Wait()
	f.fold(time.Time{})
	f.fold(time.Time{})
	st, err := f.stats(f.tenant, nil, from, to, stats.Hour)
	require.NoError(t, err)
	f.checkHourly(st)
	// Only the watermark's tail is live: the rollups alone hold the rest.
	var rows int
	require.NoError(t, f.env.System.QueryRow(context.Background(),
		`SELECT sum(started) FROM run_rollups WHERE tenant_id = $1 AND workflow_id = $2 AND width = 60`, f.tenant, stats.Total).Scan(&rows))
	assert.Equal(t, 7, rows, "each run started once in the minute rollups")
}

func TestRunCountsMatchTheRunsThemselves(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seed()
	m := time.Minute
	filters := map[string]engine.RunFilter{
		"all":                {},
		"one workflow":       {WorkflowID: &f.w2},
		"created after":      {CreatedAfter: ptr(f.base.Add(15 * m))},
		"sub-minute edges":   {CreatedAfter: ptr(f.base.Add(10*m + time.Millisecond)), CreatedBefore: ptr(f.base.Add(26*m + 500*time.Millisecond))},
		"created before":     {CreatedBefore: ptr(f.base.Add(30 * m))},
		"days of range":      {CreatedAfter: ptr(f.base.Add(-72 * time.Hour)), CreatedBefore: ptr(f.base.Add(48 * time.Hour))},
		"a workflow's range": {WorkflowID: &f.w1, CreatedAfter: ptr(f.base.Add(20 * m)), CreatedBefore: ptr(f.base.Add(2 * time.Hour))},
		"statuses ignored":   {Statuses: []string{"failed"}},
	}
	check := func(when string) {
		for name, filter := range filters {
			got, live := f.counts(f.tenant, filter)
			for _, s := range stats.Statuses {
				assert.Equal(t, live[s], got[s], "%s, %s: %s", when, name, s)
			}
		}
	}
	got, _ := f.counts(f.tenant, engine.RunFilter{})
	assert.Equal(t, map[string]int64{"queued": 0, "running": 1, "completed": 3, "failed": 2, "cancelled": 1}, got)
	check("unfolded")
	f.fold(f.base.Add(35 * m))
	check("folded to 0:35")
	f.fold(time.Now().Add(-10 * m))
	// A failed run is reopened (a rerun in place), then folded.
	f.owner(f.tenant, `UPDATE workflow_runs SET status = 'running', finished_at = NULL, reopened_at = now() - interval '5 minutes'
		WHERE tenant_id = $1 AND workflow_id = $2 AND status = 'failed'`, f.tenant, f.w1)
	f.fold(time.Time{})
	check("folded, after a reopen")
	got, _ = f.counts(f.tenant, engine.RunFilter{})
	assert.Equal(t, map[string]int64{"queued": 0, "running": 2, "completed": 3, "failed": 1, "cancelled": 1}, got)
	// The reopened run fails again: counted once.
	f.owner(f.tenant, `UPDATE workflow_runs SET status = 'failed', finished_at = now()
		WHERE tenant_id = $1 AND workflow_id = $2 AND status = 'running' AND reopened_at IS NOT NULL`, f.tenant, f.w1)
	check("refailed, live")
	f.fold(time.Time{})
	check("refailed, folded")
}

func TestStatsStayInTheirTenant(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seed()
	other, ow1, _ := f.newTenant()
	f.run(other, ow1, 5*time.Minute, time.Second, "completed")
	f.fold(time.Time{})
	st, err := f.stats(other, nil, f.base, f.base.Add(4*time.Hour), stats.Hour)
	require.NoError(t, err)
	assert.Equal(t, int64(1), st.Buckets[0].Started, "B sees its own run only")
	assert.Equal(t, int64(1), st.Buckets[0].Completed)
	st, err = f.stats(other, &f.w1, f.base, f.base.Add(4*time.Hour), stats.Hour)
	require.NoError(t, err)
	for _, b := range st.Buckets {
		assert.Equal(t, stats.Bucket{Start: b.Start}, b, "A's workflow id through B's tenant reads nothing")
	}
	got, _ := f.counts(other, engine.RunFilter{})
	assert.Equal(t, map[string]int64{"queued": 0, "running": 0, "completed": 1, "failed": 0, "cancelled": 0}, got)
	got, _ = f.counts(other, engine.RunFilter{WorkflowID: &f.w1})
	assert.Equal(t, map[string]int64{"queued": 0, "running": 0, "completed": 0, "failed": 0, "cancelled": 0}, got)
}

// TestDroppedMonthsLeaveTheRollupsTrue: when a month of runs is dropped
// (retention), its statistics stay and the counts stop counting its runs.
func TestDroppedMonthsLeaveTheRollupsTrue(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	old := time.Date(2026, 1, 10, 12, 0, 0, 0, time.UTC)
	if !time.Now().After(old.AddDate(0, 3, 0)) {
		t.Fatal("the test needs a month at least two months old")
	}
	_, err := f.env.Owner(t).Exec(ctx, `CREATE TABLE workflow_runs_202601 PARTITION OF workflow_runs
		FOR VALUES FROM (composer_uuid_floor('2026-01-01Z')) TO (composer_uuid_floor('2026-02-01Z'))`)
	require.NoError(t, err)
	f.base = old
	f.run(f.tenant, f.w1, 0, time.Second, "completed")
	f.run(f.tenant, f.w1, time.Minute, 2*time.Second, "failed")
	f.base = time.Now().UTC().Truncate(time.Hour).Add(-6 * time.Hour)
	f.seed()
	folder := &stats.Folder{DB: f.db, Step: 31 * 24 * time.Hour}
	_, err = folder.Fold(ctx)
	require.NoError(t, err)
	got, _ := f.counts(f.tenant, engine.RunFilter{})
	assert.Equal(t, map[string]int64{"queued": 0, "running": 1, "completed": 4, "failed": 3, "cancelled": 1}, got)

	var dropped int
	require.NoError(t, f.env.System.QueryRow(ctx, `SELECT composer_drop_partitions(1)`).Scan(&dropped))
	require.Positive(t, dropped)
	_, err = folder.Fold(ctx)
	require.NoError(t, err)
	got, live := f.counts(f.tenant, engine.RunFilter{})
	assert.Equal(t, live["completed"], got["completed"])
	assert.Equal(t, map[string]int64{"queued": 0, "running": 1, "completed": 3, "failed": 2, "cancelled": 1}, got, "the dropped runs are not counted")
	st, err := f.stats(f.tenant, nil, old.Truncate(24*time.Hour), old.Truncate(24*time.Hour).Add(24*time.Hour), stats.Day)
	require.NoError(t, err)
	assert.Equal(t, []int64{2, 1, 1}, []int64{st.Buckets[0].Started, st.Buckets[0].Completed, st.Buckets[0].Failed}, "January's statistics stay")
}
