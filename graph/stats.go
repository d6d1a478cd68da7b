package graph

import (
	"context"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/graph/model"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/stats"
)

var statsIntervals = map[model.StatsInterval]stats.Interval{
	model.StatsIntervalMinute: stats.Minute,
	model.StatsIntervalHour:   stats.Hour,
	model.StatsIntervalDay:    stats.Day,
}

// runStats reads dashboard statistics (runs:read); a workflow that is not
// the tenant's is NOT_FOUND.
func (r *Resolver) runStats(ctx context.Context, wf *uuid.UUID, from, to time.Time, interval model.StatsInterval) (*model.RunStats, error) {
	iv, ok := statsIntervals[interval]
	if !ok {
		return nil, errs.E(errs.Invalid, "unknown interval")
	}
	var st stats.RunStats
	err := r.inTenant(ctx, auth.ActionRunsRead, func(ctx context.Context, tx *pg.Tx) error {
		if wf != nil {
			if _, err := engine.GetWorkflow(ctx, tx, *wf); err != nil {
				return err
			}
		}
		var err error
		st, err = stats.Runs(ctx, tx, wf, from, to, iv)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := &model.RunStats{WorkflowID: st.WorkflowID, Interval: interval, From: st.From, To: st.To,
		Buckets: make([]model.RunStatsBucket, len(st.Buckets))}
	for i, b := range st.Buckets {
		out.Buckets[i] = model.RunStatsBucket{Start: b.Start, Started: int(b.Started), Completed: int(b.Completed),
			Failed: int(b.Failed), Cancelled: int(b.Cancelled), P50Ms: b.P50Ms, P95Ms: b.P95Ms, FailureRate: b.FailureRate}
	}
	return out, nil
}

// runCounts counts the tenant's runs by status (runs:read).
func (r *Resolver) runCounts(ctx context.Context, filter *model.RunFilter) ([]model.RunStatusCount, error) {
	f, err := runFilterArg(filter)
	if err != nil {
		return nil, err
	}
	f.Statuses = nil
	var counts map[string]int64
	err = r.inTenant(ctx, auth.ActionRunsRead, func(ctx context.Context, tx *pg.Tx) error {
		counts, err = stats.Counts(ctx, tx, f)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make([]model.RunStatusCount, len(stats.Statuses))
	for i, s := range stats.Statuses {
		out[i] = model.RunStatusCount{Status: model.RunStatus(strings.ToUpper(s)), Count: int(counts[s])}
	}
	return out, nil
}
