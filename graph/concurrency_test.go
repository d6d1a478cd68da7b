package graph_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestConcurrencyKeysOverGraphQL: runs beyond their key's limit are QUEUED
// with their key shown, concurrencyKeys lists the busiest keys with their
// counts, and a viewer may read them.
func TestConcurrencyKeysOverGraphQL(t *testing.T) {
	t.Parallel()
	sys, a, _ := twoTenants(t)
	var wf struct {
		CreateWorkflow struct{ Workflow struct{ ID string } }
	}
	sys.GraphQL(a.owner, `mutation($d: JSON!) { createWorkflow(input: {name: "per-customer", definition: $d}) { workflow { id } } }`,
		map[string]any{"d": json.RawMessage(`{"concurrency": {"key": "input.customer", "limit": 1},
			"nodes": [{"id": "w", "type": "wait", "wait": {"signal": "go"}}]}`)}).Decode(t, &wf)
	id := wf.CreateWorkflow.Workflow.ID
	var statuses []string
	for _, c := range []string{"A", "A", "A", "B"} {
		var started struct {
			StartRun struct {
				Run struct{ Status, ConcurrencyKey string }
			}
		}
		sys.GraphQL(a.developer, `mutation($w: ID!, $i: JSON) { startRun(input: {workflowId: $w, input: $i}) { run { status concurrencyKey } } }`,
			map[string]any{"w": id, "i": map[string]any{"customer": c}}).Decode(t, &started)
		assert.Equal(t, c, started.StartRun.Run.ConcurrencyKey)
		statuses = append(statuses, started.StartRun.Run.Status)
	}
	assert.Equal(t, []string{"RUNNING", "QUEUED", "QUEUED", "RUNNING"}, statuses)
	var keys struct {
		ConcurrencyKeys []struct {
			Key                    string
			Running, Queued, Limit int
			AtLimit                bool
		}
	}
	sys.GraphQL(a.viewer, `query($w: ID!) { concurrencyKeys(workflowId: $w) { key running queued limit atLimit } }`, map[string]any{"w": id}).Decode(t, &keys)
	require.Len(t, keys.ConcurrencyKeys, 2)
	assert.Equal(t, "A", keys.ConcurrencyKeys[0].Key)
	assert.Equal(t, 1, keys.ConcurrencyKeys[0].Running)
	assert.Equal(t, 2, keys.ConcurrencyKeys[0].Queued)
	assert.Equal(t, 1, keys.ConcurrencyKeys[0].Limit)
	assert.True(t, keys.ConcurrencyKeys[0].AtLimit)
	assert.Equal(t, "B", keys.ConcurrencyKeys[1].Key)

	res := sys.GraphQL(a.owner, `mutation($d: JSON!) { createWorkflow(input: {name: "bad-limit", definition: $d}) { workflow { id } } }`,
		map[string]any{"d": json.RawMessage(`{"concurrency": {"key": "input.x", "limit": 0, "strategy": "lifo"}, "nodes": [{"id": "a", "type": "noop"}]}`)})
	require.Equal(t, []string{"BAD_USER_INPUT"}, res.Codes())
	body := string(mustJSON(t, res.Errors[0].Extensions))
	assert.Contains(t, body, "concurrency.limit")
	assert.Contains(t, body, "concurrency.strategy")
}
