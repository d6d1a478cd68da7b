package client_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/sdk/client"
	"github.com/composer-dev/composer/sdk/worker"
)

// TestClientDrivesARun: a tenant's backend creates a workflow, starts a
// run idempotently, approves it and waits for its result; its task step
// runs on the tenant's SDK worker.
func TestClientDrivesARun(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	sys.StartSDKWorker(func(w *worker.Worker) {
		worker.Handle(w, "ship", func(_ context.Context, in struct{ Order int }) (map[string]any, error) {
			return map[string]any{"shipped": in.Order}, nil
		})
	}, apptest.SDKWorkerOptions{})
	c, err := client.New(sys.URL, sys.APIKey(auth.ScopeWorkflowsWrite, auth.ScopeWorkflowsRead, auth.ScopeRunsWrite, auth.ScopeRunsRead))
	require.NoError(t, err)

	id, version, err := c.CreateWorkflow(ctx, "order", map[string]any{"nodes": []map[string]any{
		{"id": "ok", "type": "wait", "wait": map[string]any{"signal": "approval", "approval": true}},
		{"id": "ship", "type": "task", "depends_on": []string{"ok"}, "task": map[string]any{"handler": "ship"}, "input": map[string]string{"Order": "input.order"}},
	}})
	require.NoError(t, err)
	assert.NotEmpty(t, id)
	assert.Equal(t, 1, version)

	run, created, err := c.StartRun(ctx, client.Start{Workflow: "order", Input: map[string]int{"order": 42}, IdempotencyKey: "order-42"})
	require.NoError(t, err)
	assert.True(t, created)
	again, created, err := c.StartRun(ctx, client.Start{Workflow: "order", Input: map[string]int{"order": 42}, IdempotencyKey: "order-42"})
	require.NoError(t, err)
	assert.False(t, created, "the retried start found the first run")
	assert.Equal(t, run.ID, again.ID)

	ignored, err := c.Approve(ctx, run.ID, true, "ship it")
	require.NoError(t, err)
	assert.False(t, ignored)
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	done, err := c.WaitRun(wctx, run.ID)
	require.NoError(t, err)
	assert.Equal(t, "COMPLETED", done.Status)
	assert.True(t, done.Done())
	assert.JSONEq(t, `{"ship":{"shipped":42}}`, string(done.Output))
	require.Len(t, done.Tasks, 2)
	assert.Equal(t, "ship", done.Tasks[1].Handler)

	// Signal and cancel a second run.
	second, _, err := c.StartRun(ctx, client.Start{WorkflowID: id, Input: json.RawMessage(`{"order": 7}`)})
	require.NoError(t, err)
	cancelled, err := c.CancelRun(ctx, second.ID, "changed my mind")
	require.NoError(t, err)
	assert.Equal(t, "CANCELLED", cancelled.Status)
	ignored, err = c.Signal(ctx, second.ID, "approval", map[string]bool{"approved": true}, "sig-1")
	require.NoError(t, err)
	assert.True(t, ignored, "a finished run takes no signal")
}

// TestClientErrorsCarryTheirCode: the API's stable codes reach the caller,
// with the problems of an invalid definition.
func TestClientErrorsCarryTheirCode(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	c, err := client.New(sys.URL, sys.APIKey(auth.ScopeWorkflowsWrite, auth.ScopeRunsRead))
	require.NoError(t, err)
	_, _, err = c.CreateWorkflow(ctx, "bad", map[string]any{"nodes": []map[string]any{{"id": "a", "type": "task"}}})
	var apiErr *client.Error
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, "BAD_USER_INPUT", apiErr.Code)
	require.NotEmpty(t, apiErr.Problems)
	assert.Equal(t, "a", apiErr.Problems[0].Node)

	_, err = c.GetRun(ctx, "0190b3a8-0000-7000-8000-000000000000")
	assert.Equal(t, "NOT_FOUND", client.ErrorCode(err))
	_, _, err = c.StartRun(ctx, client.Start{Workflow: "bad"})
	assert.Equal(t, "FORBIDDEN", client.ErrorCode(err), "the key lacks runs:write")

	revoked, err := client.New(sys.URL, "cmp_AAAAAAAAAAAA_"+"x")
	require.NoError(t, err)
	_, err = revoked.GetRun(ctx, "0190b3a8-0000-7000-8000-000000000000")
	assert.Equal(t, "UNAUTHENTICATED", client.ErrorCode(err))
	assert.False(t, client.IsTemporary(err))
}

// TestPublishedSchemaIsServed: the server serves the schema the SDK is
// generated from, without a credential, byte for byte the committed file.
func TestPublishedSchemaIsServed(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	resp, err := http.Get(sys.URL + "/schema.graphql")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	want, err := os.ReadFile("../schema.graphql")
	require.NoError(t, err)
	assert.Equal(t, string(want), string(got), "sdk/schema.graphql is what the server serves (run make generate)")
}
