package engine

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	sm "github.com/composer-dev/composer/engine/statemachine"
	"github.com/composer-dev/composer/tenants"
)

// SweeperConfig configures the recovery loops. Zero fields take defaults.
type SweeperConfig struct {
	// Interval is how often the lease and dispatch sweeps run (default 5s).
	Interval time.Duration
	// LostDispatchAge is how long a pending task may sit with no outbox row
	// before it is dispatched again (default 2m).
	LostDispatchAge time.Duration
	// TimerPoll bounds how long the timer loop sleeps (default 1s); it
	// wakes earlier for a timer due sooner.
	TimerPoll time.Duration
	// Batch bounds the rows one sweep statement takes (default 500).
	Batch int
	// RetentionMonths, when positive, drops whole months of run data older
	// than this many months, once a day.
	RetentionMonths int
}

func (c *SweeperConfig) defaults() {
	if c.Interval <= 0 {
		c.Interval = 5 * time.Second
	}
	if c.LostDispatchAge <= 0 {
		c.LostDispatchAge = 2 * time.Minute
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
	db   *tenants.DB
	cfg  SweeperConfig
	log  *zap.Logger
	wake chan struct{}
}

// NewSweeper returns a sweeper driving events through c.
func NewSweeper(c *Coordinator, db *tenants.DB, cfg SweeperConfig, log *zap.Logger) *Sweeper {
	cfg.defaults()
	if log == nil {
		log = zap.NewNop()
	}
	return &Sweeper{c: c, db: db, cfg: cfg, log: log, wake: make(chan struct{}, 1)}
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
		} else if st.Requeued+int64(st.Failed)+st.Redispatched > 0 {
			s.log.Info("sweep recovered tasks", zap.Int64("expired_leases_requeued", st.Requeued),
				zap.Int("expired_leases_failed", st.Failed), zap.Int64("lost_dispatches", st.Redispatched))
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
	Requeued     int64 // expired leases reset to a new attempt and re-dispatched
	Failed       int   // expired leases on their last attempt, failed through the coordinator
	Redispatched int64 // pending tasks with no message, dispatched again
}

// SweepOnce runs the expired-lease and lost-dispatch sweeps once.
func (s *Sweeper) SweepOnce(ctx context.Context) (SweepStats, error) {
	var st SweepStats
	var err error
	if st.Requeued, err = s.requeueExpired(ctx); err != nil {
		return st, err
	}
	if st.Failed, err = s.failExpiredLastAttempts(ctx); err != nil {
		return st, err
	}
	if st.Redispatched, err = s.redispatchLost(ctx); err != nil {
		return st, err
	}
	if st.Requeued+st.Redispatched > 0 && s.c.opts.Wake != nil {
		s.c.opts.Wake()
	}
	return st, nil
}

// requeueExpired resets every expired lease with attempts left to a new
// attempt and re-dispatches it, in one statement: the reset, the outbox row
// and the timeline entry commit together. The new attempt number fences the
// old holder: if it was only paused, its late report no longer matches.
func (s *Sweeper) requeueExpired(ctx context.Context) (int64, error) {
	var n int64
	err := s.db.System.QueryRow(ctx, `
		WITH expired AS (
			UPDATE task_instances t
			   SET state = 'pending', attempt = t.attempt + 1, lease_owner = NULL, lease_expires_at = NULL,
			       started_at = NULL, dispatch_at = now(), updated_at = now(),
			       last_error = jsonb_build_object('code', 'lease_expired', 'node', t.node_id,
			           'message', format('the lease of attempt %s expired: the worker stopped renewing it', t.attempt))
			  FROM workflow_runs r
			 WHERE (t.tenant_id, t.run_id, t.id) IN (
			           SELECT tenant_id, run_id, id FROM task_instances
			            WHERE state = 'running' AND lease_expires_at < now() AND attempt < max_attempts
			            LIMIT $1 FOR UPDATE SKIP LOCKED)
			   AND r.tenant_id = t.tenant_id AND r.id = t.run_id AND r.status = 'running'
			RETURNING t.tenant_id, t.run_id, t.id, t.node_id, t.node_type, t.queue, t.config->'task'->>'handler' AS handler,
			          t.attempt, r.traceparent
		), dispatched AS (
			INSERT INTO outbox (tenant_id, queue, run_id, task_id, node_id, node_type, handler, attempt, traceparent)
			SELECT tenant_id, coalesce(queue, 'default'), run_id, id, node_id, node_type, handler, attempt, traceparent FROM expired
		), timeline AS (
			INSERT INTO run_events (tenant_id, run_id, kind, node_id, task_id, attempt, detail)
			SELECT tenant_id, run_id, 'lease_expired', node_id, id, attempt - 1,
			       jsonb_build_object('status', 'running', 'actions', jsonb_build_array(
			           jsonb_build_object('kind', 'retry_task', 'node', node_id, 'attempt', attempt - 1)))
			  FROM expired
		)
		SELECT count(*) FROM expired`, s.cfg.Batch).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("requeue expired leases: %w", err)
	}
	return n, nil
}

// failExpiredLastAttempts sends each expired lease on its last attempt
// through the coordinator as a failed attempt, so the node's failure
// handling (failing the run) applies like any other failure.
func (s *Sweeper) failExpiredLastAttempts(ctx context.Context) (int, error) {
	rows, err := s.db.System.Query(ctx, `SELECT t.tenant_id, t.run_id, t.id, t.node_id, t.attempt
		  FROM task_instances t JOIN workflow_runs r ON r.tenant_id = t.tenant_id AND r.id = t.run_id
		 WHERE t.state = 'running' AND t.lease_expires_at < now() AND t.attempt >= t.max_attempts AND r.status = 'running'
		 LIMIT $1`, s.cfg.Batch)
	if err != nil {
		return 0, fmt.Errorf("find expired last attempts: %w", err)
	}
	type expired struct {
		tenant, run, task uuid.UUID
		node              string
		attempt           int
	}
	var list []expired
	var e expired
	if _, err := pgx.ForEachRow(rows, []any{&e.tenant, &e.run, &e.task, &e.node, &e.attempt}, func() error { list = append(list, e); return nil }); err != nil {
		return 0, fmt.Errorf("find expired last attempts: %w", err)
	}
	failed := 0
	for _, e := range list {
		ack, err := s.c.FailTask(ctx, e.tenant, Report{RunID: e.run, TaskID: e.task, NodeID: e.node, Attempt: e.attempt, Retryable: true,
			Error: sm.Error{Code: sm.CodeLeaseExpired, Message: fmt.Sprintf("the lease of attempt %d expired: the worker stopped renewing it", e.attempt)}})
		if err != nil {
			return failed, err
		}
		if !ack.Ignored {
			failed++
		}
	}
	return failed, nil
}

// redispatchLost dispatches again every pending task of a running run that
// has no outbox row and has not changed for LostDispatchAge: its message
// was lost (Redis restarted without persistence, a stream was trimmed). If
// the message was merely slow, the copy is a duplicate the lease drops.
func (s *Sweeper) redispatchLost(ctx context.Context) (int64, error) {
	var n int64
	err := s.db.System.QueryRow(ctx, `
		WITH lost AS (
			UPDATE task_instances t SET updated_at = now(), dispatch_at = now()
			  FROM workflow_runs r
			 WHERE (t.tenant_id, t.run_id, t.id) IN (
			           SELECT p.tenant_id, p.run_id, p.id FROM task_instances p
			            WHERE p.state = 'pending'
			              AND p.dispatch_at < now() - make_interval(secs => $2)
			              AND p.updated_at < now() - make_interval(secs => $2)
			              AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.tenant_id = p.tenant_id AND o.task_id = p.id)
			            LIMIT $1 FOR UPDATE SKIP LOCKED)
			   AND r.tenant_id = t.tenant_id AND r.id = t.run_id AND r.status = 'running'
			RETURNING t.tenant_id, t.run_id, t.id, t.node_id, t.node_type, t.queue, t.config->'task'->>'handler' AS handler,
			          t.attempt, r.traceparent
		), dispatched AS (
			INSERT INTO outbox (tenant_id, queue, run_id, task_id, node_id, node_type, handler, attempt, traceparent)
			SELECT tenant_id, coalesce(queue, 'default'), run_id, id, node_id, node_type, handler, attempt, traceparent FROM lost
		), timeline AS (
			INSERT INTO run_events (tenant_id, run_id, kind, node_id, task_id, attempt, detail)
			SELECT tenant_id, run_id, 'redispatched', node_id, id, attempt,
			       jsonb_build_object('status', 'running', 'reason', 'no message was delivered in time')
			  FROM lost
		)
		SELECT count(*) FROM lost`, s.cfg.Batch, s.cfg.LostDispatchAge.Seconds()).Scan(&n)
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

// timerClaim is how long a replica owns the due timers it claimed; if it
// dies, another fires them after this.
const timerClaim = 30 * time.Second

// FireDueTimers claims due timers and fires each through the coordinator,
// which deletes the timer in the transition's transaction. It returns when
// the next unclaimed timer falls due (zero when there is none).
func (s *Sweeper) FireDueTimers(ctx context.Context) (time.Time, error) {
	for {
		rows, err := s.db.System.Query(ctx, `UPDATE timers SET claimed_until = now() + make_interval(secs => $2)
			 WHERE (tenant_id, id) IN (
			       SELECT tenant_id, id FROM timers
			        WHERE fire_at <= now() AND (claimed_until IS NULL OR claimed_until < now())
			        ORDER BY fire_at LIMIT $1 FOR UPDATE SKIP LOCKED)
			RETURNING tenant_id, run_id, id`, s.cfg.Batch, timerClaim.Seconds())
		if err != nil {
			return time.Time{}, fmt.Errorf("claim timers: %w", err)
		}
		type due struct {
			tenant, run uuid.UUID
			id          int64
		}
		var list []due
		var d due
		if _, err := pgx.ForEachRow(rows, []any{&d.tenant, &d.run, &d.id}, func() error { list = append(list, d); return nil }); err != nil {
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
				if _, err := s.c.FireTimer(ctx, d.tenant, d.run, d.id); err != nil && ctx.Err() == nil {
					s.log.Warn("timer failed; it will fire again after its claim expires", zap.Int64("timer_id", d.id),
						zap.Stringer("run_id", d.run), zap.Error(err))
				}
			}()
		}
		wg.Wait()
		if len(list) < s.cfg.Batch {
			break
		}
	}
	var next *time.Time
	if err := s.db.System.QueryRow(ctx, `SELECT min(greatest(fire_at, coalesce(claimed_until, fire_at))) FROM timers`).Scan(&next); err != nil {
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
// retention setting, drops whole months that left it.
func (s *Sweeper) Maintain(ctx context.Context) error {
	var made, dropped int
	if err := s.db.System.QueryRow(ctx, `SELECT composer_ensure_partitions(3)`).Scan(&made); err != nil {
		return fmt.Errorf("ensure partitions: %w", err)
	}
	if s.cfg.RetentionMonths > 0 {
		if err := s.db.System.QueryRow(ctx, `SELECT composer_drop_partitions($1)`, s.cfg.RetentionMonths).Scan(&dropped); err != nil {
			return fmt.Errorf("drop partitions: %w", err)
		}
		// Idempotency keys live outside the partitions; they go with the
		// runs they named, in bounded batches.
		for {
			tag, err := s.db.System.Exec(ctx, `DELETE FROM run_idempotency_keys WHERE (tenant_id, key) IN (
				SELECT tenant_id, key FROM run_idempotency_keys
				 WHERE created_at < date_trunc('month', now() AT TIME ZONE 'UTC') - make_interval(months => $1)
				 LIMIT 10000)`, s.cfg.RetentionMonths)
			if err != nil {
				return fmt.Errorf("expire idempotency keys: %w", err)
			}
			if tag.RowsAffected() < 10000 {
				break
			}
		}
	}
	if made+dropped > 0 {
		s.log.Info("partitions maintained", zap.Int("created", made), zap.Int("dropped", dropped))
	}
	return nil
}
