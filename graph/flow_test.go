package graph_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rateLimitCases is how tenant B reaches tenant A's rate limit "partner-api"
// by name: rate limits are named per tenant, so every field that takes one
// is a cross-tenant case (TestEveryRateLimitFieldIsCovered keeps the list
// complete).
var rateLimitCases = map[string]struct {
	query string
	// null: the answer is null data, not an error (a lookup that finds
	// nothing); otherwise NOT_FOUND.
	null bool
}{
	"Query.rateLimit":          {query: `{ rateLimit(name: "partner-api") { name perSecond } }`, null: true},
	"Mutation.updateRateLimit": {query: `mutation { updateRateLimit(input: {name: "partner-api", perSecond: 1000, burst: 1000}) { name } }`},
	"Mutation.deleteRateLimit": {query: `mutation { deleteRateLimit(name: "partner-api") }`},
}

func TestEveryRateLimitFieldIsCovered(t *testing.T) {
	schema := loadSchema(t)
	for _, typ := range []string{"Query", "Mutation"} {
		for _, f := range schema.Types[typ].Fields {
			for _, a := range f.Arguments {
				named := a.Name == "name" || (a.Type.Name() == "RateLimitInput")
				if named && strings.Contains(strings.ToLower(f.Name), "ratelimit") && !strings.HasPrefix(f.Name, "create") {
					_, ok := rateLimitCases[typ+"."+f.Name]
					assert.True(t, ok, "%s.%s names a rate limit but has no cross-tenant case", typ, f.Name)
				}
			}
		}
	}
}

func TestRateLimitsAreTenantScoped(t *testing.T) {
	t.Parallel()
	sys, a, b := twoTenants(t)
	res := sys.GraphQL(a.owner, `mutation { createRateLimit(input: {name: "partner-api", perSecond: 10, burst: 20, description: "the partner's API"}) { name perSecond burst } }`, nil)
	require.Empty(t, res.Errors)
	for name, c := range rateLimitCases {
		res := sys.GraphQL(b.owner, c.query, nil)
		if c.null {
			require.Empty(t, res.Errors, name)
			assert.NotContains(t, string(res.Data), "perSecond", name)
			continue
		}
		assert.Equal(t, []string{"NOT_FOUND"}, res.Codes(), name)
	}
	var list struct{ RateLimits []struct{ Name string } }
	sys.GraphQL(b.owner, `{ rateLimits { name } }`, nil).Decode(t, &list)
	assert.Empty(t, list.RateLimits, "B lists none of A's")
	// B's own limit of the same name is B's: no conflict, A's unchanged.
	res = sys.GraphQL(b.owner, `mutation { createRateLimit(input: {name: "partner-api", perSecond: 1, burst: 1}) { name } }`, nil)
	require.Empty(t, res.Errors)
	var got struct {
		RateLimit struct {
			PerSecond   float64
			Burst       int
			Description string
		}
	}
	sys.GraphQL(a.owner, `{ rateLimit(name: "partner-api") { perSecond burst description } }`, nil).Decode(t, &got)
	assert.Equal(t, 10.0, got.RateLimit.PerSecond)
	assert.Equal(t, 20, got.RateLimit.Burst)
	assert.Equal(t, "the partner's API", got.RateLimit.Description)

	// A viewer may read but not declare.
	res = sys.GraphQL(a.viewer, `mutation { createRateLimit(input: {name: "x", perSecond: 1, burst: 1}) { name } }`, nil)
	assert.Equal(t, []string{"FORBIDDEN"}, res.Codes())
	res = sys.GraphQL(a.viewer, `{ rateLimits { name } }`, nil)
	assert.Empty(t, res.Errors)
}

func TestRateLimitInputIsBoundedAndCapped(t *testing.T) {
	t.Parallel()
	sys, a, _ := twoTenants(t)
	for _, in := range []string{
		`{name: "Bad Name", perSecond: 1, burst: 1}`,
		`{name: "ok", perSecond: 0, burst: 1}`,
		`{name: "ok", perSecond: 20000, burst: 1}`,
		`{name: "ok", perSecond: 1, burst: 0}`,
	} {
		res := sys.GraphQL(a.owner, `mutation { createRateLimit(input: `+in+`) { name } }`, nil)
		assert.Equal(t, []string{"BAD_USER_INPUT"}, res.Codes(), in)
	}
	var limits struct {
		Tenant struct{ Limits struct{ MaxRateLimits int } }
	}
	sys.GraphQL(a.owner, `{ tenant { limits { maxRateLimits } } }`, nil).Decode(t, &limits)
	max := limits.Tenant.Limits.MaxRateLimits
	require.Positive(t, max)
	for i := range max {
		res := sys.GraphQL(a.owner, fmt.Sprintf(`mutation { createRateLimit(input: {name: "l%d", perSecond: 1, burst: 1}) { name } }`, i), nil)
		require.Empty(t, res.Errors)
	}
	res := sys.GraphQL(a.owner, `mutation { createRateLimit(input: {name: "one-more", perSecond: 1, burst: 1}) { name } }`, nil)
	assert.Equal(t, []string{"QUOTA_EXCEEDED"}, res.Codes())
	res = sys.GraphQL(a.owner, `mutation { createRateLimit(input: {name: "l0", perSecond: 1, burst: 1}) { name } }`, nil)
	assert.Equal(t, []string{"QUOTA_EXCEEDED"}, res.Codes(), "the cap is checked first")
	res = sys.GraphQL(a.owner, `mutation { deleteRateLimit(name: "l0") }`, nil)
	require.Empty(t, res.Errors)
	res = sys.GraphQL(a.owner, `mutation { createRateLimit(input: {name: "l1", perSecond: 1, burst: 1}) { name } }`, nil)
	assert.Equal(t, []string{"CONFLICT"}, res.Codes())
}

func TestStartRunTakesABoundedPriority(t *testing.T) {
	t.Parallel()
	sys, a, _ := twoTenants(t)
	res := sys.GraphQL(a.owner, `mutation($w: ID!) { startRun(input: {workflowId: $w, priority: 3}) { run { id } } }`, map[string]any{"w": a.workflow})
	assert.Equal(t, []string{"BAD_USER_INPUT"}, res.Codes())
	var started struct {
		StartRun struct{ Run struct{ Priority int } }
	}
	sys.GraphQL(a.owner, `mutation($w: ID!) { startRun(input: {workflowId: $w, priority: -2}) { run { priority } } }`, map[string]any{"w": a.workflow}).Decode(t, &started)
	assert.Equal(t, -2, started.StartRun.Run.Priority)
	// A node's priority out of range names the node and the field.
	for def, field := range map[string]string{
		`{nodes: [{id: "x", type: "noop", priority: 7}]}`:                                              "field:priority",
		`{nodes: [{id: "x", type: "noop", rate_limit: {name: "p", key: "input.nope +"}}]}`:             "field:rate_limit.key",
		`{nodes: [{id: "x", type: "noop", rate_limit: {name: "Not A Name"}}]}`:                         "field:rate_limit.name",
		`{nodes: [{id: "x", type: "sleep", sleep: {duration: "1s"}, rate_limit: {name: "p"}}]}`:        "field:rate_limit",
		`{nodes: [{id: "x", type: "noop", schedule_to_start_timeout: "1s", rate_limit: {name: "p"}}]}`: "field:rate_limit",
	} {
		res = sys.GraphQL(a.owner, `mutation($id: ID!) { publishWorkflowVersion(workflowId: $id, definition: `+def+`) { version } }`,
			map[string]any{"id": a.workflow})
		require.Len(t, res.Errors, 1, def)
		assert.Equal(t, "BAD_USER_INPUT", res.Errors[0].Code(), def)
		assert.Contains(t, fmt.Sprint(res.Errors[0].Extensions["problems"]), "node:x", def)
		assert.Contains(t, fmt.Sprint(res.Errors[0].Extensions["problems"]), field, def)
	}
}
