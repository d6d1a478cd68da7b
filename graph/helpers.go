package graph

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/billing"
	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/graph/model"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/tenants"
)

func (r *Resolver) run(ctx context.Context, id uuid.UUID) (*engine.RunView, error) {
	return r.readRun(ctx, id, auth.ActionRunsRead)
}

// writing asks the coordinator for the run as the mutation's own
// transaction leaves it, for the mutation's answer: the answer is what
// was committed, so no later read can report failure for a change that
// was made (and make a client retry it). What the mutation did is the
// caller's to see with the right to do it (runs:write), so a write-only
// key learns that its start or cancel happened; nested fields it may not
// read (tasks, the timeline) stay FORBIDDEN.
func writing(ctx context.Context) (context.Context, *engine.RunView) {
	v := &engine.RunView{}
	return engine.WithReadBack(ctx, v), v
}

// wrote is the answer of a mutation that changed run id: the run as its
// transaction left it, or — if that read failed — read again now; if
// that fails too, what is known for sure (its id).
func (r *Resolver) wrote(ctx context.Context, id uuid.UUID, v *engine.RunView) *engine.RunView {
	if v.ID != uuid.Nil {
		return v
	}
	if again, err := r.readRun(ctx, id, auth.ActionRunsWrite); err == nil {
		return again
	}
	return &engine.RunView{ID: id}
}

func (r *Resolver) readRun(ctx context.Context, id uuid.UUID, action auth.Action) (*engine.RunView, error) {
	var run engine.RunView
	err := r.reading(ctx, action, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		run, err = engine.GetRun(ctx, tx, id)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &run, nil
}

// snapshot reads a run with its tasks and workflow in the tenant's scope,
// for every live subscriber of the tenant on this replica at once (each
// was authorized when it subscribed and checks its credential before a
// push).
func (r *Resolver) snapshot(ctx context.Context, tenant, id uuid.UUID) (*engine.RunView, error) {
	var run engine.RunView
	err := r.DB.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		if run, err = engine.GetRun(ctx, tx, id); err != nil {
			return err
		}
		snap := &engine.RunSnapshot{}
		if snap.Tasks, err = engine.TasksOfRuns(ctx, tx, []uuid.UUID{id}); err != nil {
			return err
		}
		if snap.Tasks == nil {
			snap.Tasks = []engine.TaskView{}
		}
		wfs, err := engine.WorkflowsByID(ctx, tx, []uuid.UUID{run.WorkflowID})
		if err != nil {
			return err
		}
		snap.Workflow = wfs[run.WorkflowID]
		run.Snapshot = snap
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &run, nil
}

// subscriber names a principal for the live subscription caps.
func subscriber(p auth.Principal) string { return string(p.Kind) + ":" + p.Subject }

// pushable re-validates the connection's credential before a push (at
// most once a second); false once it failed, which closed the socket.
func pushable(ctx context.Context) bool {
	s := sessionFrom(ctx)
	return s == nil || s.check(ctx) == nil
}

func (r *Resolver) tenant(ctx context.Context) (*tenants.Tenant, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	var t tenants.Tenant
	err = r.DB.WithTenant(ctx, p.TenantID, func(ctx context.Context, tx *pg.Tx) error {
		t, err = tenants.Get(ctx, tx)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &t, nil
}

func authRole(r model.Role) auth.Role { return auth.Role(strings.ToLower(string(r))) }

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func pageSize(first *int) (int, error) {
	n := 50
	if first != nil {
		n = *first
	}
	if n < 1 || n > engine.MaxPage {
		return 0, errs.E(errs.Invalid, "first must be between 1 and %d", engine.MaxPage)
	}
	return n, nil
}

func encodeCursor(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func decodeCursor(c string) (string, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return "", errs.E(errs.Invalid, "after: not a cursor of this list")
	}
	return string(b), nil
}

// send delivers v unless the subscription ended.
func send[T any](ctx context.Context, ch chan<- T, v T) bool {
	select {
	case ch <- v:
		return true
	case <-ctx.Done():
		return false
	}
}

// signal delivers a signal (or an approval decision) to a run and reports
// whether the run took it.
func (r *Resolver) signal(ctx context.Context, id uuid.UUID, s engine.Signal) (*model.SignalPayload, error) {
	ctx, p, err := r.gated(ctx, auth.ActionRunsWrite)
	if err != nil {
		return nil, err
	}
	ctx, run := writing(ctx)
	ack, err := r.Coord.SignalRun(ctx, p.TenantID, id, s)
	if err != nil {
		return nil, err
	}
	out := &model.SignalPayload{Run: r.wrote(ctx, id, run), Ignored: ack.Ignored}
	if ack.Reason != "" {
		out.Reason = &ack.Reason
	}
	return out, nil
}

// parsePeriod reads a billing period argument ("" or nil: this month).
func parsePeriod(period *string) (billing.Period, error) {
	var s string
	if period != nil {
		s = *period
	}
	p, err := billing.ParsePeriod(s, time.Now())
	if err != nil {
		return billing.Period{}, errs.E(errs.Invalid, "period: %v", err)
	}
	return p, nil
}

// invoice prices the principal's tenant's usage in p (billing:read); it
// is computed once per request and period.
func (r *Resolver) invoice(ctx context.Context, p billing.Period) (billing.Invoice, time.Time, error) {
	var inv billing.Invoice
	var asOf time.Time
	err := r.inTenant(ctx, auth.ActionBillingRead, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		inv, asOf, err = billing.Preview(ctx, tx, p)
		return err
	})
	return inv, asOf, err
}

// manageWebhooks runs fn in a webhooks:manage tenant transaction and
// returns what it produced.
func manageWebhooks[T any](ctx context.Context, r *Resolver, fn func(ctx context.Context, tx *pg.Tx) (T, error)) (*T, error) {
	var out T
	err := r.inTenant(ctx, auth.ActionWebhooksManage, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		out, err = fn(ctx, tx)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// metadataArg reads a metadata argument: a JSON object of strings (absent
// or null: none). Its bounds are checked by the engine.
func metadataArg(field string, raw json.RawMessage) (map[string]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var m map[string]string
	if err := json.Unmarshal(raw, &m); err != nil {
		e := errs.E(errs.Invalid, "%s must be an object of strings", field)
		e.Fields = []errs.Field{{Field: field, Message: e.Message}}
		return nil, e
	}
	return m, nil
}

// rateLimitOf is the tenants' rate limit an input describes.
func rateLimitOf(in model.RateLimitInput) tenants.RateLimit {
	l := tenants.RateLimit{Name: in.Name, PerSecond: in.PerSecond, Burst: in.Burst}
	if in.Description != nil {
		l.Description = *in.Description
	}
	return l
}
