package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/sdk/worker"
	"github.com/composer-dev/composer/tenants"
	"github.com/composer-dev/composer/workers"
)

func setLimits(t *testing.T, sys *apptest.System, tenant uuid.UUID, l tenants.Limits) {
	require.NoError(t, tenants.Update(context.Background(), sys.Deps.DB, tenant, tenants.UpdateParams{Limits: &l}))
}

// runningNow counts the tenant's tasks holding a live lease: what the quota
// bounds. (A task whose lease expired, its worker stalled or gone, stays
// 'running' until its report or the sweeper; its permit has lapsed, and
// the task will run again elsewhere.)
func runningNow(t *testing.T, sys *apptest.System, tenant uuid.UUID) int {
	var n int
	require.NoError(t, sys.Deps.DB.System().QueryRow(context.Background(),
		`SELECT count(*) FROM task_instances WHERE tenant_id = $1 AND state = 'running' AND lease_expires_at > now()`, tenant).Scan(&n))
	return n
}

// TestQuotaHoldsAcrossWorkers: a tenant limited to 5 running tasks, 200
// queued, four workers with 8 slots each: never more than 5 run at any
// sampled instant, and all 200 finish — whether the platform's workers run
// the steps (reading the streams themselves) or the tenant's own SDK
// workers do (served by polls).
func TestQuotaHoldsAcrossWorkers(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"platform", "sdk"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			quotaHoldsAcrossWorkers(t, kind)
		})
	}
}

func quotaHoldsAcrossWorkers(t *testing.T, kind string) {
	sys := apptest.Start(t)
	setLimits(t, sys, sys.Tenant, tenants.Limits{MaxRunningTasks: 5})
	var inFlight, peak atomic.Int32
	work := func() {
		n := inFlight.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(25 * time.Millisecond)
		inFlight.Add(-1)
	}
	node := `{"id":"w","type":"noop"}`
	if kind == "sdk" {
		node = `{"id":"w","type":"task","task":{"handler":"work"}}`
	}
	wf := sys.Workflow(`{"nodes":[` + node + `]}`)
	// All 200 are queued before any worker starts, and the sampler runs
	// from before the first grant, so it watches the whole drain (on a
	// loaded machine the starts alone can outlast the work).
	var runs []uuid.UUID
	for i := 0; i < 200; i++ {
		runs = append(runs, sys.StartRun(wf, `{}`))
	}
	stop := make(chan struct{})
	var samples, busy, maxSeen int
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			n := runningNow(t, sys, sys.Tenant)
			samples++
			if n > 0 {
				busy++
			}
			maxSeen = max(maxSeen, n)
			time.Sleep(2 * time.Millisecond)
		}
	}()
	for i := 0; i < 4; i++ {
		if kind == "sdk" {
			sys.StartSDKWorker(func(w *worker.Worker) {
				w.HandleRaw("work", func(context.Context, json.RawMessage) (json.RawMessage, error) { work(); return nil, nil })
			}, apptest.SDKWorkerOptions{})
			continue
		}
		sys.StartWorker(apptest.WorkerOptions{Noop: workers.ExecutorFunc(func(context.Context, workers.Task) (json.RawMessage, error) {
			work()
			return json.RawMessage(`{}`), nil
		})})
	}
	for _, id := range runs {
		run, _ := sys.WaitRun(id, 60*time.Second)
		require.Equal(t, "completed", run.Status)
	}
	close(stop)
	wg.Wait()
	t.Logf("%d database samples (%d with tasks running), at most %d running; at most %d executing at once", samples, busy, maxSeen, peak.Load())
	assert.LessOrEqual(t, maxSeen, 5, "the quota held in the database")
	assert.LessOrEqual(t, int(peak.Load()), 5, "and on the workers")
	assert.GreaterOrEqual(t, busy, 10, "the sampler saw the quota in use")
}

// TestSlotsOfAKilledWorkerComeBackWithinTheLeaseTTL: a worker process
// holding the tenant's whole quota is SIGKILLed; the quota is usable again
// within the lease TTL.
func TestSlotsOfAKilledWorkerComeBackWithinTheLeaseTTL(t *testing.T) {
	t.Parallel()
	bin := apptest.Binary(t)
	sys := apptest.Start(t)
	setLimits(t, sys, sys.Tenant, tenants.Limits{MaxRunningTasks: 3})
	var calls atomic.Int32
	hang := make(chan struct{})
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= 3 {
			select { // the killed worker's three calls never finish
			case <-hang:
			case <-r.Context().Done():
			}
			return
		}
		_, _ = w.Write([]byte(`{}`))
	}))
	defer sink.Close()
	defer close(hang)
	wf := sys.Workflow(fmt.Sprintf(`{"nodes":[{"id":"h","type":"http","http":{"method":"POST","url":"%s"},"retry":{"max_attempts":5}}]}`, sink.URL))
	var runs []uuid.UUID
	for i := 0; i < 6; i++ {
		runs = append(runs, sys.StartRun(wf, `{}`))
	}
	cmd := exec.Command(bin, "worker", "--concurrency", "8")
	cmd.Env = sys.ProcessEnv()
	require.NoError(t, cmd.Start())
	apptest.Eventually(t, "the worker to hold the whole quota", 20*time.Second, func() bool { return calls.Load() >= 3 })
	require.Equal(t, 3, runningNow(t, sys, sys.Tenant))
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	killed := time.Now()

	sys.StartWorker(apptest.WorkerOptions{})
	apptest.Eventually(t, "the quota to be usable again", 3*sys.Cfg.LeaseTTL, func() bool { return calls.Load() >= 6 })
	took := time.Since(killed)
	t.Logf("three new executions %s after the kill (lease TTL %s)", took.Round(time.Millisecond), sys.Cfg.LeaseTTL)
	assert.Less(t, took, sys.Cfg.LeaseTTL+time.Second, "slots come back within the lease TTL (plus a sweep)")
	for _, id := range runs {
		run, _ := sys.WaitRun(id, 30*time.Second)
		assert.Equal(t, "completed", run.Status)
	}
}

// TestStartsAreRateLimitedAndRejectionsWriteNothing: a burst beyond the
// tenant's token bucket is RATE_LIMITED with a retry-after hint, and the
// rejected calls leave no run behind.
func TestStartsAreRateLimitedAndRejectionsWriteNothing(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	setLimits(t, sys, sys.Tenant, tenants.Limits{StartsPerSecond: 0.5, StartBurst: 3})
	owner := sys.Token(sys.Tenant, "owner@x", auth.RoleOwner)
	wf := sys.Workflow(`{"nodes":[{"id":"w","type":"wait","wait":{"signal":"never"}}]}`)
	var ok, limited int
	var retryAfter float64
	for i := 0; i < 10; i++ {
		res := sys.GraphQL(owner, `mutation($w: ID!) { startRun(input: {workflowId: $w}) { run { id } } }`, map[string]any{"w": wf.String()})
		switch {
		case len(res.Errors) == 0:
			ok++
		case res.Errors[0].Code() == "RATE_LIMITED":
			limited++
			retryAfter, _ = res.Errors[0].Extensions["retryAfterSeconds"].(float64)
		default:
			t.Fatalf("unexpected error %v", res.Errors)
		}
	}
	assert.Equal(t, 3, ok, "the burst")
	assert.Equal(t, 7, limited)
	assert.GreaterOrEqual(t, retryAfter, 1.0, "a retry-after hint")
	var runs int
	require.NoError(t, sys.Deps.DB.System().QueryRow(context.Background(), `SELECT count(*) FROM workflow_runs WHERE tenant_id = $1`, sys.Tenant).Scan(&runs))
	assert.Equal(t, 3, runs, "rejected starts wrote nothing")
}

// TestQueuedLimitRefusesStarts: a tenant at its queued-task limit gets
// QUOTA_EXCEEDED and nothing is written; an idempotent repeat of an
// admitted start still answers.
func TestQueuedLimitRefusesStarts(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t) // no worker: tasks stay queued
	setLimits(t, sys, sys.Tenant, tenants.Limits{MaxQueuedTasks: 2})
	owner := sys.Token(sys.Tenant, "owner@x", auth.RoleOwner)
	wf := sys.Workflow(`{"nodes":[{"id":"n","type":"noop"}]}`)
	start := func(key string) apptest.GQLResponse {
		return sys.GraphQL(owner, `mutation($w: ID!, $k: String) { startRun(input: {workflowId: $w, idempotencyKey: $k}) { created run { id } } }`,
			map[string]any{"w": wf.String(), "k": key})
	}
	require.Empty(t, start("a").Errors)
	require.Empty(t, start("b").Errors)
	res := start("c")
	assert.Equal(t, []string{"QUOTA_EXCEEDED"}, res.Codes())
	assert.Empty(t, start("a").Errors, "a repeat of an admitted start still returns its run")
	var runs, keys int
	require.NoError(t, sys.Deps.DB.System().QueryRow(context.Background(), `SELECT (SELECT count(*) FROM workflow_runs WHERE tenant_id = $1),
		(SELECT count(*) FROM run_idempotency_keys WHERE tenant_id = $1)`, sys.Tenant).Scan(&runs, &keys))
	assert.Equal(t, 2, runs)
	assert.Equal(t, 2, keys, "the refused start claimed no key")
	var limits struct {
		Tenant struct {
			Limits struct{ MaxQueuedTasks, MaxRunningTasks int }
			Usage  struct{ QueuedTasks int }
		}
	}
	sys.GraphQL(owner, `{ tenant { limits { maxQueuedTasks maxRunningTasks } usage { queuedTasks } } }`, nil).Decode(t, &limits)
	assert.Equal(t, 2, limits.Tenant.Limits.MaxQueuedTasks)
	assert.Equal(t, 100, limits.Tenant.Limits.MaxRunningTasks, "the plan's default where not overridden")
	assert.Equal(t, 2, limits.Tenant.Usage.QueuedTasks)
}

// TestWorkersShareByWeight: two tenants with deep backlogs and weights 1
// and 4 share one worker's slots in proportion to their weights.
func TestWorkersShareByWeight(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	light, err := tenants.Create(ctx, sys.Deps.DB, tenants.CreateParams{Name: "light", Plan: "pro"})
	require.NoError(t, err)
	heavy, err := tenants.Create(ctx, sys.Deps.DB, tenants.CreateParams{Name: "heavy", Plan: "pro"})
	require.NoError(t, err)
	setLimits(t, sys, light.ID, tenants.Limits{Weight: 1})
	setLimits(t, sys, heavy.ID, tenants.Limits{Weight: 4})
	var done [2]atomic.Int32
	h := workers.ExecutorFunc(func(_ context.Context, tk workers.Task) (json.RawMessage, error) {
		time.Sleep(5 * time.Millisecond)
		if tk.Tenant == light.ID {
			done[0].Add(1)
		} else {
			done[1].Add(1)
		}
		return json.RawMessage(`{}`), nil
	})
	for _, tn := range []tenants.Tenant{light, heavy} {
		w, _, err := sys.Coordinator().CreateWorkflow(ctx, tn.ID, "fan", "", []byte(fanOut(400)))
		require.NoError(t, err)
		_, err = sys.Coordinator().StartRun(ctx, tn.ID, engine.StartRun{WorkflowID: w.ID})
		require.NoError(t, err)
	}
	// Let both backlogs reach the streams before the worker starts.
	apptest.Eventually(t, "both backlogs to be published", 20*time.Second, func() bool {
		var n int
		require.NoError(t, sys.Deps.DB.System().QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n))
		return n == 0
	})
	sys.StartWorker(apptest.WorkerOptions{Noop: h, Config: func(c *workers.Config) { c.Concurrency = 4 }})
	apptest.Eventually(t, "300 tasks to run", 30*time.Second, func() bool { return done[0].Load()+done[1].Load() >= 300 })
	l, hv := done[0].Load(), done[1].Load()
	ratio := float64(hv) / float64(max(l, 1))
	t.Logf("after %d tasks: light (weight 1) %d, heavy (weight 4) %d: ratio %.2f", l+hv, l, hv, ratio)
	assert.Positive(t, l, "the light tenant progresses too")
	assert.InDelta(t, 4.0, ratio, 1.5, "shares follow the weights")
}

func fanOut(n int) string {
	nodes := `{"id":"root","type":"noop"}`
	for i := 0; i < n; i++ {
		nodes += fmt.Sprintf(`,{"id":"t%d","type":"noop","depends_on":["root"]}`, i)
	}
	return `{"nodes":[` + nodes + `]}`
}

// TestRerunsAreAdmittedLikeStarts: both rerun modes create work, so both
// go through the start's admission — the queued-task limit and the start
// rate limit — and a refused rerun writes nothing.
func TestRerunsAreAdmittedLikeStarts(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t) // no worker: tasks stay queued
	owner := sys.Token(sys.Tenant, "owner@x", auth.RoleOwner)
	wf := sys.Workflow(`{"nodes":[{"id":"n","type":"noop"}]}`)
	var failed []string
	for range 2 {
		var started struct {
			StartRun struct{ Run struct{ ID string } }
		}
		sys.GraphQL(owner, `mutation($w: ID!) { startRun(input: {workflowId: $w}) { run { id } } }`, map[string]any{"w": wf.String()}).Decode(t, &started)
		failed = append(failed, started.StartRun.Run.ID)
		res := sys.GraphQL(owner, `mutation($id: ID!) { cancelRun(id: $id) { id } }`, map[string]any{"id": started.StartRun.Run.ID})
		require.Empty(t, res.Errors)
	}
	// A queued limit of 1, and one task queued: neither mode may add work.
	setLimits(t, sys, sys.Tenant, tenants.Limits{MaxQueuedTasks: 1})
	require.Empty(t, sys.GraphQL(owner, `mutation($w: ID!) { startRun(input: {workflowId: $w}) { run { id } } }`, map[string]any{"w": wf.String()}).Errors)
	for _, mode := range []string{"FROM_FAILED", "AS_NEW"} {
		res := sys.GraphQL(owner, `mutation($id: ID!, $m: RerunMode) { rerunRun(id: $id, mode: $m) { id status } }`, map[string]any{"id": failed[0], "m": mode})
		assert.Equal(t, []string{"QUOTA_EXCEEDED"}, res.Codes(), "a %s rerun over the queued limit", mode)
	}
	var runs, pending int
	require.NoError(t, sys.Deps.DB.System().QueryRow(context.Background(), `SELECT (SELECT count(*) FROM workflow_runs WHERE tenant_id = $1),
		(SELECT count(*) FROM task_instances WHERE tenant_id = $1 AND state = 'pending')`, sys.Tenant).Scan(&runs, &pending))
	assert.Equal(t, 3, runs, "the refused reruns wrote nothing")
	assert.Equal(t, 1, pending)

	// The start rate limit: at 0.01 per second with a burst of 2, reruns
	// soon answer RATE_LIMITED (the first ones may be refused for other
	// reasons: the queued limit still holds). The limiter reads limits
	// through a cache of a few seconds, so the new ones apply shortly.
	setLimits(t, sys, sys.Tenant, tenants.Limits{StartsPerSecond: 0.01, StartBurst: 2, MaxQueuedTasks: 1})
	limited := 0
	apptest.Eventually(t, "reruns to be rate limited", 20*time.Second, func() bool {
		res := sys.GraphQL(owner, `mutation($id: ID!) { rerunRun(id: $id, mode: FROM_FAILED) { id } }`, map[string]any{"id": failed[1]})
		if slices.Equal(res.Codes(), []string{"RATE_LIMITED"}) {
			limited++
		}
		return limited >= 2
	})
}
