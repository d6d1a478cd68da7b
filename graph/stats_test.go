package graph_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type statusCounts struct {
	RunCounts []struct {
		Status string
		Count  int
	}
}

func (c statusCounts) byStatus() map[string]int {
	out := map[string]int{}
	for _, s := range c.RunCounts {
		out[s.Status] = s.Count
	}
	return out
}

// listed counts a tenant's runs by status from the runs list itself.
func listed(t *testing.T, ask func(string, map[string]any, any), filter map[string]any) map[string]int {
	var page struct {
		Runs struct {
			Edges []struct{ Node struct{ Status string } }
		}
	}
	ask(`query($f: RunFilter) { runs(first: 500, filter: $f) { edges { node { status } } } }`, map[string]any{"f": filter}, &page)
	out := map[string]int{"QUEUED": 0, "RUNNING": 0, "COMPLETED": 0, "FAILED": 0, "CANCELLED": 0}
	for _, e := range page.Runs.Edges {
		out[e.Node.Status]++
	}
	return out
}

// TestRunStatsAndCountsOverGraphQL: a viewer reads the statistics and the
// counts of its own tenant; the counts are those of the runs list; another
// tenant sees none of them; bad ranges are BAD_USER_INPUT.
func TestRunStatsAndCountsOverGraphQL(t *testing.T) {
	t.Parallel()
	sys, a, b := twoTenants(t)
	// A cancelled run besides the world's running ones.
	var started struct {
		StartRun struct{ Run struct{ ID string } }
	}
	sys.GraphQL(a.developer, `mutation($w: ID!) { startRun(input: {workflowId: $w}) { run { id } } }`, map[string]any{"w": a.workflow}).Decode(t, &started)
	res := sys.GraphQL(a.developer, `mutation($id: ID!) { cancelRun(id: $id) { id } }`, map[string]any{"id": started.StartRun.Run.ID})
	require.Empty(t, res.Errors)
	askAs := func(who string) func(string, map[string]any, any) {
		return func(q string, vars map[string]any, out any) { sys.GraphQL(who, q, vars).Decode(t, out) }
	}
	const counts = `query($f: RunFilter) { runCounts(filter: $f) { status count } }`
	for _, filter := range []map[string]any{nil, {"workflowId": a.workflow}, {"status": []string{"FAILED"}},
		{"createdAfter": time.Now().Add(-time.Hour).UTC().Format(time.RFC3339Nano)}} {
		var c statusCounts
		askAs(a.viewer)(counts, map[string]any{"f": filter}, &c)
		require.Len(t, c.RunCounts, 5, "every status listed")
		assert.Equal(t, []string{"QUEUED", "RUNNING", "COMPLETED", "FAILED", "CANCELLED"},
			[]string{c.RunCounts[0].Status, c.RunCounts[1].Status, c.RunCounts[2].Status, c.RunCounts[3].Status, c.RunCounts[4].Status})
		f := map[string]any{}
		for k, v := range filter {
			if k != "status" {
				f[k] = v
			}
		}
		assert.Equal(t, listed(t, askAs(a.viewer), f), c.byStatus(), "counts of %v", filter)
	}
	var mine statusCounts
	askAs(a.viewer)(counts, nil, &mine)
	assert.Equal(t, 1, mine.byStatus()["CANCELLED"])
	assert.Positive(t, mine.byStatus()["RUNNING"])

	now := time.Now().UTC()
	var st struct {
		RunStats struct {
			WorkflowID *string
			Interval   string
			From, To   time.Time
			Buckets    []struct {
				Start                                 time.Time
				Started, Completed, Failed, Cancelled int
				P50Ms, P95Ms                          *float64
				FailureRate                           float64
			}
		}
	}
	const statsQ = `query($w: ID, $from: Time!, $to: Time!, $i: StatsInterval!) { runStats(workflowId: $w, from: $from, to: $to, interval: $i) {
		workflowId interval from to buckets { start started completed failed cancelled p50Ms p95Ms failureRate } } }`
	vars := map[string]any{"from": now.Add(-2 * time.Hour), "to": now.Add(time.Hour), "i": "HOUR"}
	askAs(a.viewer)(statsQ, vars, &st)
	require.Len(t, st.RunStats.Buckets, 4, "an unaligned range rounded out to whole hours")
	assert.Nil(t, st.RunStats.WorkflowID)
	assert.Equal(t, "HOUR", st.RunStats.Interval)
	var startedN, cancelled int
	for _, bk := range st.RunStats.Buckets {
		startedN, cancelled = startedN+bk.Started, cancelled+bk.Cancelled
	}
	total := 0
	for _, n := range mine.byStatus() {
		total += n
	}
	assert.Equal(t, total, startedN, "every run of the tenant started in the range")
	assert.Equal(t, 1, cancelled)

	// B: its own runs only, nothing through A's workflow.
	var theirs statusCounts
	askAs(b.viewer)(counts, nil, &theirs)
	assert.Equal(t, listed(t, askAs(b.viewer), nil), theirs.byStatus())
	assert.Zero(t, theirs.byStatus()["CANCELLED"], "A's cancelled run is not B's")
	askAs(b.viewer)(counts, map[string]any{"f": map[string]any{"workflowId": a.workflow}}, &theirs)
	for _, c := range theirs.RunCounts {
		assert.Zero(t, c.Count, "B's counts of A's workflow")
	}
	var bs struct {
		RunStats struct {
			Buckets []struct{ Started, Cancelled int }
		}
	}
	askAs(b.viewer)(statsQ, vars, &bs)
	var bStarted, bCancelled int
	for _, bk := range bs.RunStats.Buckets {
		bStarted, bCancelled = bStarted+bk.Started, bCancelled+bk.Cancelled
	}
	assert.Less(t, bStarted, startedN, "B's stats hold B's runs only")
	assert.Zero(t, bCancelled)
	res = sys.GraphQL(b.owner, statsQ, map[string]any{"w": a.workflow, "from": vars["from"], "to": vars["to"], "i": "HOUR"})
	assert.Equal(t, []string{"NOT_FOUND"}, res.Codes())

	for name, v := range map[string]map[string]any{
		"from after to": {"from": now, "to": now.Add(-time.Hour), "i": "HOUR"},
		"501 buckets":   {"from": now, "to": now.Add(501 * time.Minute), "i": "MINUTE"},
	} {
		res := sys.GraphQL(a.viewer, statsQ, v)
		assert.Equal(t, []string{"BAD_USER_INPUT"}, res.Codes(), name)
		assert.False(t, strings.Contains(string(res.Data), "buckets"), name)
	}
}
