package graph_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vektah/gqlparser/v2"
	"github.com/vektah/gqlparser/v2/ast"
	"go.uber.org/zap/zapcore"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/engine/taskapi"
	"github.com/composer-dev/composer/engine/taskpoll"
	"github.com/composer-dev/composer/internal/app"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/config"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/tenants"
)

// tenantWorld is one tenant with something of every kind.
type tenantWorld struct {
	id                       uuid.UUID
	owner, developer, viewer string // tokens
	workflow, run, key       string // ids
	waitingRun               string // a run parked on a signal
	endpoint, delivery       string // a webhook endpoint and its test ping
	schedule                 string // a (yearly) schedule of the workflow
	event                    string // an event (Composer's id) that started nothing
	secret, audit            string // a secret's name (unique to the tenant) and its audit entry
	bulk                     string // a running bulk cancel whose filter matches nothing
}

const waitDef = `{"nodes":[{"id":"w","type":"wait","wait":{"signal":"approval","approval":true}}]}`

// parkDef is the world's workflow: an approval only an admin who did not
// start the run may give (the world's owner starts it).
const parkDef = `{"nodes":[{"id":"w","type":"wait","wait":{"signal":"approval","approval":true,"approvers":{"roles":["admin"],"not_starter":true}}}]}`

func newTenantWorld(t *testing.T, sys *apptest.System, tenant uuid.UUID) tenantWorld {
	w := tenantWorld{id: tenant,
		owner:     sys.Token(tenant, "owner@"+tenant.String(), auth.RoleOwner),
		developer: sys.Token(tenant, "dev@"+tenant.String(), auth.RoleDeveloper),
		viewer:    sys.Token(tenant, "viewer@"+tenant.String(), auth.RoleViewer)}
	var created struct {
		CreateWorkflow struct{ Workflow struct{ ID string } }
	}
	sys.GraphQL(w.owner, `mutation($d: JSON!) { createWorkflow(input: {name: "park", definition: $d}) { workflow { id } } }`,
		map[string]any{"d": json.RawMessage(parkDef)}).Decode(t, &created)
	w.workflow = created.CreateWorkflow.Workflow.ID
	var started struct {
		StartRun struct{ Run struct{ ID string } }
	}
	sys.GraphQL(w.owner, `mutation($w: ID!) { startRun(input: {workflowId: $w}) { run { id } } }`, map[string]any{"w": w.workflow}).Decode(t, &started)
	w.run, w.waitingRun = started.StartRun.Run.ID, started.StartRun.Run.ID
	var key struct {
		CreateApiKey struct {
			ApiKey struct{ ID string }
			Secret string
		}
	}
	sys.GraphQL(w.owner, `mutation { createApiKey(input: {name: "ci", scopes: ["runs:read"]}) { apiKey { id } secret } }`, nil).Decode(t, &key)
	w.key = key.CreateApiKey.ApiKey.ID
	var ep struct {
		CreateWebhookEndpoint struct{ Endpoint struct{ ID string } }
	}
	sys.GraphQL(w.owner, `mutation { createWebhookEndpoint(input: {url: "https://127.0.0.1:9/", eventTypes: ["run.failed"]}) { endpoint { id } } }`,
		nil).Decode(t, &ep)
	w.endpoint = ep.CreateWebhookEndpoint.Endpoint.ID
	var ping struct{ SendWebhookTestPing struct{ ID string } }
	sys.GraphQL(w.owner, `mutation($e: ID!) { sendWebhookTestPing(endpointId: $e) { id } }`, map[string]any{"e": w.endpoint}).Decode(t, &ping)
	w.delivery = ping.SendWebhookTestPing.ID
	var sch struct{ CreateSchedule struct{ ID string } }
	sys.GraphQL(w.owner, `mutation($w: ID!) { createSchedule(input: {workflowId: $w, cron: "0 0 1 1 *", externalId: "yearly"}) { id } }`,
		map[string]any{"w": w.workflow}).Decode(t, &sch)
	w.schedule = sch.CreateSchedule.ID
	var ev struct {
		PublishEvent struct{ Event struct{ ID string } }
	}
	sys.GraphQL(w.owner, `mutation { publishEvent(input: {name: "nothing.listens", id: "e1"}) { event { id } } }`, nil).Decode(t, &ev)
	w.event = ev.PublishEvent.Event.ID
	w.secret = "ONLY_" + strings.ReplaceAll(tenant.String(), "-", "_")
	var sec struct{ SecretAudit []struct{ ID string } }
	sys.GraphQL(w.owner, `mutation($n: SecretName!) { createSecret(name: $n, value: "tenant-secret-value") { name } }`,
		map[string]any{"n": w.secret}).Decode(t, &struct{}{})
	sys.GraphQL(w.owner, `{ secretAudit { id } }`, nil).Decode(t, &sec)
	w.audit = sec.SecretAudit[0].ID
	var op struct {
		CreateBulkOperation struct{ Operation struct{ ID string } }
	}
	sys.GraphQL(w.owner, `mutation { createBulkOperation(input: {action: CANCEL, filter: {metadata: {nothing: "matches"}, createdAfter: "2100-01-01T00:00:00Z"}}) { operation { id } } }`,
		nil).Decode(t, &op)
	w.bulk = op.CreateBulkOperation.Operation.ID
	// A connected worker of the tenant (a poll with no free slot registers it).
	_, err := sys.Server.Poller.Poll(context.Background(), taskpoll.Caller{Tenant: tenant, KeyID: "k"}, taskapi.PollRequest{
		WorkerID: "worker-" + tenant.String(), PollID: "p1", Queues: []string{"default"}, Handlers: []string{"work"}, Capacity: 4, TTLMillis: 30_000})
	require.NoError(t, err)
	return w
}

func twoTenants(t *testing.T, mod ...func(*config.Config)) (*apptest.System, tenantWorld, tenantWorld) {
	sys := apptest.Start(t, mod...)
	b, err := tenants.Create(context.Background(), sys.Deps.DB, tenants.CreateParams{Name: "tenant-b"})
	require.NoError(t, err)
	return sys, newTenantWorld(t, sys, sys.Tenant), newTenantWorld(t, sys, b.ID)
}

// idCase is how tenant B asks for one of tenant A's objects by id.
type idCase struct {
	query string
	vars  func(a tenantWorld) map[string]any
	// listEmpty: the id filters a list, which must come back empty rather
	// than failing.
	listEmpty string
	// own: the name is per tenant, so B's request acts on B's own object of
	// that name (it must succeed and leave A's alone; it is deleted again).
	own bool
}

// idCases covers every argument and input field of type ID (or SecretName,
// which names a tenant's secret) in the schema;
// TestEveryIDFieldIsCovered fails when one is added without a case here.
var idCases = map[string]idCase{
	"Query.workflow.id": {query: `query($id: ID!) { workflow(id: $id) { id } }`, vars: func(a tenantWorld) map[string]any { return map[string]any{"id": a.workflow} }},
	"Query.run.id":      {query: `query($id: ID!) { run(id: $id) { id } }`, vars: func(a tenantWorld) map[string]any { return map[string]any{"id": a.run} }},
	"Query.runStats.workflowId": {query: `query($id: ID!) { runStats(workflowId: $id, from: "2026-01-01T00:00:00Z", to: "2026-01-02T00:00:00Z", interval: HOUR) { workflowId } }`,
		vars: func(a tenantWorld) map[string]any { return map[string]any{"id": a.workflow} }},
	"Query.concurrencyKeys.workflowId": {query: `query($id: ID!) { concurrencyKeys(workflowId: $id) { key } }`,
		vars: func(a tenantWorld) map[string]any { return map[string]any{"id": a.workflow} }},
	"Mutation.publishWorkflowVersion.workflowId": {query: `mutation($id: ID!, $d: JSON!) { publishWorkflowVersion(workflowId: $id, definition: $d) { version } }`,
		vars: func(a tenantWorld) map[string]any {
			return map[string]any{"id": a.workflow, "d": json.RawMessage(waitDef)}
		}},
	"Mutation.cancelRun.id": {query: `mutation($id: ID!) { cancelRun(id: $id) { id } }`, vars: func(a tenantWorld) map[string]any { return map[string]any{"id": a.run} }},
	"Mutation.signalRun.id": {query: `mutation($id: ID!) { signalRun(id: $id, name: "approval", payload: {approved: true}) { ignored } }`,
		vars: func(a tenantWorld) map[string]any { return map[string]any{"id": a.waitingRun} }},
	"Mutation.approve.id": {query: `mutation($id: ID!) { approve(id: $id, approved: true) { ignored } }`,
		vars: func(a tenantWorld) map[string]any { return map[string]any{"id": a.waitingRun} }},
	"Mutation.rerunRun.id": {query: `mutation($id: ID!) { rerunRun(id: $id, mode: AS_NEW) { id } }`, vars: func(a tenantWorld) map[string]any { return map[string]any{"id": a.run} }},
	"Query.apiKeys.after": {query: `query($id: ID!) { apiKeys(after: $id) { id } }`,
		vars: func(a tenantWorld) map[string]any { return map[string]any{"id": a.key} }, listEmpty: "apiKeys"},
	"Mutation.revokeApiKey.id": {query: `mutation($id: ID!) { revokeApiKey(id: $id) { id } }`, vars: func(a tenantWorld) map[string]any { return map[string]any{"id": a.key} }},
	"Subscription.runUpdated.id": {query: `subscription($id: ID!) { runUpdated(id: $id) { id status } }`,
		vars: func(a tenantWorld) map[string]any { return map[string]any{"id": a.run} }},
	"StartRunInput.workflowId": {query: `mutation($id: ID!) { startRun(input: {workflowId: $id}) { run { id } } }`,
		vars: func(a tenantWorld) map[string]any { return map[string]any{"id": a.workflow} }},
	"RunFilter.workflowId": {query: `query($id: ID!) { runs(filter: {workflowId: $id}) { edges { node { id } } } }`,
		vars: func(a tenantWorld) map[string]any { return map[string]any{"id": a.workflow} }, listEmpty: "runs"},
	"Query.webhookEndpoint.id": {query: `query($id: ID!) { webhookEndpoint(id: $id) { id } }`, vars: endpointOf},
	"Query.webhookDelivery.id": {query: `query($id: ID!) { webhookDelivery(id: $id) { id } }`, vars: deliveryOf},
	"Query.webhookDeliveries.endpointId": {query: `query($id: ID!) { webhookDeliveries(endpointId: $id) { edges { node { id } } } }`,
		vars: endpointOf, listEmpty: "webhookDeliveries"},
	"Query.webhookDeliveries.runId": {query: `query($id: ID!) { webhookDeliveries(runId: $id) { edges { node { id } } } }`,
		vars: func(a tenantWorld) map[string]any { return map[string]any{"id": a.run} }, listEmpty: "webhookDeliveries"},
	"Mutation.updateWebhookEndpoint.id": {query: `mutation($id: ID!) { updateWebhookEndpoint(id: $id, input: {url: "https://127.0.0.1:10/"}) { id } }`,
		vars: endpointOf},
	"Mutation.rotateWebhookSecret.id":    {query: `mutation($id: ID!) { rotateWebhookSecret(id: $id) { secret } }`, vars: endpointOf},
	"Mutation.disableWebhookEndpoint.id": {query: `mutation($id: ID!) { disableWebhookEndpoint(id: $id) { id } }`, vars: endpointOf},
	"Mutation.deleteWebhookEndpoint.id":  {query: `mutation($id: ID!) { deleteWebhookEndpoint(id: $id) }`, vars: endpointOf},
	"Mutation.sendWebhookTestPing.endpointId": {query: `mutation($id: ID!) { sendWebhookTestPing(endpointId: $id) { id } }`,
		vars: endpointOf},
	"Mutation.redeliverWebhook.deliveryId": {query: `mutation($id: ID!) { redeliverWebhook(deliveryId: $id) { id } }`, vars: deliveryOf},
	"Query.schedule.id":                    {query: `query($id: ID!) { schedule(id: $id) { id nextFireTimes } }`, vars: scheduleOf},
	"Query.schedules.workflowId": {query: `query($id: ID!) { schedules(workflowId: $id) { edges { node { id } } } }`,
		vars: func(a tenantWorld) map[string]any { return map[string]any{"id": a.workflow} }, listEmpty: "schedules"},
	"Mutation.updateSchedule.id": {query: `mutation($id: ID!) { updateSchedule(id: $id, input: {cron: "0 0 2 1 *"}) { id } }`, vars: scheduleOf},
	"Mutation.pauseSchedule.id":  {query: `mutation($id: ID!) { pauseSchedule(id: $id) { id } }`, vars: scheduleOf},
	"Mutation.resumeSchedule.id": {query: `mutation($id: ID!) { resumeSchedule(id: $id) { id } }`, vars: scheduleOf},
	"Mutation.deleteSchedule.id": {query: `mutation($id: ID!) { deleteSchedule(id: $id) }`, vars: scheduleOf},
	"Mutation.backfillSchedule.id": {query: `mutation($id: ID!) { backfillSchedule(id: $id, from: "2020-01-01T00:00:00Z", to: "2021-01-01T00:00:00Z") { runId } }`,
		vars: scheduleOf},
	"Query.secret.name":          {query: `query($n: SecretName!) { secret(name: $n) { name } }`, vars: secretOf},
	"Mutation.updateSecret.name": {query: `mutation($n: SecretName!) { updateSecret(name: $n, value: "b-overwrites") { version } }`, vars: secretOf},
	"Mutation.deleteSecret.name": {query: `mutation($n: SecretName!) { deleteSecret(name: $n) }`, vars: secretOf},
	"Mutation.createSecret.name": {query: `mutation($n: SecretName!) { createSecret(name: $n, value: "b-value") { name } }`, vars: secretOf, own: true},
	"Query.secretAudit.name":     {query: `query($n: SecretName) { secretAudit(name: $n) { id } }`, vars: secretOf, listEmpty: "secretAudit"},
	"Query.secretAudit.after": {query: `query($id: ID) { secretAudit(after: $id) { id } }`,
		vars: func(a tenantWorld) map[string]any { return map[string]any{"id": a.audit} }, listEmpty: "secretAudit"},
	"Query.event.id":                       {query: `query($id: ID!) { event(id: $id) { id } }`, vars: func(a tenantWorld) map[string]any { return map[string]any{"id": a.event} }},
	"Query.bulkOperation.id":               {query: `query($id: ID!) { bulkOperation(id: $id) { id } }`, vars: bulkOf},
	"Query.bulkOperations.after":           {query: `query($id: ID!) { bulkOperations(after: $id) { id } }`, vars: bulkOf, listEmpty: "bulkOperations"},
	"Mutation.cancelBulkOperation.id":      {query: `mutation($id: ID!) { cancelBulkOperation(id: $id) { id } }`, vars: bulkOf},
	"Subscription.bulkOperationUpdated.id": {query: `subscription($id: ID!) { bulkOperationUpdated(id: $id) { id matched } }`, vars: bulkOf},
	"Mutation.pauseWorkflow.id": {query: `mutation($id: ID!) { pauseWorkflow(id: $id) { id } }`,
		vars: func(a tenantWorld) map[string]any { return map[string]any{"id": a.workflow} }},
	"Mutation.resumeWorkflow.id": {query: `mutation($id: ID!) { resumeWorkflow(id: $id) { workflow { id } } }`,
		vars: func(a tenantWorld) map[string]any { return map[string]any{"id": a.workflow} }},
	"CreateScheduleInput.workflowId": {query: `mutation($id: ID!) { createSchedule(input: {workflowId: $id, cron: "0 0 1 1 *"}) { id } }`,
		vars: func(a tenantWorld) map[string]any { return map[string]any{"id": a.workflow} }},
}

func scheduleOf(a tenantWorld) map[string]any { return map[string]any{"id": a.schedule} }

func secretOf(a tenantWorld) map[string]any { return map[string]any{"n": a.secret} }
func bulkOf(a tenantWorld) map[string]any   { return map[string]any{"id": a.bulk} }

func endpointOf(a tenantWorld) map[string]any { return map[string]any{"id": a.endpoint} }
func deliveryOf(a tenantWorld) map[string]any { return map[string]any{"id": a.delivery} }

// loadSchema parses the gateway's schema files.
func loadSchema(t *testing.T) *ast.Schema {
	files, err := filepath.Glob("*.graphqls")
	require.NoError(t, err)
	var sources []*ast.Source
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		sources = append(sources, &ast.Source{Name: f, Input: string(b)})
	}
	schema, gerr := gqlparser.LoadSchema(sources...)
	require.Nil(t, gerr)
	return schema
}

// schemaIDFields lists "Type.field.arg" for every ID argument and
// "Input.field" for every ID input field of the schema.
func schemaIDFields(t *testing.T) []string {
	schema := loadSchema(t)
	isID := func(ty *ast.Type) bool {
		for ty.Elem != nil {
			ty = ty.Elem
		}
		return ty.NamedType == "ID" || ty.NamedType == "SecretName"
	}
	var out []string
	for name, def := range schema.Types {
		if strings.HasPrefix(name, "__") {
			continue
		}
		for _, f := range def.Fields {
			if def.Kind == ast.InputObject && isID(f.Type) {
				out = append(out, name+"."+f.Name)
			}
			for _, a := range f.Arguments {
				if isID(a.Type) {
					out = append(out, name+"."+f.Name+"."+a.Name)
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

func TestEveryIDFieldIsCovered(t *testing.T) {
	fields := schemaIDFields(t)
	require.NotEmpty(t, fields)
	for _, f := range fields {
		_, ok := idCases[f]
		assert.True(t, ok, "%s takes an id but has no cross-tenant case in idCases", f)
	}
	for k := range idCases {
		assert.Contains(t, fields, k, "idCases has %s, which the schema no longer has", k)
	}
}

// TestCrossTenantAccessIsNotFound asks, as tenant B's owner, for every one
// of tenant A's objects by id: each is NOT_FOUND (not FORBIDDEN, which would
// leak existence), nothing of A changes, and B's lists hold none of A's rows.
func TestCrossTenantAccessIsNotFound(t *testing.T) {
	t.Parallel()
	sys, a, b := twoTenants(t)
	for name, c := range idCases {
		if strings.HasPrefix(name, "Subscription.") {
			errs := subscribeErrors(t, sys, b.owner, c.query, c.vars(a))
			require.NotEmpty(t, errs, name)
			assert.Equal(t, "NOT_FOUND", errs[0].Code(), name)
			continue
		}
		res := sys.GraphQL(b.owner, c.query, c.vars(a))
		if c.listEmpty != "" {
			require.Empty(t, res.Errors, name)
			assert.NotContains(t, string(res.Data), a.run, "%s: a list showed tenant A's run", name)
			assert.NotContains(t, string(res.Data), a.audit, "%s: a list showed tenant A's secret audit", name)
			continue
		}
		if c.own {
			require.Empty(t, res.Errors, name)
			// Gone again, so the other cases find no secret of that name in B.
			require.Empty(t, sys.GraphQL(b.owner, `mutation($n: SecretName!) { deleteSecret(name: $n) }`, c.vars(a)).Errors)
			continue
		}
		require.NotEmpty(t, res.Errors, "%s returned data for another tenant's object: %s", name, res.Data)
		assert.Equal(t, []string{"NOT_FOUND"}, res.Codes(), name)
	}
	// A's objects are untouched.
	var run struct{ Run struct{ Status string } }
	sys.GraphQL(a.owner, `query($id: ID!) { run(id: $id) { status } }`, map[string]any{"id": a.run}).Decode(t, &run)
	assert.Equal(t, "RUNNING", run.Run.Status, "the cancel did not reach A's run")
	var parked struct {
		Run struct {
			StartedBy string
			Approvals []struct{ Waiting bool }
		}
	}
	sys.GraphQL(a.owner, `query($id: ID!) { run(id: $id) { startedBy approvals { waiting } } }`, map[string]any{"id": a.waitingRun}).Decode(t, &parked)
	assert.Equal(t, "user:owner@"+a.id.String(), parked.Run.StartedBy)
	assert.True(t, parked.Run.Approvals[0].Waiting, "B's approve and signalRun did not reach A's approval")
	// B's owner answering B's own run is held to its policy (FORBIDDEN), A's is not found.
	res := sys.GraphQL(b.owner, `mutation($id: ID!) { approve(id: $id, approved: true) { ignored } }`, map[string]any{"id": b.waitingRun})
	assert.Equal(t, []string{"FORBIDDEN"}, res.Codes())
	var keys struct {
		ApiKeys []struct{ ID, RevokedAt *string }
	}
	sys.GraphQL(a.owner, `{ apiKeys { id revokedAt } }`, nil).Decode(t, &keys)
	for _, k := range keys.ApiKeys {
		assert.Nil(t, k.RevokedAt)
	}
	var eps struct {
		WebhookEndpoints []struct {
			ID, URL string
			Enabled bool
			Secrets []struct{ ID string }
		}
	}
	sys.GraphQL(a.owner, `{ webhookEndpoints { id url enabled secrets { id } } }`, nil).Decode(t, &eps)
	require.Len(t, eps.WebhookEndpoints, 1, "B deleted A's endpoint")
	assert.Equal(t, "https://127.0.0.1:9/", eps.WebhookEndpoints[0].URL)
	assert.True(t, eps.WebhookEndpoints[0].Enabled)
	assert.Len(t, eps.WebhookEndpoints[0].Secrets, 1, "B rotated A's secret")
	var sch struct {
		Schedule struct {
			Cron         string
			Paused       bool
			StartedCount int64
		}
	}
	sys.GraphQL(a.owner, `query($id: ID!) { schedule(id: $id) { cron paused startedCount } }`, map[string]any{"id": a.schedule}).Decode(t, &sch)
	assert.Equal(t, "0 0 1 1 *", sch.Schedule.Cron, "B changed, paused, backfilled or deleted A's schedule")
	assert.False(t, sch.Schedule.Paused)
	assert.Zero(t, sch.Schedule.StartedCount)
	var sec struct {
		Secret struct {
			Version   int
			CreatedBy string
		}
		SecretAudit []struct{ Action string }
	}
	sys.GraphQL(a.owner, `query($n: SecretName!) { secret(name: $n) { version createdBy } secretAudit { action } }`,
		secretOf(a)).Decode(t, &sec)
	assert.Equal(t, 1, sec.Secret.Version, "B updated A's secret")
	assert.Len(t, sec.SecretAudit, 1, "B's changes reached A's audit")
	var wf struct{ Workflow struct{ PausedAt *string } }
	sys.GraphQL(a.owner, `query($id: ID!) { workflow(id: $id) { pausedAt } }`, map[string]any{"id": a.workflow}).Decode(t, &wf)
	assert.Nil(t, wf.Workflow.PausedAt, "B paused A's workflow")
	var op struct{ BulkOperation struct{ Status string } }
	sys.GraphQL(a.owner, `query($id: ID!) { bulkOperation(id: $id) { status } }`, map[string]any{"id": a.bulk}).Decode(t, &op)
	assert.NotEqual(t, "CANCELLED", op.BulkOperation.Status, "B cancelled A's bulk operation")
	// B's lists contain nothing of A's.
	res = sys.GraphQL(b.owner, `{ runs { edges { node { id startedBy approvals { who mayApprove reason } } } } workflows { edges { node { id } } } apiKeys { id } members { subject } viewer { tenant { id } }
		webhookEndpoints { id } webhookDeliveries { edges { node { id } } } workers { id } schedules { edges { node { id } } }
		bulkOperations { id } pausedQueues { queue } secrets { name } secretAudit { id } }`, nil)
	require.Empty(t, res.Errors)
	for _, id := range []string{a.run, a.workflow, a.key, a.id.String(), "owner@" + a.id.String(), a.endpoint, a.delivery, a.schedule, a.bulk,
		a.secret, a.audit} {
		assert.NotContains(t, string(res.Data), id)
	}
	var ws struct{ Workers []struct{ ID string } }
	sys.GraphQL(b.viewer, `{ workers { id } }`, nil).Decode(t, &ws)
	require.Len(t, ws.Workers, 1, "a viewer sees its tenant's workers, and only those")
	assert.Equal(t, "worker-"+b.id.String(), ws.Workers[0].ID)
}

func TestRolesLimitWhatAPrincipalMayDo(t *testing.T) {
	t.Parallel()
	sys, a, _ := twoTenants(t)
	mutations := map[string]string{
		"createWorkflow": `mutation { createWorkflow(input: {name: "x", definition: {nodes: [{id: "a", type: "noop"}]}}) { workflow { id } } }`,
		"startRun":       `mutation($w: ID!) { startRun(input: {workflowId: $w}) { run { id } } }`,
		"cancelRun":      `mutation($r: ID!) { cancelRun(id: $r) { id } }`,
		"createApiKey":   `mutation { createApiKey(input: {name: "k", scopes: ["admin"]}) { secret } }`,
		"addMember":      `mutation { addMember(subject: "new@x", role: VIEWER) { subject } }`,
	}
	vars := map[string]any{"w": a.workflow, "r": a.run}
	for name, m := range mutations {
		res := sys.GraphQL(a.viewer, m, vars)
		assert.Equal(t, []string{"FORBIDDEN"}, res.Codes(), "a viewer may not %s", name)
	}
	for _, name := range []string{"createApiKey", "addMember"} {
		res := sys.GraphQL(a.developer, mutations[name], vars)
		assert.Equal(t, []string{"FORBIDDEN"}, res.Codes(), "a developer may not %s", name)
	}
	res := sys.GraphQL(a.developer, mutations["startRun"], vars)
	assert.Empty(t, res.Errors, "a developer may start runs")
	res = sys.GraphQL(a.viewer, `{ runs { edges { node { id } } } }`, nil)
	assert.Empty(t, res.Errors, "a viewer may read")
	res = sys.GraphQL(a.viewer, `{ apiKeys { id } }`, nil)
	assert.Equal(t, []string{"FORBIDDEN"}, res.Codes(), "a viewer may not list keys")

	// An admin cannot make an owner; an owner can.
	admin := sys.Token(a.id, "admin@a", auth.RoleAdmin)
	res = sys.GraphQL(admin, `mutation { addMember(subject: "boss@x", role: OWNER) { role } }`, nil)
	assert.Equal(t, []string{"FORBIDDEN"}, res.Codes())
	res = sys.GraphQL(a.owner, `mutation { addMember(subject: "boss@x", role: OWNER) { role } }`, nil)
	assert.Empty(t, res.Errors)
	// Removing the last owner is refused; a downgraded member is denied at once.
	res = sys.GraphQL(a.owner, `mutation { changeMemberRole(subject: "dev@`+a.id.String()+`", role: VIEWER) { role } }`, nil)
	require.Empty(t, res.Errors)
	res = sys.GraphQL(a.developer, mutations["startRun"], vars)
	assert.NotEmpty(t, res.Errors, "the old developer token stops working")
}

func TestValidationProblemsNameNodeAndField(t *testing.T) {
	t.Parallel()
	sys, a, _ := twoTenants(t)
	res := sys.GraphQL(a.owner, `mutation($id: ID!) { publishWorkflowVersion(workflowId: $id, definition: {nodes: [{id: "x", type: "noop", depends_on: ["ghost"]}]}) { version } }`,
		map[string]any{"id": a.workflow})
	require.Len(t, res.Errors, 1)
	assert.Equal(t, "BAD_USER_INPUT", res.Errors[0].Code())
	problems, _ := res.Errors[0].Extensions["problems"].([]any)
	require.Len(t, problems, 1)
	assert.Equal(t, map[string]any{"node": "x", "field": "depends_on", "message": `unknown node "ghost"`}, problems[0])
	res = sys.GraphQL(a.owner, `query { run(id: "not-an-id") { id } }`, nil)
	assert.Equal(t, []string{"BAD_USER_INPUT"}, res.Codes())
	res = sys.GraphQL(a.owner, `mutation { startRun(input: {workflowName: "park", input: [1]}) { run { id } } }`, nil)
	assert.Equal(t, []string{"BAD_USER_INPUT"}, res.Codes())
}

func TestHostileRequestsAreRejectedBeforeExecution(t *testing.T) {
	t.Parallel()
	sys, a, _ := twoTenants(t, func(c *config.Config) { c.Dev = false })
	deep := "__typename"
	for i := 0; i < 14; i++ {
		deep = "ofType { " + deep + " }"
	}
	res := sys.GraphQL(a.owner, `{ __type(name: "Run") { fields { type { `+deep+` } } } }`, nil)
	assert.Equal(t, []string{"DEPTH_LIMIT_EXCEEDED"}, res.Codes())

	res = sys.GraphQL(a.owner, `{ runs(first: 500) { edges { node { tasks { id state } timeline(first: 1000) { id kind } } } } }`, nil)
	assert.Equal(t, []string{"COMPLEXITY_LIMIT_EXCEEDED"}, res.Codes())

	var flood strings.Builder
	flood.WriteString("mutation {")
	for i := 0; i < 40; i++ {
		fmt.Fprintf(&flood, ` s%d: startRun(input: {workflowName: "park"}) { run { id } }`, i)
	}
	flood.WriteString("}")
	res = sys.GraphQL(a.owner, flood.String(), nil)
	assert.Equal(t, []string{"ALIAS_LIMIT_EXCEEDED"}, res.Codes())
	var runs struct{ Runs struct{ Edges []any } }
	sys.GraphQL(a.owner, `{ runs(first: 100) { edges { node { id } } } }`, nil).Decode(t, &runs)
	assert.Len(t, runs.Runs.Edges, 1, "the rejected mutations never ran")

	big := fmt.Sprintf(`{"query": "{ viewer { subject } }", "variables": {"pad": %q}}`, strings.Repeat("x", 2<<20))
	res = sys.PostGraphQL(a.owner, []byte(big))
	assert.Equal(t, 413, res.Status)
	res = sys.PostGraphQL(a.owner, []byte(`[{"query": "{ viewer { subject } }"}, {"query": "{ viewer { subject } }"}]`))
	assert.NotEmpty(t, res.Errors, "batched operations are not accepted")

	res = sys.GraphQL(a.owner, `{ __schema { types { name } } }`, nil)
	assert.NotEmpty(t, res.Errors, "no introspection outside development")
	res = sys.GraphQL(a.owner, `{ viewr { subject } }`, nil)
	require.NotEmpty(t, res.Errors)
	assert.NotContains(t, res.Errors[0].Message, "Did you mean", "no field suggestions outside development")
}

func TestUnauthenticatedRequestsGetNoTenant(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	for _, cred := range []string{"", "not-a-token", "cmp_bad", "Basic abc"} {
		res := sys.GraphQL(cred, `{ viewer { subject } }`, nil)
		assert.Equal(t, 401, res.Status, "credential %q", cred)
		assert.Equal(t, []string{"UNAUTHENTICATED"}, res.Codes())
	}
	// An API key works as a principal of its tenant.
	p, err := app.ProvisionTenant(context.Background(), sys.Deps, tenants.CreateParams{Name: "k"}, "test")
	require.NoError(t, err)
	var v struct{ Viewer struct{ Kind string } }
	sys.GraphQL(p.APIKey, `{ viewer { kind } }`, nil).Decode(t, &v)
	assert.Equal(t, "API_KEY", v.Viewer.Kind)
}

// counter counts the SQL statements of the app role's pool.
type counter struct{ n atomic.Int64 }

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *counter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	c.n.Add(int64(d.Batch.Len()))
	return ctx
}
func (c *counter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *counter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// TestListingRunsWithTasksCostsAConstantNumberOfQueries: listing 10 or 100
// runs with their tasks and workflows issues the same number of statements
// (the dataloaders batch them).
func TestListingRunsWithTasksCostsAConstantNumberOfQueries(t *testing.T) {
	t.Parallel()
	c := &counter{}
	sys := apptest.StartTraced(t, testenv.New(t), c)
	owner := sys.Token(sys.Tenant, "owner@x", auth.RoleOwner)
	wf := sys.Workflow(`{"nodes":[{"id":"a","type":"sleep","sleep":{"duration":"1h"}},{"id":"b","type":"wait","wait":{"signal":"s"}}]}`)
	for i := 0; i < 100; i++ {
		sys.StartRun(wf, `{}`)
	}
	const q = `query($n: Int!) { runs(first: $n) { edges { node { id status workflow { name } tasks { nodeId state } } } } }`
	count := func(n int) int64 {
		before := c.n.Load()
		var out struct {
			Runs struct {
				Edges []struct{ Node struct{ Tasks []any } }
			}
		}
		sys.GraphQL(owner, q, map[string]any{"n": n}).Decode(t, &out)
		require.Len(t, out.Runs.Edges, n)
		require.Len(t, out.Runs.Edges[0].Node.Tasks, 2)
		return c.n.Load() - before
	}
	count(10) // warm the casbin rules
	ten, hundred := count(10), count(100)
	t.Logf("statements: %d for 10 runs, %d for 100 runs", ten, hundred)
	assert.Equal(t, ten, hundred, "the statement count does not grow with the page")
}

// txCounter counts the transactions opened on the app role's pool.
type txCounter struct{ begins atomic.Int64 }

func (c *txCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.EqualFold(strings.TrimSpace(d.SQL), "BEGIN") {
		c.begins.Add(1)
	}
	return ctx
}
func (c *txCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *txCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	for _, q := range d.Batch.QueuedQueries {
		if strings.EqualFold(strings.TrimSpace(q.SQL), "BEGIN") {
			c.begins.Add(1)
		}
	}
	return ctx
}
func (c *txCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *txCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// TestStartRunIsOneTransaction: a start over GraphQL — authorization,
// admission, the run, its first tasks and the answer read back — opens
// one transaction, as many as the smallest authorized query; so do the
// other run mutations.
func TestStartRunIsOneTransaction(t *testing.T) {
	t.Parallel()
	c := &txCounter{}
	sys := apptest.StartTraced(t, testenv.New(t), c)
	owner := sys.Token(sys.Tenant, "owner@x", auth.RoleOwner)
	wf := sys.Workflow(`{"nodes":[{"id":"w","type":"wait","wait":{"signal":"go"}},{"id":"v","type":"wait","depends_on":["w"],"wait":{"signal":"later"}}]}`)
	begins := func(query string, vars map[string]any) int64 {
		before := c.begins.Load()
		res := sys.GraphQL(owner, query, vars)
		require.Empty(t, res.Errors)
		return c.begins.Load() - before
	}
	start := `mutation($w: ID!) { startRun(input: {workflowId: $w}) { run { id status } } }`
	begins(start, map[string]any{"w": wf.String()}) // warm the caches (rules, limits)
	smallest := begins(`{ tenant { id } }`, nil)
	assert.Equal(t, smallest, begins(start, map[string]any{"w": wf.String()}), "startRun")
	var started struct {
		StartRun struct{ Run struct{ ID string } }
	}
	sys.GraphQL(owner, start, map[string]any{"w": wf.String()}).Decode(t, &started)
	id := started.StartRun.Run.ID
	assert.Equal(t, smallest, begins(`mutation($id: ID!) { signalRun(id: $id, name: "go", payload: {}) { ignored } }`, map[string]any{"id": id}), "signalRun")
	assert.Equal(t, smallest, begins(`mutation($id: ID!) { cancelRun(id: $id) { id status } }`, map[string]any{"id": id}), "cancelRun")
}

// wsClient speaks graphql-transport-ws.
type wsClient struct {
	t    *testing.T
	sys  *apptest.System
	conn *websocket.Conn
}

type wsMsg struct {
	ID      string          `json:"id,omitempty"`
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

func dialWS(t *testing.T, sys *apptest.System, credential string) *wsClient {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, strings.Replace(sys.URL, "http", "ws", 1)+"/graphql",
		&websocket.DialOptions{Subprotocols: []string{"graphql-transport-ws"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.CloseNow() })
	c := &wsClient{t: t, sys: sys, conn: conn}
	init, _ := json.Marshal(map[string]string{"Authorization": "Bearer " + credential})
	require.NoError(t, wsjson.Write(ctx, conn, wsMsg{Type: "connection_init", Payload: init}))
	m := c.next(10 * time.Second)
	require.Equal(t, "connection_ack", m.Type, "init answered %s %s", m.Type, m.Payload)
	return c
}

func (c *wsClient) subscribe(id, query string, vars map[string]any) {
	p, _ := json.Marshal(map[string]any{"query": query, "variables": vars})
	require.NoError(c.t, wsjson.Write(context.Background(), c.conn, wsMsg{ID: id, Type: "subscribe", Payload: p}))
}

// next reads the next non-ping message, or returns an empty one on timeout.
func (c *wsClient) next(timeout time.Duration) wsMsg {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		var m wsMsg
		if err := wsjson.Read(ctx, c.conn, &m); err != nil {
			return wsMsg{}
		}
		if m.Type == "ping" {
			_ = wsjson.Write(ctx, c.conn, wsMsg{Type: "pong"})
			continue
		}
		return m
	}
}

func subscribeErrors(t *testing.T, sys *apptest.System, credential, query string, vars map[string]any) []apptest.GQLError {
	c := dialWS(t, sys, credential)
	c.subscribe("1", query, vars)
	m := c.next(10 * time.Second)
	var errs []apptest.GQLError
	switch m.Type {
	case "error":
		require.NoError(t, json.Unmarshal(m.Payload, &errs))
	case "next":
		var p struct{ Errors []apptest.GQLError }
		require.NoError(t, json.Unmarshal(m.Payload, &p))
		errs = p.Errors
	}
	return errs
}

// TestSubscriptionFollowsARunToCompletionAndIsTenantScoped: runUpdated
// delivers the run's changes until it completes; another tenant's
// runsChanged subscriber receives nothing of it.
func TestSubscriptionFollowsARunToCompletionAndIsTenantScoped(t *testing.T) {
	t.Parallel()
	sys, a, b := twoTenants(t)
	sys.StartWorker(apptest.WorkerOptions{})
	var started struct {
		StartRun struct{ Run struct{ ID string } }
	}
	var created struct {
		CreateWorkflow struct{ Workflow struct{ ID string } }
	}
	sys.GraphQL(a.owner, `mutation { createWorkflow(input: {name: "steps", definition: {nodes: [
		{id: "ok", type: "wait", wait: {signal: "go"}}, {id: "x", type: "noop", depends_on: ["ok"]}, {id: "y", type: "noop", depends_on: ["x"]}]}}) { workflow { id } } }`, nil).Decode(t, &created)
	sys.GraphQL(a.owner, `mutation($w: ID!) { startRun(input: {workflowId: $w}) { run { id } } }`, map[string]any{"w": created.CreateWorkflow.Workflow.ID}).Decode(t, &started)
	id := started.StartRun.Run.ID

	watcher := dialWS(t, sys, a.viewer)
	watcher.subscribe("1", `subscription($id: ID!) { runUpdated(id: $id) { id status tasks { nodeId state } } }`, map[string]any{"id": id})
	outsider := dialWS(t, sys, b.owner)
	outsider.subscribe("1", `subscription { runsChanged { event run { id } } }`, nil)

	first := watcher.next(10 * time.Second)
	require.Equal(t, "next", first.Type, "%s", first.Payload)
	assert.Contains(t, string(first.Payload), `"RUNNING"`)

	res := sys.GraphQL(a.owner, `mutation($id: ID!) { signalRun(id: $id, name: "go") { ignored } }`, map[string]any{"id": id})
	require.Empty(t, res.Errors)
	var last wsMsg
	for {
		m := watcher.next(15 * time.Second)
		require.NotEmpty(t, m.Type, "the subscription stalled before the run completed")
		if m.Type == "complete" {
			break
		}
		require.Equal(t, "next", m.Type, "%s", m.Payload)
		last = m
	}
	assert.Contains(t, string(last.Payload), `"COMPLETED"`, "the last update is the completed run")
	assert.Equal(t, wsMsg{}, outsider.next(time.Second), "another tenant's subscriber received nothing")
}

func TestSubscriptionsNeedCredentialsAndAnAllowedOrigin(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, strings.Replace(sys.URL, "http", "ws", 1)+"/graphql",
		&websocket.DialOptions{Subprotocols: []string{"graphql-transport-ws"}})
	require.NoError(t, err)
	defer conn.CloseNow()
	init, _ := json.Marshal(map[string]string{"Authorization": "Bearer nonsense"})
	require.NoError(t, wsjson.Write(ctx, conn, wsMsg{Type: "connection_init", Payload: init}))
	var m wsMsg
	err = wsjson.Read(ctx, conn, &m)
	assert.True(t, err != nil || m.Type != "connection_ack", "a bad credential is not acknowledged")

	_, resp, err := websocket.Dial(ctx, strings.Replace(sys.URL, "http", "ws", 1)+"/graphql",
		&websocket.DialOptions{Subprotocols: []string{"graphql-transport-ws"}, HTTPHeader: map[string][]string{"Origin": {"https://evil.example"}}})
	require.Error(t, err)
	require.NotNil(t, resp)
	assert.Equal(t, 403, resp.StatusCode, "a page of another origin cannot open a subscription")
}

// TestNoPrincipalGrantsMoreThanItHolds attacks the grant rule through the
// API as a tenant's own principals would: no credential or role with more
// power than the granter's, and owner-level changes only by an owner.
func TestNoPrincipalGrantsMoreThanItHolds(t *testing.T) {
	t.Parallel()
	sys, a, _ := twoTenants(t)
	key := func(cred string, scopes ...string) (string, []string) {
		var out struct {
			CreateApiKey struct {
				Secret string
				ApiKey struct{ ID string }
			}
		}
		res := sys.GraphQL(cred, `mutation($s: [String!]!) { createApiKey(input: {name: "k", scopes: $s}) { secret apiKey { id } } }`,
			map[string]any{"s": scopes})
		if len(res.Errors) > 0 {
			return "", res.Codes()
		}
		res.Decode(t, &out)
		return out.CreateApiKey.Secret, nil
	}
	forbidden := []string{"FORBIDDEN"}
	admin := sys.Token(a.id, "admin@"+a.id.String(), auth.RoleAdmin)
	owner2 := "owner2@" + a.id.String()
	res := sys.GraphQL(a.owner, `mutation($s: String!) { addMember(subject: $s, role: OWNER) { role } }`, map[string]any{"s": owner2})
	require.Empty(t, res.Errors, "an owner grants the owner role")

	// 1. A key with only keys:manage cannot mint a broader key.
	keysOnly, codes := key(a.owner, "keys:manage")
	require.Nil(t, codes)
	for _, scopes := range [][]string{{"admin"}, {"runs:write"}, {"keys:manage", "members:manage"}} {
		_, codes := key(keysOnly, scopes...)
		assert.Equal(t, forbidden, codes, "a keys:manage key minting %v", scopes)
	}
	_, codes = key(keysOnly, "keys:manage")
	assert.Nil(t, codes, "but may mint its equal")

	// 2. A members:manage key cannot add an owner, nor any role it cannot do itself.
	membersOnly, _ := key(a.owner, "members:manage")
	for _, role := range []string{"OWNER", "ADMIN", "VIEWER"} {
		res := sys.GraphQL(membersOnly, `mutation($r: Role!) { addMember(subject: "x@y", role: $r) { role } }`, map[string]any{"r": role})
		assert.Equal(t, forbidden, res.Codes(), "a members:manage key adding a %s", role)
	}
	viewerGranter, _ := key(a.owner, "members:manage", "runs:read", "workflows:read", "billing:read")
	res = sys.GraphQL(viewerGranter, `mutation { addMember(subject: "v@y", role: VIEWER) { role } }`, nil)
	assert.Empty(t, res.Errors, "a key that can do all a viewer can may add a viewer")

	// 3. An admin cannot mint an admin-scope key, nor promote itself with a
	// members:manage key it minted.
	_, codes = key(admin, "admin")
	assert.Equal(t, forbidden, codes, "an admin minting an admin-scope key")
	adminsKey, codes := key(admin, "members:manage", "runs:read", "runs:write", "workflows:read", "workflows:write", "keys:manage",
		"webhooks:manage", "billing:read", "worker")
	require.Nil(t, codes, "an admin may mint a key of its own power")
	res = sys.GraphQL(adminsKey, `mutation($s: String!) { changeMemberRole(subject: $s, role: OWNER) { role } }`,
		map[string]any{"s": "admin@" + a.id.String()})
	assert.Equal(t, forbidden, res.Codes(), "the admin's key promoting the admin to owner")

	// 4. An admin cannot demote or remove an owner, nor revoke an owner-level key.
	res = sys.GraphQL(admin, `mutation($s: String!) { changeMemberRole(subject: $s, role: VIEWER) { role } }`, map[string]any{"s": owner2})
	assert.Equal(t, forbidden, res.Codes(), "an admin demoting an owner")
	res = sys.GraphQL(admin, `mutation($s: String!) { removeMember(subject: $s) }`, map[string]any{"s": owner2})
	assert.Equal(t, forbidden, res.Codes(), "an admin removing an owner")
	var keys struct {
		ApiKeys []struct {
			ID     string
			Scopes []string
		}
	}
	sys.GraphQL(a.owner, `{ apiKeys { id scopes } }`, nil).Decode(t, &keys)
	for _, k := range keys.ApiKeys {
		if slices.Contains(k.Scopes, "admin") {
			res = sys.GraphQL(admin, `mutation($id: ID!) { revokeApiKey(id: $id) { id } }`, map[string]any{"id": k.ID})
			assert.Equal(t, forbidden, res.Codes(), "an admin revoking an owner-level key")
		}
	}

	// Nothing changed: both owners are owners, and every admin-scope key is live.
	var members struct {
		Members []struct{ Subject, Role string }
	}
	sys.GraphQL(a.owner, `{ members { subject role } }`, nil).Decode(t, &members)
	owners := 0
	for _, m := range members.Members {
		if m.Role == "OWNER" {
			owners++
		}
	}
	assert.Equal(t, 2, owners)

	// An owner can do all of it.
	res = sys.GraphQL(a.owner, `mutation($s: String!) { changeMemberRole(subject: $s, role: ADMIN) { role } }`, map[string]any{"s": owner2})
	assert.Empty(t, res.Errors)
	_, codes = key(a.owner, "admin")
	assert.Nil(t, codes)
}

// TestAmplifyingInputMappingsAreRefused: a start whose input a node's
// mapping would copy past the value bound is BAD_USER_INPUT naming the
// node, and writes nothing.
func TestAmplifyingInputMappingsAreRefused(t *testing.T) {
	t.Parallel()
	sys, a, _ := twoTenants(t)
	var created struct {
		CreateWorkflow struct{ Workflow struct{ ID string } }
	}
	sys.GraphQL(a.owner, `mutation { createWorkflow(input: {name: "amp", definition: {nodes: [
		{id: "copy", type: "noop", input: {a: "input.s", b: "input.s", c: "input.s", d: "input.s", e: "input.s"}}]}}) { workflow { id } } }`,
		nil).Decode(t, &created)
	res := sys.GraphQL(a.owner, `mutation($w: ID!, $in: JSON) { startRun(input: {workflowId: $w, input: $in}) { run { id } } }`,
		map[string]any{"w": created.CreateWorkflow.Workflow.ID, "in": map[string]string{"s": strings.Repeat("x", 300<<10)}})
	require.Equal(t, []string{"BAD_USER_INPUT"}, res.Codes(), "%s", res.Data)
	problems, _ := res.Errors[0].Extensions["problems"].([]any)
	require.NotEmpty(t, problems)
	assert.Equal(t, "copy", problems[0].(map[string]any)["node"])
	var runs struct {
		Runs struct {
			Edges []struct{ Node struct{ ID string } }
		}
	}
	sys.GraphQL(a.owner, `query($w: ID!) { runs(filter: {workflowId: $w}) { edges { node { id } } } }`,
		map[string]any{"w": created.CreateWorkflow.Workflow.ID}).Decode(t, &runs)
	assert.Empty(t, runs.Runs.Edges, "nothing was written")
}

// TestSmallQueriesCannotMakeHugeResponses: aliases spread through
// fragments are counted every time they execute, and a response carrying
// more than the byte budget of JSON values is refused with one clear
// error instead of being built.
func TestSmallQueriesCannotMakeHugeResponses(t *testing.T) {
	t.Parallel()
	sys, a, _ := twoTenants(t)
	// 10 aliases in a fragment, spread 10 times: 100 executions.
	frag := `fragment F on Query { ` + strings.Repeat("", 0)
	for i := range 10 {
		frag += fmt.Sprintf("a%d: viewer { subject } ", i)
	}
	frag += "}"
	q := "query { "
	for i := range 10 {
		q += fmt.Sprintf("s%d: tenant { id } ...F ", i)
	}
	q += "} " + frag
	res := sys.GraphQL(a.owner, q, nil)
	assert.Equal(t, []string{"ALIAS_LIMIT_EXCEEDED"}, res.Codes(), "aliases through fragments count")

	// Runs with 900 KiB inputs: a page of them is over the 8 MiB budget.
	var created struct {
		CreateWorkflow struct{ Workflow struct{ ID string } }
	}
	sys.GraphQL(a.owner, `mutation { createWorkflow(input: {name: "big", definition: {nodes: [{id: "w", type: "wait", wait: {signal: "s"}}]}}) { workflow { id } } }`,
		nil).Decode(t, &created)
	in := map[string]string{"s": strings.Repeat("x", 900<<10)}
	for range 10 {
		res := sys.GraphQL(a.owner, `mutation($w: ID!, $in: JSON) { startRun(input: {workflowId: $w, input: $in}) { run { id } } }`,
			map[string]any{"w": created.CreateWorkflow.Workflow.ID, "in": in})
		require.Empty(t, res.Errors)
	}
	res = sys.GraphQL(a.owner, `query($w: ID!) { runs(first: 10, filter: {workflowId: $w}) { edges { node { id input } } } }`,
		map[string]any{"w": created.CreateWorkflow.Workflow.ID})
	require.Equal(t, []string{"RESPONSE_TOO_LARGE"}, res.Codes())
	assert.Equal(t, "null", string(res.Data), "nothing of the oversized response is sent")
	res = sys.GraphQL(a.owner, `query($w: ID!) { runs(first: 5, filter: {workflowId: $w}) { edges { node { id input } } } }`,
		map[string]any{"w": created.CreateWorkflow.Workflow.ID})
	assert.Empty(t, res.Errors, "a smaller page is answered")
}

// TestWriteOnlyKeysLearnWhatTheyDid: a key with runs:write but not
// runs:read gets the answer of its start, cancel and rerun (so a client
// does not retry a start that happened), but still may not read runs.
func TestWriteOnlyKeysLearnWhatTheyDid(t *testing.T) {
	t.Parallel()
	sys, a, _ := twoTenants(t)
	var key struct{ CreateApiKey struct{ Secret string } }
	sys.GraphQL(a.owner, `mutation { createApiKey(input: {name: "w", scopes: ["runs:write"]}) { secret } }`, nil).Decode(t, &key)
	w := key.CreateApiKey.Secret
	var started struct {
		StartRun struct {
			Created bool
			Run     struct{ ID, Status string }
		}
	}
	start := `mutation($w: ID!) { startRun(input: {workflowId: $w, idempotencyKey: "once"}) { created run { id status } } }`
	sys.GraphQL(w, start, map[string]any{"w": a.workflow}).Decode(t, &started)
	assert.True(t, started.StartRun.Created)
	assert.Equal(t, "RUNNING", started.StartRun.Run.Status)
	id := started.StartRun.Run.ID
	sys.GraphQL(w, start, map[string]any{"w": a.workflow}).Decode(t, &started)
	assert.False(t, started.StartRun.Created, "the retry found the first run")
	assert.Equal(t, id, started.StartRun.Run.ID)
	res := sys.GraphQL(w, `mutation($id: ID!) { cancelRun(id: $id) { id status } }`, map[string]any{"id": id})
	assert.Empty(t, res.Errors)
	assert.Contains(t, string(res.Data), "CANCELLED")
	res = sys.GraphQL(w, `query($id: ID!) { run(id: $id) { id } }`, map[string]any{"id": id})
	assert.Equal(t, []string{"FORBIDDEN"}, res.Codes(), "reading stays forbidden")
	res = sys.GraphQL(w, `mutation($id: ID!) { cancelRun(id: $id) { id tasks { nodeId } } }`, map[string]any{"id": id})
	assert.Contains(t, res.Codes(), "FORBIDDEN", "nested fields it may not read are refused")
}

// TestCollectionsAreBounded: what a tenant can accumulate is bounded by its
// limits (here overridden small), each refusal a clear QUOTA_EXCEEDED (or
// RATE_LIMITED for pings), through the API.
func TestCollectionsAreBounded(t *testing.T) {
	t.Parallel()
	sys, a, _ := twoTenants(t)
	require.NoError(t, tenants.Update(context.Background(), sys.Deps.DB, a.id, tenants.UpdateParams{Limits: &tenants.Limits{
		MaxSignalsPerRun: 3, MaxWorkflowVersions: 3, MaxAPIKeys: 3, MaxWebhookEndpoints: 2}}))
	quota := []string{"QUOTA_EXCEEDED"}

	// API keys: the world made one; two more fit.
	for i := range 3 {
		res := sys.GraphQL(a.owner, `mutation { createApiKey(input: {name: "k", scopes: ["runs:read"]}) { secret } }`, nil)
		if i < 2 {
			require.Empty(t, res.Errors, "key %d", i)
		} else {
			assert.Equal(t, quota, res.Codes(), "a key past the bound")
		}
	}
	// Versions: the world's workflow has 1; two more fit.
	for i := range 3 {
		res := sys.GraphQL(a.owner, `mutation($w: ID!, $d: JSON!) { publishWorkflowVersion(workflowId: $w, definition: $d) { version } }`,
			map[string]any{"w": a.workflow, "d": json.RawMessage(waitDef)})
		if i < 2 {
			require.Empty(t, res.Errors, "version %d", i)
		} else {
			assert.Equal(t, quota, res.Codes(), "a version past the bound")
		}
	}
	// Signals: three per run, and no payload over 64 KiB.
	for i := range 4 {
		res := sys.GraphQL(a.owner, `mutation($id: ID!, $n: String!) { signalRun(id: $id, name: $n) { ignored } }`,
			map[string]any{"id": a.waitingRun, "n": fmt.Sprintf("other-%d", i)})
		if i < 3 {
			require.Empty(t, res.Errors, "signal %d", i)
		} else {
			assert.Equal(t, quota, res.Codes(), "a signal past the bound")
		}
	}
	res := sys.GraphQL(a.owner, `mutation($id: ID!, $p: JSON) { signalRun(id: $id, name: "big", payload: $p) { ignored } }`,
		map[string]any{"id": a.run, "p": map[string]string{"x": strings.Repeat("x", 70<<10)}})
	assert.Equal(t, []string{"BAD_USER_INPUT"}, res.Codes())
	// Webhook endpoints: the world made one; one more fits.
	for i := range 2 {
		res := sys.GraphQL(a.owner, `mutation { createWebhookEndpoint(input: {url: "https://127.0.0.1:9/", eventTypes: ["run.failed"]}) { secret } }`, nil)
		if i < 1 {
			require.Empty(t, res.Errors)
		} else {
			assert.Equal(t, quota, res.Codes(), "an endpoint past the bound")
		}
	}
	// Rotations keep at most two live secrets.
	for range 3 {
		require.Empty(t, sys.GraphQL(a.owner, `mutation($id: ID!) { rotateWebhookSecret(id: $id) { secret } }`, map[string]any{"id": a.endpoint}).Errors)
	}
	var ep struct {
		WebhookEndpoint struct{ Secrets []struct{ ID string } }
	}
	sys.GraphQL(a.owner, `query($id: ID!) { webhookEndpoint(id: $id) { secrets { id } } }`, map[string]any{"id": a.endpoint}).Decode(t, &ep)
	assert.Len(t, ep.WebhookEndpoint.Secrets, 2, "the current secret and the one in its grace period")
	// Test pings: ten an hour (the world sent one).
	limited := 0
	for range 10 {
		res := sys.GraphQL(a.owner, `mutation($id: ID!) { sendWebhookTestPing(endpointId: $id) { id } }`, map[string]any{"id": a.endpoint})
		if slices.Equal(res.Codes(), []string{"RATE_LIMITED"}) {
			limited++
		}
	}
	assert.Equal(t, 1, limited, "the eleventh ping of the hour")
}

// TestHTTPHeadersAreMaskedForReaders: HTTP step headers (credentials) are
// shown to those who may change the workflow and masked for viewers and
// read-only keys. A credential written literally is refused at publish
// (pointing to a secret); a version stored with one before that was
// refused stays masked.
func TestHTTPHeadersAreMaskedForReaders(t *testing.T) {
	t.Parallel()
	sys, a, _ := twoTenants(t)
	literal := `{"nodes": [{"id": "call", "type": "http", "http": {"method": "GET", "url": "https://api.example.com/",
		"headers": {"Authorization": "Bearer sk_live_123"}, "query": {"api_key": "sk_live_456"}}}]}`
	res := sys.GraphQL(a.owner, `mutation($d: JSON!) { createWorkflow(input: {name: "secretive", definition: $d}) { workflow { id } } }`,
		map[string]any{"d": json.RawMessage(literal)})
	require.Equal(t, []string{"BAD_USER_INPUT"}, res.Codes())
	assert.Contains(t, res.Errors[0].Message, `node "call": http.headers.Authorization: Authorization carries a credential written into the definition`)
	assert.Contains(t, res.Errors[0].Message, `http.query.api_key`)
	assert.Contains(t, res.Errors[0].Message, `{{ secrets.NAME }}`)

	var created struct {
		CreateWorkflow struct{ Workflow struct{ ID string } }
	}
	sys.GraphQL(a.owner, `mutation { createWorkflow(input: {name: "secretive", definition: {nodes: [
		{id: "call", type: "http", http: {method: "GET", url: "https://api.example.com/", headers: {Authorization: "Bearer {{ secrets.T }}"}}}]}}) { workflow { id } } }`,
		nil).Decode(t, &created)
	// Version 2 holds literals, as a version published before they were refused may.
	wf := uuid.MustParse(created.CreateWorkflow.Workflow.ID)
	require.NoError(t, sys.Deps.DB.WithTenant(context.Background(), a.id, func(ctx context.Context, tx *pg.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE workflow_definitions SET latest_version = 2 WHERE tenant_id = $1 AND id = $2`, a.id, wf); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO workflow_versions (tenant_id, workflow_id, version, definition) VALUES ($1, $2, 2, $3)`, a.id, wf, literal)
		return err
	}))
	var key struct{ CreateApiKey struct{ Secret string } }
	sys.GraphQL(a.owner, `mutation { createApiKey(input: {name: "ro", scopes: ["workflows:read"]}) { secret } }`, nil).Decode(t, &key)
	q := `query($id: ID!) { workflow(id: $id) { versions { definition } version(number: 2) { definition } } }`
	vars := map[string]any{"id": created.CreateWorkflow.Workflow.ID}
	for name, cred := range map[string]string{"viewer": a.viewer, "workflows:read key": key.CreateApiKey.Secret} {
		res := sys.GraphQL(cred, q, vars)
		require.Empty(t, res.Errors, name)
		assert.NotContains(t, string(res.Data), "sk_live_123", "%s sees no header value", name)
		assert.NotContains(t, string(res.Data), "sk_live_456", "%s sees no query value", name)
		assert.Contains(t, string(res.Data), "Authorization", "%s sees the header's name", name)
		assert.Contains(t, string(res.Data), "api_key", "%s sees the parameter's name", name)
	}
	res = sys.GraphQL(a.developer, q, vars)
	require.Empty(t, res.Errors)
	assert.Contains(t, string(res.Data), "sk_live_123", "a developer, who may change the workflow, sees it")
	// Its runs still start: a stored version is read as it was published.
	res = sys.GraphQL(a.owner, `mutation($w: ID!) { startRun(input: {workflowId: $w, version: 2}) { run { id } } }`, map[string]any{"w": wf.String()})
	require.Empty(t, res.Errors)
}

// TestClientMistakesAreClientErrors: malformed requests of every shape
// answer a client error in the GraphQL envelope (never INTERNAL) and are
// not logged as errors; an oversized chunked body is drained so the client
// reads its 413 rather than a reset; an INTERNAL error's log line carries
// its cause.
func TestClientMistakesAreClientErrors(t *testing.T) {
	t.Parallel()
	sys, a, _ := twoTenants(t)
	post := func(body io.Reader, chunked bool, credential string) (int, apptest.GQLResponse) {
		req, err := http.NewRequest(http.MethodPost, sys.URL+"/graphql", body)
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		if credential != "" {
			req.Header.Set("Authorization", "Bearer "+credential)
		}
		if chunked {
			req.ContentLength = -1
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err, "the client reads an answer, not a reset")
		defer resp.Body.Close()
		var out apptest.GQLResponse
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		return resp.StatusCode, out
	}
	deep := `{"query":"{ viewer { subject } }","variables":{"x":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}}`
	for name, c := range map[string]struct {
		body    string
		chunked bool
		status  int
	}{
		"batched":          {`[{"query":"{ viewer { subject } }"}]`, false, 400},
		"nul in variables": {`{"query":"mutation($i: JSON) { startRun(input: {workflowName: \"park\", input: $i}) { run { id } } }","variables":{"i":{"x":"a\u0000b"}}}`, false, 400},
		"nul in a literal": {`{"query":"{ workflow(id: \"a\u0000\") { id } }"}`, false, 400},
		"deep":             {deep, false, 400},
		"malformed":        {`{"query":`, false, 400},
		"not json":         {`hello`, false, 400},
		"chunked 2 MiB":    {strings.Repeat("a", 2<<20), true, 413},
		"2 MiB":            {strings.Repeat("a", 2<<20), false, 413},
	} {
		status, res := post(strings.NewReader(c.body), c.chunked, a.owner)
		assert.Equal(t, c.status, status, name)
		require.NotEmpty(t, res.Errors, name)
		assert.Contains(t, []string{"BAD_USER_INPUT", "GRAPHQL_PARSE_FAILED"}, res.Errors[0].Code(), "%s: %v", name, res.Errors)
	}
	status, res := post(strings.NewReader(`{"query":"{ viewer { subject } }"}`), false, "")
	assert.Equal(t, http.StatusUnauthorized, status)
	assert.Equal(t, []string{"UNAUTHENTICATED"}, res.Codes(), "a 401 in the GraphQL envelope")
	assert.Zero(t, sys.Logs.FilterLevelExact(zapcore.ErrorLevel).Len(), "no client mistake is logged as an error: %v",
		sys.Logs.FilterLevelExact(zapcore.ErrorLevel).All())

	// A member subject with bidirectional formatting characters is refused.
	res = sys.GraphQL(a.owner, `mutation($s: String!) { addMember(subject: $s, role: VIEWER) { subject } }`, map[string]any{"s": "admin\u202e@evil"})
	assert.Equal(t, []string{"BAD_USER_INPUT"}, res.Codes())
}

// TestRunMetadataThroughTheAPI: a start's metadata comes back with the run
// and filters the list; another tenant filtering by the same pair sees
// none of it; metadata that is not an object of strings is BAD_USER_INPUT
// naming the field and starts nothing.
func TestRunMetadataThroughTheAPI(t *testing.T) {
	t.Parallel()
	sys, a, b := twoTenants(t)
	var created struct {
		CreateWorkflow struct{ Workflow struct{ ID string } }
	}
	sys.GraphQL(a.owner, `mutation { createWorkflow(input: {name: "meta", definition: {nodes: [{id: "w", type: "wait", wait: {signal: "go"}}]}}) { workflow { id } } }`,
		nil).Decode(t, &created)
	wf := created.CreateWorkflow.Workflow.ID
	start := `mutation($w: ID!, $m: JSON) { startRun(input: {workflowId: $w, metadata: $m}) { run { id metadata } } }`
	var started struct {
		StartRun struct {
			Run struct {
				ID       string
				Metadata map[string]string
			}
		}
	}
	sys.GraphQL(a.owner, start, map[string]any{"w": wf, "m": map[string]string{"customer": "c_42", "order": "o-1"}}).Decode(t, &started)
	assert.Equal(t, map[string]string{"customer": "c_42", "order": "o-1"}, started.StartRun.Run.Metadata)
	sys.GraphQL(a.owner, start, map[string]any{"w": wf, "m": map[string]string{"customer": "c_7"}}).Decode(t, &struct{}{})

	list := `query($m: JSON) { runs(filter: {metadata: $m}) { edges { node { id metadata } } } }`
	var runs struct {
		Runs struct {
			Edges []struct{ Node struct{ ID string } }
		}
	}
	sys.GraphQL(a.owner, list, map[string]any{"m": map[string]string{"customer": "c_42"}}).Decode(t, &runs)
	require.Len(t, runs.Runs.Edges, 1)
	assert.Equal(t, started.StartRun.Run.ID, runs.Runs.Edges[0].Node.ID)
	runs.Runs.Edges = nil
	sys.GraphQL(b.owner, list, map[string]any{"m": map[string]string{"customer": "c_42"}}).Decode(t, &runs)
	assert.Empty(t, runs.Runs.Edges, "another tenant's runs are not found by their metadata")

	for _, bad := range []any{map[string]any{"n": 1}, []string{"x"}, "text", map[string]string{"bad key": "x"}} {
		res := sys.GraphQL(a.owner, start, map[string]any{"w": wf, "m": bad})
		assert.Equal(t, []string{"BAD_USER_INPUT"}, res.Codes(), "%v: %s", bad, res.Data)
		res = sys.GraphQL(a.owner, list, map[string]any{"m": bad})
		assert.Equal(t, []string{"BAD_USER_INPUT"}, res.Codes(), "filter %v: %s", bad, res.Data)
	}
	runs.Runs.Edges = nil
	sys.GraphQL(a.owner, `query($w: ID!) { runs(filter: {workflowId: $w}) { edges { node { id } } } }`, map[string]any{"w": wf}).Decode(t, &runs)
	assert.Len(t, runs.Runs.Edges, 2, "the refused starts wrote nothing")
}
