package stats

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/internal/lifecycle"
	"github.com/composer-dev/composer/internal/pg"
)

// Defaults of a Folder.
const (
	DefaultFoldInterval = 15 * time.Second
	// DefaultSettle is how long after a minute ends it is folded: a run's
	// created_at and finished_at are its transaction's start, visible only
	// at commit, so a minute is folded once its transactions have ended. A
	// transition open longer than this is missed by the rollups (a
	// transition takes two round trips; the request timeout is 30 s).
	DefaultSettle = time.Minute
	// DefaultFoldStep bounds the minutes one fold transaction takes on (a
	// first fold over a long history goes on in steps of an hour).
	DefaultFoldStep = time.Hour
)

// Total is the workflow id of a tenant's totals in the rollups.
var Total = uuid.Nil

// Folder folds closed minutes of runs into the rollups, on every replica:
// each fold transaction takes the watermark's row lock, so replicas fold
// one at a time, and adds the minutes after the watermark, moving it in
// the same transaction — a fold repeated, or raced, adds each minute once.
type Folder struct {
	DB  *pg.DB
	Log *zap.Logger
	// Interval between folds (DefaultFoldInterval), Settle (DefaultSettle)
	// and Step (DefaultFoldStep); zero takes the default.
	Interval, Settle, Step time.Duration
}

// Run folds every Interval until ctx ends.
func (f *Folder) Run(ctx context.Context) error {
	log := cmp.Or(f.Log, zap.NewNop())
	for {
		if _, err := f.Fold(ctx); err != nil && ctx.Err() == nil {
			log.Warn("stats fold failed", zap.Error(err))
		}
		if !lifecycle.Sleep(ctx, cmp.Or(f.Interval, DefaultFoldInterval)) {
			return ctx.Err()
		}
	}
}

// Fold folds every closed minute up to now - Settle, one step at a time,
// and returns the watermark it left.
func (f *Folder) Fold(ctx context.Context) (time.Time, error) {
	return f.FoldUntil(ctx, time.Time{})
}

// FoldUntil folds closed minutes before until (zero: now - Settle).
func (f *Folder) FoldUntil(ctx context.Context, until time.Time) (time.Time, error) {
	for {
		to, more, err := f.FoldStep(ctx, until)
		if err != nil || !more {
			return to, err
		}
	}
}

// key names one rollup row.
type key struct {
	tenant, workflow uuid.UUID
	width            int
	bucket           time.Time
}

type events struct {
	started, completed, failed, cancelled int64
	durations                             [DurationBuckets]int32
}

type census struct{ completed, failed, cancelled int64 }

// Widths are the bucket sizes of the rollups, in seconds.
var widths = []int{60, 3600, 86400}

// FoldStep folds at most one Step of minutes, up to until (or now -
// Settle when zero), and reports the watermark and whether more minutes
// are ready.
func (f *Folder) FoldStep(ctx context.Context, until time.Time) (folded time.Time, more bool, err error) {
	settle, step := cmp.Or(f.Settle, DefaultSettle), cmp.Or(f.Step, DefaultFoldStep)
	err = f.DB.WithSystem(ctx, func(ctx context.Context, tx *pg.Tx) error {
		more = false
		var wm, censusFrom *time.Time
		if err := tx.QueryRow(ctx, qLockState).Scan(&wm, &censusFrom); err != nil {
			return fmt.Errorf("rollup state: %w", err)
		}
		var now time.Time
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
			return err
		}
		limit := until
		if limit.IsZero() {
			limit = now.Add(-settle)
		}
		limit = limit.UTC().Truncate(time.Minute)
		start := time.Time{}
		if wm != nil {
			start = wm.UTC()
		} else {
			var oldest *time.Time
			if err := tx.QueryRow(ctx, qOldestRun).Scan(&oldest); err != nil {
				return fmt.Errorf("oldest run: %w", err)
			}
			if oldest == nil {
				return nil // nothing to fold yet; the first run starts it
			}
			start = oldest.UTC()
		}
		folded = start
		end := start.Add(step)
		if !end.Before(limit) {
			end = limit
		} else {
			more = true
		}
		// Months whose runs were dropped lose their census.
		var oldestPart *time.Time
		if err := tx.QueryRow(ctx, qOldestPartition).Scan(&oldestPart); err != nil {
			return fmt.Errorf("oldest partition: %w", err)
		}
		newCensusFrom := censusFrom
		if oldestPart != nil && (censusFrom == nil || oldestPart.After(*censusFrom)) {
			from := time.Unix(0, 0).UTC()
			if censusFrom != nil {
				from = *censusFrom
			}
			if _, err := tx.Exec(ctx, qClearCensus, from, *oldestPart); err != nil {
				return fmt.Errorf("clear census: %w", err)
			}
			newCensusFrom = oldestPart
		}
		if end.After(start) {
			if err := foldRange(ctx, tx, start, end); err != nil {
				return err
			}
			folded = end
		}
		if end.After(start) || newCensusFrom != censusFrom {
			if _, err := tx.Exec(ctx, qAdvance, folded, newCensusFrom); err != nil {
				return fmt.Errorf("advance watermark: %w", err)
			}
		}
		return nil
	})
	return folded, more, err
}

// foldRange adds the events of the minutes [start, end) and recomputes the
// census of the creation minutes they touched.
func foldRange(ctx context.Context, tx *pg.Tx, start, end time.Time) error {
	ev := map[key]*events{}
	add := func(tenant, wf uuid.UUID, minute time.Time, fn func(*events)) {
		for _, w := range widths {
			b := minute.Truncate(time.Duration(w) * time.Second)
			for _, id := range []uuid.UUID{wf, Total} {
				k := key{tenant, id, w, b}
				e := ev[k]
				if e == nil {
					e = &events{}
					ev[k] = e
				}
				fn(e)
			}
		}
	}
	rows, err := tx.Query(ctx, qFoldStarted, start, end)
	if err != nil {
		return fmt.Errorf("fold started: %w", err)
	}
	var tenant, wf uuid.UUID
	var minute time.Time
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&tenant, &wf, &minute, &n}, func() error {
		add(tenant, wf, minute.UTC(), func(e *events) { e.started += n })
		return nil
	})
	if err != nil {
		return fmt.Errorf("fold started: %w", err)
	}
	rows, err = tx.Query(ctx, qFoldFinished, start, end)
	if err != nil {
		return fmt.Errorf("fold finished: %w", err)
	}
	var status string
	var bucket int
	_, err = pgx.ForEachRow(rows, []any{&tenant, &wf, &minute, &status, &bucket, &n}, func() error {
		add(tenant, wf, minute.UTC(), func(e *events) {
			switch status {
			case "completed":
				e.completed += n
			case "failed":
				e.failed += n
			case "cancelled":
				e.cancelled += n
			}
			e.durations[bucket] += int32(n)
		})
		return nil
	})
	if err != nil {
		return fmt.Errorf("fold finished: %w", err)
	}
	b := &pgx.Batch{}
	for k, e := range ev {
		b.Queue(qAddEvents, k.tenant, k.workflow, k.width, k.bucket, e.started, e.completed, e.failed, e.cancelled, e.durations[:])
	}
	if err := sendAll(ctx, tx, b); err != nil {
		return fmt.Errorf("add events: %w", err)
	}

	// The census of every creation minute a finish or a reopen touched.
	rows, err = tx.Query(ctx, qTouched, start, end)
	if err != nil {
		return fmt.Errorf("touched minutes: %w", err)
	}
	var tenants []uuid.UUID
	var minutes []time.Time
	_, err = pgx.ForEachRow(rows, []any{&tenant, &minute}, func() error {
		tenants, minutes = append(tenants, tenant), append(minutes, minute)
		return nil
	})
	if err != nil || len(tenants) == 0 {
		return err
	}
	rows, err = tx.Query(ctx, qCensus, tenants, minutes, end)
	if err != nil {
		return fmt.Errorf("census: %w", err)
	}
	cs := map[key]*census{}
	var c census
	_, err = pgx.ForEachRow(rows, []any{&tenant, &wf, &minute, &c.completed, &c.failed, &c.cancelled}, func() error {
		for _, id := range []uuid.UUID{wf, Total} {
			k := key{tenant, id, 60, minute.UTC()}
			s := cs[k]
			if s == nil {
				s = &census{}
				cs[k] = s
			}
			s.completed, s.failed, s.cancelled = s.completed+c.completed, s.failed+c.failed, s.cancelled+c.cancelled
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("census: %w", err)
	}
	b = &pgx.Batch{}
	days := map[key]bool{}
	for k, s := range cs {
		b.Queue(qSetCensus, k.tenant, k.workflow, k.bucket, s.completed, s.failed, s.cancelled)
		days[key{k.tenant, k.workflow, 86400, k.bucket.Truncate(24 * time.Hour)}] = true
	}
	for k := range days {
		b.Queue(qSetDayCensus, k.tenant, k.workflow, k.bucket)
	}
	if err := sendAll(ctx, tx, b); err != nil {
		return fmt.Errorf("set census: %w", err)
	}
	return nil
}

// sendAll runs a batch and reports its first error.
func sendAll(ctx context.Context, tx *pg.Tx, b *pgx.Batch) error {
	if b.Len() == 0 {
		return nil
	}
	br := tx.SendBatch(ctx, b)
	for range b.Len() {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return err
		}
	}
	return br.Close()
}
