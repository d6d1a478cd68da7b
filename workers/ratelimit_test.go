package workers_test

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/tenants"
)

// maxInWindow is the most times in any window [t, t+w).
func maxInWindow(times []time.Time, w time.Duration) int {
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	best, j := 0, 0
	for i := range times {
		for times[i].Sub(times[j]) >= w {
			j++
		}
		best = max(best, i-j+1)
	}
	return best
}

// TestRateLimitHoldsAcrossWorkersAndSpendsNoAttempt: 200 steps of one key
// of a 10/s, burst 20 limit, and 20 of another key, run by two workers
// (each through its own lease calls): the sink sees at most the burst plus
// the rate × the window in any window, the other key is not held up by
// the first, and every step ran on its first attempt.
func TestRateLimitHoldsAcrossWorkersAndSpendsNoAttempt(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	require.NoError(t, tenants.Update(ctx, sys.Deps.DB, sys.Tenant, tenants.UpdateParams{Limits: &tenants.Limits{
		MaxRunningTasks: 1000, MaxQueuedTasks: 100_000, StartsPerSecond: 10_000, StartBurst: 10_000}}))
	require.NoError(t, sys.Deps.DB.WithTenant(ctx, sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		_, err := tenants.CreateRateLimit(ctx, tx, tenants.RateLimit{Name: "partner-api", PerSecond: 10, Burst: 20})
		return err
	}))
	var mu sync.Mutex
	seen := map[string][]time.Time{}
	attempts := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.URL.Query().Get("p")] = append(seen[r.URL.Query().Get("p")], time.Now())
		attempts[r.Header.Get("Composer-Attempt")]++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprint(w, `{"ok": true}`)
	}))
	defer srv.Close()
	sys.StartWorker(apptest.WorkerOptions{})
	sys.StartWorker(apptest.WorkerOptions{})
	a := sys.Workflow(fmt.Sprintf(`{"nodes":[{"id":"call","type":"http","http":{"method":"POST","url":"%s?p=a"},
		"rate_limit":{"name":"partner-api","key":"input.partner"}}]}`, srv.URL))
	b := sys.Workflow(fmt.Sprintf(`{"nodes":[{"id":"call","type":"http","http":{"method":"POST","url":"%s?p=b"},
		"rate_limit":{"name":"partner-api","key":"input.partner"}}]}`, srv.URL))

	const n, rate, burst = 200, 10.0, 20
	start := time.Now()
	var runs []uuid.UUID
	var bStarted time.Time
	for i := range n {
		runs = append(runs, sys.StartRun(a, `{"partner": "acct_a"}`))
		if i == n/2 {
			// Half way through the first key's burst of starts, the other
			// key's 20 steps: its own bucket, so they run at once.
			bStarted = time.Now()
			for range burst {
				runs = append(runs, sys.StartRun(b, `{"partner": "acct_b"}`))
			}
		}
	}
	for _, id := range runs {
		run, tasks := sys.WaitRun(id, 60*time.Second)
		require.Equal(t, "completed", run.Status, "error: %s", run.Error)
		assert.Equal(t, 1, tasks["call"].Attempt, "waiting for the limit spends no attempt")
	}
	elapsed := time.Since(start)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen["a"], n, "each step of key a ran once")
	require.Len(t, seen["b"], burst)
	assert.Equal(t, map[string]int{"1": n + burst}, attempts, "every request was a first attempt")
	// GCRA: in any window w at most burst + rate·w starts (+1 for the
	// start that opens the window; the sink's arrival times add the
	// lease-to-request latency, which may bunch two starts together).
	for _, w := range []time.Duration{100 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 5 * time.Second} {
		got := maxInWindow(seen["a"], w)
		bound := burst + int(math.Ceil(rate*w.Seconds())) + 1
		t.Logf("key a: at most %d requests in any %s window (bound %d)", got, w, bound)
		assert.LessOrEqual(t, got, bound, "window %s", w)
	}
	assert.GreaterOrEqual(t, elapsed, time.Duration(float64(n-burst)/rate*0.9*float64(time.Second)), "the limit held the steps back")
	lastB := slices.MaxFunc(seen["b"], func(x, y time.Time) int { return x.Compare(y) })
	assert.Less(t, lastB.Sub(bStarted), 5*time.Second, "the other key's bucket is its own")
	assert.Positive(t, sys.Coordinator().RateDeferred())
	t.Logf("%d steps of key a in %s; deferred %d times", n, elapsed.Round(time.Millisecond), sys.Coordinator().RateDeferred())
}

// TestARateLimitedStepIsNeverLeasedEagerly: a chain of rate-limited steps
// (one key, 2/s, burst 1) on a worker that offers eager leases: every
// step after the first waits for its token instead of running in the
// reporting worker's slot at once.
func TestARateLimitedStepIsNeverLeasedEagerly(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	require.NoError(t, sys.Deps.DB.WithTenant(ctx, sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		_, err := tenants.CreateRateLimit(ctx, tx, tenants.RateLimit{Name: "slow", PerSecond: 2, Burst: 1})
		return err
	}))
	w, _ := sys.StartWorker(apptest.WorkerOptions{})
	wf := sys.Workflow(`{"nodes":[
		{"id":"a","type":"noop","rate_limit":{"name":"slow"}},
		{"id":"b","type":"noop","depends_on":["a"],"rate_limit":{"name":"slow"}},
		{"id":"c","type":"noop","depends_on":["b"],"rate_limit":{"name":"slow"}},
		{"id":"d","type":"noop","depends_on":["c"],"rate_limit":{"name":"slow"}}]}`)
	start := time.Now()
	run, tasks := sys.WaitRun(sys.StartRun(wf, `{}`), 30*time.Second)
	require.Equal(t, "completed", run.Status)
	assert.GreaterOrEqual(t, time.Since(start), 1400*time.Millisecond, "four tokens at 2/s take 1.5 s")
	assert.Zero(t, w.EagerStarts())
	for _, id := range []string{"a", "b", "c", "d"} {
		assert.Equal(t, 1, tasks[id].Attempt)
	}
}
