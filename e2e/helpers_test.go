package e2e

import (
	"context"
	"net/http"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/sdk/client"
)

// startDev runs `composer dev` (server, worker and demo tenant in one
// process) on env's database and namespace, waits until it serves, and
// returns its base URL and process. The process is killed at cleanup
// unless the test killed it.
func startDev(t *testing.T, env *testenv.Env, extraEnv ...string) (string, *exec.Cmd) {
	t.Helper()
	bin := apptest.Binary(t)
	addr := freeAddr(t)
	base := "http://" + addr
	cmd := exec.Command(bin, "dev")
	cmd.Env = append(append((&apptest.System{Cfg: apptest.Config(env), URL: base}).ProcessEnv(), "COMPOSER_HTTP_ADDR="+addr), extraEnv...)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	apptest.Eventually(t, "composer dev to serve", 30*time.Second, func() bool {
		resp, err := http.Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
	return base, cmd
}

// startServer runs a `composer server` process (and, with worker, a
// platform `composer worker` reaching it) on sys's stores, waits until it
// answers, and returns its base URL and an SDK client holding an admin
// API key of sys's tenant, as a tenant's program would hold. The
// processes are killed at cleanup.
func startServer(t *testing.T, sys *apptest.System, worker bool) (string, *client.Client) {
	t.Helper()
	bin := apptest.Binary(t)
	addr := freeAddr(t)
	base := "http://" + addr
	env := append(sys.ProcessEnv(), "COMPOSER_SERVER_URL="+base)
	server := &proc{name: "server", args: []string{"server"}, env: append(env, "COMPOSER_HTTP_ADDR="+addr)}
	server.start(t, bin)
	t.Cleanup(server.kill)
	if worker {
		w := &proc{name: "worker", args: []string{"worker", "--concurrency", "8"}, env: env}
		w.start(t, bin)
		t.Cleanup(w.kill)
	}
	c, err := client.New(base, sys.APIKey(auth.ScopeAdmin))
	require.NoError(t, err)
	apptest.Eventually(t, "the server to answer", 30*time.Second, func() bool {
		_, err := c.Workers(context.Background())
		return err == nil
	})
	return base, c
}
