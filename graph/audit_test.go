package graph_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/audit"
	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/graph"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/tenants"
)

// auditCase runs one mutation for TestEveryMutationIsAudited. st carries
// ids between cases (a case's save reads them from its answer).
type auditCase struct {
	name    string
	query   string
	vars    func(w tenantWorld, st map[string]string) map[string]any
	save    func(data json.RawMessage, st map[string]string)
	outcome string // "" means ok; notRecorded for a mutation that is not audited
}

// notRecorded: the case's mutation is not audited (its spec says why).
const notRecorded = "-"

// auditedDef parks a run on a signal and on an event.
const auditedDef = `{"nodes":[{"id":"w","type":"wait","wait":{"signal":"approval","approval":true}},
	{"id":"e","type":"wait","wait":{"event":"audited.event"}}]}`

const auditedSecretValue = "audited-secret-value-7f3a"

func noVars(tenantWorld, map[string]string) map[string]any { return nil }

func saveAt(key string, path ...string) func(json.RawMessage, map[string]string) {
	return func(data json.RawMessage, st map[string]string) {
		var v any
		_ = json.Unmarshal(data, &v)
		for _, p := range path {
			m, _ := v.(map[string]any)
			v = m[p]
		}
		st[key], _ = v.(string)
	}
}

func stVar(name, key string) func(tenantWorld, map[string]string) map[string]any {
	return func(_ tenantWorld, st map[string]string) map[string]any { return map[string]any{name: st[key]} }
}

// auditCases runs every mutation of the schema once, in an order where
// each finds what it needs; TestEveryMutationIsAudited fails when the
// schema has a mutation without a case (or a spec in graph.auditSpecs).
var auditCases = []auditCase{
	{name: "createWorkflow", query: `mutation($d: JSON!) { createWorkflow(input: {name: "audited", definition: $d}) { workflow { id } } }`,
		vars: func(tenantWorld, map[string]string) map[string]any {
			return map[string]any{"d": json.RawMessage(waitDef)}
		},
		save: saveAt("workflow", "createWorkflow", "workflow", "id")},
	{name: "publishWorkflowVersion", query: `mutation($id: ID!, $d: JSON!) { publishWorkflowVersion(workflowId: $id, definition: $d) { version } }`,
		vars: func(_ tenantWorld, st map[string]string) map[string]any {
			return map[string]any{"id": st["workflow"], "d": json.RawMessage(auditedDef)}
		}},
	{name: "startRun", query: `mutation($w: ID!) { startRun(input: {workflowId: $w, idempotencyKey: "k1"}) { run { id } } }`,
		vars: stVar("w", "workflow"), save: saveAt("run", "startRun", "run", "id"), outcome: notRecorded},
	{name: "signalRun", query: `mutation($id: ID!) { signalRun(id: $id, name: "nobody-waits", payload: {}) { ignored } }`,
		vars: stVar("id", "run")},
	{name: "approve", query: `mutation($id: ID!) { approve(id: $id, approved: true, comment: "fine") { ignored } }`, vars: stVar("id", "run")},
	// Resumes the run's event wait: the run completes.
	{name: "publishEvent", query: `mutation { publishEvent(input: {name: "audited.event", id: "audit-1"}) { created } }`, vars: noVars},
	{name: "rerunRun", query: `mutation($id: ID!) { rerunRun(id: $id, mode: AS_NEW) { id } }`, vars: stVar("id", "run"),
		save: saveAt("rerun", "rerunRun", "id")},
	{name: "cancelRun", query: `mutation($id: ID!) { cancelRun(id: $id, reason: "audit") { id } }`, vars: stVar("id", "rerun")},
	{name: "createApiKey", query: `mutation { createApiKey(input: {name: "audited", scopes: ["runs:read"]}) { apiKey { id } secret } }`,
		vars: noVars, save: func(data json.RawMessage, st map[string]string) {
			saveAt("key", "createApiKey", "apiKey", "id")(data, st)
			saveAt("keySecret", "createApiKey", "secret")(data, st)
		}},
	{name: "revokeApiKey", query: `mutation($id: ID!) { revokeApiKey(id: $id) { id } }`, vars: stVar("id", "key")},
	{name: "addMember", query: `mutation { addMember(subject: "audited@example.com", role: VIEWER) { subject } }`, vars: noVars},
	{name: "changeMemberRole", query: `mutation { changeMemberRole(subject: "audited@example.com", role: DEVELOPER) { subject } }`, vars: noVars},
	{name: "removeMember", query: `mutation { removeMember(subject: "audited@example.com") }`, vars: noVars},
	{name: "pauseWorkflow", query: `mutation($id: ID!) { pauseWorkflow(id: $id, reason: "audit") { id } }`, vars: stVar("id", "workflow")},
	{name: "resumeWorkflow", query: `mutation($id: ID!) { resumeWorkflow(id: $id) { workflow { id } } }`, vars: stVar("id", "workflow")},
	{name: "pauseQueue", query: `mutation { pauseQueue(queue: "audited") { queue } }`, vars: noVars},
	{name: "resumeQueue", query: `mutation { resumeQueue(queue: "audited") { redispatched } }`, vars: noVars},
	{name: "createBulkOperation", query: `mutation { createBulkOperation(input: {action: CANCEL, filter: {createdAfter: "2100-01-01T00:00:00Z"}}) { operation { id } } }`,
		vars: noVars, save: saveAt("bulk", "createBulkOperation", "operation", "id")},
	{name: "cancelBulkOperation", query: `mutation($id: ID!) { cancelBulkOperation(id: $id) { id } }`, vars: stVar("id", "bulk")},
	{name: "createRateLimit", query: `mutation { createRateLimit(input: {name: "audited", perSecond: 1, burst: 1}) { name } }`, vars: noVars},
	{name: "updateRateLimit", query: `mutation { updateRateLimit(input: {name: "audited", perSecond: 2, burst: 2}) { name } }`, vars: noVars},
	{name: "deleteRateLimit", query: `mutation { deleteRateLimit(name: "audited") }`, vars: noVars},
	{name: "createSchedule", query: `mutation($w: ID!) { createSchedule(input: {workflowId: $w, cron: "0 0 1 1 *"}) { id } }`,
		vars: stVar("w", "workflow"), save: saveAt("schedule", "createSchedule", "id")},
	{name: "updateSchedule", query: `mutation($id: ID!) { updateSchedule(id: $id, input: {cron: "0 0 2 1 *"}) { id } }`, vars: stVar("id", "schedule")},
	{name: "pauseSchedule", query: `mutation($id: ID!) { pauseSchedule(id: $id) { id } }`, vars: stVar("id", "schedule")},
	{name: "resumeSchedule", query: `mutation($id: ID!) { resumeSchedule(id: $id) { id } }`, vars: stVar("id", "schedule")},
	{name: "backfillSchedule", query: `mutation($id: ID!) { backfillSchedule(id: $id, from: "2020-01-01T00:00:00Z", to: "2020-03-01T00:00:00Z") { runId } }`,
		vars: stVar("id", "schedule")},
	{name: "deleteSchedule", query: `mutation($id: ID!) { deleteSchedule(id: $id) }`, vars: stVar("id", "schedule")},
	{name: "createSecret", query: `mutation($v: String!) { createSecret(name: "AUDITED", value: $v) { name } }`,
		vars: func(tenantWorld, map[string]string) map[string]any { return map[string]any{"v": auditedSecretValue} }},
	{name: "updateSecret", query: `mutation($v: String!) { updateSecret(name: "AUDITED", value: $v) { name } }`,
		vars: func(tenantWorld, map[string]string) map[string]any {
			return map[string]any{"v": auditedSecretValue + "-2"}
		}},
	{name: "deleteSecret", query: `mutation { deleteSecret(name: "AUDITED") }`, vars: noVars},
	{name: "createWebhookEndpoint", query: `mutation { createWebhookEndpoint(input: {url: "https://127.0.0.1:9/", eventTypes: ["run.failed"]}) { endpoint { id } secret } }`,
		vars: noVars, save: func(data json.RawMessage, st map[string]string) {
			saveAt("endpoint", "createWebhookEndpoint", "endpoint", "id")(data, st)
			saveAt("endpointSecret", "createWebhookEndpoint", "secret")(data, st)
		}},
	{name: "updateWebhookEndpoint", query: `mutation($id: ID!) { updateWebhookEndpoint(id: $id, input: {eventTypes: ["run.completed"]}) { id } }`,
		vars: stVar("id", "endpoint")},
	{name: "rotateWebhookSecret", query: `mutation($id: ID!) { rotateWebhookSecret(id: $id) { secret } }`, vars: stVar("id", "endpoint"),
		save: saveAt("rotatedSecret", "rotateWebhookSecret", "secret")},
	{name: "sendWebhookTestPing", query: `mutation($id: ID!) { sendWebhookTestPing(endpointId: $id) { id } }`, vars: stVar("id", "endpoint"),
		save: saveAt("delivery", "sendWebhookTestPing", "id")},
	{name: "redeliverWebhook", query: `mutation($id: ID!) { redeliverWebhook(deliveryId: $id) { id } }`, vars: stVar("id", "delivery")},
	{name: "disableWebhookEndpoint", query: `mutation($id: ID!) { disableWebhookEndpoint(id: $id) { id } }`, vars: stVar("id", "endpoint")},
	{name: "deleteWebhookEndpoint", query: `mutation($id: ID!) { deleteWebhookEndpoint(id: $id) }`, vars: stVar("id", "endpoint")},
}

type auditRow struct {
	Seq                                int64
	PrincipalKind, PrincipalID, Action string
	TargetType, TargetID, Outcome      string
	Detail                             json.RawMessage
}

func newestAudit(t *testing.T, sys *apptest.System, cred, action string) auditRow {
	t.Helper()
	var out struct {
		AuditLog struct{ Edges []struct{ Node auditRow } }
	}
	sys.GraphQL(cred, `query($a: String) { auditLog(first: 1, filter: {action: $a}) { edges { node {
		seq principalKind principalId action targetType targetId outcome detail } } } }`, map[string]any{"a": action}).Decode(t, &out)
	require.Len(t, out.AuditLog.Edges, 1, "no audit record of %s", action)
	return out.AuditLog.Edges[0].Node
}

func verifyChain(t *testing.T, sys *apptest.System, cred string) (valid bool, brokenAt int64, checked int) {
	t.Helper()
	var v struct {
		AuditVerify struct {
			Valid    bool
			BrokenAt *int64
			Checked  int
			Problem  *string
		}
	}
	sys.GraphQL(cred, `{ auditVerify { valid brokenAt checked problem } }`, nil).Decode(t, &v)
	if v.AuditVerify.BrokenAt != nil {
		brokenAt = *v.AuditVerify.BrokenAt
	}
	return v.AuditVerify.Valid, brokenAt, v.AuditVerify.Checked
}

// TestEveryMutationIsAudited runs every mutation of the schema as an owner
// and then as a viewer: each leaves one record naming the principal, the
// action, its target (the object it created, for a create) and its
// outcome — "ok" in the action's own transaction, FORBIDDEN for the
// viewer — with no secret in its detail, and the chain stays valid.
func TestEveryMutationIsAudited(t *testing.T) {
	t.Parallel()
	schema := loadSchema(t)
	var mutations []string
	for _, f := range schema.Mutation.Fields {
		if !strings.HasPrefix(f.Name, "__") {
			mutations = append(mutations, f.Name)
		}
	}
	var cased []string
	for _, c := range auditCases {
		cased = append(cased, c.name)
	}
	for _, m := range mutations {
		assert.Contains(t, cased, m, "mutation %s has no case in auditCases", m)
		assert.Contains(t, graph.AuditSpecs(), m, "mutation %s has no audit spec in graph/audit.go", m)
	}
	for _, c := range auditCases {
		assert.Equal(t, c.outcome == notRecorded, graph.AuditSpecs()[c.name] != "", "%s: the case and the spec disagree on whether it is audited", c.name)
	}
	for _, c := range cased {
		assert.Contains(t, mutations, c, "auditCases has %s, which the schema no longer has", c)
	}
	require.False(t, t.Failed())

	sys := apptest.Start(t)
	w := newTenantWorld(t, sys, sys.Tenant)
	ownerSubject := "owner@" + sys.Tenant.String()
	st := map[string]string{}
	for _, c := range auditCases {
		res := sys.GraphQL(w.owner, c.query, c.vars(w, st))
		require.Empty(t, res.Errors, "%s: %s", c.name, res.Data)
		if c.save != nil {
			c.save(res.Data, st)
		}
		if c.outcome == notRecorded {
			assert.Zero(t, auditCount(t, sys, w.owner, c.name), c.name)
			continue
		}
		rec := newestAudit(t, sys, w.owner, c.name)
		want := c.outcome
		if want == "" {
			want = audit.OK
		}
		assert.Equal(t, want, rec.Outcome, c.name)
		assert.Equal(t, "USER", rec.PrincipalKind, c.name)
		assert.Equal(t, ownerSubject, rec.PrincipalID, c.name)
		assert.NotEmpty(t, rec.TargetType, c.name)
		assert.NotEmpty(t, rec.TargetID, c.name)
		if strings.HasPrefix(c.name, "create") && c.name != "createSecret" && c.name != "createRateLimit" {
			assert.Contains(t, string(res.Data), rec.TargetID, "%s: the record names the object created", c.name)
		}
		assert.True(t, json.Valid(rec.Detail), c.name)
	}
	// No secret reached a record's detail.
	var all struct {
		AuditLog struct{ Edges []struct{ Node auditRow } }
	}
	sys.GraphQL(w.owner, `{ auditLog(first: 100) { edges { node { action targetId detail } } } }`, nil).Decode(t, &all)
	for _, e := range all.AuditLog.Edges {
		for _, s := range []string{auditedSecretValue, st["keySecret"], st["endpointSecret"], st["rotatedSecret"], "tenant-secret-value"} {
			require.NotEmpty(t, s)
			assert.NotContains(t, string(e.Node.Detail)+e.Node.TargetID, s, e.Node.Action)
		}
	}

	// A viewer may do none of them: each is FORBIDDEN and recorded so.
	viewerSubject := "viewer@" + sys.Tenant.String()
	for _, c := range auditCases {
		res := sys.GraphQL(w.viewer, c.query, c.vars(w, st))
		require.Equal(t, []string{"FORBIDDEN"}, res.Codes(), c.name)
		if c.outcome == notRecorded {
			assert.Zero(t, auditCount(t, sys, w.owner, c.name), c.name)
			continue
		}
		rec := newestAudit(t, sys, w.owner, c.name)
		assert.Equal(t, "FORBIDDEN", rec.Outcome, c.name)
		assert.Equal(t, viewerSubject, rec.PrincipalID, c.name)
	}
	// An event that changes no run (it may start some) is not recorded;
	// its repeat neither.
	before := auditCount(t, sys, w.owner, "publishEvent")
	for range 2 {
		require.Empty(t, sys.GraphQL(w.owner, `mutation { publishEvent(input: {name: "nothing.listens", id: "n-1"}) { created } }`, nil).Errors)
	}
	assert.Equal(t, before, auditCount(t, sys, w.owner, "publishEvent"))
	valid, brokenAt, checked := verifyChain(t, sys, w.owner)
	assert.True(t, valid, "broken at %d", brokenAt)
	assert.GreaterOrEqual(t, checked, 2*(len(auditCases)-1))
}

func auditCount(t *testing.T, sys *apptest.System, cred, action string) int {
	t.Helper()
	var out struct {
		AuditLog struct{ Edges []struct{ Node auditRow } }
	}
	sys.GraphQL(cred, `query($a: String) { auditLog(first: 100, filter: {action: $a}) { edges { node { seq } } } }`,
		map[string]any{"a": action}).Decode(t, &out)
	return len(out.AuditLog.Edges)
}

// withOwner runs sql as composer_owner in tenant's scope (the owner is
// bound by FORCE ROW LEVEL SECURITY like everyone but the system role).
func withOwner(t *testing.T, sys *apptest.System, tenant uuid.UUID, sql ...string) {
	t.Helper()
	ctx := context.Background()
	tx, err := sys.Env.Owner(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT set_config('app.tenant_id', $1, true)", tenant.String())
	require.NoError(t, err)
	for _, s := range sql {
		_, err = tx.Exec(ctx, s)
		require.NoError(t, err, s)
	}
	require.NoError(t, tx.Commit(ctx))
}

// appendRecords writes n records for tenant as the API would.
func appendRecords(t *testing.T, sys *apptest.System, tenant uuid.UUID, n int) {
	t.Helper()
	for i := range n {
		err := sys.Deps.DB.WithTenant(context.Background(), tenant, func(ctx context.Context, tx *pg.Tx) error {
			return audit.Append(ctx, tx, sys.Server.AuditKeys, audit.Record{PrincipalKind: "user", PrincipalID: "someone", Action: "pauseQueue",
				TargetType: "queue", TargetID: fmt.Sprintf("q%d", i), Outcome: audit.OK, Detail: audit.Detail(map[string]any{"i": i})})
		})
		require.NoError(t, err)
	}
}

// TestABrokenChainIsDetected tampers with a tenant's records as the table
// owner — a changed detail, a deleted record in the middle, at either
// end, two records swapped — and verification names the seq each breaks
// at.
func TestABrokenChainIsDetected(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	cases := []struct {
		name   string
		tamper []string
		at     int64
	}{
		{"modified", []string{`UPDATE audit_log SET detail = '{"i":99}' WHERE seq = 3`}, 3},
		{"outcome rewritten", []string{`UPDATE audit_log SET outcome = 'ok', principal_id = 'other' WHERE seq = 5`}, 5},
		{"deleted in the middle", []string{`DELETE FROM audit_log WHERE seq = 3`}, 3},
		{"deleted first", []string{`DELETE FROM audit_log WHERE seq = 1`}, 1},
		{"deleted last", []string{`DELETE FROM audit_log WHERE seq = 6`}, 6},
		{"swapped", []string{`UPDATE audit_log SET seq = 1000 WHERE seq = 3`, `UPDATE audit_log SET seq = 3 WHERE seq = 4`,
			`UPDATE audit_log SET seq = 4 WHERE seq = 1000`}, 3},
		{"rehashed alone", []string{`UPDATE audit_log SET detail = '{"i":98}', hash = sha256(hash) WHERE seq = 2`}, 2},
	}
	for _, c := range cases {
		tn, err := tenants.Create(context.Background(), sys.Deps.DB, tenants.CreateParams{Name: "tamper"})
		require.NoError(t, err)
		owner := sys.Token(tn.ID, "owner@tamper", auth.RoleOwner)
		appendRecords(t, sys, tn.ID, 6)
		valid, _, checked := verifyChain(t, sys, owner)
		require.True(t, valid, c.name)
		require.Equal(t, 6, checked, c.name)
		withOwner(t, sys, tn.ID, c.tamper...)
		valid, brokenAt, _ := verifyChain(t, sys, owner)
		assert.False(t, valid, c.name)
		assert.Equal(t, c.at, brokenAt, c.name)
	}
}

// TestARolledBackActionLeavesNoOKRecord: an action whose transaction
// passed the gate and then failed leaves no "ok" record — only its error
// code, written after the rollback — and a record that cannot be written
// fails the action itself.
func TestARolledBackActionLeavesNoOKRecord(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	owner := sys.Token(sys.Tenant, "owner@x", auth.RoleOwner)
	create := `mutation($d: JSON!) { createWorkflow(input: {name: "twice", definition: $d}) { workflow { id } } }`
	vars := map[string]any{"d": json.RawMessage(waitDef)}
	require.Empty(t, sys.GraphQL(owner, create, vars).Errors)
	// The second insert fails after the gate sealed the record.
	assert.Equal(t, []string{"CONFLICT"}, sys.GraphQL(owner, create, vars).Codes())
	var log struct {
		AuditLog struct{ Edges []struct{ Node auditRow } }
	}
	sys.GraphQL(owner, `{ auditLog(filter: {action: "createWorkflow"}) { edges { node { outcome } } } }`, nil).Decode(t, &log)
	var outcomes []string
	for _, e := range log.AuditLog.Edges {
		outcomes = append(outcomes, e.Node.Outcome)
	}
	assert.Equal(t, []string{"CONFLICT", "ok"}, outcomes)

	// A success that commits nothing (a signal the cancelled run ignores)
	// is recorded on its own as unchanged.
	run := sys.StartRun(sys.Workflow(waitDef), `{}`)
	require.Empty(t, sys.GraphQL(owner, `mutation($id: ID!) { cancelRun(id: $id) { id } }`, map[string]any{"id": run.String()}).Errors)
	var sig struct{ SignalRun struct{ Ignored bool } }
	sys.GraphQL(owner, `mutation($id: ID!) { signalRun(id: $id, name: "late", payload: {}) { ignored } }`,
		map[string]any{"id": run.String()}).Decode(t, &sig)
	require.True(t, sig.SignalRun.Ignored)
	assert.Equal(t, audit.Unchanged, newestAudit(t, sys, owner, "signalRun").Outcome,
		"not the ok of the read of the answer that followed it")

	// Sealed into a transaction that then fails: neither its change nor a
	// record commits.
	ctx := audit.With(context.Background(), audit.NewEntry(sys.Server.AuditKeys, sys.Tenant, "user", "x", "addMember", "member", "m@x", nil))
	err := sys.Deps.DB.WithTenant(ctx, sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		audit.Seal(ctx, tx)
		if _, err := (auth.Members{}).Add(ctx, tx, "m@x", auth.RoleViewer, ""); err != nil {
			return err
		}
		return fmt.Errorf("fails after the change")
	})
	require.Error(t, err)
	var members, records int
	require.NoError(t, sys.Deps.DB.WithTenant(context.Background(), sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM memberships WHERE subject = 'm@x'`).Scan(&members); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT count(*) FROM audit_log WHERE action = 'addMember'`).Scan(&records)
	}))
	assert.Zero(t, members)
	assert.Zero(t, records)
}

// TestConcurrentActionsKeepOneChain: many goroutines doing audited
// actions in one tenant at once leave a valid chain with contiguous seqs.
func TestConcurrentActionsKeepOneChain(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	owner := sys.Token(sys.Tenant, "owner@x", auth.RoleOwner)
	const goroutines, each = 16, 6
	var wg sync.WaitGroup
	errs := make(chan string, goroutines*each)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				q := fmt.Sprintf("q-%d-%d", g, i)
				res := sys.GraphQL(owner, `mutation($q: String!) { pauseQueue(queue: $q) { queue } }`, map[string]any{"q": q})
				if len(res.Errors) > 0 {
					errs <- fmt.Sprint(res.Errors)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	var seqs []int64
	require.NoError(t, sys.Deps.DB.WithTenant(context.Background(), sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		rows, err := tx.Query(ctx, `SELECT seq FROM audit_log ORDER BY seq`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var s int64
			if err := rows.Scan(&s); err != nil {
				return err
			}
			seqs = append(seqs, s)
		}
		return rows.Err()
	}))
	require.Len(t, seqs, goroutines*each)
	for i, s := range seqs {
		require.Equal(t, int64(i+1), s)
	}
	valid, brokenAt, checked := verifyChain(t, sys, owner)
	assert.True(t, valid, "broken at %d", brokenAt)
	assert.Equal(t, goroutines*each, checked)

	// Pages of 10, newest first, follow one another without a gap.
	var paged []int64
	var after *string
	for {
		var page struct {
			AuditLog struct {
				Edges    []struct{ Node auditRow }
				PageInfo struct {
					HasNextPage bool
					EndCursor   *string
				}
			}
		}
		sys.GraphQL(owner, `query($a: String) { auditLog(first: 10, after: $a, filter: {action: "pauseQueue"}) {
			edges { node { seq } } pageInfo { hasNextPage endCursor } } }`, map[string]any{"a": after}).Decode(t, &page)
		for _, e := range page.AuditLog.Edges {
			paged = append(paged, e.Node.Seq)
		}
		if !page.AuditLog.PageInfo.HasNextPage {
			break
		}
		after = page.AuditLog.PageInfo.EndCursor
	}
	require.Len(t, paged, goroutines*each)
	for i, s := range paged {
		require.Equal(t, int64(goroutines*each-i), s)
	}
	assert.Equal(t, []string{"BAD_USER_INPUT"}, sys.GraphQL(owner, `{ auditLog(after: "bm9wZQ") { edges { node { seq } } } }`, nil).Codes())
}

// TestTheAuditLogIsTheTenantsAndOwnersAndAdminsOnly: tenant B sees none
// of A's records (not even filtering by A's target), and principals
// without audit:read are FORBIDDEN.
func TestTheAuditLogIsTheTenantsAndOwnersAndAdminsOnly(t *testing.T) {
	t.Parallel()
	sys, a, b := twoTenants(t)
	var log struct {
		AuditLog struct{ Edges []struct{ Node auditRow } }
	}
	sys.GraphQL(b.owner, `query($t: String) { auditLog(first: 100, filter: {targetId: $t}) { edges { node { targetId principalId } } } }`,
		map[string]any{"t": a.workflow}).Decode(t, &log)
	assert.Empty(t, log.AuditLog.Edges)
	sys.GraphQL(b.owner, `{ auditLog(first: 100) { edges { node { targetId principalId } } } }`, nil).Decode(t, &log)
	require.NotEmpty(t, log.AuditLog.Edges)
	for _, e := range log.AuditLog.Edges {
		assert.NotContains(t, e.Node.PrincipalID, a.id.String())
		assert.NotEqual(t, a.workflow, e.Node.TargetID)
	}
	validB, _, checkedB := verifyChain(t, sys, b.owner)
	assert.True(t, validB)
	assert.Equal(t, len(log.AuditLog.Edges), checkedB, "B's verification reads B's chain only")
	// A's head as B's anchor checks B's own chain against it, and tells B
	// nothing of A's.
	headA := chainHead(t, sys, a.owner)
	var v struct {
		AuditVerify struct {
			Valid    bool
			HeadSeq  int64
			HeadHash string
			Problem  *string
		}
	}
	sys.GraphQL(b.owner, `query($s: Int64!, $h: String!) { auditVerify(anchor: {seq: $s, hash: $h}) { valid headSeq headHash problem } }`,
		map[string]any{"s": headA.seq, "h": headA.hash}).Decode(t, &v)
	assert.NotEqual(t, headA.hash, v.AuditVerify.HeadHash)
	if headA.seq <= v.AuditVerify.HeadSeq {
		assert.False(t, v.AuditVerify.Valid, "A's hash is not B's record's")
	}
	// A's refusals are not counted into B's records of the same subject.
	sameA, sameB := sys.Token(a.id, "same@x", auth.RoleViewer), sys.Token(b.id, "same@x", auth.RoleViewer)
	for range 3 {
		require.Equal(t, []string{"FORBIDDEN"}, sys.GraphQL(sameA, `mutation { pauseQueue(queue: "q") { queue } }`, nil).Codes())
	}
	require.Equal(t, []string{"FORBIDDEN"}, sys.GraphQL(sameB, `mutation { pauseQueue(queue: "q") { queue } }`, nil).Codes())
	for _, c := range []struct {
		owner string
		want  int
	}{{a.owner, 3}, {b.owner, 1}} {
		recs, total := refusedRecords(t, sys, c.owner, "same@x", "pauseQueue")
		assert.Len(t, recs, 1)
		assert.Equal(t, c.want, total)
	}

	admin := sys.Token(a.id, "admin@a", auth.RoleAdmin)
	adminKey := sys.APIKey(auth.ScopeAdmin)
	for _, cred := range []string{admin, adminKey} {
		assert.Empty(t, sys.GraphQL(cred, `{ auditLog(first: 1) { edges { node { seq } } } auditVerify { valid } }`, nil).Errors)
	}
	everyScope := slices.DeleteFunc(auth.AllScopes(), func(s string) bool { return s == auth.ScopeAdmin })
	for _, cred := range []string{a.viewer, a.developer, sys.APIKey(everyScope...)} {
		for _, q := range []string{`{ auditLog { edges { node { seq } } } }`, `{ auditVerify { valid } }`} {
			assert.Equal(t, []string{"FORBIDDEN"}, sys.GraphQL(cred, q, nil).Codes(), q)
		}
	}
}

// TestRetentionKeepsAVerifiableChain: the sweeper deletes records past
// the plan's retention, oldest first, and the kept tail still verifies
// from its first record.
func TestRetentionKeepsAVerifiableChain(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	owner := sys.Token(sys.Tenant, "owner@x", auth.RoleOwner)
	appendRecords(t, sys, sys.Tenant, 8)
	// The first five are older than any plan's retention (a changed time
	// breaks their hashes, which retention then deletes).
	withOwner(t, sys, sys.Tenant, `UPDATE audit_log SET at = at - interval '400 days' WHERE seq <= 5`)
	valid, _, _ := verifyChain(t, sys, owner)
	require.False(t, valid)
	_, err := audit.Prune(context.Background(), sys.Deps.DB, sys.Server.AuditKeys)
	require.NoError(t, err)
	valid, brokenAt, checked := verifyChain(t, sys, owner)
	assert.True(t, valid, "broken at %d", brokenAt)
	assert.Equal(t, 3, checked)
	var first struct {
		AuditVerify struct{ FirstSeq int64 }
	}
	sys.GraphQL(owner, `{ auditVerify { firstSeq } }`, nil).Decode(t, &first)
	assert.Equal(t, int64(6), first.AuditVerify.FirstSeq)
	// Deleting the oldest kept record by hand is still detected.
	withOwner(t, sys, sys.Tenant, `DELETE FROM audit_log WHERE seq = 6`)
	valid, brokenAt, _ = verifyChain(t, sys, owner)
	assert.False(t, valid)
	assert.Equal(t, int64(6), brokenAt)
}

type head struct {
	seq  int64
	hash string
}

func chainHead(t *testing.T, sys *apptest.System, cred string) head {
	t.Helper()
	var v struct {
		AuditVerify struct {
			Valid    bool
			HeadSeq  int64
			HeadHash string
		}
	}
	sys.GraphQL(cred, `{ auditVerify { valid headSeq headHash } }`, nil).Decode(t, &v)
	require.True(t, v.AuditVerify.Valid)
	require.Regexp(t, `^[0-9a-f]{64}$`, v.AuditVerify.HeadHash)
	return head{v.AuditVerify.HeadSeq, v.AuditVerify.HeadHash}
}

type refusedRecord struct {
	Seq          int64
	Outcome      string
	Repeats      int
	At           time.Time
	LastRepeatAt *time.Time
}

// refusedRecords lists principal's FORBIDDEN records of action and how
// many refusals they stand for.
func refusedRecords(t *testing.T, sys *apptest.System, owner, principal, action string) ([]refusedRecord, int) {
	t.Helper()
	var out struct {
		AuditLog struct {
			Edges []struct{ Node refusedRecord }
		}
	}
	sys.GraphQL(owner, `query($a: String, $p: String) { auditLog(first: 100, filter: {action: $a, principalId: $p}) {
		edges { node { seq outcome repeats at lastRepeatAt } } } }`, map[string]any{"a": action, "p": principal}).Decode(t, &out)
	var recs []refusedRecord
	total := 0
	for _, e := range out.AuditLog.Edges {
		if e.Node.Outcome == "FORBIDDEN" {
			recs = append(recs, e.Node)
			total += 1 + e.Node.Repeats
		}
	}
	return recs, total
}

// TestRefusedMutationsAreCoalescedPerPrincipal: 300 refused mutations of
// a viewer leave one record per 10-minute window (two, should the test
// straddle a window's end), counting all 300, newest repeat included; the
// chain stays valid.
func TestRefusedMutationsAreCoalescedPerPrincipal(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	owner := sys.Token(sys.Tenant, "owner@x", auth.RoleOwner)
	viewer := sys.Token(sys.Tenant, "viewer@x", auth.RoleViewer)
	for range 300 {
		require.Equal(t, []string{"FORBIDDEN"}, sys.GraphQL(viewer, `mutation { pauseQueue(queue: "q") { queue } }`, nil).Codes())
	}
	recs, total := refusedRecords(t, sys, owner, "viewer@x", "pauseQueue")
	require.NotEmpty(t, recs)
	assert.LessOrEqual(t, len(recs), 2)
	assert.Equal(t, 300, total)
	for _, r := range recs {
		if r.Repeats > 0 {
			require.NotNil(t, r.LastRepeatAt)
			assert.False(t, r.LastRepeatAt.Before(r.At))
		} else {
			assert.Nil(t, r.LastRepeatAt)
		}
	}
	valid, brokenAt, checked := verifyChain(t, sys, owner)
	assert.True(t, valid, "broken at %d", brokenAt)
	assert.Equal(t, len(recs), checked)

	// An anchor of the head verifies; a malformed one is refused.
	h := chainHead(t, sys, owner)
	var v struct{ AuditVerify struct{ Valid bool } }
	sys.GraphQL(owner, `query($s: Int64!, $h: String!) { auditVerify(anchor: {seq: $s, hash: $h}) { valid } }`,
		map[string]any{"s": h.seq, "h": h.hash}).Decode(t, &v)
	assert.True(t, v.AuditVerify.Valid)
	for _, bad := range []map[string]any{{"s": 0, "h": h.hash}, {"s": h.seq, "h": "zz"}, {"s": h.seq, "h": h.hash[:10]}} {
		assert.Equal(t, []string{"BAD_USER_INPUT"}, sys.GraphQL(owner, `query($s: Int64!, $h: String!) { auditVerify(anchor: {seq: $s, hash: $h}) { valid } }`, bad).Codes())
	}
}
