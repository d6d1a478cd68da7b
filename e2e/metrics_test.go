package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.yaml.in/yaml/v3"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/app"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/testenv"
)

// TestMetricsCountWhatTheyMeasure runs a workload through real processes —
// `composer dev` (server and a worker of the default queue) and a separate
// `composer worker` serving the workload's queue — and scrapes both
// operator listeners: each histogram's count equals the events it measures
// (GraphQL requests by operation type, steps executed and their queue
// waits on the worker that ran them, webhook deliveries), the fleet gauges
// are there, no series carries a tenant id, and every composer_* metric the
// shipped alert rules and dashboard query is in the scrapes.
func TestMetricsCountWhatTheyMeasure(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	admin, workerAdmin := freeAddr(t), freeAddr(t)
	base, _ := startDev(t, env, "COMPOSER_ADMIN_ADDR="+admin, "COMPOSER_WORKER_QUEUES=default")
	wenv := append((&apptest.System{Cfg: apptest.Config(env), URL: base}).ProcessEnv(), "COMPOSER_ADMIN_ADDR="+workerAdmin)
	worker := &proc{name: "worker", args: []string{"worker", "--queues", "metered", "--concurrency", "4"}, env: wenv}
	worker.start(t, apptest.Binary(t))
	t.Cleanup(worker.kill)

	// A user token of the demo tenant, minted as `composer token` would.
	ctx := context.Background()
	d, err := app.Open(ctx, apptest.Config(env), zap.NewNop(), true)
	require.NoError(t, err)
	defer d.Close()
	tenant, _, err := app.EnsureDemoTenant(ctx, d)
	require.NoError(t, err)
	token, err := app.DevToken(ctx, d, tenant, "metrics@composer.local", auth.RoleOwner, time.Hour)
	require.NoError(t, err)

	var delivered atomic.Int64
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { delivered.Add(1) }))
	t.Cleanup(sink.Close)

	ops := map[string]int{}
	gql := func(op, query string, vars map[string]any) map[string]any {
		t.Helper()
		body, err := json.Marshal(map[string]any{"query": query, "variables": vars})
		require.NoError(t, err)
		req, err := http.NewRequest(http.MethodPost, base+"/graphql", bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		ops[op]++
		assert.NotEmpty(t, resp.Header.Get("X-Request-Id"), "every response names its request")
		var out struct {
			Data   map[string]any
			Errors []any
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		require.Empty(t, out.Errors, query)
		return out.Data
	}
	gql("mutation", `mutation($u: String!) { createWebhookEndpoint(input: {url: $u, eventTypes: ["run.completed"]}) { secret } }`,
		map[string]any{"u": sink.URL + "/hook"})
	def := json.RawMessage(`{"nodes":[{"id":"a","type":"noop","queue":"metered"},{"id":"b","type":"noop","queue":"metered","depends_on":["a"]},
		{"id":"c","type":"noop","queue":"metered","depends_on":["a"]}]}`)
	created := gql("mutation", `mutation($d: JSON!) { createWorkflow(input: {name: "metered", definition: $d}) { workflow { id } } }`, map[string]any{"d": def})
	wf := created["createWorkflow"].(map[string]any)["workflow"].(map[string]any)["id"].(string)
	const runs, stepsPerRun = 6, 3
	var ids []string
	for range runs {
		started := gql("mutation", `mutation($w: ID!) { startRun(input: {workflowId: $w}) { run { id } } }`, map[string]any{"w": wf})
		ids = append(ids, started["startRun"].(map[string]any)["run"].(map[string]any)["id"].(string))
	}
	for _, id := range ids {
		apptest.Eventually(t, "run "+id+" to complete", 30*time.Second, func() bool {
			r := gql("query", `query($id: ID!) { run(id: $id) { status } }`, map[string]any{"id": id})
			return r["run"].(map[string]any)["status"] == "COMPLETED"
		})
	}
	apptest.Eventually(t, "every run.completed webhook", 30*time.Second, func() bool { return delivered.Load() == runs })

	var server, work scrape
	apptest.Eventually(t, "the deliveries in the server's histogram", 10*time.Second, func() bool {
		server = scrapeMetrics(t, admin)
		return server.sum("composer_webhook_delivery_duration_seconds_count", `outcome="success"`) == runs
	})
	work = scrapeMetrics(t, workerAdmin)

	t.Logf("ops %v steps %v waits %v handoffs %v deliveries %v", ops, work.sum("composer_step_duration_seconds_count"), work.sum("composer_step_queue_wait_seconds_count"), work.sum("composer_worker_handoff_seconds_count"), server.sum("composer_webhook_delivery_duration_seconds_count"))
	// GraphQL requests: every one, by operation type (the dev process's).
	for op, n := range ops {
		assert.Equal(t, float64(n), server.sum("composer_graphql_request_duration_seconds_count", `operation="`+op+`"`), op)
	}
	// Steps: all ran on the separate worker, none on the dev process's.
	steps := float64(runs * stepsPerRun)
	assert.Equal(t, steps, work.sum("composer_step_duration_seconds_count", `queue="metered"`, `outcome="completed"`), "one step duration per step executed")
	assert.Equal(t, steps, work.sum("composer_step_queue_wait_seconds_count", `queue="metered"`), "one queue wait per step executed")
	assert.Equal(t, steps-work.sum("composer_step_queue_wait_seconds_count", `dispatch="eager"`),
		work.sum("composer_worker_handoff_seconds_count", `queue="metered"`), "one hand-off per step read from a stream")
	assert.Zero(t, server.sum("composer_step_duration_seconds_count", `queue="metered"`))
	assert.Equal(t, float64(runs), server.sum("composer_webhook_delivery_duration_seconds_count"), "no other delivery outcomes")
	// Transitions: one run_started and one node_completed per step, each
	// with its commit latency.
	assert.Equal(t, float64(runs), server.sum("composer_transition_duration_seconds_count", `event="run_started"`))
	assert.Equal(t, steps, server.sum("composer_transition_duration_seconds_count", `event="node_completed"`))
	assert.Equal(t, float64(runs), server.sum("composer_runs_finished_total", `status="completed"`))

	// Fleet gauges and health, without tenant ids.
	for _, g := range []string{"composer_tasks_queued", "composer_tasks_running", "composer_runs_running_estimate",
		"composer_tenants_at_quota", "composer_outbox_lag_seconds"} {
		assert.True(t, server.has(g), g)
	}
	assert.True(t, work.has("composer_redis_pool_connections"), "the worker reports its Redis pool")
	assert.True(t, server.has("composer_db_pool_connections"), "the server reports its PostgreSQL pools")
	for _, s := range []scrape{server, work} {
		for _, line := range s.lines {
			assert.NotContains(t, strings.ToLower(line), "tenant_id", "no tenant ids as labels")
			assert.NotRegexp(t, `[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-`, line, "no uuids in label values")
		}
	}
	if resp, err := http.Get("http://" + workerAdmin + "/healthz"); assert.NoError(t, err) {
		resp.Body.Close()
		assert.Equal(t, 200, resp.StatusCode, "the worker's health")
	}
	if resp, err := http.Get(base + "/metrics"); assert.NoError(t, err) {
		resp.Body.Close()
		assert.Equal(t, http.StatusNotFound, resp.StatusCode, "no /metrics on the public listener")
	}

	// Every metric the alert rules and the dashboard query exists.
	for _, name := range deployMetricNames(t) {
		assert.True(t, server.has(name) || work.has(name), "%s is queried in deploy/ but no process exposes it", name)
	}
}

// scrape is one /metrics answer: its sample lines.
type scrape struct{ lines []string }

func scrapeMetrics(t *testing.T, addr string) scrape {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	var s scrape
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if line := sc.Text(); line != "" && !strings.HasPrefix(line, "#") {
			s.lines = append(s.lines, line)
		}
	}
	require.NoError(t, sc.Err())
	return s
}

// sum adds the values of the series of name whose labels contain every
// matcher (`key="value"`).
func (s scrape) sum(name string, matchers ...string) float64 {
	var total float64
	for _, line := range s.lines {
		series, value, ok := strings.Cut(line, " ")
		if !ok || (series != name && !strings.HasPrefix(series, name+"{")) {
			continue
		}
		all := true
		for _, m := range matchers {
			all = all && strings.Contains(series, m)
		}
		if v, err := strconv.ParseFloat(strings.Fields(value)[0], 64); all && err == nil {
			total += v
		}
	}
	return total
}

func (s scrape) has(name string) bool {
	for _, line := range s.lines {
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			return true
		}
	}
	return false
}

var metricName = regexp.MustCompile(`\bcomposer_[a-z0-9_]+`)

// deployMetricNames are the composer_* names in the alert rules'
// expressions and the dashboard's queries; the rules file must parse.
func deployMetricNames(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile("../deploy/prometheus/alerts.yml")
	require.NoError(t, err)
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert, Expr string
				Annotations map[string]string
			}
		}
	}
	require.NoError(t, yaml.Unmarshal(raw, &rules), "alerts.yml parses")
	seen := map[string]bool{}
	var names []string
	add := func(expr string) {
		for _, n := range metricName.FindAllString(expr, -1) {
			if !seen[n] {
				seen[n] = true
				names = append(names, n)
			}
		}
	}
	nrules := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			nrules++
			require.NotEmpty(t, r.Alert)
			require.NotEmpty(t, r.Expr, r.Alert)
			require.Contains(t, r.Annotations["runbook_url"], "OPERATIONS.md#", r.Alert)
			add(r.Expr)
		}
	}
	require.NotZero(t, nrules)
	dash, err := os.ReadFile("../deploy/grafana/composer.json")
	require.NoError(t, err)
	var board struct {
		Panels []struct {
			Targets []struct{ Expr string }
		}
	}
	require.NoError(t, json.Unmarshal(dash, &board), "the dashboard is JSON")
	for _, p := range board.Panels {
		for _, tg := range p.Targets {
			add(tg.Expr)
		}
	}
	return names
}
