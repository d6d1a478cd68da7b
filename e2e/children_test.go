package e2e

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/sdk/client"
)

// TestAMapOfChildWorkflowsOnRealProcesses: a real server and a platform
// worker run a map of 60 child workflows, 8 at a time, each a noop step;
// a program with an API key sees the parent complete with the children's
// outputs in element order, each element linked to its child run and each
// child to its parent; cancelling a parent cancels its running child.
func TestAMapOfChildWorkflowsOnRealProcesses(t *testing.T) {
	t.Parallel()
	sys := apptest.StartWith(t, testenv.New(t))
	ctx := context.Background()
	_, c := startServer(t, sys, true)
	_, _, err := c.CreateWorkflow(ctx, "double", json.RawMessage(`{"output": {"twice": "input.n * 2"},
		"nodes": [{"id": "d", "type": "noop", "input": {"n": "input.n"}}]}`))
	require.NoError(t, err)
	_, _, err = c.CreateWorkflow(ctx, "fan", json.RawMessage(`{"output": {"all": "nodes.each.output"},
		"nodes": [{"id": "each", "type": "map", "map": {"items": "input.ns", "max_parallelism": 8,
			"step": {"type": "workflow", "workflow": {"name": "double"}, "input": {"n": "item"}}}}]}`))
	require.NoError(t, err)
	ns := make([]int, 60)
	for i := range ns {
		ns[i] = i
	}
	run, _, err := c.StartRun(ctx, client.Start{Workflow: "fan", Input: map[string]any{"ns": ns}})
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	done, err := c.WaitRun(wctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, "COMPLETED", done.Status, "error: %s", done.Error)
	var out struct{ All []struct{ Twice int } }
	require.NoError(t, json.Unmarshal(done.Output, &out))
	require.Len(t, out.All, 60)
	for i, o := range out.All {
		require.Equal(t, 2*i, o.Twice, "element %d", i)
	}
	children := map[string]bool{}
	for _, tk := range done.Tasks {
		if tk.NodeID == "each" {
			continue
		}
		require.NotEmpty(t, tk.ChildRunID, "element %s names its child", tk.NodeID)
		children[tk.ChildRunID] = true
	}
	require.Len(t, children, 60, "one child per element")
	for id := range children {
		child, err := c.GetRun(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, run.ID, child.ParentRunID)
		assert.Equal(t, "COMPLETED", child.Status)
		break
	}

	// A parent cancelled while its child waits cancels the child.
	_, _, err = c.CreateWorkflow(ctx, "hold", json.RawMessage(`{"nodes": [{"id": "w", "type": "wait", "wait": {"signal": "go"}}]}`))
	require.NoError(t, err)
	_, _, err = c.CreateWorkflow(ctx, "outer", json.RawMessage(`{"nodes": [{"id": "h", "type": "workflow", "workflow": {"name": "hold"}}]}`))
	require.NoError(t, err)
	outer, _, err := c.StartRun(ctx, client.Start{Workflow: "outer"})
	require.NoError(t, err)
	got, err := c.GetRun(ctx, outer.ID)
	require.NoError(t, err)
	require.Len(t, got.Tasks, 1)
	childID := got.Tasks[0].ChildRunID
	require.NotEmpty(t, childID)
	_, err = c.CancelRun(ctx, outer.ID, "no longer needed")
	require.NoError(t, err)
	cctx, cancel2 := context.WithTimeout(ctx, 20*time.Second)
	defer cancel2()
	child, err := c.WaitRun(cctx, childID)
	require.NoError(t, err)
	assert.Equal(t, "CANCELLED", child.Status)
}
