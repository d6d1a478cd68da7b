package graph

import (
	"context"
	"encoding/json"

	"github.com/composer-dev/composer/audit"
	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/schedules"
)

// changeSchedule runs a change of a schedule in the principal's tenant
// transaction. A schedule starts runs on its own, so changing one needs
// both workflows:write and runs:write: a key that may edit workflows but
// not start runs cannot start them through a schedule.
func (r *Resolver) changeSchedule(ctx context.Context, fn func(ctx context.Context, tx *pg.Tx) (schedules.Schedule, error)) (*schedules.Schedule, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	var s schedules.Schedule
	err = r.inTenant(ctx, auth.ActionWorkflowsWrite, func(ctx context.Context, tx *pg.Tx) error {
		if err := r.Authz.Allowed(ctx, tx, p, auth.ActionRunsWrite); err != nil {
			return err
		}
		s, err = fn(ctx, tx)
		audit.Identify(ctx, s.ID.String())
		return err
	})
	if err != nil {
		return nil, err
	}
	if r.Schedules != nil && s.NextFireAt != nil {
		r.Schedules.Wake()
	}
	return &s, nil
}

// scheduleMetadata reads a schedule's metadata: an object of strings.
func scheduleMetadata(raw json.RawMessage) (map[string]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var m map[string]string
	if err := json.Unmarshal(raw, &m); err != nil {
		e := errs.E(errs.Invalid, "metadata: must be an object of strings")
		e.Fields = []errs.Field{{Field: "metadata", Message: "must be an object of strings"}}
		return nil, e
	}
	return m, nil
}

// valueOf is *p, or the zero value when p is nil.
func valueOf[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
