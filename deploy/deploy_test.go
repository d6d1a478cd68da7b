// Package deploy holds the deployment files; this test keeps them valid.
package deploy

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// TestComposeFilesAreValid: both compose files parse with the services
// they promise; the production one runs with development off and holds
// no secret of its own (every one comes from the env file).
func TestComposeFilesAreValid(t *testing.T) {
	for _, f := range []string{"../docker-compose.yml", "docker-compose.prod.yml"} {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		var doc struct {
			Services map[string]map[string]any `yaml:"services"`
		}
		require.NoError(t, yaml.Unmarshal(b, &doc), f)
		for _, s := range []string{"postgres", "redis", "migrate", "server", "worker"} {
			assert.Contains(t, doc.Services, s, "%s has %s", f, s)
		}
	}
	prod, err := os.ReadFile("docker-compose.prod.yml")
	require.NoError(t, err)
	text := string(prod)
	assert.Contains(t, text, `COMPOSER_DEV: "false"`)
	for _, secret := range []string{"COMPOSER_WORKER_TOKEN:", "COMPOSER_WEBHOOK_SECRET_KEY:", "COMPOSER_AUDIT_KEY:", "PASSWORD:", "change-me"} {
		assert.False(t, strings.Contains(text, secret), "the production compose file sets %s itself", secret)
	}
	var doc struct {
		Services map[string]struct {
			Command   []string       `yaml:"command"`
			Restart   string         `yaml:"restart"`
			DependsOn map[string]any `yaml:"depends_on"`
			Deploy    struct {
				Replicas int `yaml:"replicas"`
			} `yaml:"deploy"`
			Volumes []string `yaml:"volumes"`
		} `yaml:"services"`
	}
	require.NoError(t, yaml.Unmarshal(prod, &doc))
	assert.Equal(t, []string{"migrate"}, doc.Services["migrate"].Command)
	assert.Equal(t, "no", doc.Services["migrate"].Restart, "the migration is a job, not a service")
	assert.Contains(t, doc.Services["server"].DependsOn, "migrate", "servers start after the migration")
	assert.Equal(t, 2, doc.Services["server"].Deploy.Replicas)
	assert.GreaterOrEqual(t, doc.Services["worker"].Deploy.Replicas, 1)
	for _, s := range []string{"postgres", "redis"} {
		assert.NotEmpty(t, doc.Services[s].Volumes, "%s keeps its data in a volume", s)
	}
	assert.Contains(t, text, "--appendonly yes", "Redis persists its streams")
	env, err := os.ReadFile("composer.env.example")
	require.NoError(t, err)
	for _, v := range []string{"COMPOSER_WORKER_TOKEN=", "COMPOSER_WEBHOOK_SECRET_KEY=", "COMPOSER_AUDIT_KEY=", "POSTGRES_PASSWORD=", "REDIS_PASSWORD="} {
		assert.Contains(t, string(env), v+"\n", "the example leaves %s empty", v)
	}
}

// TestAlertRulesHaveRunbooks: the alert rules parse as Prometheus rule
// groups, and every alert's runbook_url points at a section of
// docs/OPERATIONS.md that exists. (That every metric they query exists in
// a real scrape is e2e's TestMetricsCountWhatTheyMeasure.)
func TestAlertRulesHaveRunbooks(t *testing.T) {
	b, err := os.ReadFile("prometheus/alerts.yml")
	require.NoError(t, err)
	var doc struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(b, &doc))
	ops, err := os.ReadFile("../docs/OPERATIONS.md")
	require.NoError(t, err)
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(ops), "\n") {
		if h, ok := strings.CutPrefix(line, "### "); ok {
			anchors[strings.ToLower(strings.TrimSpace(h))] = true
		}
	}
	n := 0
	for _, g := range doc.Groups {
		require.NotEmpty(t, g.Name)
		for _, r := range g.Rules {
			n++
			assert.NotEmpty(t, r.Alert)
			assert.Contains(t, r.Expr, "composer_", r.Alert)
			assert.NotEmpty(t, r.Labels["severity"], r.Alert)
			assert.NotEmpty(t, r.Annotations["summary"], r.Alert)
			_, anchor, ok := strings.Cut(r.Annotations["runbook_url"], "OPERATIONS.md#")
			assert.True(t, ok && anchors[anchor], "%s: runbook %q is not a section of docs/OPERATIONS.md", r.Alert, r.Annotations["runbook_url"])
			assert.Equal(t, strings.ToLower(r.Alert), anchor, "the runbook section is named for its alert")
		}
	}
	assert.GreaterOrEqual(t, n, 8)
	dash, err := os.ReadFile("grafana/composer.json")
	require.NoError(t, err)
	var board map[string]any
	require.NoError(t, json.Unmarshal(dash, &board), "the dashboard is JSON")
	assert.NotEmpty(t, board["panels"])
}
