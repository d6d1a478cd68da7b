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

	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
)

// RunView is a run as dashboards and APIs show it.
type RunView struct {
	ID              uuid.UUID       `json:"id"`
	WorkflowID      uuid.UUID       `json:"workflow_id"`
	WorkflowVersion int             `json:"workflow_version"`
	Status          string          `json:"status"`
	Input           json.RawMessage `json:"input"`
	Output          json.RawMessage `json:"output,omitempty"`
	Error           json.RawMessage `json:"error,omitempty"`
	IdempotencyKey  *string         `json:"idempotency_key,omitempty"`
	RerunOf         *uuid.UUID      `json:"rerun_of,omitempty"`
	CreatedAt       time.Time       `json:"created_at"`
	UpdatedAt       time.Time       `json:"updated_at"`
	FinishedAt      *time.Time      `json:"finished_at,omitempty"`
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
}

const runColumns = `id, workflow_id, workflow_version, status, input, output, error, idempotency_key, rerun_of, created_at, updated_at, finished_at`

func scanRun(row pgx.Row) (RunView, error) {
	var r RunView
	err := row.Scan(&r.ID, &r.WorkflowID, &r.WorkflowVersion, &r.Status, &r.Input, &r.Output, &r.Error, &r.IdempotencyKey,
		&r.RerunOf, &r.CreatedAt, &r.UpdatedAt, &r.FinishedAt)
	return r, err
}

// GetRun reads one run in the transaction's tenant.
func GetRun(ctx context.Context, tx *pg.Tx, id uuid.UUID) (RunView, error) {
	r, err := scanRun(tx.QueryRow(ctx, `SELECT `+runColumns+` FROM workflow_runs WHERE tenant_id = $1 AND id = $2`, tx.Tenant, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return RunView{}, errs.E(errs.NotFound, "run %s not found", id)
	}
	if err != nil {
		return RunView{}, fmt.Errorf("get run: %w", err)
	}
	return r, nil
}

const taskColumns = `id, run_id, node_id, node_type, queue, config->'task'->>'handler', state, attempt, max_attempts, input, output, last_error,
	skip_reason, created_at, started_at, finished_at`

// TasksOfRuns reads the tasks of the given runs, in creation order.
func TasksOfRuns(ctx context.Context, tx *pg.Tx, runs []uuid.UUID) ([]TaskView, error) {
	rows, err := tx.Query(ctx, `SELECT `+taskColumns+` FROM task_instances WHERE tenant_id = $1 AND run_id = ANY($2) ORDER BY run_id, id`, tx.Tenant, runs)
	if err != nil {
		return nil, fmt.Errorf("tasks of runs: %w", err)
	}
	var out []TaskView
	var t TaskView
	_, err = pgx.ForEachRow(rows, []any{&t.ID, &t.RunID, &t.NodeID, &t.NodeType, &t.Queue, &t.Handler, &t.State, &t.Attempt, &t.MaxAttempts,
		&t.Input, &t.Output, &t.LastError, &t.SkipReason, &t.CreatedAt, &t.StartedAt, &t.FinishedAt}, func() error {
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
}

// MaxPage bounds one page of a listing.
const MaxPage = 500

// ListRuns returns up to first runs older than the run id after (nil for
// the newest), newest first, and whether more follow.
func ListRuns(ctx context.Context, tx *pg.Tx, f RunFilter, first int, after *uuid.UUID) ([]RunView, bool, error) {
	if first < 1 || first > MaxPage {
		return nil, false, errs.E(errs.Invalid, "first must be between 1 and %d", MaxPage)
	}
	for _, s := range f.Statuses {
		switch s {
		case "running", "completed", "failed", "cancelled":
		default:
			return nil, false, errs.E(errs.Invalid, "unknown status %q", s)
		}
	}
	where := []string{"tenant_id = $1"}
	args := []any{tx.Tenant}
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	if after != nil {
		where = append(where, "id < "+arg(*after))
	}
	if len(f.Statuses) == 1 {
		where = append(where, "status = "+arg(f.Statuses[0]))
	} else if len(f.Statuses) > 1 {
		where = append(where, "status = ANY("+arg(f.Statuses)+")")
	}
	if f.WorkflowID != nil {
		where = append(where, "workflow_id = "+arg(*f.WorkflowID))
	}
	if f.CreatedAfter != nil {
		where = append(where, "id >= composer_uuid_floor("+arg(*f.CreatedAfter)+")")
	}
	if f.CreatedBefore != nil {
		where = append(where, "id < composer_uuid_floor("+arg(*f.CreatedBefore)+")")
	}
	if f.IdempotencyKey != nil {
		where = append(where, "id = (SELECT run_id FROM run_idempotency_keys k WHERE k.tenant_id = $1 AND k.key = "+arg(*f.IdempotencyKey)+")")
	}
	q := `SELECT ` + runColumns + ` FROM workflow_runs WHERE ` + strings.Join(where, " AND ") + ` ORDER BY id DESC LIMIT ` + arg(first+1)
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
	rows, err := tx.Query(ctx, `SELECT id, kind, node_id, task_id, attempt, detail, created_at FROM run_events
		WHERE tenant_id = $1 AND run_id = $2 ORDER BY id LIMIT $3`, tx.Tenant, run, limit)
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

const workflowColumns = `id, name, description, latest_version, created_at, updated_at`

func scanWorkflow(row pgx.Row) (Workflow, error) {
	var w Workflow
	err := row.Scan(&w.ID, &w.Name, &w.Description, &w.LatestVersion, &w.CreatedAt, &w.UpdatedAt)
	return w, err
}

// ListWorkflows returns up to first workflows after the name after, by name.
func ListWorkflows(ctx context.Context, tx *pg.Tx, first int, after *string) ([]Workflow, bool, error) {
	if first < 1 || first > MaxPage {
		return nil, false, errs.E(errs.Invalid, "first must be between 1 and %d", MaxPage)
	}
	rows, err := tx.Query(ctx, `SELECT `+workflowColumns+` FROM workflow_definitions
		WHERE tenant_id = $1 AND ($2::text IS NULL OR name > $2) ORDER BY name LIMIT $3`, tx.Tenant, after, first+1)
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
	rows, err := tx.Query(ctx, `SELECT `+workflowColumns+` FROM workflow_definitions WHERE tenant_id = $1 AND id = ANY($2)`, tx.Tenant, ids)
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
	w, err := scanWorkflow(tx.QueryRow(ctx, `SELECT `+workflowColumns+` FROM workflow_definitions WHERE tenant_id = $1 AND id = $2`, tx.Tenant, id))
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
	rows, err := tx.Query(ctx, `SELECT workflow_id, version, definition, created_at FROM workflow_versions
		WHERE tenant_id = $1 AND workflow_id = $2 AND ($3 = 0 OR version = $3) AND ($5 = 0 OR version < $5)
		ORDER BY version DESC LIMIT CASE WHEN $4 > 0 THEN $4 END`, tx.Tenant, workflow, number, limit, before)
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
	err := tx.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM workflow_runs WHERE tenant_id = $1 AND status = 'running'),
		(SELECT count(*) FROM task_instances t WHERE t.tenant_id = $1 AND t.state = 'pending'
		    AND t.run_id IN (SELECT id FROM workflow_runs WHERE tenant_id = $1 AND status = 'running')),
		(SELECT count(*) FROM task_instances t WHERE t.tenant_id = $1 AND t.state = 'running'
		    AND t.run_id IN (SELECT id FROM workflow_runs WHERE tenant_id = $1 AND status = 'running'))`, tx.Tenant).
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
	err := tx.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM task_instances WHERE tenant_id = $1 AND state = 'pending' LIMIT $2) q`,
		tx.Tenant, n).Scan(&have)
	if err != nil {
		return false, fmt.Errorf("queued tasks: %w", err)
	}
	return have >= n, nil
}
