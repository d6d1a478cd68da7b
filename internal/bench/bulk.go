package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/internal/lifecycle"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/tenants"
)

// BulkCancel is the bulk-operation scenario.
const BulkCancel = "bulk-cancel"

// runBulkCancel measures a bulk cancel of aRuns running runs of tenant A
// (each parked on a wait node) by the server's bulk runner, and what it
// does to tenant B's latency: B drives chains of two noop steps, four in
// flight, alone (bRuns runs), then again for as long as the job runs.
// Reported: the job's duration and runs cancelled per second, every run
// cancelled exactly once, the progress reports, and B's run latency in
// both phases with their ratio.
func runBulkCancel(ctx context.Context, o Options, rep *Report, aRuns, bRuns int) (Result, error) {
	e, err := setup(ctx, o, nil, nil)
	if err != nil {
		return Result{}, err
	}
	defer e.stop()
	if rep.Machine.CPUs == 0 {
		rep.Machine = machine(ctx, e)
	}
	a, err := tenants.Create(ctx, e.deps.DB, tenants.CreateParams{Name: "bulk", Plan: "enterprise"})
	if err != nil {
		return Result{}, err
	}
	bwf, err := e.workflow(ctx, chainDef(2, noopStep))
	if err != nil {
		return Result{}, err
	}
	awf, err := e.workflowFor(ctx, a.ID, `{"nodes":[{"id":"w","type":"wait","wait":{"signal":"go"}}]}`)
	if err != nil {
		return Result{}, err
	}
	latencies := func(starts map[uuid.UUID]time.Time) Percentiles {
		_, lat := e.chainLatencies(starts, 2)
		return lat
	}
	// B drives in rounds of 20 runs, in both phases.
	rounds := func(stop func() (bool, error), most int) (map[uuid.UUID]time.Time, int, error) {
		all := map[uuid.UUID]time.Time{}
		n := 0
		for {
			done, err := stop()
			if err != nil || done || (most > 0 && n >= most) {
				return all, n, err
			}
			starts, _, err := e.drive(ctx, bwf, 4, 20)
			if err != nil {
				return nil, n, err
			}
			n++
			for k, v := range starts {
				all[k] = v
			}
		}
	}

	// A's runs, from 8 goroutines.
	tStart := time.Now()
	var next atomic.Int64
	errc := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(aRuns) {
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
	startTook := time.Since(tStart)

	// B alone (A's runs exist, nothing is done to them), half before the
	// job and half after it (the machine's noise falls on both phases).
	lifecycle.Sleep(ctx, 2*time.Second)                    // A's starts settle (WAL, vacuum)
	if _, _, err := e.drive(ctx, bwf, 4, 40); err != nil { // warm up
		return Result{}, err
	}
	e.probe.reset()
	soloStarts, _, err := rounds(func() (bool, error) { return false, nil }, max(1, bRuns/40))
	if err != nil {
		return Result{}, err
	}
	soloBefore := latencies(soloStarts)
	soloLat := e.runLatencies(soloStarts)

	e.probe.reset()
	t0 := time.Now()
	op, _, err := e.server.Coordinator.CreateBulkOperation(ctx, a.ID, engine.BulkRequest{Action: engine.BulkCancel,
		Filter: engine.RunFilter{WorkflowID: &awf}, IdempotencyKey: "bench"})
	if err != nil {
		return Result{}, err
	}
	read := func() (engine.BulkOperation, error) {
		var got engine.BulkOperation
		err := e.deps.DB.WithTenant(ctx, a.ID, func(ctx context.Context, tx *pg.Tx) error {
			var err error
			got, err = engine.GetBulkOperation(ctx, tx, op.ID)
			return err
		})
		return got, err
	}
	// B keeps driving, in rounds, while the job runs.
	var jobTook time.Duration
	var got engine.BulkOperation
	during, nRounds, err := rounds(func() (bool, error) {
		var err error
		if got, err = read(); err != nil {
			return false, err
		}
		if got.Status != engine.BulkRunning {
			jobTook = time.Since(t0)
			return true, nil
		}
		return false, nil
	}, 0)
	if err != nil {
		return Result{}, err
	}
	noisy := latencies(during)
	e.probe.reset()
	afterStarts, _, err := rounds(func() (bool, error) { return false, nil }, max(1, bRuns/40))
	if err != nil {
		return Result{}, err
	}
	soloAfter := latencies(afterStarts)
	solo := percentiles(append(soloLat, e.runLatencies(afterStarts)...))
	var cancelled, events int
	if err := e.deps.DB.System().QueryRow(ctx, `SELECT count(*) FROM workflow_runs WHERE tenant_id = $1 AND status = 'cancelled'`, a.ID).Scan(&cancelled); err != nil {
		return Result{}, err
	}
	if err := e.deps.DB.System().QueryRow(ctx, `SELECT count(*) FROM run_events WHERE tenant_id = $1 AND kind = 'cancel_requested'`, a.ID).Scan(&events); err != nil {
		return Result{}, err
	}
	if cancelled != aRuns || events != aRuns || got.Done != int64(aRuns) || got.Matched != int64(aRuns) {
		return Result{}, fmt.Errorf("bulk cancel: %d runs cancelled, %d cancel events, progress %d/%d of %d", cancelled, events, got.Done, got.Matched, aRuns)
	}
	return Result{
		Scenario: BulkCancel, Runs: len(during), Seconds: jobTook.Seconds(), RunLatency: noisy,
		Extra: map[string]any{
			"a_runs_cancelled":        cancelled,
			"a_cancel_events":         events,
			"job_runs_per_sec":        fmt.Sprintf("%.0f", float64(aRuns)/jobTook.Seconds()),
			"job_batches":             (aRuns + engine.BulkBatch - 1) / engine.BulkBatch,
			"a_start_seconds":         fmt.Sprintf("%.1f", startTook.Seconds()),
			"b_solo_run_latency":      solo,
			"b_solo_before_p99_ms":    soloBefore.P99,
			"b_solo_after_p99_ms":     soloAfter.P99,
			"b_p50_vs_solo":           fmt.Sprintf("%.2fx", noisy.P50/solo.P50),
			"b_p99_vs_solo":           fmt.Sprintf("%.2fx", noisy.P99/solo.P99),
			"b_runs_during_the_job":   len(during),
			"b_rounds_during_the_job": nRounds,
		},
	}, nil
}

// runLatencies are the runs' start-to-end times, as the probe saw them.
func (e *env) runLatencies(starts map[uuid.UUID]time.Time) []time.Duration {
	e.probe.mu.Lock()
	defer e.probe.mu.Unlock()
	var out []time.Duration
	for run, st := range starts {
		if end, ok := e.probe.ends[run]; ok {
			out = append(out, end.Sub(st))
		}
	}
	return out
}
