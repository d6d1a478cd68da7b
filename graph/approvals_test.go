package graph_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/apptest"
)

type approvalView struct {
	Node, Signal, Who string
	Waiting           bool
	MayApprove        bool
	Reason            *string
	Policy            *struct {
		Roles, Members, APIKeys []string
		NotStarter              bool
	}
}

// TestApprovalsFollowTheirPolicyOverGraphQL: the approver recorded is the
// principal that answered, whatever the payload says (approve or
// signalRun alike); a wait's policy says who may answer, the API shows it
// (and whether the asker may), and an answer from anyone else is
// FORBIDDEN in words naming who may, changing nothing.
func TestApprovalsFollowTheirPolicyOverGraphQL(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	bea := sys.Token(sys.Tenant, "bea", auth.RoleAdmin)
	ann := sys.Token(sys.Tenant, "ann", auth.RoleAdmin)
	dan := sys.Token(sys.Tenant, "dan", auth.RoleDeveloper)
	vic := sys.Token(sys.Tenant, "vic", auth.RoleViewer)
	key := sys.APIKey(auth.ScopeRunsRead, auth.ScopeRunsWrite)
	keyID := key[len(auth.APIKeyPrefix) : len(auth.APIKeyPrefix)+12]

	def := `{"nodes":[
		{"id":"review","type":"wait","wait":{"signal":"approval","approval":true,
		  "approvers":{"roles":["admin"],"api_keys":["` + keyID + `"],"not_starter":true}}},
		{"id":"pay","type":"wait","depends_on":["review"],"input":{"approver":"nodes.review.output.by","kind":"nodes.review.output.by_kind"},
		 "wait":{"signal":"paid"}}]}`
	var created struct {
		CreateWorkflow struct{ Workflow struct{ ID string } }
	}
	sys.GraphQL(bea, `mutation($d: JSON!) { createWorkflow(input: {name: "reviewed", definition: $d}) { workflow { id } } }`,
		map[string]any{"d": json.RawMessage(def)}).Decode(t, &created)
	var started struct {
		StartRun struct {
			Run struct {
				ID        string
				StartedBy string
			}
		}
	}
	sys.GraphQL(bea, `mutation($w: ID!) { startRun(input: {workflowId: $w}) { run { id startedBy } } }`,
		map[string]any{"w": created.CreateWorkflow.Workflow.ID}).Decode(t, &started)
	run := started.StartRun.Run.ID
	assert.Equal(t, "user:bea", started.StartRun.Run.StartedBy, "the run records who started it")

	approvals := func(cred string) approvalView {
		t.Helper()
		var out struct {
			Run struct{ Approvals []approvalView }
		}
		sys.GraphQL(cred, `query($id: ID!) { run(id: $id) { approvals { node signal waiting who mayApprove reason
			policy { roles members apiKeys notStarter } } } }`, map[string]any{"id": run}).Decode(t, &out)
		require.Len(t, out.Run.Approvals, 1)
		return out.Run.Approvals[0]
	}
	a := approvals(ann)
	assert.Equal(t, "review", a.Node)
	assert.Equal(t, "approval", a.Signal)
	assert.True(t, a.Waiting)
	assert.True(t, a.MayApprove)
	require.NotNil(t, a.Policy)
	assert.Equal(t, []string{"ADMIN"}, a.Policy.Roles)
	assert.Equal(t, []string{keyID}, a.Policy.APIKeys)
	assert.True(t, a.Policy.NotStarter)
	who := `members with the admin role, or the API key "` + keyID + `", except whoever started the run`
	assert.Equal(t, who, a.Who)
	for name, c := range map[string]struct{ cred, reason string }{
		"the starter":  {bea, "you (user:bea) started this run, so you may not approve it"},
		"a developer":  {dan, `you are the member "dan" (developer)`},
		"a viewer":     {vic, "you may not write runs"},
		"a listed key": {key, ""},
	} {
		a := approvals(c.cred)
		if c.reason == "" {
			assert.True(t, a.MayApprove, name)
			continue
		}
		assert.False(t, a.MayApprove, name)
		require.NotNil(t, a.Reason, name)
		assert.Contains(t, *a.Reason, c.reason, name)
	}

	timeline := func() int {
		var out struct{ Run struct{ Timeline []any } }
		sys.GraphQL(ann, `query($id: ID!) { run(id: $id) { timeline { id } } }`, map[string]any{"id": run}).Decode(t, &out)
		return len(out.Run.Timeline)
	}
	before := timeline()
	forged := map[string]any{"approved": true, "by": "ann", "by_kind": "user"}
	for name, c := range map[string]struct{ cred, query, want string }{
		"the starter approves":         {bea, `mutation($id: ID!) { approve(id: $id, approved: true) { ignored } }`, "started this run"},
		"a developer approves":         {dan, `mutation($id: ID!) { approve(id: $id, approved: true) { ignored } }`, who},
		"a developer forges a signal":  {dan, `mutation($id: ID!, $p: JSON) { signalRun(id: $id, name: "approval", payload: $p) { ignored } }`, who},
		"a developer rejects":          {dan, `mutation($id: ID!) { approve(id: $id, approved: false) { ignored } }`, who},
		"the starter forges a signal":  {bea, `mutation($id: ID!, $p: JSON) { signalRun(id: $id, name: "approval", payload: $p) { ignored } }`, "started this run"},
		"a viewer approves (no right)": {vic, `mutation($id: ID!) { approve(id: $id, approved: true) { ignored } }`, "runs:write"},
	} {
		res := sys.GraphQL(c.cred, c.query, map[string]any{"id": run, "p": forged})
		require.Equal(t, []string{"FORBIDDEN"}, res.Codes(), name)
		assert.Contains(t, res.Errors[0].Message, c.want, name)
	}
	assert.Equal(t, before, timeline(), "a refused answer changes nothing")
	assert.True(t, approvals(ann).Waiting)

	// The listed key answers through plain signalRun with a forged "by":
	// the approval records the key, and the next step reads the key.
	res := sys.GraphQL(key, `mutation($id: ID!, $p: JSON) { signalRun(id: $id, name: "approval", payload: $p) { ignored } }`,
		map[string]any{"id": run, "p": forged})
	require.Empty(t, res.Errors)
	var got struct {
		Run struct {
			Tasks []struct {
				NodeID        string
				Input, Output json.RawMessage
			}
			Timeline []struct {
				Kind   string
				Detail json.RawMessage
			}
			Approvals []approvalView
		}
	}
	sys.GraphQL(ann, `query($id: ID!) { run(id: $id) { tasks { nodeId input output } timeline { kind detail } approvals { waiting } } }`,
		map[string]any{"id": run}).Decode(t, &got)
	tasks := map[string]json.RawMessage{}
	for _, tk := range got.Run.Tasks {
		tasks[tk.NodeID+".output"], tasks[tk.NodeID+".input"] = tk.Output, tk.Input
	}
	assert.JSONEq(t, `{"approved":true,"by":"`+keyID+`","by_kind":"api_key","comment":null}`, normalizeComment(tasks["review.output"]))
	assert.JSONEq(t, `{"approver":"`+keyID+`","kind":"api_key"}`, string(tasks["pay.input"]))
	assert.False(t, got.Run.Approvals[0].Waiting)
	var signalled json.RawMessage
	for _, e := range got.Run.Timeline {
		if e.Kind == "signal_received" {
			signalled = e.Detail
		}
	}
	assert.Contains(t, string(signalled), `"by":"api_key:`+keyID+`"`, "the timeline names the approver")
	assert.Contains(t, string(signalled), `"approvers":"`+strings.ReplaceAll(who, `"`, `\"`)+`"`)

	// Without a policy anyone who may write runs answers, and is recorded
	// as themselves whatever the payload says.
	open := sys.Workflow(`{"nodes":[{"id":"ok","type":"wait","wait":{"signal":"approval","approval":true}}]}`)
	var second struct {
		StartRun struct{ Run struct{ ID string } }
	}
	sys.GraphQL(bea, `mutation($w: ID!) { startRun(input: {workflowId: $w}) { run { id } } }`, map[string]any{"w": open}).Decode(t, &second)
	res = sys.GraphQL(dan, `mutation($id: ID!) { approve(id: $id, approved: true, comment: "fine") { ignored } }`,
		map[string]any{"id": second.StartRun.Run.ID})
	require.Empty(t, res.Errors)
	var done struct {
		Run struct {
			Output json.RawMessage
			Tasks  []struct{ Output json.RawMessage }
		}
	}
	sys.GraphQL(ann, `query($id: ID!) { run(id: $id) { output tasks { output } } }`, map[string]any{"id": second.StartRun.Run.ID}).Decode(t, &done)
	assert.JSONEq(t, `{"approved":true,"by":"dan","by_kind":"user","comment":"fine"}`, string(done.Run.Tasks[0].Output))
}

// normalizeComment gives an approval's output a "comment" key (null when
// signalRun sent none), so it compares as one shape.
func normalizeComment(b json.RawMessage) string {
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	if _, ok := m["comment"]; !ok {
		m["comment"] = nil
	}
	out, _ := json.Marshal(m)
	return string(out)
}
