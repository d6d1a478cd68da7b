package schedules

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/engine/dag"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/lifecycle"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/tenants"
)

// Firer starts the fires of every tenant's schedules. It runs on every
// server replica: a pass claims due schedules across tenants (the system
// role's one statement here: FOR UPDATE SKIP LOCKED, stamping a claim, so
// replicas split the work), then handles each claimed schedule in its
// tenant's own transactions: the overlap policy, the catch-up window, the
// idempotent start through the coordinator (admitted like any start), and
// the record of the outcome, fenced by the state it was decided from.
type Firer struct {
	DB    *pg.DB
	Coord *engine.Coordinator
	// Limiter, when set, takes every fire's start from the tenant's token
	// bucket like a startRun; a fire it refuses is recorded as refused.
	Limiter *tenants.RateLimiter
	Log     *zap.Logger
	// Poll bounds how long the loop sleeps (default 1s); it wakes earlier
	// for a schedule due sooner, and at once on Wake.
	Poll time.Duration
	// Batch bounds the schedules one pass claims (default 100).
	Batch int
	// MaxFiresPerPass bounds the fires of one schedule one pass starts
	// (default 10); a longer backlog within the catch-up window is worked
	// off over the following passes, in order.
	MaxFiresPerPass int
	// Claim is how long a replica owns a schedule it claimed (default 30s):
	// if it dies, another fires the schedule that much later.
	Claim time.Duration

	once   sync.Once
	wake   chan struct{}
	limits tenants.LimitsCache
}

func (f *Firer) init() {
	f.once.Do(func() {
		f.wake = make(chan struct{}, 1)
		if f.Log == nil {
			f.Log = zap.NewNop()
		}
		if f.Poll <= 0 {
			f.Poll = time.Second
		}
		if f.Batch <= 0 {
			f.Batch = 100
		}
		if f.MaxFiresPerPass <= 0 {
			f.MaxFiresPerPass = 10
		}
		if f.Claim <= 0 {
			f.Claim = 30 * time.Second
		}
	})
}

// Wake asks the loop to look for due schedules now (after a create or
// resume in this process).
func (f *Firer) Wake() {
	f.init()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// Run fires schedules until ctx ends.
func (f *Firer) Run(ctx context.Context) error {
	f.init()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		case <-f.wake:
		}
		wait := f.Poll
		st, err := f.FireDue(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			f.Log.Warn("schedule pass failed", zap.Error(err))
		case st.More:
			wait = 0
		case !st.NextDue.IsZero():
			wait = min(wait, max(time.Until(st.NextDue), time.Millisecond))
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wait)
	}
}

// PassStats is what one pass did.
type PassStats struct {
	Claimed, Started, Skipped, Buffered, Refused, Missed int
	// More: some schedule still has due fires (the pass was bounded).
	More bool
	// NextDue is when the next schedule not claimed falls due (zero: none).
	NextDue time.Time
}

type claimed struct{ tenant, id uuid.UUID }

// FireDue runs one pass: claims due schedules and fires each.
func (f *Firer) FireDue(ctx context.Context) (PassStats, error) {
	f.init()
	var st PassStats
	rows, err := f.DB.System().Query(ctx, qClaimDue, f.Batch, f.Claim.Seconds())
	if err != nil {
		return st, fmt.Errorf("claim schedules: %w", err)
	}
	var list []claimed
	var c claimed
	if _, err := pgx.ForEachRow(rows, []any{&c.tenant, &c.id}, func() error { list = append(list, c); return nil }); err != nil {
		return st, fmt.Errorf("claim schedules: %w", err)
	}
	st.Claimed = len(list)
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		first error
	)
	sem := make(chan struct{}, 8)
	for _, c := range list {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			one, err := f.fireSchedule(ctx, c)
			mu.Lock()
			defer mu.Unlock()
			st.Started += one.Started
			st.Skipped += one.Skipped
			st.Buffered += one.Buffered
			st.Refused += one.Refused
			st.Missed += one.Missed
			st.More = st.More || one.More
			if err != nil && first == nil && ctx.Err() == nil {
				first = err
			}
		}()
	}
	wg.Wait()
	if len(list) == f.Batch {
		st.More = true
	}
	var next *time.Time
	if err := f.DB.System().QueryRow(ctx, qNextDue).Scan(&next); err != nil {
		return st, errors.Join(first, fmt.Errorf("next schedule: %w", err))
	}
	if next != nil {
		st.NextDue = *next
	}
	return st, first
}

// state is a schedule as a pass decides from it.
type state struct {
	s      Schedule
	now    time.Time
	active []uuid.UUID // runs of its recent fires still going
}

func (f *Firer) load(ctx context.Context, c claimed) (state, error) {
	var st state
	err := f.DB.WithTenant(ctx, c.tenant, func(ctx context.Context, tx *pg.Tx) error {
		s, err := get(ctx, tx, c.id, false)
		if err != nil {
			return err
		}
		now, err := dbNow(ctx, tx)
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, qActiveRuns, c.tenant, c.id)
		if err != nil {
			return fmt.Errorf("read the schedule's runs: %w", err)
		}
		active, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil {
			return fmt.Errorf("read the schedule's runs: %w", err)
		}
		st = state{s: s, now: now, active: active}
		return nil
	})
	return st, err
}

// fireSchedule handles one claimed schedule's due fires, then releases
// its claim (after a short backoff if a start failed for a reason that
// may pass, so the fire is retried soon; its key keeps it one run).
func (f *Firer) fireSchedule(ctx context.Context, c claimed) (one PassStats, err error) {
	release := (*time.Time)(nil)
	defer func() {
		if ctx.Err() != nil {
			return // the claim lapses on its own
		}
		if rerr := f.DB.WithTenant(ctx, c.tenant, func(ctx context.Context, tx *pg.Tx) error {
			_, err := tx.Exec(ctx, qReleaseClaim, c.tenant, c.id, release)
			return err
		}); rerr != nil && err == nil {
			err = fmt.Errorf("release schedule claim: %w", rerr)
		}
	}()
	st, err := f.load(ctx, c)
	if errs.KindOf(err) == errs.NotFound {
		return one, nil // deleted meanwhile
	}
	if err != nil {
		return one, err
	}
	s := &st.s
	if s.Paused {
		return one, nil
	}
	sch, err := s.Spec()
	if err != nil {
		return one, fmt.Errorf("schedule %s: %w", s.ID, err)
	}
	fires := 0
	// A buffered fire starts once nothing of the schedule runs.
	if s.BufferedFireAt != nil && len(st.active) == 0 {
		at := *s.BufferedFireAt
		ok, err := f.start(ctx, c, st, at, &one, func(o fireOutcome) advance {
			return advance{next: s.NextFireAt, buffered: nil, outcome: o}
		})
		if err != nil || !ok {
			return one, f.retryLater(err, &release)
		}
		fires++
		if st, err = f.load(ctx, c); err != nil {
			return one, err
		}
	}
	for s.NextFireAt != nil && !s.NextFireAt.After(st.now) {
		if fires == f.MaxFiresPerPass {
			one.More = true
			return one, nil
		}
		at := *s.NextFireAt
		cutoff := st.now.Add(-time.Duration(s.CatchupWindowSeconds) * time.Second)
		if at.Before(cutoff) {
			// Missed while no server fired it: not started, counted.
			missed, next := 0, at
			for !next.IsZero() && next.Before(cutoff) && missed < 1_000_000 {
				missed++
				next = sch.Next(next)
			}
			var nextPtr *time.Time
			if !next.IsZero() {
				nextPtr = &next
			}
			ok, err := f.record(ctx, c, st, advance{next: nextPtr, buffered: s.BufferedFireAt, missed: missed, lastFire: &at})
			if err != nil || !ok {
				return one, err
			}
			one.Missed += missed
			if st, err = f.load(ctx, c); err != nil {
				return one, err
			}
			continue
		}
		nextPtr := func() *time.Time {
			if n := sch.Next(at); !n.IsZero() {
				return &n
			}
			return nil
		}()
		if len(st.active) > 0 {
			switch s.Overlap {
			case OverlapSkip:
				ok, err := f.record(ctx, c, st, advance{next: nextPtr, buffered: s.BufferedFireAt,
					outcome: fireOutcome{at: at, outcome: OutcomeSkipped}})
				if err != nil || !ok {
					return one, err
				}
				one.Skipped++
				fires++
				if st, err = f.load(ctx, c); err != nil {
					return one, err
				}
				continue
			case OverlapBufferOne:
				o := fireOutcome{at: at, outcome: OutcomeBuffered}
				buffered := &at
				if s.BufferedFireAt != nil {
					o.outcome, buffered = OutcomeSkipped, s.BufferedFireAt // the buffer holds one
				}
				ok, err := f.record(ctx, c, st, advance{next: nextPtr, buffered: buffered, outcome: o})
				if err != nil || !ok {
					return one, err
				}
				if o.outcome == OutcomeBuffered {
					one.Buffered++
				} else {
					one.Skipped++
				}
				fires++
				if st, err = f.load(ctx, c); err != nil {
					return one, err
				}
				continue
			case OverlapCancelPrevious:
				for _, run := range st.active {
					if _, err := f.Coord.CancelRun(ctx, c.tenant, run, fmt.Sprintf("schedule %s fired again at %s", s.ID, at.Format(time.RFC3339))); err != nil &&
						errs.KindOf(err) != errs.NotFound {
						return one, f.retryLater(err, &release)
					}
				}
			}
		}
		ok, err := f.start(ctx, c, st, at, &one, func(o fireOutcome) advance {
			return advance{next: nextPtr, buffered: s.BufferedFireAt, outcome: o}
		})
		if err != nil || !ok {
			return one, f.retryLater(err, &release)
		}
		fires++
		if st, err = f.load(ctx, c); err != nil {
			return one, err
		}
	}
	return one, nil
}

// retryLater makes a schedule whose start failed for a reason that may
// pass due again in a few seconds, not after the whole claim.
func (f *Firer) retryLater(err error, release **time.Time) error {
	if err != nil {
		t := time.Now().Add(2 * f.Poll)
		*release = &t
	}
	return err
}

type fireOutcome struct {
	at       time.Time
	outcome  Outcome
	run      *uuid.UUID
	backfill bool
	code     string
	message  string
}

// advance is what recording a fire changes on the schedule.
type advance struct {
	next, buffered *time.Time
	outcome        fireOutcome // zero outcome: nothing to list (missed fires)
	missed         int
	lastFire       *time.Time
}

// refusal reports whether err is a fire's final answer — the start was
// refused or could never succeed — rather than a failure that may pass.
func refusal(err error) bool {
	switch errs.KindOf(err) {
	case errs.Invalid, errs.NotFound, errs.Conflict, errs.QuotaExceeded, errs.RateLimited, errs.Forbidden:
		return true
	}
	return false
}

// start starts the fire at at (admitted like any start) and records what
// became of it. ok is false when the schedule changed meanwhile.
func (f *Firer) start(ctx context.Context, c claimed, st state, at time.Time, one *PassStats, adv func(fireOutcome) advance) (bool, error) {
	s := st.s
	o := fireOutcome{at: at}
	started, err := f.admitAndStart(ctx, c.tenant, s, at)
	switch {
	case err == nil:
		o.outcome, o.run = OutcomeStarted, &started.RunID
	case refusal(err):
		o.outcome, o.code, o.message = OutcomeRefused, string(errs.KindOf(err)), truncate(errs.PublicMessage(err), 1000)
	default:
		return false, fmt.Errorf("start schedule %s's fire at %s: %w", s.ID, at.Format(time.RFC3339), err)
	}
	ok, err := f.record(ctx, c, st, adv(o))
	if err != nil || !ok {
		return ok, err
	}
	if o.outcome == OutcomeStarted {
		one.Started++
	} else {
		one.Refused++
	}
	return true, nil
}

func (f *Firer) admitAndStart(ctx context.Context, tenant uuid.UUID, s Schedule, at time.Time) (engine.Started, error) {
	if f.Limiter != nil {
		l, err := f.limits.Get(ctx, f.DB, tenant)
		if err != nil {
			return engine.Started{}, err
		}
		wait, err := f.Limiter.Allow(ctx, tenant, l.StartsPerSecond, l.StartBurst)
		if err != nil {
			f.Log.Warn("rate limiter unavailable; admitting the fire", zap.Error(err))
		} else if wait > 0 {
			return engine.Started{}, &errs.Error{Kind: errs.RateLimited, RetryAfter: wait,
				Message: fmt.Sprintf("run starts are limited to %g per second (burst %d)", l.StartsPerSecond, l.StartBurst)}
		}
	}
	// A fire is started by the schedule, not by whoever wrote it.
	ctx = engine.WithActor(ctx, dag.Principal{Kind: dag.PrincipalSchedule, ID: s.ID.String()})
	return f.Coord.StartRun(ctx, tenant, startRequest(s, at))
}

func startRequest(s Schedule, at time.Time) engine.StartRun {
	return engine.StartRun{WorkflowID: s.WorkflowID, Version: s.WorkflowVersion, Input: s.Input,
		Metadata: s.MetadataMap(), IdempotencyKey: IdempotencyKey(s.ID, at), Priority: s.Priority}
}

// record writes a fire's outcome and moves the schedule on, if it is
// still as st saw it; ok is false when it changed meanwhile.
func (f *Firer) record(ctx context.Context, c claimed, st state, a advance) (ok bool, err error) {
	s := st.s
	err = f.DB.WithTenant(ctx, c.tenant, func(ctx context.Context, tx *pg.Tx) error {
		var outcome, lastErr *string
		var started, skipped, refused int
		o := a.outcome
		if o.outcome != "" {
			x := string(o.outcome)
			outcome = &x
			if o.message != "" {
				m := o.code + ": " + o.message
				lastErr = &m
			}
			switch o.outcome {
			case OutcomeStarted:
				started = 1
			case OutcomeSkipped:
				skipped = 1
			case OutcomeRefused:
				refused = 1
			}
			a.lastFire = &o.at
		} else if a.missed > 0 {
			x := string(OutcomeMissed)
			outcome = &x
		}
		tag, err := tx.Exec(ctx, qAdvance, c.tenant, c.id, s.NextFireAt, s.BufferedFireAt, a.next, a.buffered,
			a.lastFire, o.run, outcome, lastErr, started, skipped, refused, a.missed)
		if err != nil {
			return fmt.Errorf("advance schedule: %w", err)
		}
		if tag.RowsAffected() == 0 {
			ok = false
			return nil
		}
		ok = true
		if o.outcome == "" {
			return nil
		}
		return recordFire(ctx, tx, c.id, o)
	})
	return ok, err
}

func recordFire(ctx context.Context, tx *pg.Tx, schedule uuid.UUID, o fireOutcome) error {
	var code, msg *string
	if o.code != "" {
		code, msg = &o.code, &o.message
	}
	if _, err := tx.Exec(ctx, qRecordFire, tx.Tenant, schedule, o.at, o.run, string(o.outcome), o.backfill, code, msg); err != nil {
		return fmt.Errorf("record fire: %w", err)
	}
	if _, err := tx.Exec(ctx, qTrimFires, tx.Tenant, schedule); err != nil {
		return fmt.Errorf("trim fires: %w", err)
	}
	return nil
}

// Backfill starts the schedule's fire times in [from, to) — at most
// MaxBackfill of them, and none in the future — as if they had fired then:
// each is the same idempotent start a fire at that time is (a time the
// schedule already fired is not started again), admitted like any start,
// regardless of the overlap policy and the catch-up window, and listed in
// the schedule's fires. A range holding more fires is refused whole.
func (f *Firer) Backfill(ctx context.Context, tenant, id uuid.UUID, from, to time.Time) ([]Fire, error) {
	f.init()
	var s Schedule
	var now time.Time
	err := f.DB.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		if s, err = get(ctx, tx, id, false); err != nil {
			return err
		}
		now, err = dbNow(ctx, tx)
		return err
	})
	if err != nil {
		return nil, err
	}
	if !from.Before(to) {
		return nil, invalid("to", "must be after from")
	}
	if to.After(now) {
		return nil, invalid("to", "must not be in the future (the schedule fires those itself)")
	}
	sch, err := s.Spec()
	if err != nil {
		return nil, err
	}
	times, more := sch.Between(from, to, MaxBackfill)
	if more {
		return nil, invalid("to", "the range holds more than %d fires; backfill it in parts", MaxBackfill)
	}
	out := make([]Fire, 0, len(times))
	for _, at := range times {
		o := fireOutcome{at: at, backfill: true}
		started, err := f.admitAndStart(ctx, tenant, s, at)
		switch {
		case err == nil:
			o.outcome, o.run = OutcomeStarted, &started.RunID
		case refusal(err):
			o.outcome, o.code, o.message = OutcomeRefused, string(errs.KindOf(err)), truncate(errs.PublicMessage(err), 1000)
		default:
			return out, err
		}
		err = f.DB.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
			st, rf := 0, 0
			if o.outcome == OutcomeStarted {
				st = 1
			} else {
				rf = 1
			}
			if _, err := tx.Exec(ctx, qCountBackfill, tenant, id, st, rf); err != nil {
				return fmt.Errorf("count backfill: %w", err)
			}
			return recordFire(ctx, tx, id, o)
		})
		if err != nil {
			return out, err
		}
		fire := Fire{FireAt: at, RunID: o.run, Outcome: o.outcome, Backfill: true, RecordedAt: now}
		if o.code != "" {
			fire.ErrorCode, fire.ErrorMessage = &o.code, &o.message
		}
		out = append(out, fire)
	}
	return out, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	r := []rune(s[:n])
	return string(r[:len(r)-1])
}

var _ lifecycle.Service = (*Firer)(nil)
