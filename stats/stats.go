package stats

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
)

// MaxBuckets bounds the buckets of one Runs answer.
const MaxBuckets = 500

// Interval is a bucket size.
type Interval time.Duration

// The intervals of the API.
const (
	Minute = Interval(time.Minute)
	Hour   = Interval(time.Hour)
	Day    = Interval(24 * time.Hour)
)

// Bucket is the statistics of one time bucket.
type Bucket struct {
	Start                                 time.Time
	Started, Completed, Failed, Cancelled int64
	// P50Ms and P95Ms estimate the duration percentiles of the runs that
	// finished in the bucket (within MaxRelativeError); nil when none did.
	P50Ms, P95Ms *float64
	// FailureRate is Failed / (Completed + Failed), 0 when neither.
	FailureRate float64
}

// RunStats is the statistics of [From, To) in buckets of Interval.
type RunStats struct {
	WorkflowID *uuid.UUID
	Interval   Interval
	From, To   time.Time
	Buckets    []Bucket
}

// Runs reads the run statistics of the transaction's tenant (one workflow,
// or all with wf nil) over [from, to), rounded out to whole buckets of
// interval aligned in UTC: the rollups of the folded minutes plus the runs
// table since the watermark (at most a few minutes of runs).
func Runs(ctx context.Context, tx *pg.Tx, wf *uuid.UUID, from, to time.Time, interval Interval) (RunStats, error) {
	width := time.Duration(interval)
	if width != time.Minute && width != time.Hour && width != 24*time.Hour {
		return RunStats{}, errs.E(errs.Invalid, "unknown interval")
	}
	if !from.Before(to) {
		return RunStats{}, errs.E(errs.Invalid, "from must be before to")
	}
	f, t := from.UTC().Truncate(width), to.UTC().Truncate(width)
	if t.Before(to) {
		t = t.Add(width)
	}
	if f.Year() < 1970 || t.Year() > 9999 {
		return RunStats{}, errs.E(errs.Invalid, "from and to must lie between 1970 and 9999")
	}
	n := int(t.Sub(f) / width)
	if n > MaxBuckets {
		return RunStats{}, errs.E(errs.Invalid, "%d buckets asked for; at most %d (a longer interval, or a shorter range)", n, MaxBuckets)
	}
	out := RunStats{WorkflowID: wf, Interval: interval, From: f, To: t, Buckets: make([]Bucket, n)}
	hists := make([]histogram, n)
	index := func(at time.Time) int { return int(at.UTC().Sub(f) / width) }
	id := Total
	if wf != nil {
		id = *wf
	}
	rows, err := tx.Query(ctx, qRollupRows, tx.Tenant, id, int(width/time.Second), f, t)
	if err != nil {
		return RunStats{}, fmt.Errorf("run stats: %w", err)
	}
	var wm, at *time.Time
	var started, completed, failed, cancelled *int64
	var durations []int32
	_, err = pgx.ForEachRow(rows, []any{&wm, &at, &started, &completed, &failed, &cancelled, &durations}, func() error {
		if at == nil {
			return nil
		}
		i := index(*at)
		if i < 0 || i >= n {
			return nil
		}
		b := &out.Buckets[i]
		b.Started += *started
		b.Completed += *completed
		b.Failed += *failed
		b.Cancelled += *cancelled
		hists[i].addArray(durations)
		return nil
	})
	if err != nil {
		return RunStats{}, fmt.Errorf("run stats: %w", err)
	}
	// The live tail: every minute from the watermark on.
	tail := f
	if wm != nil && wm.After(tail) {
		tail = *wm
	}
	if tail.Before(t) {
		var m time.Time
		var c int64
		rows, err := tx.Query(ctx, qTailStarted, tx.Tenant, tail, t, wf)
		if err != nil {
			return RunStats{}, fmt.Errorf("run stats tail: %w", err)
		}
		_, err = pgx.ForEachRow(rows, []any{&m, &c}, func() error {
			if i := index(m); i >= 0 && i < n {
				out.Buckets[i].Started += c
			}
			return nil
		})
		if err != nil {
			return RunStats{}, fmt.Errorf("run stats tail: %w", err)
		}
		var status string
		var hb int
		rows, err = tx.Query(ctx, qTailFinished, tx.Tenant, tail, t, wf)
		if err != nil {
			return RunStats{}, fmt.Errorf("run stats tail: %w", err)
		}
		_, err = pgx.ForEachRow(rows, []any{&m, &status, &hb, &c}, func() error {
			i := index(m)
			if i < 0 || i >= n {
				return nil
			}
			b := &out.Buckets[i]
			switch status {
			case "completed":
				b.Completed += c
			case "failed":
				b.Failed += c
			case "cancelled":
				b.Cancelled += c
			}
			hists[i][hb] += c
			return nil
		})
		if err != nil {
			return RunStats{}, fmt.Errorf("run stats tail: %w", err)
		}
	}
	for i := range out.Buckets {
		b := &out.Buckets[i]
		b.Start = f.Add(time.Duration(i) * width)
		if p, ok := hists[i].quantile(0.5); ok {
			b.P50Ms = &p
		}
		if p, ok := hists[i].quantile(0.95); ok {
			b.P95Ms = &p
		}
		if b.Completed+b.Failed > 0 {
			b.FailureRate = float64(b.Failed) / float64(b.Completed+b.Failed)
		}
	}
	return out, nil
}

// Statuses lists every run status, in the order Counts answers them.
var Statuses = []string{"queued", "running", "completed", "failed", "cancelled"}

var (
	minTime = time.Unix(0, 0).UTC()
	maxTime = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
)

// Counts counts the transaction's tenant's runs by status for the runs f
// matches (its statuses are ignored), every status included. Without a
// metadata or idempotency-key filter it reads the census of the rollups
// (per creation minute and day) and only what the census cannot know live:
// queued and running runs, runs finished since the watermark, and the
// sub-minute edges of a created range. With one, it counts the matching
// runs themselves (engine.CountRuns).
func Counts(ctx context.Context, tx *pg.Tx, f engine.RunFilter) (map[string]int64, error) {
	out := map[string]int64{}
	for _, s := range Statuses {
		out[s] = 0
	}
	if len(f.Metadata) > 0 || f.IdempotencyKey != nil {
		live, err := engine.CountRuns(ctx, tx, f)
		if err != nil {
			return nil, err
		}
		for s, n := range live {
			out[s] += n
		}
		return out, nil
	}
	lo, hi := minTime, maxTime
	if f.CreatedAfter != nil && f.CreatedAfter.After(lo) {
		lo = f.CreatedAfter.UTC()
	}
	if f.CreatedBefore != nil && f.CreatedBefore.Before(hi) {
		hi = f.CreatedBefore.UTC()
	}
	if !lo.Before(hi) {
		return out, nil
	}
	// Run ids carry milliseconds: the edges are whole milliseconds as
	// ListRuns' id bounds are.
	lo, hi = lo.Truncate(time.Millisecond), hi.Truncate(time.Millisecond)
	// [a1, b1) is the whole minutes of [lo, hi), [d1, d2) the whole days.
	a1, b1 := lo.Truncate(time.Minute), hi.Truncate(time.Minute)
	if a1.Before(lo) {
		a1 = a1.Add(time.Minute)
	}
	if b1.Before(a1) {
		b1 = a1
	}
	day := 24 * time.Hour
	d1, d2 := a1.Truncate(day), b1.Truncate(day)
	if d1.Before(a1) {
		d1 = d1.Add(day)
	}
	m1, m2, m3, m4 := a1, b1, b1, b1 // minute ranges [m1, m2) and [m3, m4)
	if d1.Before(d2) {
		m2, m3 = d1, d2
	} else {
		d1, d2 = a1, a1
	}
	id := Total
	if f.WorkflowID != nil {
		id = *f.WorkflowID
	}
	var wm *time.Time
	var c census
	err := tx.QueryRow(ctx, qCensusSum, tx.Tenant, id, m1, m2, m3, m4, d1, d2).Scan(&wm, &c.completed, &c.failed, &c.cancelled)
	if err != nil {
		return nil, fmt.Errorf("run counts: %w", err)
	}
	out["completed"], out["failed"], out["cancelled"] = c.completed, c.failed, c.cancelled
	since := minTime
	if wm != nil {
		since = *wm
	}
	rows, err := tx.Query(ctx, qLiveCounts, tx.Tenant, lo, hi, a1, b1, since, f.WorkflowID)
	if err != nil {
		return nil, fmt.Errorf("run counts: %w", err)
	}
	var s string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&s, &n}, func() error {
		out[s] += n
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("run counts: %w", err)
	}
	return out, nil
}
