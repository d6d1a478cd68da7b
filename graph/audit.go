package graph

import (
	"context"
	"fmt"
	"reflect"
	"strings"

	"github.com/99designs/gqlgen/graphql"
	"github.com/google/uuid"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/audit"
	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/errs"
)

// auditSpec says what an audited mutation's record names: its target's
// type, the argument holding the target's id (alternatives separated by
// "|"; empty when the action names the object it creates with
// audit.Identify) and the arguments kept in the record's detail — never
// a secret value, an API key's secret or a webhook's signing secret.
// A mutation that is not audited says why in notAudited instead.
type auditSpec struct {
	target     string
	id         string
	detail     []string
	notAudited string
}

// auditSpecs covers every mutation of the schema (TestEveryMutationIsAudited
// fails for one without a spec, and runs each).
var auditSpecs = map[string]auditSpec{
	"createWorkflow":         {target: "workflow", detail: []string{"input.name"}},
	"publishWorkflowVersion": {target: "workflow", id: "workflowId"},
	// Run starts are the data plane — the busiest mutation, at up to the
	// plan's start rate — and each run records its own start; recording
	// them would serialise a tenant's starts on its chain head (measured:
	// about 20% fewer starts a second for 16 concurrent clients of one
	// tenant). The log records what changes existing runs and the tenant.
	"startRun":               {notAudited: "a run start is recorded by the run itself"},
	"cancelRun":              {target: "run", id: "id", detail: []string{"reason"}},
	"signalRun":              {target: "run", id: "id", detail: []string{"name", "signalId"}},
	"approve":                {target: "run", id: "id", detail: []string{"signal", "approved", "signalId"}},
	"rerunRun":               {target: "run", id: "id", detail: []string{"mode"}},
	"createApiKey":           {target: "api_key", detail: []string{"input.name", "input.scopes", "input.expiresAt"}},
	"revokeApiKey":           {target: "api_key", id: "id"},
	"addMember":              {target: "member", id: "subject", detail: []string{"role"}},
	"changeMemberRole":       {target: "member", id: "subject", detail: []string{"role"}},
	"removeMember":           {target: "member", id: "subject"},
	"pauseWorkflow":          {target: "workflow", id: "id", detail: []string{"reason"}},
	"resumeWorkflow":         {target: "workflow", id: "id"},
	"pauseQueue":             {target: "queue", id: "queue", detail: []string{"reason"}},
	"resumeQueue":            {target: "queue", id: "queue"},
	"createBulkOperation":    {target: "bulk_operation", detail: []string{"input.action", "input.reason", "input.idempotencyKey"}},
	"cancelBulkOperation":    {target: "bulk_operation", id: "id"},
	"publishEvent":           {target: "event", id: "input.id", detail: []string{"input.name"}},
	"createRateLimit":        {target: "rate_limit", id: "input.name", detail: []string{"input.perSecond", "input.burst"}},
	"updateRateLimit":        {target: "rate_limit", id: "input.name", detail: []string{"input.perSecond", "input.burst"}},
	"deleteRateLimit":        {target: "rate_limit", id: "name"},
	"createSchedule":         {target: "schedule", detail: []string{"input.workflowId", "input.workflowName", "input.cron", "input.intervalSeconds", "input.externalId"}},
	"updateSchedule":         {target: "schedule", id: "id", detail: []string{"input.cron", "input.intervalSeconds"}},
	"pauseSchedule":          {target: "schedule", id: "id"},
	"resumeSchedule":         {target: "schedule", id: "id"},
	"deleteSchedule":         {target: "schedule", id: "id"},
	"backfillSchedule":       {target: "schedule", id: "id", detail: []string{"from", "to"}},
	"createSecret":           {target: "secret", id: "name"},
	"updateSecret":           {target: "secret", id: "name"},
	"deleteSecret":           {target: "secret", id: "name"},
	"createWebhookEndpoint":  {target: "webhook_endpoint", detail: []string{"input.eventTypes"}},
	"updateWebhookEndpoint":  {target: "webhook_endpoint", id: "id", detail: []string{"input.eventTypes", "input.enabled"}},
	"rotateWebhookSecret":    {target: "webhook_endpoint", id: "id", detail: []string{"graceSeconds"}},
	"disableWebhookEndpoint": {target: "webhook_endpoint", id: "id"},
	"deleteWebhookEndpoint":  {target: "webhook_endpoint", id: "id"},
	"redeliverWebhook":       {target: "webhook_delivery", id: "deliveryId"},
	"sendWebhookTestPing":    {target: "webhook_endpoint", id: "endpointId"},
}

// AuditSpecs lists the mutations with a spec and, for those not audited,
// why (for the schema test).
func AuditSpecs() map[string]string {
	out := make(map[string]string, len(auditSpecs))
	for k, s := range auditSpecs {
		out[k] = s.notAudited
	}
	return out
}

// auditMutations is the gateway's one audit point, a field middleware:
// every root Mutation field of an authenticated request carries an
// audit.Entry in its context. The authorization gate of the transaction
// that does the work (inTenant, or the coordinator's gate set by gated)
// seals it into that transaction, so its "ok" record commits or rolls
// back with the change. An action that ends without such a commit is
// recorded once it ended, in a transaction of its own: its error code
// (FORBIDDEN, NOT_FOUND, …; RATE_LIMITED is not recorded — the limiter
// refused before any database work, and recording would add a write for
// each refusal) or "unchanged" for a success that committed nothing. An
// action may decline its record in its transaction (audit.Skip: an event
// that changed no run).
func (r *Resolver) auditMutations(ctx context.Context, next graphql.Resolver) (res any, err error) {
	fc := graphql.GetFieldContext(ctx)
	if fc == nil || fc.Object != "Mutation" || !fc.IsResolver {
		return next(ctx)
	}
	p, ok := auth.FromContext(ctx)
	if !ok || p.TenantID == uuid.Nil {
		return next(ctx)
	}
	spec := auditSpecs[fc.Field.Name]
	if spec.notAudited != "" {
		return next(ctx)
	}
	var detail map[string]any
	for _, path := range spec.detail {
		if v, ok := argAt(fc.Args, path); ok {
			if detail == nil {
				detail = map[string]any{}
			}
			detail[path[strings.LastIndex(path, ".")+1:]] = v
		}
	}
	var target string
	for _, path := range strings.Split(spec.id, "|") {
		if v, ok := argAt(fc.Args, path); ok && path != "" {
			target = fmt.Sprint(v)
			break
		}
	}
	e := audit.NewEntry(r.AuditKeys, p.TenantID, string(p.Kind), p.Subject, fc.Field.Name, spec.target, target, detail)
	defer func() {
		if v := recover(); v != nil {
			r.finishAudit(ctx, e, errs.E(errs.Internal, "panic"))
			panic(v)
		}
		r.finishAudit(ctx, e, err)
	}()
	return next(audit.With(ctx, e))
}

func (r *Resolver) finishAudit(ctx context.Context, e *audit.Entry, err error) {
	if err != nil && errs.KindOf(err) == errs.RateLimited {
		return
	}
	if _, werr := audit.Finish(ctx, r.DB, e, err); werr != nil && r.Log != nil {
		r.Log.Error("audit record not written", zap.Error(werr))
	}
}

// argAt reads a dotted path of argument and input field names (as in the
// schema) from a field's arguments; absent, null and empty are not found.
func argAt(args map[string]any, path string) (any, bool) {
	if path == "" {
		return nil, false
	}
	parts := strings.Split(path, ".")
	v := reflect.ValueOf(args[parts[0]])
	for _, name := range parts[1:] {
		v = indirect(v)
		if !v.IsValid() || v.Kind() != reflect.Struct {
			return nil, false
		}
		v = fieldByJSON(v, name)
	}
	v = indirect(v)
	if !v.IsValid() || v.IsZero() && v.Kind() != reflect.Bool {
		return nil, false
	}
	switch x := v.Interface().(type) {
	case uuid.UUID:
		return x.String(), true
	case fmt.Stringer:
		return x.String(), true
	}
	if v.Kind() == reflect.String {
		return v.String(), true
	}
	return v.Interface(), true
}

func indirect(v reflect.Value) reflect.Value {
	for v.IsValid() && (v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface) {
		if v.IsNil() {
			return reflect.Value{}
		}
		v = v.Elem()
	}
	return v
}

func fieldByJSON(v reflect.Value, name string) reflect.Value {
	t := v.Type()
	for i := range t.NumField() {
		tag, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if tag == name {
			return v.Field(i)
		}
	}
	return reflect.Value{}
}
