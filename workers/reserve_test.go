package workers_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/internal/apptest"
)

// TestLowPrioritiesLeaveASlotToTheTopPriority: a worker of 8 slots whose
// tenant has just run priority-2 work gives its priority -2 backlog at
// most 7 slots, so the next priority-2 step starts at once while every
// backlog step is still running — instead of waiting for one to end —
// and when the backlog's steps end, all of them have run exactly once.
func TestLowPrioritiesLeaveASlotToTheTopPriority(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	release := make(chan struct{})
	var slowNow, slowMax, slowAll atomic.Int64
	var mu sync.Mutex
	seen := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			mu.Lock()
			seen[r.Header.Get("Idempotency-Key")]++
			mu.Unlock()
			n := slowNow.Add(1)
			slowAll.Add(1)
			for m := slowMax.Load(); n > m && !slowMax.CompareAndSwap(m, n); m = slowMax.Load() {
			}
			<-release
			slowNow.Add(-1)
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"ok": true}`)
	}))
	defer srv.Close()
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock()
	sys.StartWorker(apptest.WorkerOptions{})

	high := sys.Workflow(fmt.Sprintf(`{"nodes":[{"id":"fast","type":"http","priority":2,"http":{"method":"POST","url":"%s/fast"}}]}`, srv.URL))
	var nodes []string
	for i := range 20 {
		nodes = append(nodes, fmt.Sprintf(`{"id":"s%d","type":"http","priority":-2,"http":{"method":"POST","url":"%s/slow"}}`, i, srv.URL))
	}
	low := sys.Workflow(`{"nodes":[` + strings.Join(nodes, ",") + `]}`)

	run, _ := sys.WaitRun(sys.StartRun(high, `{}`), 20*time.Second)
	require.Equal(t, "completed", run.Status, "error: %s", run.Error)
	backlog := sys.StartRun(low, `{}`)
	apptest.Eventually(t, "the backlog fills the worker but the reserve", 20*time.Second, func() bool { return slowNow.Load() == 7 })

	run, _ = sys.WaitRun(sys.StartRun(high, `{}`), 20*time.Second)
	require.Equal(t, "completed", run.Status, "the priority-2 step ran while the backlog held its slots: %s", run.Error)
	assert.Equal(t, int64(7), slowNow.Load(), "every backlog step still running")
	assert.Equal(t, int64(7), slowMax.Load(), "the backlog never took the reserved slot")

	unblock()
	run, _ = sys.WaitRun(backlog, 60*time.Second)
	require.Equal(t, "completed", run.Status, "error: %s", run.Error)
	assert.Equal(t, int64(20), slowAll.Load())
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, seen, 20)
	for k, n := range seen {
		assert.Equal(t, 1, n, "step %s ran once", k)
	}
}
