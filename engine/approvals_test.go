package engine

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/engine/dag"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
)

var (
	sam = dag.Principal{Kind: dag.PrincipalUser, ID: "sam", Role: "admin"}
	bea = dag.Principal{Kind: dag.PrincipalUser, ID: "bea", Role: "admin"}
	dan = dag.Principal{Kind: dag.PrincipalUser, ID: "dan", Role: "developer"}
)

const reviewedDef = `{"nodes":[{"id":"a","type":"noop"},
	{"id":"review","type":"wait","depends_on":["a"],"wait":{"signal":"approval","approval":true,"approvers":{"roles":["admin"],"not_starter":true}}},
	{"id":"pay","type":"noop","depends_on":["review"],"input":{"approver":"nodes.review.output.by"}}]}`

// TestAnApprovalPolicyRefusesBeforeAnythingIsWritten: a signal of an
// approval's name from a sender its policy refuses — another role, the
// run's starter, someone unknown — is FORBIDDEN with words naming who may
// approve, and writes nothing, whether the wait is reached, not reached
// yet or the run is queued; an allowed approver's signal is kept with its
// sender, and the approval records that sender whatever the payload said.
func TestAnApprovalPolicyRefusesBeforeAnythingIsWritten(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	wf := f.workflow(reviewedDef)
	res, err := f.c.StartRun(WithActor(ctx, sam), f.tenant, StartRun{WorkflowID: wf})
	require.NoError(t, err)
	run := res.RunID
	assert.Equal(t, "user:sam", f.text(`SELECT started_by FROM workflow_runs WHERE id = $1`, run), "the run records its starter")

	before := f.snapshot(run)
	for _, c := range []struct {
		by   dag.Principal
		want string
	}{
		{dan, `approval "approval" of node review: it may be answered by members with the admin role, except whoever started the run; you are the member "dan" (developer)`},
		{sam, `you (user:sam) started this run, so you may not approve it`},
		{dag.Principal{}, `the approver is unknown`},
	} {
		_, err := f.c.SignalRun(WithActor(ctx, c.by), f.tenant, run, Signal{ID: "s-" + c.by.ID, Name: "approval",
			Payload: json.RawMessage(`{"approved":true,"by":"bea"}`)})
		require.Equal(t, errs.Forbidden, errs.KindOf(err), "%+v: %v", c.by, err)
		assert.Contains(t, errs.PublicMessage(err), c.want)
	}
	assert.Equal(t, before, f.snapshot(run), "a refused approval changes nothing")
	assert.Zero(t, f.count(`SELECT count(*) FROM run_signals WHERE run_id = $1`, run))

	// bea may: her early approval is kept, with her as its sender.
	ack, err := f.c.SignalRun(WithActor(ctx, bea), f.tenant, run, Signal{ID: "s-bea", Name: "approval",
		Payload: json.RawMessage(`{"approved":true,"by":"the-cfo","comment":"ok"}`)})
	require.NoError(t, err)
	require.False(t, ack.Ignored)
	assert.Equal(t, "user:bea", f.text(`SELECT sent_by FROM run_signals WHERE run_id = $1`, run))
	f.complete(run, "a", `{}`)
	review := f.mustTask(run, "review")
	require.Equal(t, "completed", review.State)
	assert.JSONEq(t, `{"approved":true,"by":"bea","by_kind":"user","comment":"ok"}`, string(review.Output))
	pay := f.text(`SELECT input::text FROM task_instances WHERE run_id = $1 AND node_id = 'pay'`, run)
	assert.JSONEq(t, `{"approver":"bea"}`, pay, "the step after the approval reads the real approver")
	assert.Equal(t, "user:bea", f.text(`SELECT detail->'signal'->>'by' FROM run_events WHERE run_id = $1 AND kind = 'signal_received'`, run),
		"the timeline names the approver")
	assert.Equal(t, "members with the admin role, except whoever started the run",
		f.text(`SELECT detail->>'approvers' FROM run_events WHERE run_id = $1 AND kind = 'signal_received'`, run))

	// A queued run (its workflow paused) keeps the policy too.
	_, err = f.c.PauseWorkflow(ctx, f.tenant, wf, "")
	require.NoError(t, err)
	queued, err := f.c.StartRun(WithActor(ctx, sam), f.tenant, StartRun{WorkflowID: wf})
	require.NoError(t, err)
	require.Equal(t, RunQueued, queued.Status)
	_, err = f.c.SignalRun(WithActor(ctx, sam), f.tenant, queued.RunID, Signal{ID: "q1", Name: "approval", Payload: json.RawMessage(`{"approved":true}`)})
	require.Equal(t, errs.Forbidden, errs.KindOf(err))
	assert.Zero(t, f.count(`SELECT count(*) FROM run_signals WHERE run_id = $1`, queued.RunID))
	_, err = f.c.SignalRun(WithActor(ctx, bea), f.tenant, queued.RunID, Signal{ID: "q2", Name: "approval", Payload: json.RawMessage(`{"approved":true}`)})
	require.NoError(t, err)
	assert.Equal(t, "user:bea", f.text(`SELECT sent_by FROM run_signals WHERE run_id = $1`, queued.RunID))

	// A plain signal of another name is not an approval: anyone may send it.
	_, err = f.c.SignalRun(WithActor(ctx, dan), f.tenant, run, Signal{ID: "other", Name: "other"})
	require.NoError(t, err)
}

// TestARunRecordsItsStarterAndWhatItsInputDerivesFrom: a start records
// the actor as its starter (a rerun as a new run, its own actor); a child
// run inherits its parent's starter, and its input derives from a secret
// when the node that started it is downstream of a step that read one.
func TestARunRecordsItsStarterAndWhatItsInputDerivesFrom(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	f.namedWorkflow("kid", `{"nodes":[{"id":"k","type":"noop"}]}`)
	key := dag.Principal{Kind: dag.PrincipalAPIKey, ID: "Ab12Cd34Ef56"}
	wf := f.workflow(`{"nodes":[
		{"id":"call","type":"http","http":{"method":"GET","url":"https://api.example.com/","headers":{"Authorization":"Bearer {{ secrets.T }}"}}},
		{"id":"plain","type":"workflow","workflow":{"name":"kid"}},
		{"id":"tainted","type":"workflow","depends_on":["call"],"workflow":{"name":"kid"},"input":{"body":"nodes.call.output"}}]}`)
	res, err := f.c.StartRun(WithActor(ctx, key), f.tenant, StartRun{WorkflowID: wf})
	require.NoError(t, err)
	f.complete(res.RunID, "call", `{"body":"echoed"}`)
	kids := map[string]string{}
	for _, k := range f.childrenOf(res.RunID) {
		kids[k.Node] = f.text(`SELECT started_by || ' ' || secret_input FROM workflow_runs WHERE id = $1`, k.ID)
	}
	assert.Equal(t, map[string]string{"plain": "api_key:Ab12Cd34Ef56 false", "tainted": "api_key:Ab12Cd34Ef56 true"}, kids)

	again, err := f.c.RerunAsNew(WithActor(ctx, dan), f.tenant, res.RunID)
	require.NoError(t, err)
	assert.Equal(t, "user:dan", f.text(`SELECT started_by FROM workflow_runs WHERE id = $1`, again.RunID))
	bare, err := f.c.StartRun(ctx, f.tenant, StartRun{WorkflowID: wf})
	require.NoError(t, err)
	assert.Zero(t, f.count(`SELECT count(*) FROM workflow_runs WHERE id = $1 AND started_by IS NOT NULL`, bare.RunID), "no actor, no starter")
}

// TestLiteralCredentialsAreRefusedAtPublish: a definition that writes a
// credential header literally is BAD_USER_INPUT naming the node and header
// and pointing to a secret; nothing is written.
func TestLiteralCredentialsAreRefusedAtPublish(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	def := `{"nodes":[{"id":"call","type":"http","http":{"method":"GET","url":"https://api.example.com/","headers":{"X-Api-Key":"sk_live_1"}}}]}`
	_, _, err := f.c.CreateWorkflow(ctx, f.tenant, "literal", "", []byte(def))
	var e *errs.Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, errs.Invalid, e.Kind)
	require.Len(t, e.Fields, 1)
	assert.Equal(t, "call", e.Fields[0].Node)
	assert.Equal(t, "http.headers.X-Api-Key", e.Fields[0].Field)
	assert.Contains(t, e.Fields[0].Message, "{{ secrets.NAME }}")
	assert.Zero(t, f.count(`SELECT count(*) FROM workflow_definitions`))

	wf := f.workflow(`{"nodes":[{"id":"a","type":"noop"}]}`)
	_, err = f.c.PublishVersion(ctx, f.tenant, wf, []byte(def))
	require.Equal(t, errs.Invalid, errs.KindOf(err))
	assert.Equal(t, 1, f.count(`SELECT count(*) FROM workflow_versions WHERE workflow_id = $1`, wf))
}

// TestStoredLiteralCredentialsAreFound: the operator's scan names every
// stored version that writes a credential literally (as one published
// before they were refused may), and no clean one; such a version still
// runs.
func TestStoredLiteralCredentialsAreFound(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	wf := f.workflow(`{"nodes":[{"id":"call","type":"http","http":{"method":"GET","url":"https://api.example.com/","headers":{"Authorization":"Bearer {{ secrets.T }}"}}}]}`)
	require.NoError(t, f.db.WithTenant(ctx, f.tenant, func(ctx context.Context, tx *pg.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE workflow_definitions SET latest_version = 2 WHERE tenant_id = $1 AND id = $2`, f.tenant, wf); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO workflow_versions (tenant_id, workflow_id, version, definition) VALUES ($1, $2, 2, $3)`, f.tenant, wf,
			`{"nodes":[{"id":"call","type":"http","http":{"method":"GET","url":"https://api.example.com/?key=k1","headers":{"X-Api-Key":"sk_live_1"}}}]}`)
		return err
	}))
	var found []StoredCredential
	require.NoError(t, StoredCredentials(ctx, f.db, func(c StoredCredential) { found = append(found, c) }))
	require.Len(t, found, 1)
	assert.Equal(t, StoredCredential{Tenant: f.tenant, Workflow: wf, Version: 2, Fields: []string{"call http.headers.X-Api-Key", "call http.url"}}, found[0])
	_, err := f.c.StartRun(ctx, f.tenant, StartRun{WorkflowID: wf, Version: 2})
	require.NoError(t, err)
}

func (f *fixture) text(query string, args ...any) string {
	f.t.Helper()
	var s string
	require.NoError(f.t, f.env.System.QueryRow(context.Background(), query, args...).Scan(&s))
	return s
}
