package stats_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/stats"
)

// BenchmarkDashboardStats1M seeds 1,000,000 runs over the last seven days
// in one tenant (ten workflows; 1% running, ~3% failed, 1% cancelled, the
// rest completed, durations up to 100 s and a few late finishes), folds
// them, and measures runStats and runCounts through the real GraphQL
// endpoint with a viewer's token. Each iteration asks every query once;
// p50 and p99 per query are reported in milliseconds. Run with
// -benchtime 200x (make bench does).
func BenchmarkDashboardStats1M(b *testing.B) {
	runs := 1_000_000
	if testing.Short() {
		runs = 20_000
	}
	sys := apptest.Start(b)
	ctx := context.Background()
	owner := sys.Env.Owner(b)
	var wfs []uuid.UUID
	for i := range 10 {
		wfs = append(wfs, sys.Workflow(fmt.Sprintf(`{"nodes":[{"id":"n%d","type":"noop"}]}`, i)))
	}
	now := time.Now().UTC()
	t0 := time.Now()
	tx, err := owner.Begin(ctx)
	require.NoError(b, err)
	defer tx.Rollback(ctx) // a failed seed must not keep its connection from the pool's Close
	_, err = tx.Exec(ctx, `SELECT set_config('app.tenant_id', $1, true)`, sys.Tenant.String())
	require.NoError(b, err)
	// Run g is created (7 days × g / n) after the start of the week; its
	// duration is up to 100 s, one in 500 finishes hours later.
	_, err = tx.Exec(ctx, `INSERT INTO workflow_runs (tenant_id, id, workflow_id, workflow_version, status, created_at, updated_at, finished_at)
		SELECT $1, composer_uuidv7(c), ($3::uuid[])[1 + g % 10], 1, s, c, c,
		       CASE WHEN s = 'running' THEN NULL
		            WHEN g % 500 = 0 THEN least(c + interval '3 hours', $4::timestamptz - interval '2 minutes')
		            ELSE c + make_interval(secs => (g::bigint * 7919 % 100000) / 1000.0) END
		  FROM (SELECT g, $4::timestamptz - interval '7 days' + make_interval(secs => 604680.0 * g / $2) AS c,
		               CASE WHEN g % 100 = 0 THEN 'running' WHEN g % 33 = 0 THEN 'failed' WHEN g % 101 = 0 THEN 'cancelled'
		                    ELSE 'completed' END AS s
		          FROM generate_series(1, $2) g) x`, sys.Tenant, runs, wfs, now)
	require.NoError(b, err)
	require.NoError(b, tx.Commit(ctx))
	_, err = owner.Exec(ctx, `VACUUM ANALYZE workflow_runs`)
	require.NoError(b, err)
	seed := time.Since(t0)
	t0 = time.Now()
	_, err = (&stats.Folder{DB: sys.Deps.DB, Step: 6 * time.Hour}).Fold(ctx)
	require.NoError(b, err)
	fold := time.Since(t0)
	_, err = owner.Exec(ctx, `VACUUM ANALYZE run_rollups`)
	require.NoError(b, err)
	b.ReportMetric(seed.Seconds(), "seed_s")
	b.ReportMetric(fold.Seconds(), "fold_s")

	if os.Getenv("STATS_EXPLAIN") != "" {
		explain(b, sys, wfs[3], now)
		for name, f := range map[string]engine.RunFilter{"all": {}, "wf": {WorkflowID: &wfs[3]}} {
			var lat []time.Duration
			for range 50 {
				t := time.Now()
				err := sys.Deps.DB.WithTenant(ctx, sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
					_, err := stats.Counts(ctx, tx, f)
					return err
				})
				require.NoError(b, err)
				lat = append(lat, time.Since(t))
			}
			slices.Sort(lat)
			fmt.Println("Counts", name, "p50", lat[25], "p90", lat[45], "max", lat[49])
		}
		return
	}
	token := sys.Token(sys.Tenant, "viewer@bench", auth.RoleViewer)
	const statsQ = `query($w: ID, $from: Time!, $to: Time!, $i: StatsInterval!) { runStats(workflowId: $w, from: $from, to: $to, interval: $i) {
		buckets { start started completed failed cancelled p50Ms p95Ms failureRate } } }`
	const countsQ = `query($f: RunFilter) { runCounts(filter: $f) { status count } }`
	queries := []struct {
		name, query string
		vars        map[string]any
	}{
		{"stats_day_hour", statsQ, map[string]any{"from": now.Add(-24 * time.Hour), "to": now, "i": "HOUR"}},
		{"stats_week_hour", statsQ, map[string]any{"from": now.Add(-7 * 24 * time.Hour), "to": now, "i": "HOUR"}},
		{"stats_week_hour_wf", statsQ, map[string]any{"w": wfs[3], "from": now.Add(-7 * 24 * time.Hour), "to": now, "i": "HOUR"}},
		{"stats_week_day", statsQ, map[string]any{"from": now.Add(-7 * 24 * time.Hour), "to": now, "i": "DAY"}},
		{"counts", countsQ, map[string]any{}},
		{"counts_wf", countsQ, map[string]any{"f": map[string]any{"workflowId": wfs[3]}}},
		{"counts_3days", countsQ, map[string]any{"f": map[string]any{"createdAfter": now.Add(-71*time.Hour - 17*time.Second)}}},
	}
	lat := make([][]time.Duration, len(queries))
	// One warm-up round, checked.
	for _, q := range queries {
		res := sys.GraphQL(token, q.query, q.vars)
		require.Empty(b, res.Errors, q.name)
	}
	b.ResetTimer()
	for range b.N {
		for i, q := range queries {
			t := time.Now()
			res := sys.GraphQL(token, q.query, q.vars)
			lat[i] = append(lat[i], time.Since(t))
			if len(res.Errors) > 0 {
				b.Fatalf("%s: %v", q.name, res.Errors)
			}
		}
	}
	b.StopTimer()
	for i, q := range queries {
		l := lat[i]
		slices.Sort(l)
		pct := func(p float64) float64 {
			return float64(l[min(len(l)-1, int(p*float64(len(l))))]) / float64(time.Millisecond)
		}
		b.ReportMetric(pct(0.50), q.name+"_p50_ms")
		b.ReportMetric(pct(0.99), q.name+"_p99_ms")
	}
}

// explain prints the generic plans of the counts' statements
// (STATS_EXPLAIN=1), as the app pool's force_generic_plan runs them.
func explain(b *testing.B, sys *apptest.System, wf uuid.UUID, now time.Time) {
	ctx := context.Background()
	var wm time.Time
	require.NoError(b, sys.Env.System.QueryRow(ctx, `SELECT folded_to FROM run_rollup_state`).Scan(&wm))
	ts := func(t time.Time) string { return "'" + t.UTC().Format(time.RFC3339Nano) + "'" }
	lo, hi := time.Unix(0, 0).UTC(), time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
	ten := "'" + sys.Tenant.String() + "'"
	for _, c := range []struct{ q, types, args string }{
		{stats.QLiveCounts, "uuid, timestamptz, timestamptz, timestamptz, timestamptz, timestamptz, uuid",
			strings.Join([]string{ten, ts(lo), ts(hi), ts(lo), ts(hi), ts(wm), "'" + wf.String() + "'"}, ", ")},
		{stats.QCensusSum, "uuid, uuid, timestamptz, timestamptz, timestamptz, timestamptz, timestamptz, timestamptz",
			strings.Join([]string{ten, "'" + stats.Total.String() + "'", ts(lo), ts(lo), ts(hi), ts(hi), ts(lo), ts(hi)}, ", ")},
	} {
		err := sys.Deps.DB.WithTenant(ctx, sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = force_generic_plan"); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "PREPARE p("+c.types+") AS "+c.q); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF) EXECUTE p("+c.args+")")
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var line string
				if err := rows.Scan(&line); err != nil {
					return err
				}
				if !strings.Contains(line, "One-Time Filter") && !strings.Contains(line, "Seq Scan on workflow_runs_2027") {
					fmt.Println(line)
				}
			}
			if err := rows.Err(); err != nil {
				return err
			}
			_, err = tx.Exec(ctx, "DEALLOCATE p")
			return err
		})
		require.NoError(b, err)
		fmt.Println("----")
	}
}
