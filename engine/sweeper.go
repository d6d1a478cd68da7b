package engine

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/audit"
	"github.com/composer-dev/composer/internal/config"
	"github.com/composer-dev/composer/internal/pg"
)

// SweeperConfig configures the recovery loops. Zero fields take defaults.
type SweeperConfig struct {
	// Interval is how often the lease and dispatch sweeps run (default 5s).
	Interval time.Duration
	// LostDispatchAge is how long a pending task must have been waiting,
	// with no outbox row, before the sweep asks whether its message still
	// exists (default 10s); one whose message is gone is dispatched again.
	LostDispatchAge time.Duration
	// StillQueued reports whether a message of each task is still in the
	// tenant's streams (stream.Names.StillQueued). Without it every
	// candidate counts as lost (tests of the sweep alone).
	StillQueued func(ctx context.Context, tenant uuid.UUID, tasks []uuid.UUID) ([]bool, error)
	// CheckBatch bounds the waiting tasks one sweep checks (default 5000);
	// a longer backlog is checked over several sweeps, in dispatch order.
	CheckBatch int
	// TimerPoll bounds how long the timer loop sleeps (default 1s); it
	// wakes earlier for a timer due sooner.
	TimerPoll time.Duration
	// Batch bounds the rows one sweep statement takes (default 500).
	Batch int
	// RetentionMonths, when positive, drops whole months of run data older
	// than this many months, once a day.
	RetentionMonths int
	// AuditKeys mark the audit log's retention cuts (audit.Prune); without
	// them the audit log is not pruned.
	AuditKeys *audit.Keyring
}

func (c *SweeperConfig) defaults() {
	if c.Interval <= 0 {
		c.Interval = config.DefaultSweepInterval
	}
	if c.LostDispatchAge <= 0 {
		c.LostDispatchAge = config.DefaultLostDispatchAge
	}
	if c.CheckBatch <= 0 {
		c.CheckBatch = 5000
	}
	if c.TimerPoll <= 0 {
		c.TimerPoll = time.Second
	}
	if c.Batch <= 0 {
		c.Batch = 500
	}
}

// Sweeper recovers what was lost and fires what is due. Every statement is
// safe on every replica at once: claims use SKIP LOCKED, and the state
// machine ignores a timer or report that is no longer relevant.
type Sweeper struct {
	c    *Coordinator
	db   *pg.DB
	cfg  SweeperConfig
	log  *zap.Logger
	wake chan struct{}

	id string // marks the expired leases this sweeper claimed

	failMu   sync.Mutex
	failures map[int64]int // timer id -> consecutive failed fires here

	// cursor is where the lost-dispatch check of a backlog longer than
	// CheckBatch goes on (the zero value: from the oldest).
	cursor lostCursor
}

type lostCursor struct {
	at         time.Time
	tenant, id uuid.UUID
}

// NewSweeper returns a sweeper driving events through c.
func NewSweeper(c *Coordinator, db *pg.DB, cfg SweeperConfig, log *zap.Logger) *Sweeper {
	cfg.defaults()
	if log == nil {
		log = zap.NewNop()
	}
	return &Sweeper{c: c, db: db, cfg: cfg, log: log, wake: make(chan struct{}, 1), id: "!sweep:" + uuid.NewString()}
}

// WakeTimers asks the timer loop to look for due timers now.
func (s *Sweeper) WakeTimers() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Run runs the sweeps, the timer loop and partition maintenance until ctx
// ends.
func (s *Sweeper) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); s.sweepLoop(ctx) }()
	go func() { defer wg.Done(); s.timerLoop(ctx) }()
	go func() { defer wg.Done(); s.maintenanceLoop(ctx) }()
	wg.Wait()
	return ctx.Err()
}

func (s *Sweeper) sweepLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		if st, err := s.SweepOnce(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("sweep failed", zap.Error(err))
		} else if int64(st.Expired)+st.Redispatched > 0 {
			s.log.Info("sweep recovered tasks", zap.Int("expired_leases", st.Expired), zap.Int64("lost_dispatches", st.Redispatched))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// SweepStats counts what one sweep recovered.
type SweepStats struct {
	Expired      int   // expired leases applied as events (retried, or the node failed)
	Redispatched int64 // pending tasks whose message was lost, dispatched again
}

// SweepOnce runs the expired-lease and lost-dispatch sweeps once.
func (s *Sweeper) SweepOnce(ctx context.Context) (SweepStats, error) {
	var st SweepStats
	var err error
	// A mass expiry (a fleet of workers gone) drains at the engine's
	// transition rate, not one batch per interval.
	for {
		n, full, err := s.expireLeases(ctx)
		st.Expired += n
		if err != nil {
			return st, err
		}
		if !full || n == 0 || ctx.Err() != nil {
			break
		}
	}
	if st.Redispatched, err = s.redispatchLost(ctx); err != nil {
		return st, err
	}
	if st.Redispatched > 0 && s.c.opts.Wake != nil {
		s.c.opts.Wake()
	}
	return st, nil
}

// expireLeases finds running attempts whose lease expired and applies
// each as a LeaseExpired event through the coordinator, eight runs at a
// time: the state machine decides — a retry with the node's backoff and
// schedule-to-start timer, or on the last attempt the node's failure —
// and the change commits with its timeline entry, hooks and live update
// like every other. The new attempt number fences the old holder: if it
// was only paused, its late report no longer matches. Replicas sweeping at
// once may pick the same lease; the second application is ignored.
func (s *Sweeper) expireLeases(ctx context.Context) (applied int, full bool, err error) {
	// Claim them first (lease_owner becomes this sweeper's, which no
	// worker id can be), so replicas sweeping at once split the work
	// instead of each applying every lease. A claim older than two
	// intervals (its sweeper died) may be taken again.
	rows, err := s.db.System().Query(ctx, qClaimExpiredLeases, s.cfg.Batch, s.id, (2 * s.cfg.Interval).Seconds())
	if err != nil {
		return 0, false, fmt.Errorf("find expired leases: %w", err)
	}
	type expired struct {
		tenant uuid.UUID
		lease  ExpiredLease
	}
	var list []expired
	var e expired
	if _, err := pgx.ForEachRow(rows, []any{&e.tenant, &e.lease.RunID, &e.lease.TaskID, &e.lease.NodeID, &e.lease.Attempt},
		func() error { list = append(list, e); return nil }); err != nil {
		return 0, false, fmt.Errorf("find expired leases: %w", err)
	}
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	sem := make(chan struct{}, 8)
	for _, e := range list {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ack, err := s.c.ExpireLease(ctx, e.tenant, e.lease)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil && first == nil:
				first = fmt.Errorf("apply an expired lease: %w", err)
			case err == nil && !ack.Ignored:
				applied++
			}
		}()
	}
	wg.Wait()
	return applied, len(list) == s.cfg.Batch, first
}

// redispatchLost dispatches again every pending task of a running run
// whose message is gone: Redis lost its data (restarted without
// persistence, failed over before replicating) or a message was dropped
// by mistake. A task that merely waits — behind a backlog, or for a
// tenant at its running quota — still has its message, and is left
// alone however long it waits: each candidate (pending, no outbox row,
// unchanged for LostDispatchAge) is looked up in its tenant's queued
// hash, which changes atomically with the streams. If Redis cannot be
// asked, nothing is re-dispatched.
func (s *Sweeper) redispatchLost(ctx context.Context) (int64, error) {
	type cand struct {
		tenant, run, id uuid.UUID
		dispatchAt      time.Time
		updatedAt       time.Time
	}
	cur := s.cursor
	rows, err := s.db.System().Query(ctx, qLostCandidates,
		s.cfg.LostDispatchAge.Seconds(), cur.at, cur.tenant, cur.id, s.cfg.CheckBatch)
	if err != nil {
		return 0, fmt.Errorf("find waiting tasks: %w", err)
	}
	var cands []cand
	var c cand
	if _, err := pgx.ForEachRow(rows, []any{&c.tenant, &c.run, &c.id, &c.dispatchAt, &c.updatedAt}, func() error {
		cands = append(cands, c)
		return nil
	}); err != nil {
		return 0, fmt.Errorf("find waiting tasks: %w", err)
	}
	if len(cands) < s.cfg.CheckBatch {
		s.cursor = lostCursor{} // the whole backlog was seen: start over next time
	} else {
		last := cands[len(cands)-1]
		s.cursor = lostCursor{at: last.dispatchAt, tenant: last.tenant, id: last.id}
	}
	if len(cands) == 0 {
		return 0, nil
	}
	lost := cands
	if s.cfg.StillQueued != nil {
		byTenant := map[uuid.UUID][]int{}
		for i, c := range cands {
			byTenant[c.tenant] = append(byTenant[c.tenant], i)
		}
		gone := make([]bool, len(cands))
		for tenant, idx := range byTenant {
			tasks := make([]uuid.UUID, len(idx))
			for j, i := range idx {
				tasks[j] = cands[i].id
			}
			queued, err := s.cfg.StillQueued(ctx, tenant, tasks)
			if err != nil {
				return 0, fmt.Errorf("ask which waiting tasks still have a message: %w", err)
			}
			for j, i := range idx {
				gone[i] = !queued[j]
			}
		}
		lost = lost[:0:0]
		for i, c := range cands {
			if gone[i] {
				lost = append(lost, c)
			}
		}
	}
	if len(lost) == 0 {
		return 0, nil
	}
	tenantIDs, runIDs, taskIDs, updated := make([]uuid.UUID, len(lost)), make([]uuid.UUID, len(lost)), make([]uuid.UUID, len(lost)), make([]time.Time, len(lost))
	for i, c := range lost {
		tenantIDs[i], runIDs[i], taskIDs[i], updated[i] = c.tenant, c.run, c.id, c.updatedAt
	}
	// Only a task unchanged since it was read is re-dispatched: one leased,
	// retried or dispatched meanwhile is not lost.
	var n int64
	err = s.db.System().QueryRow(ctx, qRedispatchLost, tenantIDs, runIDs, taskIDs, updated).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("redispatch lost tasks: %w", err)
	}
	return n, nil
}

func (s *Sweeper) timerLoop(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-s.wake:
		}
		next, err := s.FireDueTimers(ctx)
		if err != nil && ctx.Err() == nil {
			s.log.Warn("timers failed", zap.Error(err))
		}
		wait := s.cfg.TimerPoll
		if !next.IsZero() {
			wait = min(wait, max(time.Until(next), time.Millisecond))
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

// timerClaim is how long a replica owns the due timers it claimed: two
// sweep intervals, so if it dies another fires them that much later. A
// timer whose firing failed is released sooner (retryTimer).
func (s *Sweeper) timerClaim() time.Duration { return 2 * s.cfg.Interval }

// retryTimer makes a timer whose firing failed due again soon: after a
// backoff that grows with its consecutive failures on this replica
// (from TimerPoll up to the claim), not after the whole claim.
func (s *Sweeper) retryTimer(ctx context.Context, tenant uuid.UUID, id int64) {
	s.failMu.Lock()
	if s.failures == nil || len(s.failures) > 10_000 {
		s.failures = map[int64]int{}
	}
	s.failures[id]++
	n := s.failures[id]
	s.failMu.Unlock()
	delay := min(s.cfg.TimerPoll<<min(n-1, 10), s.timerClaim())
	if _, err := s.db.System().Exec(ctx, qRetryTimerSoon, tenant, id, delay.Seconds()); err != nil {
		return // the claim lapses on its own
	}
	s.WakeTimers()
}

func (s *Sweeper) timerFired(id int64) {
	s.failMu.Lock()
	delete(s.failures, id)
	s.failMu.Unlock()
}

// FireDueTimers claims due timers and fires each through the coordinator,
// which deletes the timer in the transition's transaction. It returns when
// the next unclaimed timer falls due (zero when there is none).
func (s *Sweeper) FireDueTimers(ctx context.Context) (time.Time, error) {
	for {
		rows, err := s.db.System().Query(ctx, qClaimDueTimers, s.cfg.Batch, s.timerClaim().Seconds())
		if err != nil {
			return time.Time{}, fmt.Errorf("claim timers: %w", err)
		}
		type due struct {
			tenant, run uuid.UUID
			id          int64
			kind        string
			detail      []byte
		}
		var list []due
		var d due
		if _, err := pgx.ForEachRow(rows, []any{&d.tenant, &d.run, &d.id, &d.kind, &d.detail}, func() error { list = append(list, d); return nil }); err != nil {
			return time.Time{}, fmt.Errorf("claim timers: %w", err)
		}
		sem := make(chan struct{}, 8)
		var wg sync.WaitGroup
		for _, d := range list {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				var err error
				if d.kind == timerConcurrencyRelease {
					err = s.c.ReleaseConcurrency(ctx, d.tenant, d.id, d.detail)
				} else {
					_, err = s.c.FireTimer(ctx, d.tenant, d.run, d.id)
				}
				switch {
				case err == nil:
					s.timerFired(d.id)
				case ctx.Err() == nil:
					s.log.Warn("timer failed; it is retried shortly", zap.Int64("timer_id", d.id),
						zap.Stringer("run_id", d.run), zap.Error(err))
					s.retryTimer(ctx, d.tenant, d.id)
				}
			}()
		}
		wg.Wait()
		if len(list) < s.cfg.Batch {
			break
		}
	}
	var next *time.Time
	if err := s.db.System().QueryRow(ctx, qNextTimer).Scan(&next); err != nil {
		return time.Time{}, fmt.Errorf("next timer: %w", err)
	}
	if next == nil {
		return time.Time{}, nil
	}
	return *next, nil
}

func (s *Sweeper) maintenanceLoop(ctx context.Context) {
	for {
		if err := s.Maintain(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("partition maintenance failed", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(12 * time.Hour):
		}
	}
}

// Maintain creates the partitions of the coming months and, with a
// retention setting, drops whole months that left it; it deletes audit
// records past their tenant's plan's retention.
func (s *Sweeper) Maintain(ctx context.Context) error {
	var made, dropped int
	if err := s.db.System().QueryRow(ctx, qEnsurePartitions).Scan(&made); err != nil {
		return fmt.Errorf("ensure partitions: %w", err)
	}
	if s.cfg.RetentionMonths > 0 {
		if err := s.db.System().QueryRow(ctx, qDropPartitions, s.cfg.RetentionMonths).Scan(&dropped); err != nil {
			return fmt.Errorf("drop partitions: %w", err)
		}
		// Idempotency keys and published events (with what they did, by
		// cascade) live outside the partitions; they go with the runs they
		// named, in bounded batches.
		for what, q := range map[string]string{"idempotency keys": qDropOldIdempotencyKeys, "events": qDropOldEvents} {
			for {
				tag, err := s.db.System().Exec(ctx, q, s.cfg.RetentionMonths)
				if err != nil {
					return fmt.Errorf("expire %s: %w", what, err)
				}
				if tag.RowsAffected() < 10000 {
					break
				}
			}
		}
	}
	// Audit records past their plan's retention, oldest first (each
	// tenant's kept records stay a contiguous tail of its chain).
	if s.cfg.AuditKeys != nil {
		if _, err := audit.Prune(ctx, s.db, s.cfg.AuditKeys); err != nil {
			return err
		}
	}
	if made+dropped > 0 {
		s.log.Info("partitions maintained", zap.Int("created", made), zap.Int("dropped", dropped))
	}
	return nil
}
