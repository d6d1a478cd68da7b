package engine

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/audit"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/lifecycle"
	"github.com/composer-dev/composer/internal/pg"
)

// Bulk operations.
//
// A bulk operation applies one action to every run matching a runs filter
// (status, workflow, time range, metadata: ListRuns' filter), as a job any
// server replica works on:
//
//   - cancel: CancelRun on each queued or running run;
//   - rerun: RerunRun (from the failed nodes) on each failed or cancelled run;
//   - resume: starts each queued run (runs created while their workflow was
//     paused, see pause.go) whose workflow is no longer paused.
//
// The job visits the matching runs oldest first, in batches of BulkBatch,
// from a keyset cursor (the last run id handled) kept in its row, so there
// is no long transaction and a crash loses at most the batch in hand. Each
// run goes through the coordinator's own transition, whose transaction
// also inserts (job, run) into bulk_operation_runs before anything else
// (WithGate): a run already marked is not touched again, so a batch
// retried after a crash, or worked by two replicas at once after a lease
// ran out, changes each run at most once. After each batch the job records
// its cursor and counts (matched, done, failed, skipped), fenced by its
// lease and the cursor it started from, and announces the progress.
//
// Outcomes: done — the run was changed (or had been by this job already);
// skipped — the run needed nothing (already cancelled, not queued, its
// workflow paused again); failed — the change was refused for good (the
// error is kept in last_error); a refusal that may pass (admission: the
// queued-task limit, a cap; the database unavailable) stops the batch
// there, and the job tries again from that run after a backoff.

// BulkAction is what a bulk operation does to each run.
type BulkAction string

// The bulk actions.
const (
	BulkCancel BulkAction = "cancel"
	BulkRerun  BulkAction = "rerun"
	BulkResume BulkAction = "resume"
)

// Bulk operation statuses.
const (
	BulkRunning   = "running"
	BulkCompleted = "completed"
	BulkCancelled = "cancelled"
)

// Bounds of bulk operations.
const (
	// MaxActiveBulkOperations bounds a tenant's running bulk operations.
	MaxActiveBulkOperations = 10
	// BulkBatch is how many runs one batch handles.
	BulkBatch = 200
	// BulkRetention is how long a finished bulk operation is kept.
	BulkRetention = 7 * 24 * time.Hour
)

// BulkRequest asks for a bulk operation.
type BulkRequest struct {
	Action BulkAction
	Filter RunFilter
	// Reason is recorded with each cancelled run (cancel only).
	Reason string
	// IdempotencyKey makes creation idempotent: the same key returns the
	// same job; with another action or filter it is a Conflict.
	IdempotencyKey string
	// By is who asked (recorded).
	By string
}

// BulkOperation is a bulk job and its progress.
type BulkOperation struct {
	ID             uuid.UUID  `json:"id"`
	Action         BulkAction `json:"action"`
	Status         string     `json:"status"`
	Filter         RunFilter  `json:"filter"`
	Reason         *string    `json:"reason,omitempty"`
	IdempotencyKey *string    `json:"idempotency_key,omitempty"`
	CreatedBy      *string    `json:"created_by,omitempty"`
	Matched        int64      `json:"matched"`
	Done           int64      `json:"done"`
	Failed         int64      `json:"failed"`
	Skipped        int64      `json:"skipped"`
	LastError      *string    `json:"last_error,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	UpdatedAt      time.Time  `json:"updated_at"`
	FinishedAt     *time.Time `json:"finished_at,omitempty"`
}

// storedFilter is a RunFilter as bulk_operations.filter keeps it.
type storedFilter struct {
	Statuses      []string          `json:"statuses,omitempty"`
	WorkflowID    *uuid.UUID        `json:"workflow_id,omitempty"`
	CreatedAfter  *time.Time        `json:"created_after,omitempty"`
	CreatedBefore *time.Time        `json:"created_before,omitempty"`
	Metadata      map[string]string `json:"metadata,omitempty"`
}

func (s storedFilter) runFilter() RunFilter {
	return RunFilter{Statuses: s.Statuses, WorkflowID: s.WorkflowID, CreatedAfter: s.CreatedAfter, CreatedBefore: s.CreatedBefore,
		Metadata: s.Metadata, OldestFirst: true}
}

// bulkStatuses are the statuses an action applies to: a filter's statuses
// are narrowed to them (all of them when it names none).
var bulkStatuses = map[BulkAction][]string{
	BulkCancel: {"queued", "running"},
	BulkRerun:  {"failed", "cancelled"},
	BulkResume: {"queued"},
}

// CreateBulkOperation creates a bulk operation (or, with an idempotency key
// used before with the same request, answers the first); created is false
// for a repeat.
func (c *Coordinator) CreateBulkOperation(ctx context.Context, tenant uuid.UUID, req BulkRequest) (BulkOperation, bool, error) {
	var op BulkOperation
	var created bool
	err := c.db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		if err := gate(ctx, tx); err != nil {
			return err
		}
		var err error
		op, created, err = createBulk(ctx, tx, req, true)
		audit.Identify(ctx, op.ID.String())
		return err
	})
	if err == nil && created && c.opts.BulkWake != nil {
		c.opts.BulkWake()
	}
	return op, created, err
}

// createBulk validates and inserts a job in tx; bound caps created_before
// at now (a cancel or rerun acts on the runs that exist when it is asked).
func createBulk(ctx context.Context, tx *pg.Tx, req BulkRequest, bound bool) (BulkOperation, bool, error) {
	allowed, ok := bulkStatuses[req.Action]
	if !ok {
		return BulkOperation{}, false, errs.E(errs.Invalid, "action: one of cancel, rerun, resume")
	}
	if len(req.Reason) > 1000 {
		return BulkOperation{}, false, errs.E(errs.Invalid, "reason: at most 1000 characters")
	}
	if len(req.IdempotencyKey) > 255 {
		return BulkOperation{}, false, errs.E(errs.Invalid, "idempotency key: at most 255 characters")
	}
	if req.Filter.IdempotencyKey != nil {
		return BulkOperation{}, false, errs.E(errs.Invalid, "filter.idempotencyKey: name the run itself instead")
	}
	f := req.Filter
	if err := checkRunFilter(f); err != nil {
		return BulkOperation{}, false, err
	}
	var statuses []string
	for _, s := range allowed {
		if len(f.Statuses) == 0 || slices.Contains(f.Statuses, s) {
			statuses = append(statuses, s)
		}
	}
	if len(statuses) == 0 {
		return BulkOperation{}, false, errs.E(errs.Invalid, "filter.status: %s applies only to runs that are %v", req.Action, allowed)
	}
	sf := storedFilter{Statuses: statuses, WorkflowID: f.WorkflowID, CreatedAfter: f.CreatedAfter, CreatedBefore: f.CreatedBefore, Metadata: f.Metadata}
	doc, err := json.Marshal(sf)
	if err != nil {
		return BulkOperation{}, false, err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00", req.Action, req.Reason)
	h.Write(doc)
	hash := h.Sum(nil)
	if req.IdempotencyKey != "" {
		op, have, err := bulkByKey(ctx, tx, req.IdempotencyKey)
		if err != nil {
			return BulkOperation{}, false, err
		}
		if op != nil {
			if string(have) != string(hash) {
				return BulkOperation{}, false, errs.E(errs.Conflict, "idempotency key %q was already used for another bulk operation", req.IdempotencyKey)
			}
			return *op, false, nil
		}
	}
	var active int
	if err := tx.QueryRow(ctx, qCountActiveBulk, tx.Tenant, MaxActiveBulkOperations).Scan(&active); err != nil {
		return BulkOperation{}, false, fmt.Errorf("count bulk operations: %w", err)
	}
	if active >= MaxActiveBulkOperations {
		return BulkOperation{}, false, errs.E(errs.QuotaExceeded, "at most %d bulk operations may run at once", MaxActiveBulkOperations)
	}
	id := uuid.Must(uuid.NewV7())
	tag, err := tx.Exec(ctx, qInsertBulk, tx.Tenant, id, string(req.Action), doc, nullIfEmpty(req.Reason), nullIfEmpty(req.IdempotencyKey),
		hash, nullIfEmpty(req.By), bound)
	if err != nil {
		return BulkOperation{}, false, fmt.Errorf("insert bulk operation: %w", err)
	}
	if tag.RowsAffected() == 0 {
		// A concurrent creation with the key committed first.
		op, have, err := bulkByKey(ctx, tx, req.IdempotencyKey)
		if err != nil || op == nil {
			return BulkOperation{}, false, errs.E(errs.Conflict, "idempotency key %q is being used", req.IdempotencyKey)
		}
		if string(have) != string(hash) {
			return BulkOperation{}, false, errs.E(errs.Conflict, "idempotency key %q was already used for another bulk operation", req.IdempotencyKey)
		}
		return *op, false, nil
	}
	op, err := GetBulkOperation(ctx, tx, id)
	return op, true, err
}

func bulkByKey(ctx context.Context, tx *pg.Tx, key string) (*BulkOperation, []byte, error) {
	var id uuid.UUID
	var hash []byte
	err := tx.QueryRow(ctx, qBulkByKey, tx.Tenant, key).Scan(&id, &hash)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read bulk operation: %w", err)
	}
	op, err := GetBulkOperation(ctx, tx, id)
	return &op, hash, err
}

const bulkColumns = `id, action, status, filter, reason, idempotency_key, created_by, matched, done, failed, skipped, last_error,
	created_at, updated_at, finished_at`

func scanBulk(row pgx.Row) (BulkOperation, error) {
	var op BulkOperation
	var action string
	var doc []byte
	err := row.Scan(&op.ID, &action, &op.Status, &doc, &op.Reason, &op.IdempotencyKey, &op.CreatedBy, &op.Matched, &op.Done, &op.Failed,
		&op.Skipped, &op.LastError, &op.CreatedAt, &op.UpdatedAt, &op.FinishedAt)
	if err != nil {
		return op, err
	}
	op.Action = BulkAction(action)
	var sf storedFilter
	if err := json.Unmarshal(doc, &sf); err != nil {
		return op, fmt.Errorf("bulk operation filter: %w", err)
	}
	op.Filter = sf.runFilter()
	op.Filter.OldestFirst = false
	return op, nil
}

// GetBulkOperation reads one bulk operation of the transaction's tenant.
func GetBulkOperation(ctx context.Context, tx *pg.Tx, id uuid.UUID) (BulkOperation, error) {
	op, err := scanBulk(tx.QueryRow(ctx, qGetBulk, tx.Tenant, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return op, errs.E(errs.NotFound, "bulk operation %s not found", id)
	}
	return op, err
}

// ListBulkOperations reads up to first of the tenant's bulk operations
// older than after (nil: the newest), newest first, and whether more follow.
func ListBulkOperations(ctx context.Context, tx *pg.Tx, first int, after *uuid.UUID) ([]BulkOperation, bool, error) {
	if first < 1 || first > 100 {
		return nil, false, errs.E(errs.Invalid, "first must be between 1 and 100")
	}
	rows, err := tx.Query(ctx, qListBulk, tx.Tenant, after, first+1)
	if err != nil {
		return nil, false, fmt.Errorf("list bulk operations: %w", err)
	}
	defer rows.Close()
	var out []BulkOperation
	for rows.Next() {
		op, err := scanBulk(rows)
		if err != nil {
			return nil, false, fmt.Errorf("list bulk operations: %w", err)
		}
		out = append(out, op)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("list bulk operations: %w", err)
	}
	more := len(out) > first
	if more {
		out = out[:first]
	}
	return out, more, nil
}

// CancelBulkOperation stops a running bulk operation after the batch in
// hand; what it changed stays changed. Cancelling a finished one answers
// it as it is.
func (c *Coordinator) CancelBulkOperation(ctx context.Context, tenant, id uuid.UUID) (BulkOperation, error) {
	var op BulkOperation
	err := c.db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		if err := gate(ctx, tx); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, qCancelBulk, tenant, id); err != nil {
			return fmt.Errorf("cancel bulk operation: %w", err)
		}
		var err error
		op, err = GetBulkOperation(ctx, tx, id)
		return err
	})
	return op, err
}

// errAppliedByThisJob ends a run's transition whose (job, run) mark exists:
// the job changed that run already.
var errAppliedByThisJob = errors.New("the bulk operation already changed this run")

// applyBulk applies op's action to one run, marked in the transition's
// own transaction.
func (c *Coordinator) applyBulk(ctx context.Context, tenant, op uuid.UUID, action BulkAction, reason string, run uuid.UUID) (Ack, error) {
	ctx = WithGate(ctx, func(ctx context.Context, tx *pg.Tx) error {
		tag, err := tx.Exec(ctx, qMarkBulkRun, tenant, op, run)
		if err != nil {
			return fmt.Errorf("mark run: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return errAppliedByThisJob
		}
		return nil
	})
	switch action {
	case BulkCancel:
		return c.CancelRun(ctx, tenant, run, reason)
	case BulkRerun:
		return c.RerunRun(ctx, tenant, run)
	default:
		return c.startQueued(ctx, tenant, run)
	}
}

// BulkRunner works the bulk operations of every tenant. Run it on every
// server replica: each pass claims one due job (FOR UPDATE SKIP LOCKED,
// stamping a lease), works one batch of it in the job's tenant, records
// the progress and gives the job back, so the jobs of several tenants take
// turns and a replica that dies holds a job for at most Lease.
type BulkRunner struct {
	DB    *pg.DB
	Coord *Coordinator
	Log   *zap.Logger
	// Owner names this runner in leases (default: a random id).
	Owner string
	// Batch bounds the runs of one batch (default BulkBatch).
	Batch int
	// Parallel bounds the runs of a batch changed at once (default 1: a
	// bulk job is background work, and each run it changes at once takes
	// a share of the database from every tenant's live work).
	Parallel int
	// Lease is how long a claimed job is this runner's (default 30s).
	Lease time.Duration
	// Poll bounds the sleep between passes without work (default 1s).
	Poll time.Duration
	// Retry is the wait after a batch stopped on a refusal that may pass
	// (default 1s).
	Retry time.Duration
	// OnProgress, when set, is called after each recorded batch (live
	// updates).
	OnProgress func(tenant, op uuid.UUID, status string)

	once sync.Once
	wake chan struct{}
}

func (b *BulkRunner) init() {
	b.once.Do(func() {
		b.wake = make(chan struct{}, 1)
		if b.Log == nil {
			b.Log = zap.NewNop()
		}
		if b.Owner == "" {
			b.Owner = "bulk-" + uuid.NewString()
		}
		if b.Batch <= 0 {
			b.Batch = BulkBatch
		}
		if b.Parallel <= 0 {
			b.Parallel = 1
		}
		if b.Lease <= 0 {
			b.Lease = 30 * time.Second
		}
		if b.Poll <= 0 {
			b.Poll = time.Second
		}
		if b.Retry <= 0 {
			b.Retry = time.Second
		}
	})
}

// Wake asks the runner to look for work now.
func (b *BulkRunner) Wake() {
	b.init()
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// Run works bulk operations until ctx ends.
func (b *BulkRunner) Run(ctx context.Context) error {
	b.init()
	lastClean := time.Time{}
	for ctx.Err() == nil {
		worked, err := b.Step(ctx)
		if err != nil && ctx.Err() == nil {
			b.Log.Warn("bulk operation batch failed", zap.Error(err))
		}
		if time.Since(lastClean) > time.Minute {
			lastClean = time.Now()
			if _, err := b.DB.System().Exec(ctx, qDropOldBulk, BulkRetention.Seconds()); err != nil && ctx.Err() == nil {
				b.Log.Warn("dropping finished bulk operations failed", zap.Error(err))
			}
		}
		if worked && err == nil {
			continue
		}
		select {
		case <-ctx.Done():
		case <-b.wake:
		case <-time.After(b.Poll):
		}
	}
	return ctx.Err()
}

// Step claims one due job and works one batch of it; it reports whether
// there was one.
func (b *BulkRunner) Step(ctx context.Context) (bool, error) {
	b.init()
	var tenant, id uuid.UUID
	err := b.DB.System().QueryRow(ctx, qClaimBulk, b.Owner, b.Lease.Seconds()).Scan(&tenant, &id)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("claim bulk operation: %w", err)
	}
	if err := b.batch(ctx, tenant, id); err != nil {
		// Give the job back for a later try rather than hold it for a lease.
		if _, rerr := b.DB.System().Exec(context.WithoutCancel(ctx), qReleaseBulk, tenant, id, b.Owner, b.Retry.Seconds()); rerr != nil {
			b.Log.Warn("giving a bulk operation back failed; it is free again when its lease ends", zap.Error(rerr))
		}
		return true, err
	}
	return true, nil
}

type bulkJob struct {
	action BulkAction
	status string
	filter storedFilter
	reason string
	cursor *uuid.UUID
}

type bulkOutcome int

const (
	outcomeDone bulkOutcome = iota
	outcomeSkipped
	outcomeFailed
	outcomeRetry
)

// batch works one batch of a claimed job.
func (b *BulkRunner) batch(ctx context.Context, tenant, id uuid.UUID) error {
	var job bulkJob
	var runs []uuid.UUID
	var more bool
	err := b.DB.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		var action string
		var doc []byte
		var reason *string
		if err := tx.QueryRow(ctx, qBulkJob, tenant, id).Scan(&action, &job.status, &doc, &reason, &job.cursor); err != nil {
			return fmt.Errorf("read bulk operation: %w", err)
		}
		job.action, job.reason = BulkAction(action), deref(reason)
		if err := json.Unmarshal(doc, &job.filter); err != nil {
			return fmt.Errorf("bulk operation filter: %w", err)
		}
		if job.status != BulkRunning {
			return nil
		}
		q, args := runsQuery(tenant, job.filter.runFilter(), b.Batch, job.cursor, "r.id")
		rows, err := tx.Query(ctx, q, args...)
		if err != nil {
			return fmt.Errorf("list runs: %w", err)
		}
		runs, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil {
			return fmt.Errorf("list runs: %w", err)
		}
		if more = len(runs) > b.Batch; more {
			runs = runs[:b.Batch]
		}
		return nil
	})
	if err != nil {
		return err
	}
	if job.status != BulkRunning {
		return b.record(ctx, tenant, id, job.cursor, job.cursor, [4]int64{}, 0, "", false)
	}
	reason := job.reason
	if reason == "" {
		reason = "cancelled by a bulk operation"
	}
	outcomes := make([]bulkOutcome, len(runs))
	problems := make([]error, len(runs))
	parallel := b.Parallel
	if job.action == BulkResume {
		parallel = 1 // queued runs start in the order they were queued
	}
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i, run := range runs {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ack, err := b.Coord.applyBulk(ctx, tenant, id, job.action, reason, run)
			outcomes[i], problems[i] = classify(ack, err)
		}()
	}
	wg.Wait()
	// The batch counts up to the first run to try again; the cursor stops
	// before it.
	var counts [4]int64
	cursor := job.cursor
	lastErr := ""
	retry := false
	for i, o := range outcomes {
		if o == outcomeRetry {
			retry = true
			if ctx.Err() == nil {
				b.Log.Info("bulk operation waits", zap.Stringer("tenant_id", tenant), zap.Stringer("operation", id), zap.Error(problems[i]))
			}
			lastErr = truncate(problems[i].Error(), 1000)
			break
		}
		counts[o]++
		if o == outcomeFailed {
			lastErr = truncate(problems[i].Error(), 1000)
		}
		r := runs[i]
		cursor = &r
	}
	finished := !retry && !more
	var wait time.Duration
	if retry {
		wait = b.Retry
	}
	return b.record(ctx, tenant, id, job.cursor, cursor, counts, wait, lastErr, finished)
}

// record writes a batch's progress, fenced by the lease and the cursor the
// batch started from, and gives the job back. The runs done are counted
// from the job's marks in the batch's id range (to the end when the job
// finishes), not from this runner's outcomes: a run another runner of the
// job changed meanwhile (one whose lease ran out mid-batch) is counted
// once, by whoever records the range it is in.
func (b *BulkRunner) record(ctx context.Context, tenant, id uuid.UUID, from, to *uuid.UUID, counts [4]int64, wait time.Duration, lastErr string, finished bool) error {
	var status string
	upTo := to
	if finished || (to == nil && from == nil) {
		upTo = nil // no upper bound
	}
	counted := to != from || finished
	err := b.DB.WithTenant(context.WithoutCancel(ctx), tenant, func(ctx context.Context, tx *pg.Tx) error {
		err := tx.QueryRow(ctx, qRecordBulk, tenant, id, b.Owner, from, to, counted, upTo,
			counts[outcomeFailed], counts[outcomeSkipped], nullIfEmpty(lastErr), finished, wait.Seconds()).Scan(&status)
		if errors.Is(err, pgx.ErrNoRows) {
			status = "" // the lease was lost: another runner has the job; its marks keep this batch's changes single
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("record bulk progress: %w", err)
	}
	if status != "" && b.OnProgress != nil {
		b.OnProgress(tenant, id, status)
	}
	return nil
}

func classify(ack Ack, err error) (bulkOutcome, error) {
	switch {
	case err == nil && ack.Ignored:
		return outcomeSkipped, nil
	case err == nil, errors.Is(err, errAppliedByThisJob):
		return outcomeDone, nil
	}
	switch errs.KindOf(err) {
	case errs.NotFound, errs.Invalid, errs.Conflict, errs.Forbidden:
		return outcomeFailed, err
	default:
		return outcomeRetry, err // admission (quota, caps), or the database
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

var _ lifecycle.Service = (*BulkRunner)(nil)

const (
	qCountActiveBulk = `SELECT count(*) FROM (SELECT 1 FROM bulk_operations WHERE tenant_id = $1 AND status = 'running' LIMIT $2) a`
	qInsertBulk      = `INSERT INTO bulk_operations (tenant_id, id, action, status, filter, reason, idempotency_key, request_hash, created_by)
		VALUES ($1, $2, $3, 'running',
		        CASE WHEN $9::boolean AND NOT ($4::jsonb ? 'created_before' AND ($4::jsonb->>'created_before')::timestamptz < now())
		             THEN jsonb_set($4::jsonb, '{created_before}', to_jsonb(now())) ELSE $4::jsonb END,
		        $5, $6, $7, $8)
		ON CONFLICT DO NOTHING`
	qBulkByKey  = `SELECT id, request_hash FROM bulk_operations WHERE tenant_id = $1 AND idempotency_key = $2`
	qGetBulk    = `SELECT ` + bulkColumns + ` FROM bulk_operations WHERE tenant_id = $1 AND id = $2`
	qListBulk   = `SELECT ` + bulkColumns + ` FROM bulk_operations WHERE tenant_id = $1 AND ($2::uuid IS NULL OR id < $2) ORDER BY id DESC LIMIT $3`
	qCancelBulk = `UPDATE bulk_operations SET status = 'cancelled', finished_at = now(), updated_at = now()
		WHERE tenant_id = $1 AND id = $2 AND status = 'running'`
	qMarkBulkRun = `INSERT INTO bulk_operation_runs (tenant_id, operation_id, run_id) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`
	qClaimBulk   = `UPDATE bulk_operations SET lease_owner = $1, lease_expires_at = now() + make_interval(secs => $2)
		WHERE (tenant_id, id) = (
		      SELECT tenant_id, id FROM bulk_operations
		       WHERE status = 'running' AND next_batch_at <= now() AND (lease_expires_at IS NULL OR lease_expires_at < now())
		       ORDER BY next_batch_at LIMIT 1 FOR UPDATE SKIP LOCKED)
		RETURNING tenant_id, id`
	qReleaseBulk = `UPDATE bulk_operations SET lease_owner = NULL, lease_expires_at = NULL, next_batch_at = now() + make_interval(secs => $4)
		WHERE tenant_id = $1 AND id = $2 AND lease_owner = $3`
	qBulkJob    = `SELECT action, status, filter, reason, cursor_run FROM bulk_operations WHERE tenant_id = $1 AND id = $2`
	qRecordBulk = `WITH marked AS (
		  SELECT count(*) AS n FROM bulk_operation_runs
		   WHERE $6 AND tenant_id = $1 AND operation_id = $2
		     AND ($4::uuid IS NULL OR run_id > $4) AND ($7::uuid IS NULL OR run_id <= $7))
		UPDATE bulk_operations
		   SET cursor_run = $5, matched = matched + marked.n + $8 + $9, done = done + marked.n, failed = failed + $8, skipped = skipped + $9,
		       last_error = coalesce($10, last_error),
		       status = CASE WHEN $11 AND status = 'running' THEN 'completed' ELSE status END,
		       finished_at = CASE WHEN $11 AND status = 'running' THEN now() ELSE finished_at END,
		       next_batch_at = now() + make_interval(secs => $12), lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
		  FROM marked
		 WHERE tenant_id = $1 AND id = $2 AND lease_owner = $3 AND cursor_run IS NOT DISTINCT FROM $4
		RETURNING status`
	qDropOldBulk = `DELETE FROM bulk_operations WHERE (tenant_id, id) IN (
		SELECT tenant_id, id FROM bulk_operations WHERE status <> 'running' AND finished_at < now() - make_interval(secs => $1) LIMIT 100)`
)
