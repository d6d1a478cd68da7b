package client_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/sdk/client"
)

// TestClientPublishesEvents: a backend publishes events (a retry starts
// nothing again) and reads what they started.
func TestClientPublishesEvents(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	admin, err := client.New(sys.URL, sys.APIKey(auth.ScopeWorkflowsWrite, auth.ScopeRunsRead))
	require.NoError(t, err)
	wf, _, err := admin.CreateWorkflow(ctx, "on-signup", map[string]any{
		"triggers": []map[string]any{{"event": "user.*", "if": "event.payload.plan == 'pro'"}},
		"nodes":    []map[string]any{{"id": "a", "type": "noop"}}})
	require.NoError(t, err)

	publisher, err := client.New(sys.URL, sys.APIKey(auth.ScopeEventsWrite))
	require.NoError(t, err)
	ev, created, err := publisher.PublishEvent(ctx, "user.signed_up", map[string]string{"plan": "pro"}, "signup-1")
	require.NoError(t, err)
	assert.True(t, created)
	require.Len(t, ev.Runs, 1)
	assert.Equal(t, wf, ev.Runs[0].WorkflowId)
	assert.Equal(t, client.EventRunOutcomeStarted, ev.Runs[0].Outcome)
	require.NotNil(t, ev.Runs[0].RunId)

	again, created, err := publisher.PublishEvent(ctx, "user.signed_up", map[string]string{"plan": "pro"}, "signup-1")
	require.NoError(t, err)
	assert.False(t, created)
	assert.Equal(t, ev.Id, again.Id)
	assert.Equal(t, *ev.Runs[0].RunId, *again.Runs[0].RunId)
	_, _, err = publisher.PublishEvent(ctx, "user.signed_up", map[string]string{"plan": "free"}, "signup-1")
	assert.Equal(t, "CONFLICT", client.ErrorCode(err))
	free, _, err := publisher.PublishEvent(ctx, "user.signed_up", map[string]string{"plan": "free"}, "signup-2")
	require.NoError(t, err)
	assert.Empty(t, free.Runs)
	_, err = publisher.GetEvent(ctx, ev.Id)
	assert.Equal(t, "FORBIDDEN", client.ErrorCode(err), "reading events needs runs:read")

	got, err := admin.GetEvent(ctx, ev.Id)
	require.NoError(t, err)
	assert.Equal(t, "signup-1", got.EventId)
	list, next, err := admin.ListEvents(ctx, "user.signed_up", 1, "")
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, "signup-2", list[0].EventId)
	require.NotEmpty(t, next)
	list, next, err = admin.ListEvents(ctx, "", 10, next)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, "signup-1", list[0].EventId)
	assert.Empty(t, next)
	_, _, err = admin.PublishEvent(ctx, "user.x", nil, "x")
	assert.Equal(t, "FORBIDDEN", client.ErrorCode(err), "publishing needs events:write")
}
