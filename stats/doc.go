// Package stats answers the dashboard's questions about runs — how many
// started, completed, failed and were cancelled per minute, hour or day,
// how long they took (p50, p95), and how many runs have each status —
// without scanning the runs: from rollups folded asynchronously out of the
// runs table, plus the few minutes since the last fold read live.
//
// A [Folder] runs on every replica; its folds are serialised by the
// watermark's row lock and each adds a minute exactly once. [Runs] and
// [Counts] run in the caller's tenant transaction (row-level security):
//
//	err := db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
//		st, err := stats.Runs(ctx, tx, nil, time.Now().Add(-24*time.Hour), time.Now(), stats.Hour)
//		...
//	})
//
// Percentiles come from fixed log-spaced histograms and are within
// [MaxRelativeError] (9.05%) of the true value; counts are exact.
package stats
