package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/composer-dev/composer/tenants"
	"github.com/composer-dev/composer/workers"
)

// NoisyNeighbour is the tenant-isolation scenario.
const NoisyNeighbour = "noisy-neighbour"

// fanWidth is how many independent tasks each of the noisy tenant's runs has.
const fanWidth = 400

// runNoisyNeighbour measures what a tenant flooding the system does to
// another tenant's latency. Tenant B runs bRuns small runs (a chain of two
// 50 ms tasks, four in flight) alone; then tenant A enqueues aTasks tasks
// of 500 ms (runs of 400 parallel tasks), enough to keep every slot of the
// shared worker pool (32) busy for over five minutes, and B runs again
// while A's backlog drains. Without fair scheduling B's tasks would queue
// behind A's. Both tenants are on the same plan, so nothing but the scheduler's
// fairness and A's quota protects B. Reported: B's run latency in both
// phases and their ratio, and A's backlog and throughput while B ran.
func runNoisyNeighbour(ctx context.Context, o Options, rep *Report, aTasks, bRuns int) (Result, error) {
	const taskTime, slowTaskTime = 50 * time.Millisecond, 500 * time.Millisecond
	// The steps are noop nodes the executor gives a duration: the
	// platform's scheduler is what is measured.
	e, err := setup(ctx, o, func(c *workers.Config) { c.Concurrency = 32 }, timedNoops(taskTime, slowTaskTime))
	if err != nil {
		return Result{}, err
	}
	defer e.stop()
	if rep.Machine.CPUs == 0 {
		rep.Machine = machine(ctx, e)
	}
	if err := tenants.Update(ctx, e.deps.DB, e.tenant, tenants.UpdateParams{Plan: "pro"}); err != nil {
		return Result{}, err
	}
	a, err := tenants.Create(ctx, e.deps.DB, tenants.CreateParams{Name: "noisy", Plan: "pro", StreamShards: 4})
	if err != nil {
		return Result{}, err
	}
	task := func(int) string { return `"type":"noop"` }
	bwf, err := e.workflowFor(ctx, e.tenant, chainDef(2, task))
	if err != nil {
		return Result{}, err
	}
	latencies := func(starts map[uuid.UUID]time.Time) Percentiles {
		_, lat := e.chainLatencies(starts, 2)
		return lat
	}

	if _, _, err := e.drive(ctx, bwf, 4, 8); err != nil { // warm up
		return Result{}, err
	}
	soloStarts, _, err := e.drive(ctx, bwf, 4, bRuns)
	if err != nil {
		return Result{}, err
	}
	solo := latencies(soloStarts)

	// A enqueues aTasks tasks: runs of 400 independent tasks, from two
	// goroutines. The workers start on them at once.
	var nodes []string
	for i := range fanWidth {
		nodes = append(nodes, fmt.Sprintf(`{"id":"t%d","type":"noop","input":{"slow":"true"}}`, i))
	}
	awf, err := e.workflowFor(ctx, a.ID, `{"nodes":[`+strings.Join(nodes, ",")+`]}`)
	if err != nil {
		return Result{}, err
	}
	floodRuns := max(1, aTasks/fanWidth)
	var next atomic.Int64
	errc := make(chan error, 2)
	tFlood := time.Now()
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(floodRuns) {
				if _, _, err := e.startRun(ctx, a.ID, awf); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return Result{}, fmt.Errorf("tenant A's starts: %w", err)
	}
	floodTook := time.Since(tFlood)
	backlogAtStart, err := e.backlog(ctx, a.ID)
	if err != nil {
		return Result{}, err
	}
	doneBefore, err := e.finishedTasks(ctx, a.ID)
	if err != nil {
		return Result{}, err
	}
	t0 := time.Now()
	noisyStarts, took, err := e.drive(ctx, bwf, 4, bRuns)
	if err != nil {
		return Result{}, err
	}
	noisy := latencies(noisyStarts)
	doneAfter, err := e.finishedTasks(ctx, a.ID)
	if err != nil {
		return Result{}, err
	}
	backlogAtEnd, err := e.backlog(ctx, a.ID)
	if err != nil {
		return Result{}, err
	}
	elapsed := time.Since(t0).Seconds()
	return Result{
		Scenario: NoisyNeighbour, Steps: bRuns * 2, Runs: bRuns, Seconds: took.Seconds(),
		StepsPerSec: float64(bRuns*2) / took.Seconds(), RunLatency: noisy,
		Extra: map[string]any{
			"b_solo_run_latency":        solo,
			"b_p50_vs_solo":             fmt.Sprintf("%.2fx", noisy.P50/solo.P50),
			"b_p99_vs_solo":             fmt.Sprintf("%.2fx", noisy.P99/solo.P99),
			"a_backlog_when_b_started":  backlogAtStart,
			"a_backlog_when_b_finished": backlogAtEnd,
			"a_tasks_per_sec_during_b":  fmt.Sprintf("%.0f", float64(doneAfter-doneBefore)/elapsed),
			"worker_slots":              32,
			"b_task_ms":                 taskTime.Milliseconds(),
			"a_task_ms":                 slowTaskTime.Milliseconds(),
			"a_tasks_enqueued":          floodRuns * fanWidth,
			"a_enqueue_seconds":         fmt.Sprintf("%.1f", floodTook.Seconds()),
		},
	}, nil
}

// timedNoops runs noop steps for d, or for slow when their input says
// {"slow": true}, recording each start with the probe.
func timedNoops(d, slow time.Duration) func(*probe) map[string]workers.Executor {
	return func(p *probe) map[string]workers.Executor {
		return map[string]workers.Executor{"noop": workers.ExecutorFunc(func(ctx context.Context, t workers.Task) (json.RawMessage, error) {
			p.started(t.Run, t.NodeID)
			wait := d
			var in struct{ Slow bool }
			_ = json.Unmarshal(t.Input, &in)
			if in.Slow {
				wait = slow
			}
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return json.RawMessage(`{}`), nil
		})}
	}
}

// backlog counts a tenant's tasks waiting for a worker.
func (e *env) backlog(ctx context.Context, tenant uuid.UUID) (int, error) {
	var n int
	err := e.deps.DB.System().QueryRow(ctx, `SELECT count(*) FROM task_instances WHERE tenant_id = $1 AND state = 'pending'`, tenant).Scan(&n)
	return n, err
}

// finishedTasks counts a tenant's completed tasks.
func (e *env) finishedTasks(ctx context.Context, tenant uuid.UUID) (int, error) {
	var n int
	err := e.deps.DB.System().QueryRow(ctx, `SELECT count(*) FROM task_instances WHERE tenant_id = $1 AND state = 'completed'`, tenant).Scan(&n)
	return n, err
}
