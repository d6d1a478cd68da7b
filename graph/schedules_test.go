package graph_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSchedulesOverGraphQL: create (and its refusals, each naming its
// field), read with the next fire times, list by pages, pause, resume,
// backfill, delete; who may do what.
func TestSchedulesOverGraphQL(t *testing.T) {
	t.Parallel()
	sys, a, _ := twoTenants(t)
	// Refusals: a stable code, the field in extensions.problems, nothing written.
	for _, c := range []struct{ input, code, field string }{
		{`{workflowName: "park", cron: "61 * * * *"}`, "BAD_USER_INPUT", "cron"},
		{`{workflowName: "park", cron: "0 9 * * *", timeZone: "Moon/Base"}`, "BAD_USER_INPUT", "timeZone"},
		{`{workflowName: "park", intervalSeconds: 2}`, "BAD_USER_INPUT", "intervalSeconds"}, // pro: 10 s at least
		{`{workflowName: "park", cron: "0 9 * * *", metadata: {a: 1}}`, "BAD_USER_INPUT", "metadata"},
		{`{workflowName: "park", cron: "0 9 * * *", externalId: "yearly"}`, "CONFLICT", "externalId"},
		{`{workflowName: "nope", cron: "0 9 * * *"}`, "NOT_FOUND", ""},
	} {
		res := sys.GraphQL(a.owner, `mutation { createSchedule(input: `+c.input+`) { id } }`, nil)
		require.Len(t, res.Errors, 1, c.input)
		assert.Equal(t, c.code, res.Errors[0].Code(), c.input)
		if c.field != "" {
			problems, _ := res.Errors[0].Extensions["problems"].([]any)
			require.Len(t, problems, 1, c.input)
			assert.Equal(t, c.field, problems[0].(map[string]any)["field"], c.input)
		}
	}
	var list struct {
		Schedules struct {
			Edges []struct{ Node struct{ ID string } }
		}
	}
	sys.GraphQL(a.owner, `{ schedules { edges { node { id } } } }`, nil).Decode(t, &list)
	require.Len(t, list.Schedules.Edges, 1, "only the world's own schedule")

	var created struct {
		CreateSchedule struct {
			ID            string
			Overlap       string
			TimeZone      string
			NextFireTimes []time.Time
			Metadata      json.RawMessage
		}
	}
	sys.GraphQL(a.developer, `mutation { createSchedule(input: {workflowName: "park", cron: "30 2 * * *", timeZone: "America/New_York",
		overlap: BUFFER_ONE, input: {x: 1}, metadata: {customer: "c-1"}}) { id overlap timeZone nextFireTimes(count: 3) metadata } }`, nil).Decode(t, &created)
	s := created.CreateSchedule
	assert.Equal(t, "BUFFER_ONE", s.Overlap)
	assert.JSONEq(t, `{"customer":"c-1"}`, string(s.Metadata))
	require.Len(t, s.NextFireTimes, 3)
	ny, _ := time.LoadLocation("America/New_York")
	for i, ft := range s.NextFireTimes {
		if i > 0 {
			assert.True(t, ft.After(s.NextFireTimes[i-1]))
		}
		h, m, _ := ft.In(ny).Clock()
		assert.True(t, h == 2 && m == 30 || h == 3 && m == 0, "02:30 New York time (or 03:00 on a spring-forward day): %v", ft.In(ny))
	}

	// Pages.
	var page struct {
		Schedules struct {
			Edges    []struct{ Node struct{ ID string } }
			PageInfo struct {
				HasNextPage bool
				EndCursor   string
			}
		}
	}
	sys.GraphQL(a.viewer, `{ schedules(first: 1) { edges { node { id } } pageInfo { hasNextPage endCursor } } }`, nil).Decode(t, &page)
	require.Len(t, page.Schedules.Edges, 1)
	assert.True(t, page.Schedules.PageInfo.HasNextPage)
	first := page.Schedules.Edges[0].Node.ID
	sys.GraphQL(a.viewer, `query($c: String) { schedules(first: 1, after: $c) { edges { node { id } } pageInfo { hasNextPage endCursor } } }`,
		map[string]any{"c": page.Schedules.PageInfo.EndCursor}).Decode(t, &page)
	require.Len(t, page.Schedules.Edges, 1)
	assert.NotEqual(t, first, page.Schedules.Edges[0].Node.ID)
	assert.False(t, page.Schedules.PageInfo.HasNextPage)

	// Viewers read; changing a schedule needs workflows:write and runs:write.
	res := sys.GraphQL(a.viewer, `mutation($id: ID!) { pauseSchedule(id: $id) { id } }`, map[string]any{"id": s.ID})
	assert.Equal(t, []string{"FORBIDDEN"}, res.Codes())
	workflowsOnly := sys.APIKey("workflows:write", "workflows:read")
	res = sys.GraphQL(workflowsOnly, `mutation { createSchedule(input: {workflowName: "park", cron: "0 9 * * *"}) { id } }`, nil)
	assert.Equal(t, []string{"FORBIDDEN"}, res.Codes(), "a key that may not start runs cannot schedule them")

	var paused struct {
		PauseSchedule struct {
			Paused        bool
			NextFireAt    *time.Time
			NextFireTimes []time.Time
		}
	}
	sys.GraphQL(a.developer, `mutation($id: ID!) { pauseSchedule(id: $id) { paused nextFireAt nextFireTimes } }`, map[string]any{"id": s.ID}).Decode(t, &paused)
	assert.True(t, paused.PauseSchedule.Paused)
	assert.Nil(t, paused.PauseSchedule.NextFireAt)
	assert.Empty(t, paused.PauseSchedule.NextFireTimes)
	var resumed struct {
		ResumeSchedule struct {
			Paused     bool
			NextFireAt *time.Time
		}
	}
	sys.GraphQL(a.developer, `mutation($id: ID!) { resumeSchedule(id: $id) { paused nextFireAt } }`, map[string]any{"id": s.ID}).Decode(t, &resumed)
	assert.False(t, resumed.ResumeSchedule.Paused)
	require.NotNil(t, resumed.ResumeSchedule.NextFireAt)

	var updated struct {
		UpdateSchedule struct {
			Cron            *string
			IntervalSeconds *int
		}
	}
	sys.GraphQL(a.developer, `mutation($id: ID!) { updateSchedule(id: $id, input: {intervalSeconds: 3600}) { cron intervalSeconds } }`,
		map[string]any{"id": s.ID}).Decode(t, &updated)
	assert.Nil(t, updated.UpdateSchedule.Cron)
	assert.Equal(t, 3600, *updated.UpdateSchedule.IntervalSeconds)

	// Backfill: the last three hours, each an idempotent start.
	to := time.Now().UTC().Truncate(time.Hour)
	var bf struct {
		BackfillSchedule []struct {
			FireAt  time.Time
			RunID   string
			Outcome string
		}
	}
	vars := map[string]any{"id": s.ID, "from": to.Add(-3 * time.Hour), "to": to}
	sys.GraphQL(a.developer, `mutation($id: ID!, $from: Time!, $to: Time!) { backfillSchedule(id: $id, from: $from, to: $to) { fireAt runId outcome } }`,
		vars).Decode(t, &bf)
	require.Len(t, bf.BackfillSchedule, 3)
	for _, f := range bf.BackfillSchedule {
		assert.Equal(t, "STARTED", f.Outcome)
		assert.NotEmpty(t, f.RunID)
	}
	var fires struct {
		Schedule struct {
			StartedCount int64
			RecentFires  []struct {
				RunID    string
				Backfill bool
			}
		}
	}
	sys.GraphQL(a.viewer, `query($id: ID!) { schedule(id: $id) { startedCount recentFires { runId backfill } } }`, map[string]any{"id": s.ID}).Decode(t, &fires)
	assert.EqualValues(t, 3, fires.Schedule.StartedCount)
	require.Len(t, fires.Schedule.RecentFires, 3)
	assert.True(t, fires.Schedule.RecentFires[0].Backfill)
	res = sys.GraphQL(a.developer, `mutation($id: ID!, $from: Time!, $to: Time!) { backfillSchedule(id: $id, from: $from, to: $to) { runId } }`,
		map[string]any{"id": s.ID, "from": to.Add(-1000 * time.Hour), "to": to})
	assert.Equal(t, []string{"BAD_USER_INPUT"}, res.Codes(), "more than 100 fires")

	var limits struct {
		Tenant struct {
			Limits struct{ MaxSchedules, MinScheduleIntervalSeconds int }
		}
	}
	sys.GraphQL(a.viewer, `{ tenant { limits { maxSchedules minScheduleIntervalSeconds } } }`, nil).Decode(t, &limits)
	assert.Equal(t, 200, limits.Tenant.Limits.MaxSchedules)
	assert.Equal(t, 10, limits.Tenant.Limits.MinScheduleIntervalSeconds)

	var del struct{ DeleteSchedule string }
	sys.GraphQL(a.developer, `mutation($id: ID!) { deleteSchedule(id: $id) }`, map[string]any{"id": s.ID}).Decode(t, &del)
	assert.Equal(t, s.ID, del.DeleteSchedule)
	res = sys.GraphQL(a.viewer, `query($id: ID!) { schedule(id: $id) { id } }`, map[string]any{"id": s.ID})
	assert.Equal(t, []string{"NOT_FOUND"}, res.Codes())
}
