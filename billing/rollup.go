package billing

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/composer-dev/composer/internal/pg"
)

// Rollup rolls raw usage into hourly and daily totals and drops raw rows
// past retention. Every replica may run it: passes take the rollup state's
// row lock, so they run one at a time, and each pass recomputes totals
// from the raw rows (it sets them, never adds), so a pass repeated, or
// run on two replicas, leaves the same totals.
type Rollup struct {
	DB       *pg.DB
	Log      *zap.Logger
	Interval time.Duration
	// Retention is how long raw rows are kept after their hour was rolled
	// up (and, with export on, after they left).
	Retention time.Duration
}

// lateness is how far back each pass recomputes before the previous one:
// a usage row carries its transaction's start time but becomes visible at
// commit, so a row may appear this long after its timestamp.
const lateness = 10 * time.Minute

// Retention deletes at most maxRetentionBatches × retentionBatch raw rows
// per pass (5M: a pass a minute keeps up with 80,000 rows a second).
const (
	retentionBatch      = 50_000
	maxRetentionBatches = 100
)

// Run rolls up every Interval until ctx ends.
func (r *Rollup) Run(ctx context.Context) error {
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	for {
		if _, err := r.Pass(ctx); err != nil && ctx.Err() == nil {
			r.Log.Warn("usage rollup failed", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// PassStats reports one pass.
type PassStats struct {
	Hours, Days int64
	Deleted     int64
	Through     time.Time
}

// Pass runs one rollup.
func (r *Rollup) Pass(ctx context.Context) (PassStats, error) {
	var st PassStats
	err := r.DB.WithSystem(ctx, func(ctx context.Context, tx *pg.Tx) error {
		var through time.Time
		if err := tx.QueryRow(ctx, qLockRollup).Scan(&through); err != nil {
			return fmt.Errorf("rollup state: %w", err)
		}
		from := through.Add(-lateness).Truncate(time.Hour)
		tag, err := tx.Exec(ctx, qRollupHourly, from)
		if err != nil {
			return fmt.Errorf("hourly totals: %w", err)
		}
		st.Hours = tag.RowsAffected()
		tag, err = tx.Exec(ctx, qRollupDaily, from)
		if err != nil {
			return fmt.Errorf("daily totals: %w", err)
		}
		st.Days = tag.RowsAffected()
		// Raw rows go once rolled up for good (older than this pass's
		// recompute window), past retention, and settled for export (sent,
		// or never to be sent; dead rows stay for an operator to requeue).
		// In batches, until a batch comes back short or a pass's budget is
		// spent, so deletion keeps up with any write rate.
		if r.Retention > 0 {
			for range maxRetentionBatches {
				tag, err := tx.Exec(ctx, qDeleteRolledUp, from, r.Retention.Seconds(), retentionBatch)
				if err != nil {
					return fmt.Errorf("usage retention: %w", err)
				}
				st.Deleted += tag.RowsAffected()
				if tag.RowsAffected() < retentionBatch {
					break
				}
			}
		}
		return tx.QueryRow(ctx, qAdvanceRollup).Scan(&st.Through)
	})
	return st, err
}
