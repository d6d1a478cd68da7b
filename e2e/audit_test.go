package e2e

import (
	"context"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/apptest"
)

// TestAuditVerifyCommand: `composer audit verify --tenant` accepts an
// intact chain and prints its head, accepts that head as an anchor, and
// exits 1 naming the seq of a tampered record; without the audit key it
// refuses to verify at all.
func TestAuditVerifyCommand(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	owner := sys.Token(sys.Tenant, "owner@x", auth.RoleOwner)
	for _, q := range []string{"a", "b", "c"} {
		require.Empty(t, sys.GraphQL(owner, `mutation($q: String!) { pauseQueue(queue: $q) { queue } }`, map[string]any{"q": q}).Errors)
	}
	verifyWith := func(env []string, args ...string) (string, error) {
		cmd := exec.Command(apptest.Binary(t), append([]string{"audit", "verify", "--tenant", sys.Tenant.String()}, args...)...)
		cmd.Env = append(append(sys.ProcessEnv(), "COMPOSER_LOG_LEVEL=warn"), env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	verify := func(args ...string) (string, error) { return verifyWith(nil, args...) }
	out, err := verify()
	require.NoError(t, err, out)
	assert.Contains(t, out, "valid: 3 records, seq 1 to 3")
	head := regexp.MustCompile(`head: (3:[0-9a-f]{64})`).FindStringSubmatch(out)
	require.Len(t, head, 2, out)
	out, err = verify("--anchor", head[1])
	require.NoError(t, err, out)
	out, err = verify("--anchor", "3:"+strings.Repeat("0", 64))
	require.Error(t, err, out)
	assert.Contains(t, out, "BROKEN at seq 3")
	out, err = verifyWith([]string{"COMPOSER_AUDIT_KEY="})
	require.Error(t, err, out)
	assert.Contains(t, out, "COMPOSER_AUDIT_KEY is not set")

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

// TestServerRefusesToStartWithoutAnAuditKey: outside development mode a
// server without COMPOSER_AUDIT_KEY exits at once, saying what to set.
func TestServerRefusesToStartWithoutAnAuditKey(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	// (A guard only: a server that did start would otherwise run forever.)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, apptest.Binary(t), "server")
	cmd.Env = append(sys.ProcessEnv(), "COMPOSER_HTTP_ADDR=127.0.0.1:0", "COMPOSER_DEV=false", "COMPOSER_AUDIT_KEY=")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, string(out))
	assert.Contains(t, string(out), "COMPOSER_AUDIT_KEY is not set")
	assert.Contains(t, string(out), "openssl rand -base64 32")
}
