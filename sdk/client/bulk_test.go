package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/sdk/client"
)

// TestClientPausesAndBulkOperates: a backend pauses a workflow (a new run is
// QUEUED), resumes it (the run starts), then cancels its runs in bulk by
// metadata and waits for the job; a queue is paused and resumed.
func TestClientPausesAndBulkOperates(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	c, err := client.New(sys.URL, sys.APIKey(auth.ScopeWorkflowsWrite, auth.ScopeWorkflowsRead, auth.ScopeRunsRead, auth.ScopeRunsWrite))
	require.NoError(t, err)
	wf, _, err := c.CreateWorkflow(ctx, "parked", map[string]any{
		"metadata": map[string]string{"customer": "input.customer"},
		"nodes":    []map[string]any{{"id": "w", "type": "wait", "wait": map[string]string{"signal": "go"}}}})
	require.NoError(t, err)
	at, err := c.PauseWorkflow(ctx, wf, "deploy")
	require.NoError(t, err)
	assert.False(t, at.IsZero())
	run, _, err := c.StartRun(ctx, client.Start{WorkflowID: wf, Input: map[string]string{"customer": "c1"}})
	require.NoError(t, err)
	assert.Equal(t, string(client.RunStatusQueued), run.Status)
	op, err := c.ResumeWorkflow(ctx, wf)
	require.NoError(t, err)
	require.NotNil(t, op)
	done, err := c.WaitBulkOperation(ctx, op.Id, 50*time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, 1, done.Done)

	for i := 0; i < 3; i++ {
		_, _, err := c.StartRun(ctx, client.Start{WorkflowID: wf, Input: map[string]string{"customer": "c1"}})
		require.NoError(t, err)
	}
	_, _, err = c.StartRun(ctx, client.Start{WorkflowID: wf, Input: map[string]string{"customer": "c2"}})
	require.NoError(t, err)
	req := client.BulkRequest{Action: client.BulkActionCancel, Filter: client.BulkFilter{WorkflowID: wf, Metadata: map[string]string{"customer": "c1"}},
		IdempotencyKey: "cancel-c1"}
	op, created, err := c.CreateBulkOperation(ctx, req)
	require.NoError(t, err)
	assert.True(t, created)
	again, created, err := c.CreateBulkOperation(ctx, req)
	require.NoError(t, err)
	assert.False(t, created)
	assert.Equal(t, op.Id, again.Id)
	done, err = c.WaitBulkOperation(ctx, op.Id, 50*time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, client.BulkOperationStatusCompleted, done.Status)
	assert.Equal(t, 4, done.Done, "the resumed run and the three others of c1")
	assert.Equal(t, 4, done.Matched)

	q, err := c.PauseQueue(ctx, "partner", "down")
	require.NoError(t, err)
	assert.Equal(t, "partner", q.Queue)
	n, err := c.ResumeQueue(ctx, "partner")
	require.NoError(t, err)
	assert.Zero(t, n)
}
