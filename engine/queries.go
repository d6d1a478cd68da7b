package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/tenants"
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
}

// TaskView is one node's task.
type TaskView struct {
	ID          uuid.UUID       `json:"id"`
	RunID       uuid.UUID       `json:"run_id"`
	NodeID      string          `json:"node_id"`
	NodeType    string          `json:"node_type"`
	Queue       *string         `json:"queue,omitempty"`
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
func GetRun(ctx context.Context, tx *tenants.Tx, id uuid.UUID) (RunView, error) {
	r, err := scanRun(tx.QueryRow(ctx, `SELECT `+runColumns+` FROM workflow_runs WHERE tenant_id = $1 AND id = $2`, tx.Tenant, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return RunView{}, errs.E(errs.NotFound, "run %s not found", id)
	}
	if err != nil {
		return RunView{}, fmt.Errorf("get run: %w", err)
	}
	return r, nil
}

const taskColumns = `id, run_id, node_id, node_type, queue, state, attempt, max_attempts, input, output, last_error, skip_reason, created_at, started_at, finished_at`

// TasksOfRuns reads the tasks of the given runs, in creation order.
func TasksOfRuns(ctx context.Context, tx *tenants.Tx, runs []uuid.UUID) ([]TaskView, error) {
	rows, err := tx.Query(ctx, `SELECT `+taskColumns+` FROM task_instances WHERE tenant_id = $1 AND run_id = ANY($2) ORDER BY run_id, id`, tx.Tenant, runs)
	if err != nil {
		return nil, fmt.Errorf("tasks of runs: %w", err)
	}
	var out []TaskView
	var t TaskView
	_, err = pgx.ForEachRow(rows, []any{&t.ID, &t.RunID, &t.NodeID, &t.NodeType, &t.Queue, &t.State, &t.Attempt, &t.MaxAttempts,
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
