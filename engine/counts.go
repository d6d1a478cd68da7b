package engine

import (
	"context"
	"fmt"
	"math"

	"github.com/composer-dev/composer/internal/pg"
)

// CountRuns counts the runs ListRuns would list for f, by status (f's
// statuses are ignored), reading every matching run's index entry: its
// cost grows with the runs matched, so package stats serves the unfiltered
// and time-bounded counts from its rollups and uses this for metadata and
// idempotency-key filters (whose index ranges are as narrow as they match).
func CountRuns(ctx context.Context, tx *pg.Tx, f RunFilter) (map[string]int64, error) {
	f.Statuses = nil
	if err := checkRunFilter(f); err != nil {
		return nil, err
	}
	q, args := runsQuery(tx.Tenant, f, math.MaxInt32-1, nil, "r.status")
	rows, err := tx.Query(ctx, `SELECT status, count(*) FROM (`+q+`) c GROUP BY status`, args...)
	if err != nil {
		return nil, fmt.Errorf("count runs: %w", err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var s string
		var n int64
		if err := rows.Scan(&s, &n); err != nil {
			return nil, fmt.Errorf("count runs: %w", err)
		}
		out[s] = n
	}
	return out, rows.Err()
}
