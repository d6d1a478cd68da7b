package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/composer-dev/composer/engine/stream"
	"github.com/composer-dev/composer/tenants"
	"github.com/composer-dev/composer/workers"
)

// BacklogAtQuota is the waiting-backlog scenario.
const BacklogAtQuota = "backlog-at-quota"

// runBacklogAtQuota holds a tenant at its running quota (4 tasks at once,
// 200 ms each) with 100,000 tasks queued behind it, for hold, with the
// default sweep settings, and measures what waiting costs: tasks
// dispatched again (there must be none: every message is still in its
// stream), stream entries against pending tasks, timeline rows written by
// re-dispatch, and Redis memory.
func runBacklogAtQuota(ctx context.Context, o Options, rep *Report, tasks int, hold time.Duration) (Result, error) {
	e, err := setup(ctx, o, func(c *workers.Config) { c.Concurrency = 16 }, timedNoops(200*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		return Result{}, err
	}
	defer e.stop()
	if rep.Machine.CPUs == 0 {
		rep.Machine = machine(ctx, e)
	}
	if err := tenants.Update(ctx, e.deps.DB, e.tenant, tenants.UpdateParams{Limits: &tenants.Limits{MaxRunningTasks: 4}}); err != nil {
		return Result{}, err
	}
	var nodes []string
	for i := range fanWidth {
		nodes = append(nodes, fmt.Sprintf(`{"id":"t%d","type":"noop"}`, i))
	}
	wf, err := e.workflow(ctx, `{"nodes":[`+strings.Join(nodes, ",")+`]}`)
	if err != nil {
		return Result{}, err
	}
	t0 := time.Now()
	for range max(1, tasks/fanWidth) {
		if _, _, err := e.startRun(ctx, e.tenant, wf); err != nil {
			return Result{}, err
		}
	}
	enqueue := time.Since(t0)
	// Wait until the outbox has published everything: then every pending
	// task has its message and waits only for the quota.
	for {
		var n int
		if err := e.deps.DB.System().QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n); err != nil {
			return Result{}, err
		}
		if n == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	count := func(q string) (int, error) {
		var n int
		err := e.deps.DB.System().QueryRow(ctx, q, e.tenant).Scan(&n)
		return n, err
	}
	redisMemory := func() int64 {
		info, _ := e.deps.Redis.Info(ctx, "memory").Result()
		for _, l := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "used_memory:"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		return 0
	}
	doneBefore, err := e.finishedTasks(ctx, e.tenant)
	if err != nil {
		return Result{}, err
	}
	memBefore := redisMemory()
	time.Sleep(hold)
	redispatched, err := count(`SELECT count(*) FROM run_events WHERE tenant_id = $1 AND kind = 'redispatched'`)
	if err != nil {
		return Result{}, err
	}
	pending, err := e.backlog(ctx, e.tenant)
	if err != nil {
		return Result{}, err
	}
	doneAfter, err := e.finishedTasks(ctx, e.tenant)
	if err != nil {
		return Result{}, err
	}
	names := stream.NewNames(e.cfg.RedisNamespace)
	var entries int64
	for s := range 4 {
		n, err := e.deps.Redis.XLen(ctx, names.Stream(e.tenant, "default", s)).Result()
		if err != nil {
			return Result{}, err
		}
		entries += n
	}
	return Result{
		Scenario: BacklogAtQuota, Steps: doneAfter - doneBefore, Seconds: hold.Seconds(),
		StepsPerSec: float64(doneAfter-doneBefore) / hold.Seconds(),
		Extra: map[string]any{
			"tasks_queued":              tasks,
			"enqueue_seconds":           fmt.Sprintf("%.1f", enqueue.Seconds()),
			"held_seconds":              hold.Seconds(),
			"running_quota":             4,
			"sweep_interval":            e.cfg.SweepInterval.String(),
			"lost_dispatch_age":         e.cfg.LostDispatchAge.String(),
			"redispatched":              redispatched,
			"pending_tasks_at_end":      pending,
			"stream_entries_at_end":     entries,
			"redis_memory_growth_bytes": redisMemory() - memBefore,
		},
	}, nil
}
