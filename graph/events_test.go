package graph_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type publishAnswer struct {
	PublishEvent struct {
		Created bool
		Event   struct {
			ID, EventID, Name string
			Payload           json.RawMessage
			Runs              []struct {
				WorkflowID, Outcome string
				RunID               *string
				Run                 *struct{ ID, Status string }
				ErrorCode           *string
			}
		}
	}
}

const publishQuery = `mutation($n: String!, $id: String!, $p: JSON) { publishEvent(input: {name: $n, id: $id, payload: $p}) {
	created event { id eventId name payload runs { workflowId outcome runId run { id status } errorCode } } } }`

// TestEventsOverGraphQL: publish (a repeat starts nothing), the runs an
// event started, listing by name and page, who may publish, and tenant B's
// events never starting tenant A's workflows.
func TestEventsOverGraphQL(t *testing.T) {
	t.Parallel()
	sys, a, b := twoTenants(t)
	var wf struct {
		CreateWorkflow struct{ Workflow struct{ ID string } }
	}
	def := `{"triggers": [{"event": "order.*", "if": "event.payload.total > 10"}], "nodes": [{"id": "a", "type": "noop"}]}`
	sys.GraphQL(a.owner, `mutation($d: JSON!) { createWorkflow(input: {name: "on-order", definition: $d}) { workflow { id } } }`,
		map[string]any{"d": json.RawMessage(def)}).Decode(t, &wf)

	// An invalid trigger names its field.
	res := sys.GraphQL(a.owner, `mutation($d: JSON!) { createWorkflow(input: {name: "bad", definition: $d}) { workflow { id } } }`,
		map[string]any{"d": json.RawMessage(`{"triggers": [{"event": "order.x*"}], "nodes": [{"id": "a", "type": "noop"}]}`)})
	require.Equal(t, []string{"BAD_USER_INPUT"}, res.Codes())
	assert.Contains(t, string(mustJSON(t, res.Errors[0].Extensions)), "triggers[0].event")

	vars := map[string]any{"n": "order.created", "id": "o-1", "p": map[string]any{"total": 20}}
	var first publishAnswer
	sys.GraphQL(a.developer, publishQuery, vars).Decode(t, &first)
	require.True(t, first.PublishEvent.Created)
	require.Len(t, first.PublishEvent.Event.Runs, 1)
	r := first.PublishEvent.Event.Runs[0]
	assert.Equal(t, wf.CreateWorkflow.Workflow.ID, r.WorkflowID)
	assert.Equal(t, "STARTED", r.Outcome)
	require.NotNil(t, r.Run)
	assert.Equal(t, *r.RunID, r.Run.ID)
	for i := 0; i < 2; i++ {
		var again publishAnswer
		sys.GraphQL(a.developer, publishQuery, vars).Decode(t, &again)
		assert.False(t, again.PublishEvent.Created)
		assert.Equal(t, first.PublishEvent.Event, again.PublishEvent.Event)
	}
	res = sys.GraphQL(a.developer, publishQuery, map[string]any{"n": "order.created", "id": "o-1", "p": map[string]any{"total": 21}})
	assert.Equal(t, []string{"CONFLICT"}, res.Codes())
	var small publishAnswer
	sys.GraphQL(a.owner, publishQuery, map[string]any{"n": "order.created", "id": "o-2", "p": map[string]any{"total": 5}}).Decode(t, &small)
	assert.Empty(t, small.PublishEvent.Event.Runs)

	// A viewer may read events but not publish them.
	res = sys.GraphQL(a.viewer, publishQuery, map[string]any{"n": "order.created", "id": "o-3"})
	assert.Equal(t, []string{"FORBIDDEN"}, res.Codes())
	var list struct {
		Events struct {
			Edges []struct {
				Node struct {
					ID, EventID string
					Runs        []struct{ Outcome string }
				}
			}
			PageInfo struct {
				HasNextPage bool
				EndCursor   string
			}
		}
	}
	sys.GraphQL(a.viewer, `{ events(name: "order.created", first: 1) { edges { node { id eventId runs { outcome } } } pageInfo { hasNextPage endCursor } } }`,
		nil).Decode(t, &list)
	require.Len(t, list.Events.Edges, 1)
	assert.Equal(t, "o-2", list.Events.Edges[0].Node.EventID)
	assert.True(t, list.Events.PageInfo.HasNextPage)
	after := list.Events.PageInfo.EndCursor
	sys.GraphQL(a.viewer, `query($a: String) { events(name: "order.created", first: 5, after: $a) { edges { node { id eventId runs { outcome } } } pageInfo { hasNextPage endCursor } } }`,
		map[string]any{"a": after}).Decode(t, &list)
	require.Len(t, list.Events.Edges, 1)
	assert.Equal(t, "o-1", list.Events.Edges[0].Node.EventID)
	assert.Equal(t, "STARTED", list.Events.Edges[0].Node.Runs[0].Outcome)
	assert.False(t, list.Events.PageInfo.HasNextPage)
	var one struct{ Event struct{ EventID string } }
	sys.GraphQL(a.viewer, `query($id: ID!) { event(id: $id) { eventId } }`, map[string]any{"id": first.PublishEvent.Event.ID}).Decode(t, &one)
	assert.Equal(t, "o-1", one.Event.EventID)

	// Tenant B publishing the same name and id starts none of A's workflows.
	var inB publishAnswer
	sys.GraphQL(b.owner, publishQuery, vars).Decode(t, &inB)
	assert.True(t, inB.PublishEvent.Created)
	assert.Empty(t, inB.PublishEvent.Event.Runs)
	var runs struct {
		Runs struct {
			Edges []struct{ Node struct{ ID string } }
		}
	}
	sys.GraphQL(a.owner, `query($w: ID!) { runs(filter: {workflowId: $w}) { edges { node { id } } } }`,
		map[string]any{"w": wf.CreateWorkflow.Workflow.ID}).Decode(t, &runs)
	assert.Len(t, runs.Runs.Edges, 1)
	// And B's list holds none of A's events.
	sys.GraphQL(b.owner, `{ events { edges { node { id eventId runs { outcome } } } pageInfo { hasNextPage endCursor } } }`, nil).Decode(t, &list)
	for _, e := range list.Events.Edges {
		assert.NotEqual(t, first.PublishEvent.Event.ID, e.Node.ID)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

// TestEventsResumeAndCancelRunsOverGraphQL: an event published over
// GraphQL resumes the run whose wait it matches and cancels the one whose
// cancel_on it matches, listed with the event as RESUMED and CANCELLED;
// tenant B's runs waiting for the same name and key are untouched.
func TestEventsResumeAndCancelRunsOverGraphQL(t *testing.T) {
	t.Parallel()
	sys, a, b := twoTenants(t)
	def := `{"cancel_on": [{"event": "order.cancelled", "match": "event.payload.order == input.order"}],
		"nodes": [{"id": "paid", "type": "wait", "wait": {"event": "order.paid", "match": "event.payload.order == input.order"}}]}`
	start := func(who string, order string) string {
		var wf struct {
			CreateWorkflow struct{ Workflow struct{ ID string } }
		}
		sys.GraphQL(who, `mutation($d: JSON!, $n: String!) { createWorkflow(input: {name: $n, definition: $d}) { workflow { id } } }`,
			map[string]any{"d": json.RawMessage(def), "n": "w-" + order}).Decode(t, &wf)
		var started struct {
			StartRun struct{ Run struct{ ID string } }
		}
		sys.GraphQL(who, `mutation($w: ID!, $i: JSON) { startRun(input: {workflowId: $w, input: $i}) { run { id } } }`,
			map[string]any{"w": wf.CreateWorkflow.Workflow.ID, "i": map[string]any{"order": order}}).Decode(t, &started)
		return started.StartRun.Run.ID
	}
	paid, cancelled := start(a.owner, "o-1"), start(a.owner, "o-2")
	theirs := start(b.owner, "o-1")

	var p publishAnswer
	sys.GraphQL(a.developer, publishQuery, map[string]any{"n": "order.paid", "id": "paid-o-1", "p": map[string]any{"order": "o-1"}}).Decode(t, &p)
	require.Len(t, p.PublishEvent.Event.Runs, 1)
	r := p.PublishEvent.Event.Runs[0]
	assert.Equal(t, "RESUMED", r.Outcome)
	require.NotNil(t, r.Run)
	assert.Equal(t, paid, r.Run.ID)
	assert.Equal(t, "COMPLETED", r.Run.Status)

	sys.GraphQL(a.developer, publishQuery, map[string]any{"n": "order.cancelled", "id": "cancel-o-2", "p": map[string]any{"order": "o-2"}}).Decode(t, &p)
	require.Len(t, p.PublishEvent.Event.Runs, 1)
	assert.Equal(t, "CANCELLED", p.PublishEvent.Event.Runs[0].Outcome)
	assert.Equal(t, cancelled, p.PublishEvent.Event.Runs[0].Run.ID)
	assert.Equal(t, "CANCELLED", p.PublishEvent.Event.Runs[0].Run.Status)

	var run struct{ Run struct{ Status string } }
	sys.GraphQL(b.owner, `query($id: ID!) { run(id: $id) { status } }`, map[string]any{"id": theirs}).Decode(t, &run)
	assert.Equal(t, "RUNNING", run.Run.Status, "another tenant's event never resumes B's run")
}
