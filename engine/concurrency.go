package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/composer-dev/composer/engine/dag"
	sm "github.com/composer-dev/composer/engine/statemachine"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
)

// Timer kinds of concurrency keys (migration 00021): a queued-strategy
// run ended, so its key may start the next queued run; a run superseded by
// a newer one of its key (cancel_in_progress) is cancelled.
const (
	timerConcurrencyRelease = "concurrency_release"
	timerCancel             = "cancel"
)

// reasonKeyAtLimit starts the ignore reason of a queued run its key has
// no room for.
const reasonKeyAtLimit = "its concurrency key is at its limit"

// MaxConcurrencyKeysPage bounds one ConcurrencyKeys answer.
const MaxConcurrencyKeysPage = 100

// lockKey takes the key's transaction-scoped advisory lock and counts its
// running and queued runs. The lock is a statement of its own, before the
// count, so the count's snapshot sees what the previous holder committed.
// Every path that takes it holds at most run locks taken before it (never
// a run lock after it), so it cannot deadlock against a run's transition.
func lockKey(ctx context.Context, tx *pg.Tx, workflow uuid.UUID, key string) (running, queued int, err error) {
	if _, err := tx.Exec(ctx, qLockConcurrencyKey, tx.Tenant.String()+"/"+workflow.String()+"/"+key); err != nil {
		return 0, 0, fmt.Errorf("lock concurrency key: %w", err)
	}
	if err := tx.QueryRow(ctx, qCountConcurrencyKey, tx.Tenant, workflow, key).Scan(&running, &queued); err != nil {
		return 0, 0, fmt.Errorf("count concurrency key: %w", err)
	}
	return running, queued, nil
}

// admission is what a start's concurrency key decides.
type admission struct {
	key    string
	queue  bool   // write the run queued (the queue strategy, no room or others waiting)
	cancel string // cancel the new run at once with this reason (cancel_newest)
	// supersedes is set when older runs of the key are being cancelled
	// for this one (cancel_in_progress).
	supersedes bool
}

// admitKey evaluates a new run's concurrency key and decides, under the
// key's lock, whether it starts, queues or is cancelled; with
// cancel_in_progress it schedules the cancellation of the key's oldest
// running runs beyond Limit-1 (as due timers: no other run is locked here).
func admitKey(ctx context.Context, tx *pg.Tx, wid uuid.UUID, wf *dag.Workflow, input json.RawMessage, meta map[string]string, paused bool) (admission, error) {
	cc := wf.Concurrency
	if cc == nil {
		return admission{}, nil
	}
	key, err := wf.ConcurrencyKey(input, meta)
	if err != nil {
		e := errs.E(errs.Invalid, "%v", err)
		e.Fields = []errs.Field{{Field: "concurrency.key", Message: err.Error()}}
		return admission{}, e
	}
	a := admission{key: key}
	if paused {
		return a, nil // queued by the pause; its start (the resume) admits the key
	}
	running, queued, err := lockKey(ctx, tx, wid, key)
	if err != nil {
		return admission{}, err
	}
	switch cc.StrategyName() {
	case dag.ConcurrencyQueue:
		a.queue = running >= cc.Limit || queued > 0
	case dag.ConcurrencyCancelNewest:
		if running >= cc.Limit {
			a.cancel = fmt.Sprintf("concurrency key %q already has %d running run(s), its limit (cancel_newest)", key, running)
		}
	case dag.ConcurrencyCancelInProgress:
		if over := running - cc.Limit + 1; over > 0 {
			reason := fmt.Sprintf("superseded by a newer run of concurrency key %q (cancel_in_progress)", key)
			detail, _ := json.Marshal(map[string]string{"reason": reason})
			if _, err := tx.Exec(ctx, qSupersede, tx.Tenant, wid, key, over, detail); err != nil {
				return admission{}, fmt.Errorf("cancel superseded runs: %w", err)
			}
			a.supersedes = true
		}
	}
	return a, nil
}

// releaseKey is what a queued-strategy run that ends leaves for its key: a
// due concurrency_release timer, in the ending transition's batch.
func (p *persister) releaseKey() {
	cc := p.def.wf.Concurrency
	if cc == nil || p.concurrencyKey == "" || cc.StrategyName() != dag.ConcurrencyQueue {
		return
	}
	detail, _ := json.Marshal(map[string]string{"workflow": p.workflowID.String(), "key": p.concurrencyKey})
	p.exec(qInsertReleaseTimer, p.tx.Tenant, p.runID, detail)
	p.wakeTimers = true
}

// ReleaseConcurrency fires a concurrency_release timer: it starts the key's
// oldest queued runs, each in its own transaction (startQueued: the run's
// lock, then the key's), while the key has room, then drops the timer. A
// failure leaves the timer to fire again (starting a run twice is not
// possible: a started run is no longer queued).
func (c *Coordinator) ReleaseConcurrency(ctx context.Context, tenant uuid.UUID, timerID int64, detail []byte) error {
	var d struct {
		Workflow uuid.UUID `json:"workflow"`
		Key      string    `json:"key"`
	}
	if err := json.Unmarshal(detail, &d); err != nil {
		return fmt.Errorf("concurrency release timer %d: %w", timerID, err)
	}
	for round := 0; round < 100; round++ {
		var ids []uuid.UUID
		err := c.db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
			rows, err := tx.Query(ctx, qQueuedOfKey, tx.Tenant, d.Workflow, d.Key, 10)
			if err != nil {
				return err
			}
			ids, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
			return err
		})
		if err != nil {
			return fmt.Errorf("read queued runs of a concurrency key: %w", err)
		}
		if len(ids) == 0 {
			break
		}
		blocked := false
		for _, id := range ids {
			ack, err := c.startQueued(ctx, tenant, id)
			if err != nil {
				return err
			}
			if ack.Ignored && (strings.HasPrefix(ack.Reason, reasonKeyAtLimit) || strings.HasPrefix(ack.Reason, reasonWorkflowPaused)) {
				blocked = true
				break
			}
		}
		if blocked {
			break
		}
	}
	return c.db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		_, err := tx.Exec(ctx, qDeleteTimer, tx.Tenant, timerID)
		return err
	})
}

// keyHasRoom is startQueued's check of a queued run's key, under the key's
// lock (taken after the run's).
func (c *Coordinator) keyHasRoom(ctx context.Context, tx *pg.Tx, runID uuid.UUID) error {
	var wid uuid.UUID
	var version int
	var key *string
	if err := tx.QueryRow(ctx, qRunConcurrencyKey, tx.Tenant, runID).Scan(&wid, &version, &key); err != nil {
		return fmt.Errorf("read the run's concurrency key: %w", err)
	}
	if key == nil {
		return nil
	}
	def, err := c.defs.load(ctx, tx, wid, version)
	if err != nil {
		return err
	}
	cc := def.wf.Concurrency
	if cc == nil || cc.StrategyName() != dag.ConcurrencyQueue {
		return nil
	}
	running, _, err := lockKey(ctx, tx, wid, *key)
	if err != nil {
		return err
	}
	if running >= cc.Limit {
		return ignored("%s (%d running of %q)", reasonKeyAtLimit, running, *key)
	}
	return nil
}

// rerunKeyHasRoom refuses the rerun of a run whose key has no room: a
// rerun does not queue.
func (c *Coordinator) rerunKeyHasRoom(ctx context.Context, tx *pg.Tx, runID uuid.UUID) error {
	err := c.keyHasRoom(ctx, tx, runID)
	var ig ignoredError
	if errors.As(err, &ig) {
		return errs.E(errs.Conflict, "the run cannot be re-run now: %s", ig.reason)
	}
	return err
}

// KeyState is one concurrency key of a workflow with runs running or
// queued — or, with Node set, of one of its steps, with tasks holding a
// slot (Running) or waiting for one (Queued).
type KeyState struct {
	Node    string
	Key     string
	Running int
	Queued  int
	Limit   int
}

// ConcurrencyKeys lists a workflow's keys that have running or queued runs,
// the busiest (most queued, then most running) first.
func ConcurrencyKeys(ctx context.Context, tx *pg.Tx, workflow uuid.UUID, limit int) ([]KeyState, error) {
	if limit < 1 || limit > MaxConcurrencyKeysPage {
		return nil, errs.E(errs.Invalid, "first must be between 1 and %d", MaxConcurrencyKeysPage)
	}
	rows, err := tx.Query(ctx, qConcurrencyKeys, tx.Tenant, workflow, limit)
	if err != nil {
		return nil, fmt.Errorf("concurrency keys: %w", err)
	}
	var out []KeyState
	var k KeyState
	if _, err := pgx.ForEachRow(rows, []any{&k.Key, &k.Running, &k.Queued}, func() error {
		out = append(out, k)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("concurrency keys: %w", err)
	}
	return out, nil
}

// cancelEvent is the event of a fired cancel timer.
func cancelEvent(detail []byte) sm.Event {
	var d struct{ Reason string }
	_ = json.Unmarshal(detail, &d)
	if d.Reason == "" {
		d.Reason = "cancelled"
	}
	return sm.CancelRequested{Reason: d.Reason}
}

const (
	qLockConcurrencyKey  = `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`
	qCountConcurrencyKey = `SELECT count(*) FILTER (WHERE status = 'running'), count(*) FILTER (WHERE status = 'queued')
			FROM workflow_runs WHERE tenant_id = $1 AND workflow_id = $2 AND concurrency_key = $3 AND status IN ('running', 'queued')`
	// The oldest running runs of the key beyond what may stay, cancelled
	// through due timers.
	qSupersede = `INSERT INTO timers (tenant_id, run_id, kind, fire_at, detail)
			SELECT tenant_id, id, 'cancel', now(), $5 FROM workflow_runs
			 WHERE tenant_id = $1 AND workflow_id = $2 AND concurrency_key = $3 AND status = 'running'
			 ORDER BY id LIMIT $4`
	qInsertReleaseTimer = `INSERT INTO timers (tenant_id, run_id, kind, fire_at, detail) VALUES ($1, $2, 'concurrency_release', now(), $3)`
	qQueuedOfKey        = `SELECT id FROM workflow_runs WHERE tenant_id = $1 AND workflow_id = $2 AND concurrency_key = $3 AND status = 'queued'
			ORDER BY id LIMIT $4`
	qDeleteTimer         = `DELETE FROM timers WHERE tenant_id = $1 AND id = $2`
	qRunConcurrencyKey   = `SELECT workflow_id, workflow_version, concurrency_key FROM workflow_runs WHERE tenant_id = $1 AND id = $2`
	qStepConcurrencyKeys = `SELECT concurrency_key, count(*) FILTER (WHERE concurrency_slot),
			count(*) FILTER (WHERE NOT concurrency_slot AND state = 'pending'), max(concurrency_limit)
			FROM task_instances WHERE tenant_id = $1 AND concurrency_key IS NOT NULL AND state IN ('pending', 'running')
			  AND starts_with(concurrency_key, $2)
			GROUP BY concurrency_key ORDER BY 3 DESC, 2 DESC, 1 LIMIT $3`
	qConcurrencyKeys = `SELECT concurrency_key, count(*) FILTER (WHERE status = 'running'), count(*) FILTER (WHERE status = 'queued')
			FROM workflow_runs WHERE tenant_id = $1 AND workflow_id = $2 AND concurrency_key IS NOT NULL AND status IN ('running', 'queued')
			GROUP BY concurrency_key ORDER BY 3 DESC, 2 DESC, 1 LIMIT $3`
)

// WorkflowKeys lists a workflow's busy concurrency keys: its own (with the
// limit of its latest version), then its steps' (each with its tasks'
// limit), the busiest first within each; NotFound for a workflow tx's
// tenant does not have.
func (c *Coordinator) WorkflowKeys(ctx context.Context, tx *pg.Tx, workflow uuid.UUID, first int) ([]KeyState, error) {
	w, err := GetWorkflow(ctx, tx, workflow)
	if err != nil {
		return nil, err
	}
	def, err := c.defs.load(ctx, tx, w.ID, w.LatestVersion)
	if err != nil {
		return nil, err
	}
	var out []KeyState
	if cc := def.wf.Concurrency; cc != nil {
		if out, err = ConcurrencyKeys(ctx, tx, workflow, first); err != nil {
			return nil, err
		}
		for i := range out {
			out[i].Limit = cc.Limit
		}
	}
	if len(out) >= first {
		return out, nil
	}
	prefix := workflow.String() + "/"
	rows, err := tx.Query(ctx, qStepConcurrencyKeys, tx.Tenant, prefix, first-len(out))
	if err != nil {
		return nil, fmt.Errorf("step concurrency keys: %w", err)
	}
	var k KeyState
	var stored string
	if _, err := pgx.ForEachRow(rows, []any{&stored, &k.Running, &k.Queued, &k.Limit}, func() error {
		node, value, _ := strings.Cut(strings.TrimPrefix(stored, prefix), "/")
		out = append(out, KeyState{Node: node, Key: value, Running: k.Running, Queued: k.Queued, Limit: k.Limit})
		return nil
	}); err != nil {
		return nil, fmt.Errorf("step concurrency keys: %w", err)
	}
	return out, nil
}

// dispatchKeyed dispatches an attempt of a step with a concurrency key:
// under the key's lock, the task takes one of the key's slots if one is
// free and no older task of the key waits (a task that holds one keeps it),
// and its outbox row is due at notBefore with a slot, held ('infinity')
// without. The key, its limit and the slot live on the task row, written
// earlier in the same batch, so each statement reads them there.
//
// A task that found no slot under a cancel strategy acts at once, through
// due cancel timers (no other run is locked here, as for a run's key):
// cancel_newest cancels its own run; cancel_in_progress cancels the runs
// of the key's other pending or running tasks beyond Limit-1, the oldest
// first, and waits (held) for the first slot their ends free — a waiting
// task older than it is cancelled too, so the slot is its own.
func (p *persister) dispatchKeyed(n *dag.Node, node string, t taskRef, attempt int, notBefore time.Time, priority int) {
	tenant := p.tx.Tenant
	p.exec(qLockTaskKey, tenant, p.runID, t.id)
	p.exec(qTakeSlot, tenant, p.runID, t.id)
	p.exec(qInsertKeyedOutbox, tenant, n.QueueName(), p.runID, t.id, node, string(n.Type), n.HandlerName(), attempt, p.traceparent, notBefore,
		priority)
	switch n.Concurrency.StrategyName() {
	case dag.ConcurrencyCancelNewest:
		detail, _ := json.Marshal(map[string]string{"reason": fmt.Sprintf(
			"step %s found its concurrency key at its limit of %d (cancel_newest)", node, n.Concurrency.Limit)})
		p.exec(qCancelNewestStep, tenant, p.runID, t.id, detail)
		p.wakeTimers = true
	case dag.ConcurrencyCancelInProgress:
		detail, _ := json.Marshal(map[string]string{"reason": fmt.Sprintf(
			"superseded by a newer run at step %s of its concurrency key (cancel_in_progress)", node)})
		p.exec(qSupersedeSteps, tenant, p.runID, t.id, detail)
		p.wakeTimers = true
	}
}

// releaseSlot gives back the slot of a keyed step's task that ends, drops
// its held outbox rows, and grants the key's free slots to its oldest
// waiting tasks (their rows become due; the enqueuer is woken).
func (p *persister) releaseSlot(node string, task uuid.UUID) {
	if n := p.def.wf.Node(node); n == nil || n.Concurrency == nil {
		return
	}
	tenant := p.tx.Tenant
	p.exec(qDropHeldOutbox, tenant, task)
	p.exec(qLockTaskKey, tenant, p.runID, task)
	p.exec(qGrantSlots, tenant, p.runID, task)
	p.dispatched = true
}

const (
	qLockTaskKey = `SELECT pg_advisory_xact_lock(hashtextextended('step/' || tenant_id::text || '/' || concurrency_key, 0))
			FROM task_instances WHERE tenant_id = $1 AND run_id = $2 AND id = $3 AND concurrency_key IS NOT NULL`
	qTakeSlot = `UPDATE task_instances t SET concurrency_slot = true
			 WHERE t.tenant_id = $1 AND t.run_id = $2 AND t.id = $3 AND NOT t.concurrency_slot AND t.concurrency_key IS NOT NULL
			   AND (SELECT count(*) FROM task_instances h WHERE h.tenant_id = t.tenant_id AND h.concurrency_key = t.concurrency_key
			          AND h.concurrency_slot AND h.state IN ('pending', 'running')) < t.concurrency_limit
			   AND NOT EXISTS (SELECT 1 FROM task_instances w WHERE w.tenant_id = t.tenant_id AND w.concurrency_key = t.concurrency_key
			          AND w.state = 'pending' AND NOT w.concurrency_slot AND (w.created_at, w.id) < (t.created_at, t.id))`
	qInsertKeyedOutbox = `INSERT INTO outbox (tenant_id, queue, run_id, task_id, node_id, node_type, handler, attempt, traceparent, next_attempt_at,
				priority)
			SELECT $1, $2, $3, $4, $5, $6, NULLIF($7, ''), $8, NULLIF($9, ''),
			       CASE WHEN t.concurrency_slot THEN $10::timestamptz ELSE 'infinity' END, $11
			  FROM task_instances t WHERE t.tenant_id = $1 AND t.run_id = $3 AND t.id = $4`
	qDropHeldOutbox = `DELETE FROM outbox WHERE tenant_id = $1 AND task_id = $2 AND next_attempt_at = 'infinity'`
	// A keyed task that got no slot (cancel_newest): its own run is
	// cancelled.
	qCancelNewestStep = `INSERT INTO timers (tenant_id, run_id, kind, fire_at, detail)
			SELECT tenant_id, run_id, 'cancel', now(), $4 FROM task_instances
			 WHERE tenant_id = $1 AND run_id = $2 AND id = $3 AND concurrency_key IS NOT NULL AND NOT concurrency_slot`
	// A keyed task that got no slot (cancel_in_progress): the runs of the
	// key's other live tasks, newest first, beyond the Limit-1 that may
	// stay, are cancelled.
	qSupersedeSteps = `INSERT INTO timers (tenant_id, run_id, kind, fire_at, detail)
			SELECT $1, o.run_id, 'cancel', now(), $4 FROM (
			  SELECT h.run_id, max(h.created_at) AS at FROM task_instances h, task_instances t
			   WHERE t.tenant_id = $1 AND t.run_id = $2 AND t.id = $3 AND t.concurrency_key IS NOT NULL AND NOT t.concurrency_slot
			     AND h.tenant_id = t.tenant_id AND h.concurrency_key = t.concurrency_key AND h.state IN ('pending', 'running')
			     AND h.run_id <> t.run_id
			   GROUP BY h.run_id) o
			 ORDER BY o.at DESC, o.run_id DESC
			OFFSET (SELECT concurrency_limit - 1 FROM task_instances WHERE tenant_id = $1 AND run_id = $2 AND id = $3)`
	// The ended task is no longer pending or running (its UPDATE came first
	// in the batch), so its slot is free to grant.
	qGrantSlots = `WITH k AS (
			SELECT tenant_id, concurrency_key AS key, concurrency_limit AS lim FROM task_instances
			 WHERE tenant_id = $1 AND run_id = $2 AND id = $3 AND concurrency_key IS NOT NULL
		), room AS (
			SELECT k.key, k.lim - (SELECT count(*) FROM task_instances h WHERE h.tenant_id = k.tenant_id AND h.concurrency_key = k.key
			                         AND h.concurrency_slot AND h.state IN ('pending', 'running')) AS n FROM k
		), next AS (
			SELECT w.tenant_id, w.run_id, w.id FROM task_instances w, room
			 WHERE w.tenant_id = $1 AND w.concurrency_key = room.key AND w.state = 'pending' AND NOT w.concurrency_slot
			 ORDER BY w.created_at, w.id LIMIT (SELECT greatest(n, 0) FROM room)
			   FOR UPDATE OF w SKIP LOCKED
		), granted AS (
			UPDATE task_instances t SET concurrency_slot = true FROM next
			 WHERE t.tenant_id = next.tenant_id AND t.run_id = next.run_id AND t.id = next.id RETURNING t.tenant_id, t.id
		)
		UPDATE outbox o SET next_attempt_at = now() FROM granted g
		 WHERE o.tenant_id = g.tenant_id AND o.task_id = g.id AND o.next_attempt_at = 'infinity'`
)
