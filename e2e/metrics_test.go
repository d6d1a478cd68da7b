package e2e

import (
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/testenv"
)

// TestMetricsEndpointHasFleetFiguresWithoutTenantLabels scrapes a real
// `composer dev` process after it parked a run: the fleet gauges and the
// transition counters are there, and no series carries a tenant id.
func TestMetricsEndpointHasFleetFiguresWithoutTenantLabels(t *testing.T) {
	t.Parallel()
	admin := freeAddr(t)
	base, _ := startDev(t, testenv.New(t), "COMPOSER_ADMIN_ADDR="+admin)
	post := func(path, body string) {
		resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode, path)
	}
	post("/v1/dev/workflows", `{"name":"parked","definition":{"nodes":[{"id":"w","type":"wait","wait":{"signal":"never"}}]}}`)
	post("/v1/dev/runs", `{"workflow":"parked"}`)

	// Fleet figures are the operator's: not on the public listener.
	if resp, err := http.Get(base + "/metrics"); assert.NoError(t, err) {
		resp.Body.Close()
		assert.Equal(t, http.StatusNotFound, resp.StatusCode, "no /metrics on the public listener")
	}
	scrape := func() string {
		resp, err := http.Get("http://" + admin + "/metrics")
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return string(b)
	}
	running := regexp.MustCompile(`(?m)^composer_runs_running(\{[^}]*\})? 1$`)
	var body string
	apptest.Eventually(t, "the parked run in the gauges", 30*time.Second, func() bool {
		body = scrape()
		return running.MatchString(body)
	})
	assert.Regexp(t, `(?m)^composer_tasks_queued(\{[^}]*\})? \d+$`, body)
	assert.Regexp(t, `(?m)^composer_tasks_running(\{[^}]*\})? \d+$`, body)
	assert.Regexp(t, `(?m)^composer_tenants_at_quota(\{[^}]*\})? 0$`, body)
	assert.Regexp(t, `(?m)^composer_transitions_total\{[^}]*event="[a-z_]+"[^}]*\} [1-9]`, body)
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		assert.NotContains(t, strings.ToLower(line), "tenant_id", "no tenant ids as labels")
		assert.NotRegexp(t, `[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-`, line, "no uuids in label values")
	}
}
