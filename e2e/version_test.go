package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/migrations"
)

// TestVersionAndMigrateStatus runs the binary as an operator would:
// `composer version` names the schema it expects, and `composer migrate
// status` against a migrated database lists every migration applied and
// none pending.
func TestVersionAndMigrateStatus(t *testing.T) {
	t.Parallel()
	bin := apptest.Binary(t)
	out, err := exec.Command(bin, "version").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Regexp(t, fmt.Sprintf(`^composer \S+ \(commit .*, go1\.\S+\), schema %d\n$`, migrations.Latest()), string(out))

	env := testenv.NewPG(t)
	cmd := exec.Command(bin, "migrate", "status")
	cmd.Env = append(os.Environ(), "COMPOSER_MIGRATE_DATABASE_URL="+env.OwnerURL, "COMPOSER_LOG_LEVEL=warn")
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	assert.Contains(t, lines[len(lines)-1], "0 pending")
	assert.Contains(t, lines[len(lines)-1], fmt.Sprintf("expects schema %d", migrations.Latest()))
	for _, l := range lines[:len(lines)-1] {
		assert.Contains(t, l, " applied ", l)
	}
}
