package e2e

import (
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/testenv"
)

func status(url string) int {
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestReadinessGoesRedBeforeTheListenerDrains sends SIGTERM to a real
// process: /readyz answers 503 at once while /healthz stays 200 and the
// listener keeps serving for COMPOSER_DRAIN_DELAY; then the process exits.
func TestReadinessGoesRedBeforeTheListenerDrains(t *testing.T) {
	t.Parallel()
	const delay = 3 * time.Second
	base, cmd := startDev(t, testenv.New(t), "COMPOSER_DRAIN_DELAY="+delay.String())
	require.Equal(t, 200, status(base+"/readyz"))
	exited := make(chan error, 1)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	sent := time.Now()
	go func() { exited <- cmd.Wait() }()
	apptest.Eventually(t, "/readyz to answer 503", delay, func() bool { return status(base+"/readyz") == 503 })
	// While draining: not ready, alive, serving.
	for time.Since(sent) < delay-time.Second {
		require.Equal(t, 503, status(base+"/readyz"))
		require.Equal(t, 200, status(base+"/healthz"), "healthz stays green while draining")
		select {
		case err := <-exited:
			t.Fatalf("the process exited %s after SIGTERM, before the drain delay: %v", time.Since(sent), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	select {
	case err := <-exited:
		assert.NoError(t, err)
		assert.GreaterOrEqual(t, time.Since(sent), delay)
	case <-time.After(delay + 30*time.Second):
		t.Fatal("the process did not exit after the drain delay")
	}
}
