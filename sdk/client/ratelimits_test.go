package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/sdk/client"
)

// TestClientManagesRateLimitsAndStartsWithAPriority: declare, read,
// change and delete a rate limit; start a rate-limited workflow's run at
// a priority.
func TestClientManagesRateLimitsAndStartsWithAPriority(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	sys.StartWorker(apptest.WorkerOptions{})
	ctx := context.Background()
	c, err := client.New(sys.URL, sys.APIKey(auth.ScopeWorkflowsWrite, auth.ScopeWorkflowsRead, auth.ScopeRunsWrite, auth.ScopeRunsRead))
	require.NoError(t, err)

	l, err := c.CreateRateLimit(ctx, client.RateLimitSpec{Name: "partner-api", PerSecond: 10, Burst: 20, Description: "the partner"})
	require.NoError(t, err)
	assert.Equal(t, 10.0, l.PerSecond)
	_, err = c.CreateRateLimit(ctx, client.RateLimitSpec{Name: "partner-api", PerSecond: 1, Burst: 1})
	var apiErr *client.Error
	require.True(t, errors.As(err, &apiErr), "%v", err)
	assert.Equal(t, "CONFLICT", apiErr.Code)
	l, err = c.UpdateRateLimit(ctx, client.RateLimitSpec{Name: "partner-api", PerSecond: 5, Burst: 5})
	require.NoError(t, err)
	assert.Equal(t, 5, l.Burst)
	all, err := c.RateLimits(ctx)
	require.NoError(t, err)
	require.Len(t, all, 1)
	assert.Equal(t, "partner-api", all[0].Name)

	_, _, err = c.CreateWorkflow(ctx, "limited", map[string]any{"nodes": []map[string]any{
		{"id": "call", "type": "noop", "priority": 1, "rate_limit": map[string]string{"name": "partner-api", "key": "input.partner"}},
	}})
	require.NoError(t, err)
	run, _, err := c.StartRun(ctx, client.Start{Workflow: "limited", Input: map[string]string{"partner": "p1"}, Priority: 2})
	require.NoError(t, err)
	assert.Equal(t, 2, run.Priority)
	apptest.Eventually(t, "the run to finish", 10*time.Second, func() bool {
		run, err = c.GetRun(ctx, run.ID)
		return err == nil && run.Done()
	})
	assert.Equal(t, "COMPLETED", run.Status)

	require.NoError(t, c.DeleteRateLimit(ctx, "partner-api"))
	got, err := c.GetRateLimit(ctx, "partner-api")
	require.NoError(t, err)
	assert.Nil(t, got)
}
