package e2e

import (
	"net/http"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/testenv"
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
