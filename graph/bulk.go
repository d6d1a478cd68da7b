package graph

import (
	"context"
	"strings"

	"github.com/google/uuid"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/graph/model"
	"github.com/composer-dev/composer/internal/pg"
)

// runFilterArg is a RunFilter argument as the engine takes it.
func runFilterArg(filter *model.RunFilter) (engine.RunFilter, error) {
	var f engine.RunFilter
	if filter == nil {
		return f, nil
	}
	for _, s := range filter.Status {
		f.Statuses = append(f.Statuses, strings.ToLower(string(s)))
	}
	f.WorkflowID, f.CreatedAfter, f.CreatedBefore, f.IdempotencyKey = filter.WorkflowID, filter.CreatedAfter, filter.CreatedBefore, filter.IdempotencyKey
	var err error
	f.Metadata, err = metadataArg("filter.metadata", filter.Metadata)
	return f, err
}

// bulkOperation reads one bulk operation for the principal (runs:read).
func (r *Resolver) bulkOperation(ctx context.Context, id uuid.UUID) (*engine.BulkOperation, error) {
	var op engine.BulkOperation
	err := r.inTenant(ctx, auth.ActionRunsRead, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		op, err = engine.GetBulkOperation(ctx, tx, id)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &op, nil
}

// bulkSnapshot reads a bulk operation in the tenant's scope for its live
// subscribers (each authorized when it subscribed).
func (r *Resolver) bulkSnapshot(ctx context.Context, tenant, id uuid.UUID) (*engine.BulkOperation, error) {
	var op engine.BulkOperation
	err := r.DB.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		op, err = engine.GetBulkOperation(ctx, tx, id)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &op, nil
}

// workflowAfterWrite reads a workflow a mutation (authorized in its own
// transaction) just changed, so a key that may change it but not read
// workflows learns what it did.
func (r *Resolver) workflowAfterWrite(ctx context.Context, id uuid.UUID) (*engine.Workflow, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	var w engine.Workflow
	err = r.DB.WithTenant(ctx, p.TenantID, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		w, err = engine.GetWorkflow(ctx, tx, id)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &w, nil
}

// live reports whether a run of this status may still change by itself
// (running, or queued behind a paused workflow).
func live(status string) bool { return status == "running" || status == string(engine.RunQueued) }
