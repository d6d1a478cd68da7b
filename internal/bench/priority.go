package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/composer-dev/composer/tenants"
	"github.com/composer-dev/composer/workers"
)

// PriorityBacklog is the priorities scenario.
const PriorityBacklog = "priority-backlog"

// runPriorityBacklog measures what a backlog of low-priority steps does
// to a high-priority run of the same tenant. Runs of a two-step chain (20
// ms steps) at priority 2 run alone, k in flight; then the tenant enqueues
// backlog steps of 200 ms at priority -2 (runs of 100 independent steps),
// enough to keep every one of the worker's 16 slots busy for about a
// minute, and the priority-2 runs go again while it drains. Without
// priorities each of them would wait behind the whole backlog. Reported:
// the high-priority runs' start-to-finish latency in both phases and the
// ratio (same run), the backlog when they started and finished.
func runPriorityBacklog(ctx context.Context, o Options, rep *Report, backlog, runs int) (Result, error) {
	const stepTime, backlogStepTime, slots, k = 20 * time.Millisecond, 200 * time.Millisecond, 16, 2
	e, err := setup(ctx, o, func(c *workers.Config) { c.Concurrency = slots }, timedNoops(stepTime, backlogStepTime))
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
	hwf, err := e.workflowFor(ctx, e.tenant, chainDef(2, noopStep))
	if err != nil {
		return Result{}, err
	}
	const width = 100
	var nodes []string
	for i := range width {
		nodes = append(nodes, fmt.Sprintf(`{"id":"t%d","type":"noop","input":{"slow":"true"}}`, i))
	}
	lwf, err := e.workflowFor(ctx, e.tenant, `{"nodes":[`+strings.Join(nodes, ",")+`]}`)
	if err != nil {
		return Result{}, err
	}
	// drive keeps k priority-2 runs in flight until total have finished.
	drive := func(total int) (map[uuid.UUID]time.Time, error) {
		return e.driveSpread(ctx, func(int) tw { return tw{tenant: e.tenant, wf: hwf, priority: 2} }, k, total)
	}
	latencies := func(starts map[uuid.UUID]time.Time) Percentiles {
		_, lat := e.chainLatencies(starts, 2)
		return lat
	}
	if _, err := drive(10); err != nil { // warm up
		return Result{}, err
	}
	soloStarts, err := drive(runs)
	if err != nil {
		return Result{}, err
	}
	solo := latencies(soloStarts)

	tFill := time.Now()
	for range max(1, backlog/width) {
		if _, _, err := e.startRunAt(ctx, e.tenant, lwf, -2); err != nil {
			return Result{}, fmt.Errorf("the backlog's starts: %w", err)
		}
	}
	fillTook := time.Since(tFill)
	backlogAtStart, err := e.backlog(ctx, e.tenant)
	if err != nil {
		return Result{}, err
	}
	t0 := time.Now()
	busyStarts, err := drive(runs)
	if err != nil {
		return Result{}, err
	}
	took := time.Since(t0)
	busy := latencies(busyStarts)
	backlogAtEnd, err := e.backlog(ctx, e.tenant)
	if err != nil {
		return Result{}, err
	}
	return Result{
		Scenario: PriorityBacklog, Steps: runs * 2, Runs: runs, Seconds: took.Seconds(),
		StepsPerSec: float64(runs*2) / took.Seconds(), RunLatency: busy,
		Extra: map[string]any{
			"high_idle_run_latency":         solo,
			"high_p50_vs_idle":              fmt.Sprintf("%.2fx", busy.P50/solo.P50),
			"high_p99_vs_idle":              fmt.Sprintf("%.2fx", busy.P99/solo.P99),
			"low_backlog_when_high_started": backlogAtStart,
			"low_backlog_when_high_ended":   backlogAtEnd,
			"low_steps_enqueued":            max(1, backlog/width) * width,
			"low_enqueue_seconds":           fmt.Sprintf("%.1f", fillTook.Seconds()),
			"worker_slots":                  slots,
			"high_step_ms":                  stepTime.Milliseconds(),
			"low_step_ms":                   backlogStepTime.Milliseconds(),
			"priorities":                    "high 2, backlog -2",
		},
	}, nil
}
