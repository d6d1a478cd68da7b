package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/composer-dev/composer/engine/dag"
	sm "github.com/composer-dev/composer/engine/statemachine"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
)

// Pausing.
//
// A paused workflow keeps accepting starts (startRun, schedules, event
// triggers all go through startIn) but records each new run as queued:
// status "queued", no task, nothing dispatched. Runs already running go on
// and their steps finish. Resuming un-pauses the workflow and, in the same
// transaction, creates a bulk operation of action "resume" that starts the
// queued runs oldest first in bounded batches (bulk.go) — a crash mid-resume
// leaves the job, which any replica carries on from its cursor.
//
// A start reads the pause flag without a lock; only a start that sees the
// workflow paused re-reads it FOR SHARE, which waits for a resume in
// progress (its UPDATE) and then sees it. So a run is queued only if the
// resume that will start it has not committed yet, and the resume job,
// which reads after that commit, finds it.
//
// A paused queue (queue_pauses) stops the tasks of that queue of the tenant
// from being handed to workers: the lease statement refuses them (a worker
// that read the message drops it, as for any task it cannot lease), the
// outbox enqueuer holds their rows, and an eager offer on that queue is
// not taken. Running tasks finish. Resuming deletes the pause and, in the
// same transaction, dispatches again every pending task of the queue that
// has no outbox row (a duplicate of a message still in a stream is
// harmless: the lease is the duplicate filter).

// RunQueued is the status of a run created while its workflow was paused,
// or beyond its concurrency key's limit (concurrency.go).
const RunQueued sm.RunStatus = "queued"

// reasonWorkflowPaused is the ignore reason of a queued run whose workflow
// is paused.
const reasonWorkflowPaused = "its workflow is paused"

// MaxQueuedRuns bounds the queued runs a tenant may hold (runs started
// into paused workflows); beyond it a start is QUOTA_EXCEEDED.
const MaxQueuedRuns = 100_000

// MaxPausedQueues bounds a tenant's paused queues.
const MaxPausedQueues = 100

// MaxPauseReason bounds a pause's reason.
const MaxPauseReason = 500

var queueName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.:-]{0,63}$`)

// lockPausedWorkflow re-reads a workflow's pause under a share lock (see
// above): it reports whether the workflow is still paused.
func lockPausedWorkflow(ctx context.Context, tx *pg.Tx, wid uuid.UUID) (bool, error) {
	var paused bool
	if err := tx.QueryRow(ctx, qLockPausedWorkflow, tx.Tenant, wid).Scan(&paused); err != nil {
		return false, fmt.Errorf("read the workflow's pause: %w", err)
	}
	return paused, nil
}

// queueRun finishes a start into a paused workflow: the run row exists
// with status queued (the workflow is paused, or its concurrency key is at
// its limit: reason says which); record it on the timeline and announce
// it. (It leaves the transaction to its caller, open or not: WithTenant
// commits.)
func (c *Coordinator) queueRun(ctx context.Context, tx *pg.Tx, runID uuid.UUID, reason string) (Started, error) {
	var n int
	if err := tx.QueryRow(ctx, qCountQueuedRuns, tx.Tenant, MaxQueuedRuns+1).Scan(&n); err != nil {
		return Started{}, fmt.Errorf("count queued runs: %w", err)
	}
	if n > MaxQueuedRuns {
		return Started{}, errs.E(errs.QuotaExceeded, "the tenant already holds %d queued runs, the most it may", MaxQueuedRuns)
	}
	detail, err := json.Marshal(map[string]string{"status": "queued", "reason": reason})
	if err != nil {
		return Started{}, err
	}
	if _, err := tx.Exec(ctx, qInsertEvent, tx.Tenant, runID, "run_queued", "", nil, nil, detail); err != nil {
		return Started{}, fmt.Errorf("record the queued run: %w", err)
	}
	if err := readBack(ctx, tx, runID); err != nil {
		return Started{}, err
	}
	tenant := tx.Tenant
	tx.AfterCommit(func() {
		if c.opts.OnTransition != nil {
			c.opts.OnTransition(Transition{Tenant: tenant, RunID: runID, Event: "run_queued", Status: RunQueued})
		}
	})
	return Started{RunID: runID, Created: true, Status: RunQueued}, nil
}

// unqueue makes a queued run running inside its event's transaction (the
// run lock is held), so the state machine, which knows only running runs
// as live, applies the event to it as to a run that has no task yet.
func unqueue(ctx context.Context, tx *pg.Tx, run *sm.Run) error {
	if run.Status != RunQueued {
		return nil
	}
	runID, err := uuid.Parse(run.ID)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, qUnqueueRun, tx.Tenant, runID); err != nil {
		return fmt.Errorf("unqueue run: %w", err)
	}
	run.Status = sm.RunRunning
	return nil
}

// errKept ends an event's preparation that wrote the event itself (a
// signal kept for a queued run): the transaction commits, no transition.
var errKept = errors.New("kept")

// keepSignal keeps a signal sent to a queued run, as a signal nobody waits
// for yet is kept: the run's first wait node for its name consumes it once
// the run starts.
func keepSignal(ctx context.Context, tx *pg.Tx, run *sm.Run, id, name string, payload []byte, by dag.Principal) error {
	runID, err := uuid.Parse(run.ID)
	if err != nil {
		return err
	}
	b := &pgx.Batch{}
	b.Queue(qInsertSignal, tx.Tenant, runID, id, name, payload, "", by.String())
	detail, err := json.Marshal(map[string]any{"status": "queued", "signal": signalDetail(sm.Signal{ID: id, Name: name, By: by})})
	if err != nil {
		return fmt.Errorf("keep signal: %w", err)
	}
	b.Queue(qInsertEvent, tx.Tenant, runID, sm.KindSignalReceived, "", nil, nil, detail)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("keep signal: %w", err)
	}
	return errKept
}

// startQueued starts a queued run (a resume): admitted like a start, and
// only while its workflow is not paused; a run no longer queued is
// ignored.
func (c *Coordinator) startQueued(ctx context.Context, tenant, runID uuid.UUID) (Ack, error) {
	return c.apply(ctx, tenant, runID, eventRef{}, func(ctx context.Context, tx *pg.Tx, run *sm.Run) (sm.Event, error) {
		if run.Status != RunQueued {
			return nil, ignored("run is %s, not queued", run.Status)
		}
		var paused bool
		if err := tx.QueryRow(ctx, qRunWorkflowPaused, tx.Tenant, runID).Scan(&paused); err != nil {
			return nil, fmt.Errorf("read the workflow's pause: %w", err)
		}
		if paused {
			return nil, ignored(reasonWorkflowPaused)
		}
		if err := c.keyHasRoom(ctx, tx, runID); err != nil {
			return nil, err
		}
		if c.opts.Admit != nil {
			if err := c.opts.Admit(ctx, tx); err != nil {
				return nil, err
			}
		}
		if err := unqueue(ctx, tx, run); err != nil {
			return nil, err
		}
		return sm.RunStarted{}, nil
	})
}

// WorkflowPause is a workflow's pause state.
type WorkflowPause struct {
	WorkflowID uuid.UUID
	PausedAt   *time.Time
	Reason     *string
}

// PauseWorkflow pauses a workflow: new runs queue instead of starting
// until it is resumed. Pausing a paused workflow changes nothing.
func (c *Coordinator) PauseWorkflow(ctx context.Context, tenant, workflow uuid.UUID, reason string) (WorkflowPause, error) {
	if len(reason) > MaxPauseReason {
		return WorkflowPause{}, errs.E(errs.Invalid, "reason: at most %d characters", MaxPauseReason)
	}
	out := WorkflowPause{WorkflowID: workflow}
	err := c.db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		if err := gate(ctx, tx); err != nil {
			return err
		}
		err := tx.QueryRow(ctx, qPauseWorkflow, tenant, workflow, reason).Scan(&out.PausedAt, &out.Reason)
		if errors.Is(err, pgx.ErrNoRows) {
			return errs.E(errs.NotFound, "workflow not found")
		}
		return err
	})
	return out, err
}

// ResumeWorkflow un-pauses a workflow and creates the bulk operation that
// starts its queued runs, oldest first (nil when it was not paused).
// Resuming twice is harmless: the second finds it running.
func (c *Coordinator) ResumeWorkflow(ctx context.Context, tenant, workflow uuid.UUID, by string) (WorkflowPause, *BulkOperation, error) {
	out := WorkflowPause{WorkflowID: workflow}
	var op *BulkOperation
	err := c.db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		op = nil
		if err := gate(ctx, tx); err != nil {
			return err
		}
		var was *time.Time
		err := tx.QueryRow(ctx, qResumeWorkflow, tenant, workflow).Scan(&was)
		if errors.Is(err, pgx.ErrNoRows) {
			return errs.E(errs.NotFound, "workflow not found")
		}
		if err != nil {
			return fmt.Errorf("resume workflow: %w", err)
		}
		if was == nil {
			return nil // was not paused
		}
		wid := workflow
		o, _, err := createBulk(ctx, tx, BulkRequest{Action: BulkResume, Filter: RunFilter{WorkflowID: &wid, Statuses: []string{string(RunQueued)}},
			Reason: "workflow resumed", IdempotencyKey: fmt.Sprintf("resume:%s:%d", workflow, was.UnixMicro()), By: by}, false)
		if err != nil {
			return err
		}
		op = &o
		return nil
	})
	if err == nil && op != nil && c.opts.BulkWake != nil {
		c.opts.BulkWake()
	}
	return out, op, err
}

// WorkflowPauseOf reads a workflow's pause state.
func WorkflowPauseOf(ctx context.Context, tx *pg.Tx, workflow uuid.UUID) (WorkflowPause, error) {
	out := WorkflowPause{WorkflowID: workflow}
	err := tx.QueryRow(ctx, qWorkflowPause, tx.Tenant, workflow).Scan(&out.PausedAt, &out.Reason)
	if errors.Is(err, pgx.ErrNoRows) {
		return out, errs.E(errs.NotFound, "workflow not found")
	}
	return out, err
}

// QueuePause is a paused queue of a tenant.
type QueuePause struct {
	Queue    string    `json:"queue"`
	Reason   *string   `json:"reason,omitempty"`
	PausedBy *string   `json:"paused_by,omitempty"`
	PausedAt time.Time `json:"paused_at"`
}

func checkQueue(queue string) error {
	if !queueName.MatchString(queue) {
		return errs.E(errs.Invalid, "queue: 1-64 letters, digits, '_', '.', ':' or '-', starting with a letter or digit")
	}
	return nil
}

// PauseQueue pauses one of the tenant's queues: its tasks are held until
// ResumeQueue; tasks already running finish. Pausing a paused queue
// answers the existing pause.
func (c *Coordinator) PauseQueue(ctx context.Context, tenant uuid.UUID, queue, reason, by string) (QueuePause, error) {
	if err := checkQueue(queue); err != nil {
		return QueuePause{}, err
	}
	if len(reason) > MaxPauseReason {
		return QueuePause{}, errs.E(errs.Invalid, "reason: at most %d characters", MaxPauseReason)
	}
	var out QueuePause
	err := c.db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		if err := gate(ctx, tx); err != nil {
			return err
		}
		var n int
		var already bool
		if err := tx.QueryRow(ctx, qCountQueuePauses, tenant, queue).Scan(&n, &already); err != nil {
			return fmt.Errorf("count paused queues: %w", err)
		}
		if n >= MaxPausedQueues && !already {
			return errs.E(errs.QuotaExceeded, "at most %d paused queues", MaxPausedQueues)
		}
		if _, err := tx.Exec(ctx, qPauseQueue, tenant, queue, nullIfEmpty(reason), nullIfEmpty(by)); err != nil {
			return fmt.Errorf("pause queue: %w", err)
		}
		return tx.QueryRow(ctx, qQueuePause, tenant, queue).Scan(&out.Queue, &out.Reason, &out.PausedBy, &out.PausedAt)
	})
	return out, err
}

// ResumeQueue resumes a paused queue and dispatches again its pending
// tasks that have no outbox row; it reports how many (0 when the queue was
// not paused).
func (c *Coordinator) ResumeQueue(ctx context.Context, tenant uuid.UUID, queue string) (int64, error) {
	if err := checkQueue(queue); err != nil {
		return 0, err
	}
	var n int64
	err := c.db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		n = 0
		if err := gate(ctx, tx); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, qResumeQueue, tenant, queue)
		if err != nil {
			return fmt.Errorf("resume queue: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return nil
		}
		// The tenant's pending tasks are bounded by its queued-task limit.
		return tx.QueryRow(ctx, qRedispatchQueue, tenant, queue).Scan(&n)
	})
	if err == nil && n > 0 && c.opts.Wake != nil {
		c.opts.Wake()
	}
	return n, err
}

// QueuePauses lists the tenant's paused queues, by name.
func QueuePauses(ctx context.Context, tx *pg.Tx) ([]QueuePause, error) {
	rows, err := tx.Query(ctx, qQueuePauses, tx.Tenant)
	if err != nil {
		return nil, fmt.Errorf("paused queues: %w", err)
	}
	var out []QueuePause
	var p QueuePause
	_, err = pgx.ForEachRow(rows, []any{&p.Queue, &p.Reason, &p.PausedBy, &p.PausedAt}, func() error {
		out = append(out, p)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("paused queues: %w", err)
	}
	return out, nil
}

const (
	qLockPausedWorkflow = `SELECT paused_at IS NOT NULL FROM workflow_definitions WHERE tenant_id = $1 AND id = $2 FOR SHARE`
	qCountQueuedRuns    = `SELECT count(*) FROM (SELECT 1 FROM workflow_runs WHERE tenant_id = $1 AND status = 'queued' LIMIT $2) q`
	qUnqueueRun         = `UPDATE workflow_runs SET status = 'running', updated_at = now() WHERE tenant_id = $1 AND id = $2 AND status = 'queued'`
	qRunWorkflowPaused  = `SELECT d.paused_at IS NOT NULL FROM workflow_runs r
		JOIN workflow_definitions d ON d.tenant_id = r.tenant_id AND d.id = r.workflow_id
		WHERE r.tenant_id = $1 AND r.id = $2`
	qPauseWorkflow = `UPDATE workflow_definitions SET paused_at = coalesce(paused_at, now()), pause_reason = NULLIF($3, ''), updated_at = now()
		WHERE tenant_id = $1 AND id = $2 RETURNING paused_at, pause_reason`
	qResumeWorkflow = `WITH old AS (SELECT paused_at FROM workflow_definitions WHERE tenant_id = $1 AND id = $2 FOR UPDATE)
		UPDATE workflow_definitions d SET paused_at = NULL, pause_reason = NULL, updated_at = now()
		  FROM old WHERE d.tenant_id = $1 AND d.id = $2 RETURNING old.paused_at`
	qWorkflowPause    = `SELECT paused_at, pause_reason FROM workflow_definitions WHERE tenant_id = $1 AND id = $2`
	qQueuePaused      = `SELECT EXISTS (SELECT 1 FROM queue_pauses WHERE tenant_id = $1 AND queue = $2)`
	qCountQueuePauses = `SELECT count(*), coalesce(bool_or(queue = $2), false) FROM queue_pauses WHERE tenant_id = $1`
	qPauseQueue       = `INSERT INTO queue_pauses (tenant_id, queue, reason, paused_by) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`
	qQueuePause       = `SELECT queue, reason, paused_by, paused_at FROM queue_pauses WHERE tenant_id = $1 AND queue = $2`
	qQueuePauses      = `SELECT queue, reason, paused_by, paused_at FROM queue_pauses WHERE tenant_id = $1 ORDER BY queue LIMIT 1000`
	qResumeQueue      = `DELETE FROM queue_pauses WHERE tenant_id = $1 AND queue = $2`
	qRedispatchQueue  = `
		WITH held AS (
			SELECT t.tenant_id, t.run_id, t.id, t.node_id, t.node_type, t.queue, t.config->'task'->>'handler' AS handler, t.attempt, r.traceparent
			  FROM task_instances t JOIN workflow_runs r ON r.tenant_id = t.tenant_id AND r.id = t.run_id
			 WHERE t.tenant_id = $1 AND t.state = 'pending' AND coalesce(t.queue, 'default') = $2 AND r.status = 'running'
			   AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.tenant_id = t.tenant_id AND o.task_id = t.id)
		), dispatched AS (
			INSERT INTO outbox (tenant_id, queue, run_id, task_id, node_id, node_type, handler, attempt, traceparent)
			SELECT tenant_id, coalesce(queue, 'default'), run_id, id, node_id, node_type, handler, attempt, traceparent FROM held
		)
		SELECT count(*) FROM held`
)
