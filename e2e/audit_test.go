package e2e

import (
	"context"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/apptest"
)

// TestAuditVerifyCommand: `composer audit verify --tenant` accepts an
// intact chain and exits 1 naming the seq of a tampered record.
func TestAuditVerifyCommand(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	owner := sys.Token(sys.Tenant, "owner@x", auth.RoleOwner)
	for _, q := range []string{"a", "b", "c"} {
		require.Empty(t, sys.GraphQL(owner, `mutation($q: String!) { pauseQueue(queue: $q) { queue } }`, map[string]any{"q": q}).Errors)
	}
	verify := func() (string, error) {
		cmd := exec.Command(apptest.Binary(t), "audit", "verify", "--tenant", sys.Tenant.String())
		cmd.Env = append(sys.ProcessEnv(), "COMPOSER_LOG_LEVEL=warn")
		out, err := cmd.Output()
		return string(out), err
	}
	out, err := verify()
	require.NoError(t, err, out)
	assert.Contains(t, out, "valid: 3 records, seq 1 to 3")

	ctx := context.Background()
	tx, err := sys.Env.Owner(t).Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SELECT set_config('app.tenant_id', $1, true)", sys.Tenant.String())
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE audit_log SET target_id = 'z' WHERE seq = 2`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	out, err = verify()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, out)
	assert.Equal(t, 1, exit.ExitCode())
	assert.Contains(t, out, "BROKEN at seq 2")
}
