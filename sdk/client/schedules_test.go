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

// TestClientManagesSchedules: a tenant's backend schedules a workflow per
// customer; the server's own firing loop starts its fires.
func TestClientManagesSchedules(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	c, err := client.New(sys.URL, sys.APIKey(auth.ScopeWorkflowsWrite, auth.ScopeWorkflowsRead, auth.ScopeRunsWrite, auth.ScopeRunsRead))
	require.NoError(t, err)
	_, _, err = c.CreateWorkflow(ctx, "report", map[string]any{"nodes": []map[string]any{{"id": "a", "type": "noop"}}})
	require.NoError(t, err)

	daily, err := c.CreateSchedule(ctx, client.ScheduleSpec{Workflow: "report", Cron: "30 2 * * *", TimeZone: "Europe/London",
		ExternalID: "customer-1", Metadata: map[string]string{"customer": "1"}, Input: map[string]int{"customer": 1},
		Overlap: client.ScheduleOverlapPolicyBufferOne, Priority: 1})
	require.NoError(t, err)
	assert.Equal(t, client.ScheduleOverlapPolicyBufferOne, daily.Overlap)
	assert.Equal(t, 1, daily.Priority)
	_, err = c.CreateSchedule(ctx, client.ScheduleSpec{Workflow: "report", Cron: "30 2 * * *", ExternalID: "customer-1"})
	assert.Equal(t, "CONFLICT", client.ErrorCode(err), "one schedule per external id")
	_, err = c.CreateSchedule(ctx, client.ScheduleSpec{Workflow: "report", Cron: "30 2 * * *", TimeZone: "Nowhere/Land"})
	var apiErr *client.Error
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, "BAD_USER_INPUT", apiErr.Code)
	require.NotEmpty(t, apiErr.Problems)
	assert.Equal(t, "timeZone", apiErr.Problems[0].Field)

	got, err := c.GetSchedule(ctx, daily.Id, 3)
	require.NoError(t, err)
	require.Len(t, got.NextFireTimes, 3)
	london, _ := time.LoadLocation("Europe/London")
	for _, ft := range got.NextFireTimes {
		assert.Contains(t, []string{"02:30", "03:00"}, ft.In(london).Format("15:04"))
	}

	paused, err := c.PauseSchedule(ctx, daily.Id)
	require.NoError(t, err)
	assert.True(t, paused.Paused)
	resumed, err := c.ResumeSchedule(ctx, daily.Id)
	require.NoError(t, err)
	assert.False(t, resumed.Paused)
	cron := "0 3 * * *"
	updated, err := c.UpdateSchedule(ctx, daily.Id, client.ScheduleUpdate{Cron: &cron})
	require.NoError(t, err)
	assert.Equal(t, cron, *updated.Cron)
	assert.JSONEq(t, `{"customer":1}`, string(updated.Input), "what the update did not name is kept")
	assert.Equal(t, 1, updated.Priority, "kept")
	top := 2
	updated, err = c.UpdateSchedule(ctx, daily.Id, client.ScheduleUpdate{Priority: &top})
	require.NoError(t, err)
	assert.Equal(t, 2, updated.Priority)

	to := time.Now().Add(-24 * time.Hour)
	fires, err := c.BackfillSchedule(ctx, daily.Id, to.Add(-72*time.Hour), to)
	require.NoError(t, err)
	require.Len(t, fires, 3)
	for _, f := range fires {
		assert.Equal(t, client.ScheduleFireOutcomeStarted, f.Outcome)
		run, err := c.GetRun(ctx, *f.RunId)
		require.NoError(t, err)
		assert.JSONEq(t, `{"customer":1}`, string(run.Input))
	}

	// The server fires an interval schedule by itself.
	every, err := c.CreateSchedule(ctx, client.ScheduleSpec{Workflow: "report", Interval: 10 * time.Second,
		Overlap: client.ScheduleOverlapPolicyAllowAll})
	require.NoError(t, err)
	apptest.Eventually(t, "the first fire", 15*time.Second, func() bool {
		s, err := c.GetSchedule(ctx, every.Id, 1)
		require.NoError(t, err)
		return s.StartedCount > 0
	})
	s, err := c.GetSchedule(ctx, every.Id, 1)
	require.NoError(t, err)
	require.NotEmpty(t, s.RecentFires)
	assert.Equal(t, client.ScheduleFireOutcomeStarted, s.RecentFires[0].Outcome)
	assert.Zero(t, s.RecentFires[0].FireAt.Unix()%10, "interval fires fall on multiples of the interval")

	list, next, err := c.ListSchedules(ctx, "", 1, "")
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.NotEmpty(t, next)
	rest, next, err := c.ListSchedules(ctx, "", 10, next)
	require.NoError(t, err)
	assert.Len(t, rest, 1)
	assert.Empty(t, next)

	require.NoError(t, c.DeleteSchedule(ctx, daily.Id))
	_, err = c.GetSchedule(ctx, daily.Id, 1)
	assert.Equal(t, "NOT_FOUND", client.ErrorCode(err))
}
