package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/composer-dev/composer/engine/dag"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
)

// RunView is a run as dashboards and APIs show it.
type RunView struct {
	ID              uuid.UUID         `json:"id"`
	WorkflowID      uuid.UUID         `json:"workflow_id"`
	WorkflowVersion int               `json:"workflow_version"`
	Status          string            `json:"status"`
	Input           json.RawMessage   `json:"input"`
	Output          json.RawMessage   `json:"output,omitempty"`
	Error           json.RawMessage   `json:"error,omitempty"`
	Metadata        map[string]string `json:"metadata"`
	IdempotencyKey  *string           `json:"idempotency_key,omitempty"`
	RerunOf         *uuid.UUID        `json:"rerun_of,omitempty"`
	CreatedAt       time.Time         `json:"created_at"`
	UpdatedAt       time.Time         `json:"updated_at"`
	FinishedAt      *time.Time        `json:"finished_at,omitempty"`
	// ParentRunID and ParentNode name the run and node that started this
	// one, for a child run.
	ParentRunID *uuid.UUID `json:"parent_run_id,omitempty"`
	ParentNode  *string    `json:"parent_node,omitempty"`
	// ConcurrencyKey is the run's key under its workflow's concurrency
	// limit.
	ConcurrencyKey *string `json:"concurrency_key,omitempty"`
	Priority       int     `json:"priority"`
	// StartedBy is who started the run ("user:<subject>", "api_key:<key
	// id>", "schedule:<id>"; nil when not recorded).
	StartedBy *string `json:"started_by,omitempty"`
	// SecretInput marks a child run whose input derives from a step that
	// read a secret: all of its values count as derived from one.
	SecretInput bool `json:"-"`
	// Snapshot, when set, holds the run's tasks and workflow as read with
	// it (a live update read once and given to every subscriber): readers
	// use them rather than loading their own.
	Snapshot *RunSnapshot `json:"-"`
}

// RunSnapshot is what a run view was read with.
type RunSnapshot struct {
	Tasks    []TaskView
	Workflow Workflow
}

// TaskView is one node's task.
type TaskView struct {
	ID       uuid.UUID `json:"id"`
	RunID    uuid.UUID `json:"run_id"`
	NodeID   string    `json:"node_id"`
	NodeType string    `json:"node_type"`
	Queue    *string   `json:"queue,omitempty"`
	// Handler is a task node's handler.
	Handler     *string         `json:"handler,omitempty"`
	State       string          `json:"state"`
	Attempt     int             `json:"attempt"`
	MaxAttempts int             `json:"max_attempts"`
	Input       json.RawMessage `json:"input,omitempty"`
	Output      json.RawMessage `json:"output,omitempty"`
	LastError   json.RawMessage `json:"last_error,omitempty"`
	SkipReason  *string         `json:"skip_reason,omitempty"`
	CreatedAt   time.Time       `json:"created_at"`
	StartedAt   *time.Time      `json:"started_at,omitempty"`
	FinishedAt  *time.Time      `json:"finished_at,omitempty"`
	// ChildRunID is the child run a workflow task (or map element) started.
	ChildRunID *uuid.UUID `json:"child_run_id,omitempty"`
	// WaitingUntil is, for a waiting task, when its timer fires: a sleep's
	// end, or a wait's timeout.
	WaitingUntil *time.Time `json:"waiting_until,omitempty"`
	// SecretDerived marks a task whose input, output and error may hold
	// what a step that read a secret produced (set by the API, which
	// knows the definition: dag.Workflow.SecretDerived).
	SecretDerived bool `json:"-"`
}

const runColumns = `id, workflow_id, workflow_version, status, input, output, error, idempotency_key, rerun_of, created_at, updated_at, finished_at, metadata,
	parent_run_id, parent_node, concurrency_key, priority, started_by, secret_input`

func scanRun(row pgx.Row) (RunView, error) {
	var r RunView
	err := row.Scan(&r.ID, &r.WorkflowID, &r.WorkflowVersion, &r.Status, &r.Input, &r.Output, &r.Error, &r.IdempotencyKey,
		&r.RerunOf, &r.CreatedAt, &r.UpdatedAt, &r.FinishedAt, &r.Metadata, &r.ParentRunID, &r.ParentNode, &r.ConcurrencyKey, &r.Priority,
		&r.StartedBy, &r.SecretInput)
	return r, err
}

// GetRun reads one run in the transaction's tenant.
func GetRun(ctx context.Context, tx *pg.Tx, id uuid.UUID) (RunView, error) {
	r, err := scanRun(tx.QueryRow(ctx, qGetRun, tx.Tenant, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return RunView{}, errs.E(errs.NotFound, "run %s not found", id)
	}
	if err != nil {
		return RunView{}, fmt.Errorf("get run: %w", err)
	}
	return r, nil
}

const taskColumns = `t.id, t.run_id, t.node_id, t.node_type, t.queue, t.config->'task'->>'handler', t.state, t.attempt, t.max_attempts, t.input,
	t.output, t.last_error, t.skip_reason, t.created_at, t.started_at, t.finished_at,
	CASE WHEN t.node_type = 'workflow' THEN (SELECT c.id FROM workflow_runs c
	  WHERE c.tenant_id = t.tenant_id AND c.parent_run_id = t.run_id AND c.parent_task_id = t.id ORDER BY c.id DESC LIMIT 1) END,
	CASE WHEN t.state = 'waiting' THEN (SELECT min(tm.fire_at) FROM timers tm
	  WHERE tm.tenant_id = t.tenant_id AND tm.run_id = t.run_id AND tm.task_id = t.id AND tm.kind IN ('sleep', 'wait_timeout')) END`

// TasksOfRuns reads the tasks of the given runs, in creation order.
func TasksOfRuns(ctx context.Context, tx *pg.Tx, runs []uuid.UUID) ([]TaskView, error) {
	rows, err := tx.Query(ctx, qTasksOfRuns, tx.Tenant, runs)
	if err != nil {
		return nil, fmt.Errorf("tasks of runs: %w", err)
	}
	var out []TaskView
	var t TaskView
	_, err = pgx.ForEachRow(rows, []any{&t.ID, &t.RunID, &t.NodeID, &t.NodeType, &t.Queue, &t.Handler, &t.State, &t.Attempt, &t.MaxAttempts,
		&t.Input, &t.Output, &t.LastError, &t.SkipReason, &t.CreatedAt, &t.StartedAt, &t.FinishedAt, &t.ChildRunID, &t.WaitingUntil}, func() error {
		c := t
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("tasks of runs: %w", err)
	}
	return out, nil
}

// RunFilter narrows a run listing. Created bounds become id bounds (run ids
// are UUIDv7, ordered by creation), so every filter is an index range.
type RunFilter struct {
	Statuses       []string
	WorkflowID     *uuid.UUID
	CreatedAfter   *time.Time
	CreatedBefore  *time.Time
	IdempotencyKey *string
	// Metadata keeps runs whose metadata has each of these key/value pairs
	// (at most MaxMetadataFilters).
	Metadata map[string]string
	// OldestFirst lists in creation order; after is then the run id the
	// listing continues after (a bulk operation's cursor).
	OldestFirst bool
}

// checkRunFilter is the BAD_USER_INPUT of a filter ListRuns would refuse.
func checkRunFilter(f RunFilter) error {
	for _, s := range f.Statuses {
		switch s {
		case "queued", "running", "completed", "failed", "cancelled":
		default:
			return errs.E(errs.Invalid, "unknown status %q", s)
		}
	}
	if len(f.Metadata) > 0 {
		if err := checkMetadata("filter.metadata", f.Metadata, MaxMetadataFilters); err != nil {
			return err
		}
	}
	return nil
}

// MaxPage bounds one page of a listing.
const MaxPage = 500

// ListRuns returns up to first runs older than the run id after (nil for
// the newest), newest first, and whether more follow.
func ListRuns(ctx context.Context, tx *pg.Tx, f RunFilter, first int, after *uuid.UUID) ([]RunView, bool, error) {
	if first < 1 || first > MaxPage {
		return nil, false, errs.E(errs.Invalid, "first must be between 1 and %d", MaxPage)
	}
	if err := checkRunFilter(f); err != nil {
		return nil, false, err
	}
	q, args := runsQuery(tx.Tenant, f, first, after, qualified(runColumns, "r."))
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		return nil, false, fmt.Errorf("list runs: %w", err)
	}
	defer rows.Close()
	var out []RunView
	for rows.Next() {
		r, err := scanRun(rows)
		if err != nil {
			return nil, false, fmt.Errorf("list runs: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("list runs: %w", err)
	}
	more := len(out) > first
	if more {
		out = out[:first]
	}
	return out, more, nil
}

// runsQuery builds ListRuns' statement (selecting cols, up to first+1
// rows) and its arguments.
func runsQuery(tenant uuid.UUID, f RunFilter, first int, after *uuid.UUID, cols string) (string, []any) {
	args := []any{tenant}
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	// conds bound the run; ranges bound the id order column (the run's id,
	// or with a metadata filter the driving metadata row's run id).
	var conds, ranges []string
	order := "r.id"
	var meta []string
	if len(f.Metadata) > 0 {
		order = "m.run_id"
		keys := slices.Sorted(maps.Keys(f.Metadata))
		meta = append(meta, "m.tenant_id = $1", "m.key = "+arg(keys[0]), "m.value = "+arg(f.Metadata[keys[0]]))
		for _, k := range keys[1:] {
			meta = append(meta, "EXISTS (SELECT 1 FROM run_metadata x WHERE x.tenant_id = $1 AND x.key = "+arg(k)+
				" AND x.value = "+arg(f.Metadata[k])+" AND x.run_id = m.run_id)")
		}
	}
	dir, cmp := "DESC", " < "
	if f.OldestFirst {
		dir, cmp = "ASC", " > "
	}
	if after != nil {
		ranges = append(ranges, order+cmp+arg(*after))
	}
	if len(f.Statuses) == 1 {
		conds = append(conds, "r.status = "+arg(f.Statuses[0]))
	} else if len(f.Statuses) > 1 {
		conds = append(conds, "r.status = ANY("+arg(f.Statuses)+")")
	}
	if f.WorkflowID != nil {
		conds = append(conds, "r.workflow_id = "+arg(*f.WorkflowID))
	}
	if f.CreatedAfter != nil {
		ranges = append(ranges, order+" >= composer_uuid_floor("+arg(*f.CreatedAfter)+")")
	}
	if f.CreatedBefore != nil {
		ranges = append(ranges, order+" < composer_uuid_floor("+arg(*f.CreatedBefore)+")")
	}
	if f.IdempotencyKey != nil {
		conds = append(conds, "r.id = (SELECT run_id FROM run_idempotency_keys k WHERE k.tenant_id = $1 AND k.key = "+arg(*f.IdempotencyKey)+")")
	}
	var q string
	if len(meta) == 0 {
		where := append(append([]string{"r.tenant_id = $1"}, ranges...), conds...)
		q = `SELECT ` + cols + ` FROM workflow_runs r WHERE ` + strings.Join(where, " AND ") +
			` ORDER BY r.id ` + dir + ` LIMIT ` + arg(first+1)
	} else {
		// The first pair drives the listing: its index range is in run-id
		// order, and each of its rows probes one run by primary key (the
		// lateral subquery, kept apart by OFFSET 0, is never turned into a
		// join the planner could drive from the runs, as it would on a
		// partition without statistics), so a page reads about as many rows
		// as the filters pass over; further pairs are primary-key probes.
		inner := append([]string{"r.tenant_id = $1", "r.id = m.run_id"}, conds...)
		where := append(meta, ranges...)
		q = `SELECT ` + cols + ` FROM run_metadata m CROSS JOIN LATERAL (SELECT * FROM workflow_runs r WHERE ` +
			strings.Join(inner, " AND ") + ` OFFSET 0) r WHERE ` + strings.Join(where, " AND ") + ` ORDER BY m.run_id ` + dir + ` LIMIT ` + arg(first+1)
	}
	return q, args
}

// qualified prefixes every column of a column list.
func qualified(cols, prefix string) string {
	parts := strings.Split(cols, ",")
	for i, c := range parts {
		parts[i] = prefix + strings.TrimSpace(c)
	}
	return strings.Join(parts, ", ")
}

// RunEvent is one entry of a run's timeline: an applied event and what it
// changed.
type RunEvent struct {
	ID        int64           `json:"id"`
	Kind      string          `json:"kind"`
	NodeID    *string         `json:"node_id,omitempty"`
	TaskID    *uuid.UUID      `json:"task_id,omitempty"`
	Attempt   *int            `json:"attempt,omitempty"`
	Detail    json.RawMessage `json:"detail"`
	CreatedAt time.Time       `json:"created_at"`
}

// Timeline reads up to limit of a run's events, oldest first.
func Timeline(ctx context.Context, tx *pg.Tx, run uuid.UUID, limit int) ([]RunEvent, error) {
	if limit < 1 || limit > 5000 {
		return nil, errs.E(errs.Invalid, "first must be between 1 and 5000")
	}
	rows, err := tx.Query(ctx, qTimeline, tx.Tenant, run, limit)
	if err != nil {
		return nil, fmt.Errorf("timeline: %w", err)
	}
	var out []RunEvent
	var e RunEvent
	_, err = pgx.ForEachRow(rows, []any{&e.ID, &e.Kind, &e.NodeID, &e.TaskID, &e.Attempt, &e.Detail, &e.CreatedAt}, func() error {
		c := e
		c.Detail = append(json.RawMessage(nil), e.Detail...)
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("timeline: %w", err)
	}
	return out, nil
}

const workflowColumns = `id, name, description, latest_version, created_at, updated_at, paused_at, pause_reason`

func scanWorkflow(row pgx.Row) (Workflow, error) {
	var w Workflow
	err := row.Scan(&w.ID, &w.Name, &w.Description, &w.LatestVersion, &w.CreatedAt, &w.UpdatedAt, &w.PausedAt, &w.PauseReason)
	return w, err
}

// ListWorkflows returns up to first workflows after the name after, by name.
func ListWorkflows(ctx context.Context, tx *pg.Tx, first int, after *string) ([]Workflow, bool, error) {
	if first < 1 || first > MaxPage {
		return nil, false, errs.E(errs.Invalid, "first must be between 1 and %d", MaxPage)
	}
	rows, err := tx.Query(ctx, qListWorkflows, tx.Tenant, after, first+1)
	if err != nil {
		return nil, false, fmt.Errorf("list workflows: %w", err)
	}
	defer rows.Close()
	var out []Workflow
	for rows.Next() {
		w, err := scanWorkflow(rows)
		if err != nil {
			return nil, false, fmt.Errorf("list workflows: %w", err)
		}
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("list workflows: %w", err)
	}
	more := len(out) > first
	if more {
		out = out[:first]
	}
	return out, more, nil
}

// WorkflowsByID reads workflows by id (for batched loading); missing ids
// are absent from the map.
func WorkflowsByID(ctx context.Context, tx *pg.Tx, ids []uuid.UUID) (map[uuid.UUID]Workflow, error) {
	rows, err := tx.Query(ctx, qWorkflowsByID, tx.Tenant, ids)
	if err != nil {
		return nil, fmt.Errorf("workflows by id: %w", err)
	}
	defer rows.Close()
	out := make(map[uuid.UUID]Workflow, len(ids))
	for rows.Next() {
		w, err := scanWorkflow(rows)
		if err != nil {
			return nil, fmt.Errorf("workflows by id: %w", err)
		}
		out[w.ID] = w
	}
	return out, rows.Err()
}

// GetWorkflow reads one workflow.
func GetWorkflow(ctx context.Context, tx *pg.Tx, id uuid.UUID) (Workflow, error) {
	w, err := scanWorkflow(tx.QueryRow(ctx, qGetWorkflow, tx.Tenant, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Workflow{}, errs.E(errs.NotFound, "workflow %s not found", id)
	}
	if err != nil {
		return Workflow{}, fmt.Errorf("get workflow: %w", err)
	}
	return w, nil
}

// Versions reads a workflow's versions, newest first; number > 0 reads
// only that one (NotFound when it does not exist).
func Versions(ctx context.Context, tx *pg.Tx, workflow uuid.UUID, number int) ([]Version, error) {
	out, err := versionPage(ctx, tx, workflow, number, 0, 0)
	if err == nil && number > 0 && len(out) == 0 {
		return nil, errs.E(errs.NotFound, "version %d of workflow %s not found", number, workflow)
	}
	return out, err
}

// VersionPage lists up to limit versions of a workflow, newest first,
// older than before (0: from the newest).
func VersionPage(ctx context.Context, tx *pg.Tx, workflow uuid.UUID, limit, before int) ([]Version, error) {
	return versionPage(ctx, tx, workflow, 0, limit, before)
}

func versionPage(ctx context.Context, tx *pg.Tx, workflow uuid.UUID, number, limit, before int) ([]Version, error) {
	rows, err := tx.Query(ctx, qVersionPage, tx.Tenant, workflow, number, limit, before)
	if err != nil {
		return nil, fmt.Errorf("versions: %w", err)
	}
	var out []Version
	var v Version
	_, err = pgx.ForEachRow(rows, []any{&v.WorkflowID, &v.Version, &v.Definition, &v.CreatedAt}, func() error {
		c := v
		c.Definition = append(json.RawMessage(nil), v.Definition...)
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("versions: %w", err)
	}
	return out, nil
}

// Usage is what a tenant uses now.
type Usage struct {
	RunningRuns  int
	QueuedTasks  int
	RunningTasks int
}

// TenantUsage counts the tenant's running runs and its queued and running
// tasks.
func TenantUsage(ctx context.Context, tx *pg.Tx) (Usage, error) {
	var u Usage
	err := tx.QueryRow(ctx, qTenantUsage, tx.Tenant).
		Scan(&u.RunningRuns, &u.QueuedTasks, &u.RunningTasks)
	if err != nil {
		return Usage{}, fmt.Errorf("tenant usage: %w", err)
	}
	return u, nil
}

// QueuedTasksAtLeast reports whether the tenant has at least n tasks
// waiting for a worker (counting no further than n).
func QueuedTasksAtLeast(ctx context.Context, tx *pg.Tx, n int) (bool, error) {
	if n <= 0 {
		return false, nil
	}
	var have int
	err := tx.QueryRow(ctx, qQueuedTasksAtLeast,
		tx.Tenant, n).Scan(&have)
	if err != nil {
		return false, fmt.Errorf("queued tasks: %w", err)
	}
	return have >= n, nil
}

// The package's SQL, named. (Statements that are assembled from
// parameterised pieces — filters — are built next to their const parts.)
const (
	// coordinator
	qClaimIdempotencyKey = `INSERT INTO run_idempotency_keys (tenant_id, key, run_id, request_hash)
				VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING run_id`
	// A child run ($10 its parent) inherits its parent's starter, and its
	// input derives from a secret when its node's does ($18) or its
	// parent's input did.
	qInsertRun = `INSERT INTO workflow_runs (tenant_id, id, workflow_id, workflow_version, status, input, idempotency_key, rerun_of, traceparent, metadata,
				parent_run_id, parent_task_id, parent_node, depth, concurrency_key, priority, started_by, secret_input)
			VALUES ($1, $2, $3, $4, $14, $5, NULLIF($6, ''), $7, NULLIF($8, ''), $9, $10, $11, $12, $13, $15, $16,
				coalesce(NULLIF($17, ''), (SELECT p.started_by FROM workflow_runs p WHERE p.tenant_id = $1 AND p.id = $10)),
				$18 OR coalesce((SELECT p.secret_input FROM workflow_runs p WHERE p.tenant_id = $1 AND p.id = $10), false))
			RETURNING created_at`
	qInsertRunMetadata = `INSERT INTO run_metadata (tenant_id, run_id, key, value) SELECT $1, $2, k, v FROM unnest($3::text[], $4::text[]) AS m(k, v)`
	qIdempotentRun     = `SELECT k.run_id, k.request_hash, r.status FROM run_idempotency_keys k
		JOIN workflow_runs r ON r.tenant_id = k.tenant_id AND r.id = k.run_id
		WHERE k.tenant_id = $1 AND k.key = $2`
	qWorkflowByID     = `SELECT id, latest_version, paused_at IS NOT NULL FROM workflow_definitions WHERE tenant_id = $1 AND id = $2`
	qWorkflowByName   = `SELECT id, latest_version, paused_at IS NOT NULL FROM workflow_definitions WHERE tenant_id = $1 AND name = $2`
	qExtendEagerLease = `UPDATE task_instances t SET lease_expires_at = now() + make_interval(secs => $6), updated_at = now()
			  FROM task_instances d, workflow_runs r
			 WHERE d.tenant_id = $1 AND d.run_id = $2 AND d.id = $3 AND d.attempt = $4 AND d.state = 'completed'
			   AND t.tenant_id = $1 AND t.run_id = $2 AND t.id <> d.id AND t.state = 'running' AND t.attempt = 1
			   AND t.lease_owner = $5 AND t.started_at = d.finished_at AND t.lease_expires_at > now() AND ` + keyFenceT7 + `
			   AND r.tenant_id = $1 AND r.id = $2 AND r.status = 'running'
			RETURNING t.id, t.node_id, t.node_type, coalesce(t.queue, ''), t.input, t.config, t.max_attempts, t.lease_expires_at,
			          r.workflow_id, r.workflow_version, coalesce(r.traceparent, '')`
	qSignalSeen = `SELECT EXISTS (SELECT 1 FROM run_signals WHERE tenant_id = $1 AND run_id = $2 AND id = $3),
				(SELECT count(*) FROM run_signals WHERE tenant_id = $1 AND run_id = $2), r.workflow_id, r.workflow_version
			  FROM workflow_runs r WHERE r.tenant_id = $1 AND r.id = $2`
	qTakeTimer = `DELETE FROM timers WHERE tenant_id = $1 AND id = $2 AND run_id = $3
			RETURNING kind, coalesce(node_id, ''), task_id, attempt, detail`
	qLockRun = `UPDATE workflow_runs SET updated_at = now() WHERE tenant_id = $1 AND id = $2
		RETURNING workflow_id, workflow_version, status, input, now(), parent_run_id, parent_task_id, parent_node, depth, concurrency_key, priority,
			coalesce(started_by, '')`
	qRunTasks          = `SELECT id, node_id, state, attempt, output, last_error, started_at FROM task_instances WHERE tenant_id = $1 AND run_id = $2`
	qUnconsumedSignals = `SELECT id, name, payload, coalesce(sent_by, '') FROM run_signals WHERE tenant_id = $1 AND run_id = $2 AND consumed_by IS NULL
		ORDER BY created_at, id`
	// leases
	// A holder with a key ($7; '' for a platform worker) is a tenant's
	// worker: its leases are of task nodes only, and record the key.
	qAcquireLease = `UPDATE task_instances t
			   SET state = 'running', lease_owner = $5, lease_key_id = NULLIF($7, ''), lease_expires_at = now() + make_interval(secs => $6),
			       started_at = now(), updated_at = now()
			  FROM workflow_runs r
			 WHERE t.tenant_id = $1 AND t.run_id = $2 AND t.id = $3 AND t.attempt = $4 AND t.state = 'pending'
			   AND ($7 = '' OR t.node_type = '` + tenantWorkerNodeType + `')
			   AND r.tenant_id = $1 AND r.id = $2 AND r.status = 'running'
			   AND NOT EXISTS (SELECT 1 FROM queue_pauses p WHERE p.tenant_id = $1 AND p.queue = coalesce(t.queue, 'default'))
			RETURNING t.lease_expires_at, t.node_id, t.node_type, t.input, t.config, t.max_attempts, r.workflow_id, r.workflow_version`
	qReacquireLease = `UPDATE task_instances t SET lease_expires_at = now() + make_interval(secs => $6),
			       lease_key_id = coalesce(t.lease_key_id, NULLIF($7, '')), updated_at = now()
			  FROM workflow_runs r
			 WHERE t.tenant_id = $1 AND t.run_id = $2 AND t.id = $3 AND t.attempt = $4 AND t.state = 'running'
			   AND t.lease_owner = $5 AND t.lease_expires_at > now() AND ` + keyFenceT7 + `
			   AND r.tenant_id = $1 AND r.id = $2 AND r.status = 'running'
			RETURNING t.lease_expires_at, t.node_id, t.node_type, t.input, t.config, t.max_attempts, r.workflow_id, r.workflow_version`
	qReleaseLease = `UPDATE task_instances t SET state = 'pending', lease_owner = NULL, lease_key_id = NULL, lease_expires_at = NULL, started_at = NULL,
			       updated_at = now()
			 WHERE tenant_id = $1 AND run_id = $2 AND id = $3 AND attempt = $4 AND state = 'running' AND lease_owner = $5
			   AND ` + keyFenceT6
	qExpireKeyLeases = `UPDATE task_instances SET lease_expires_at = now() - interval '1 millisecond', updated_at = now()
			 WHERE tenant_id = $1 AND state = 'running' AND lease_key_id = $2 AND lease_expires_at > now()`
	// A renewal by a key records it on a lease taken without one (by the
	// previous release): from then on the lease is bound to it.
	qRenewLease = `UPDATE task_instances t SET lease_expires_at = now() + make_interval(secs => $6),
			       lease_key_id = coalesce(t.lease_key_id, NULLIF($7, ''))
			 WHERE tenant_id = $1 AND run_id = $2 AND id = $3 AND attempt = $4 AND state = 'running' AND lease_owner = $5
			   AND lease_expires_at > now() AND ` + keyFenceT7 + `
			RETURNING lease_expires_at`
	qRunningLimit = `SELECT coalesce(composer_tenant_limit($1, 'max_running_tasks'), 0)`
	// metrics
	qFleetGauges = `SELECT
			(SELECT count(*) FROM (SELECT 1 FROM task_instances WHERE state = 'pending' LIMIT $1) q),
			(SELECT count(*) FROM (SELECT 1 FROM task_instances WHERE state = 'running' LIMIT $1) q),
			(SELECT count(*) FROM (SELECT tenant_id, count(*) AS n FROM task_instances
			    WHERE state = 'running' AND lease_expires_at > now() GROUP BY tenant_id) c
			  WHERE c.n >= coalesce(composer_tenant_limit(c.tenant_id, 'max_running_tasks'), 2147483647)),
			coalesce(extract(epoch FROM now() - (SELECT min(next_attempt_at) FROM outbox WHERE next_attempt_at <= now())), 0)::float8`
	qRunsRunningEstimate = `EXPLAIN (FORMAT JSON) SELECT 1 FROM workflow_runs WHERE status = 'running'`
	// persist
	qGuard            = `WITH g AS (%s RETURNING 1) SELECT composer_guard(count(*), $%d) FROM g`
	qInsertLeasedTask = `INSERT INTO task_instances (tenant_id, run_id, id, node_id, node_type, queue, state, max_attempts,
					input, config, dispatch_at, lease_owner, lease_key_id, lease_expires_at, started_at)
					VALUES ($1, $2, $3, $4, $5, NULLIF($6, ''), 'running', $7, $8, $9, now(), $10, NULLIF($12, ''),
					        now() + make_interval(secs => $11), now())
					RETURNING input, config`
	qInsertTask = `INSERT INTO task_instances (tenant_id, run_id, id, node_id, node_type, queue, state, max_attempts,
				input, config, output, last_error, skip_reason, dispatch_at, finished_at, concurrency_key, concurrency_limit)
				VALUES ($1, $2, $3, $4, $5, NULLIF($6, ''), $7, $8, $9, $10, $11, $12, NULLIF($13, ''), $14, $15, NULLIF($16, ''), NULLIF($17, 0))`
	qInsertTimer = `INSERT INTO timers (tenant_id, run_id, kind, node_id, task_id, attempt, fire_at) VALUES ($1, $2, $3, $4, $5, $6, $7)`
	// A worker's report is fenced on its lease: the owner and, for a
	// tenant's worker, the key (see keyFence).
	qCompleteTask = `UPDATE task_instances t SET state = 'completed', output = $4, lease_owner = NULL,
				lease_expires_at = NULL, finished_at = now(), updated_at = now()
				WHERE tenant_id = $1 AND run_id = $2 AND id = $3 AND attempt = $5 AND state IN ` + activeStates + `
				AND ($6 = '' OR lease_owner = $6) AND ` + keyFenceT7
	// qRetryTask and qFailTask take the states the event may find its task
	// in (%s: the active ones, or only pending for an unleased report, or
	// only running with an expired lease for a lease expiry).
	qRetryTask = `UPDATE task_instances t SET state = 'pending', attempt = attempt + 1, last_error = $4,
				lease_owner = NULL, lease_expires_at = NULL, started_at = NULL, dispatch_at = $5, updated_at = now()
				WHERE tenant_id = $1 AND run_id = $2 AND id = $3 AND attempt = $6 AND state IN %s
				AND ($7 = '' OR lease_owner = $7) AND ` + keyFenceT8
	qFailTask = `UPDATE task_instances t SET state = 'failed', last_error = $4, lease_owner = NULL,
				lease_expires_at = NULL, finished_at = now(), updated_at = now()
				WHERE tenant_id = $1 AND run_id = $2 AND id = $3 AND attempt = $5 AND state IN %s
				AND ($6 = '' OR lease_owner = $6) AND ` + keyFenceT7
	qCancelTask = `UPDATE task_instances SET state = 'cancelled', lease_owner = NULL,
				lease_expires_at = NULL, finished_at = now(), updated_at = now()
				WHERE tenant_id = $1 AND run_id = $2 AND id = $3 AND state IN ` + activeStates
	qDeleteTaskTimers = `DELETE FROM timers WHERE tenant_id = $1 AND run_id = $2 AND task_id = $3`
	qDeleteTask       = `DELETE FROM task_instances WHERE tenant_id = $1 AND run_id = $2 AND id = $3`
	qInsertSignal     = `INSERT INTO run_signals (tenant_id, run_id, id, name, payload, consumed_by, sent_by) VALUES ($1, $2, $3, $4, $5, NULLIF($6, ''), NULLIF($7, ''))`
	qConsumeSignal    = `UPDATE run_signals SET consumed_by = $4
				WHERE tenant_id = $1 AND run_id = $2 AND id = $3 AND consumed_by IS NULL`
	qReopenRun = `UPDATE workflow_runs SET status = 'running', output = NULL, error = NULL, finished_at = NULL, reopened_at = now()
				WHERE tenant_id = $1 AND id = $2 AND status IN ('failed', 'cancelled')`
	qInsertEvent  = `INSERT INTO run_events (tenant_id, run_id, kind, node_id, task_id, attempt, detail) VALUES ($1, $2, $3, NULLIF($4, ''), $5, $6, $7)`
	qReadBackRun  = `SELECT ` + runColumns + ` FROM workflow_runs WHERE tenant_id = $1 AND id = $2`
	qInsertOutbox = `INSERT INTO outbox (tenant_id, queue, run_id, task_id, node_id, node_type, handler, attempt, traceparent, next_attempt_at, priority)
		VALUES ($1, $2, $3, $4, $5, $6, NULLIF($7, ''), $8, NULLIF($9, ''), $10, $11)`
	qFinishRun = `UPDATE workflow_runs SET status = $3, output = $4, error = $5, finished_at = now(), updated_at = now()
		WHERE tenant_id = $1 AND id = $2 AND status = 'running'`
	qDeleteRunTimers = `DELETE FROM timers WHERE tenant_id = $1 AND run_id = $2`
	// The index of event waits (events.go reads it).
	qInsertEventWait = `INSERT INTO event_waits (tenant_id, run_id, task_id, node_id, cancel_on, name, key_expr, match_key)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`
	qDeleteTaskEventWait = `DELETE FROM event_waits WHERE tenant_id = $1 AND task_id = $2`
	qDeleteRunEventWaits = `DELETE FROM event_waits WHERE tenant_id = $1 AND run_id = $2`
	// queries
	qGetRun      = `SELECT ` + runColumns + ` FROM workflow_runs WHERE tenant_id = $1 AND id = $2`
	qTasksOfRuns = `SELECT ` + taskColumns + ` FROM task_instances t WHERE t.tenant_id = $1 AND t.run_id = ANY($2) ORDER BY t.run_id, t.id`
	qTimeline    = `SELECT id, kind, node_id, task_id, attempt, detail, created_at FROM run_events
		WHERE tenant_id = $1 AND run_id = $2 ORDER BY id LIMIT $3`
	qListWorkflows = `SELECT ` + workflowColumns + ` FROM workflow_definitions
		WHERE tenant_id = $1 AND ($2::text IS NULL OR name > $2) ORDER BY name LIMIT $3`
	qWorkflowsByID = `SELECT ` + workflowColumns + ` FROM workflow_definitions WHERE tenant_id = $1 AND id = ANY($2)`
	qGetWorkflow   = `SELECT ` + workflowColumns + ` FROM workflow_definitions WHERE tenant_id = $1 AND id = $2`
	qVersionPage   = `SELECT workflow_id, version, definition, created_at FROM workflow_versions
		WHERE tenant_id = $1 AND workflow_id = $2 AND ($3 = 0 OR version = $3) AND ($5 = 0 OR version < $5)
		ORDER BY version DESC LIMIT CASE WHEN $4 > 0 THEN $4 END`
	qTenantUsage = `SELECT
		(SELECT count(*) FROM workflow_runs WHERE tenant_id = $1 AND status = 'running'),
		(SELECT count(*) FROM task_instances t WHERE t.tenant_id = $1 AND t.state = 'pending'
		    AND t.run_id IN (SELECT id FROM workflow_runs WHERE tenant_id = $1 AND status = 'running')),
		(SELECT count(*) FROM task_instances t WHERE t.tenant_id = $1 AND t.state = 'running'
		    AND t.run_id IN (SELECT id FROM workflow_runs WHERE tenant_id = $1 AND status = 'running'))`
	qQueuedTasksAtLeast = `SELECT count(*) FROM (SELECT 1 FROM task_instances WHERE tenant_id = $1 AND state = 'pending' LIMIT $2) q`
	// sweeper
	qClaimExpiredLeases = `UPDATE task_instances t SET lease_owner = $2, updated_at = now()
		  FROM workflow_runs r
		 WHERE (t.tenant_id, t.run_id, t.id) IN (
		           SELECT tenant_id, run_id, id FROM task_instances
		            WHERE state = 'running' AND lease_expires_at < now()
		              AND (lease_owner IS NULL OR lease_owner NOT LIKE '!sweep:%' OR updated_at < now() - make_interval(secs => $3))
		            ORDER BY lease_expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)
		   AND r.tenant_id = t.tenant_id AND r.id = t.run_id AND r.status = 'running'
		RETURNING t.tenant_id, t.run_id, t.id, t.node_id, t.attempt`
	qLostCandidates = `SELECT p.tenant_id, p.run_id, p.id, p.dispatch_at, p.updated_at FROM task_instances p
		 WHERE p.state = 'pending'
		   AND p.dispatch_at < now() - make_interval(secs => $1)
		   AND p.updated_at < now() - make_interval(secs => $1)
		   AND p.dispatch_at >= $2 AND (p.dispatch_at, p.tenant_id, p.id) > ($2, $3, $4)
		   AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.tenant_id = p.tenant_id AND o.task_id = p.id)
		 ORDER BY p.dispatch_at, p.tenant_id, p.id LIMIT $5`
	qRedispatchLost = `
		WITH cand AS (
			SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::timestamptz[]) AS c(tenant_id, run_id, id, updated_at)
		), lost AS (
			UPDATE task_instances t SET updated_at = now(), dispatch_at = now()
			  FROM cand c, workflow_runs r
			 WHERE t.tenant_id = c.tenant_id AND t.run_id = c.run_id AND t.id = c.id
			   AND t.state = 'pending' AND t.updated_at = c.updated_at
			   AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.tenant_id = t.tenant_id AND o.task_id = t.id)
			   AND r.tenant_id = t.tenant_id AND r.id = t.run_id AND r.status = 'running'
			RETURNING t.tenant_id, t.run_id, t.id, t.node_id, t.node_type, t.queue, t.config->'task'->>'handler' AS handler,
			          t.attempt, r.traceparent, coalesce((t.config->>'priority')::int, 0) AS priority
		), dispatched AS (
			INSERT INTO outbox (tenant_id, queue, run_id, task_id, node_id, node_type, handler, attempt, traceparent, priority)
			SELECT tenant_id, coalesce(queue, 'default'), run_id, id, node_id, node_type, handler, attempt, traceparent, priority FROM lost
		), timeline AS (
			INSERT INTO run_events (tenant_id, run_id, kind, node_id, task_id, attempt, detail)
			SELECT tenant_id, run_id, 'redispatched', node_id, id, attempt,
			       jsonb_build_object('status', 'running', 'reason', 'its message was lost')
			  FROM lost
		)
		SELECT count(*) FROM lost`
	qRetryTimerSoon = `UPDATE timers SET claimed_until = now() + make_interval(secs => $3)
		WHERE tenant_id = $1 AND id = $2`
	qClaimDueTimers = `UPDATE timers SET claimed_until = now() + make_interval(secs => $2)
			 WHERE (tenant_id, id) IN (
			       SELECT tenant_id, id FROM timers
			        WHERE fire_at <= now() AND (claimed_until IS NULL OR claimed_until < now())
			        ORDER BY fire_at LIMIT $1 FOR UPDATE SKIP LOCKED)
			RETURNING tenant_id, run_id, id, kind, detail`
	qNextTimer              = `SELECT min(greatest(fire_at, coalesce(claimed_until, fire_at))) FROM timers`
	qEnsurePartitions       = `SELECT composer_ensure_partitions(3)`
	qDropPartitions         = `SELECT composer_drop_partitions($1)`
	qDropOldIdempotencyKeys = `DELETE FROM run_idempotency_keys WHERE (tenant_id, key) IN (
				SELECT tenant_id, key FROM run_idempotency_keys
				 WHERE created_at < date_trunc('month', now() AT TIME ZONE 'UTC') - make_interval(months => $1)
				 LIMIT 10000)`
	qDropOldEvents = `DELETE FROM events WHERE (tenant_id, id) IN (
				SELECT tenant_id, id FROM events
				 WHERE received_at < date_trunc('month', now() AT TIME ZONE 'UTC') - make_interval(months => $1)
				 LIMIT 10000)`
	// workflows
	qInsertWorkflow = `INSERT INTO workflow_definitions (tenant_id, id, name, description, latest_version)
			VALUES ($1, $2, $3, $4, 1) RETURNING created_at, updated_at`
	qInsertVersion = `INSERT INTO workflow_versions (tenant_id, workflow_id, version, definition)
			VALUES ($1, $2, 1, $3) RETURNING created_at`
	qInsertNextVersion = `INSERT INTO workflow_versions (tenant_id, workflow_id, version, definition)
			VALUES ($1, $2, $3, $4) RETURNING created_at`
	qBumpVersion = `UPDATE workflow_definitions SET latest_version = latest_version + 1, updated_at = now()
			WHERE tenant_id = $1 AND id = $2 RETURNING latest_version`
	qLoadDefinition = `SELECT definition FROM workflow_versions WHERE tenant_id = $1 AND workflow_id = $2 AND version = $3`
	// (The system role, for an operator's scan of every tenant.)
	qAllDefinitions = `SELECT tenant_id, workflow_id, version, definition FROM workflow_versions ORDER BY tenant_id, workflow_id, version`
)

const activeStates = `('pending', 'running', 'waiting')`

// tenantWorkerNodeType is the one node type tenant workers run (a map's
// elements of a task step are task_instances of this type too).
const tenantWorkerNodeType = string(dag.TypeTask)

// keyFence is the condition of a statement acting for a lease holder with
// an API key (a tenant's worker; the parameter is empty for a platform
// worker) on task_instances t: the lease was taken with that key, and is of
// a task node. A lease with no key recorded was taken by the previous
// release (a rolling upgrade) and is fenced on its owner alone, as that
// release did; every lease this release grants a key holder records it.
const (
	keyFenceT6 = `($6 = '' OR ((t.lease_key_id = $6 OR t.lease_key_id IS NULL) AND t.node_type = '` + tenantWorkerNodeType + `'))`
	keyFenceT7 = `($7 = '' OR ((t.lease_key_id = $7 OR t.lease_key_id IS NULL) AND t.node_type = '` + tenantWorkerNodeType + `'))`
	keyFenceT8 = `($8 = '' OR ((t.lease_key_id = $8 OR t.lease_key_id IS NULL) AND t.node_type = '` + tenantWorkerNodeType + `'))`
)
