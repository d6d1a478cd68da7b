// Package deploy holds the deployment files; this test keeps them valid.
package deploy

import (
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
	for _, secret := range []string{"COMPOSER_WORKER_TOKEN:", "COMPOSER_WEBHOOK_SECRET_KEY:", "PASSWORD:", "change-me"} {
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
	for _, v := range []string{"COMPOSER_WORKER_TOKEN=", "COMPOSER_WEBHOOK_SECRET_KEY=", "POSTGRES_PASSWORD=", "REDIS_PASSWORD="} {
		assert.Contains(t, string(env), v+"\n", "the example leaves %s empty", v)
	}
}
