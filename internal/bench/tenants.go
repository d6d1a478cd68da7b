package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/composer-dev/composer/engine/taskapi"
	"github.com/composer-dev/composer/tenants"
	"github.com/composer-dev/composer/workers"
)

// The many-tenants scenarios: the same work spread over 1, 100, 1,000 and
// 10,000 tenants.
const (
	Tenants1 = "tenants-1"
	// Tenants1Stream is one tenant with eager dispatch off: every step
	// through a stream, as every step is when many tenants share workers.
	Tenants1Stream = "tenants-1-stream"
	Tenants100     = "tenants-100"
	Tenants1000    = "tenants-1000"
	Tenants10000   = "tenants-10000"
)

// tenantWorkers and tenantSlots: three workers of 16 slots share the
// work, as a small fleet would.
const tenantWorkers, tenantSlots, tenantInFlight = 3, 16, 32

// runManyTenants runs `runs` two-step noop chains, tenantInFlight at a
// time, the i-th for tenant i mod n, on three workers, and measures steps
// per second, run latency, and the CPU and Redis commands a step costs.
// Then, with every tenant but one quiet, it runs the same chains for that
// one tenant alone: what a busy tenant gets from a system that has served
// n tenants (compared with tenants-1, a fresh system, when both ran).
func runManyTenants(ctx context.Context, o Options, rep *Report, name string, n, runs int, noEager bool) (Result, error) {
	e, err := setup(ctx, o, func(c *workers.Config) { c.Concurrency, c.NoEager = tenantSlots, noEager }, nil)
	if err != nil {
		return Result{}, err
	}
	defer e.stop()
	if rep.Machine.CPUs == 0 {
		rep.Machine = machine(ctx, e)
	}
	// Two more workers like the first.
	wctx, stopWorkers := context.WithCancel(context.Background())
	var wwg sync.WaitGroup
	defer func() { stopWorkers(); wwg.Wait() }()
	for range tenantWorkers - 1 {
		w := workers.New(workers.Config{Queues: []string{"default"}, Concurrency: tenantSlots, Namespace: e.cfg.RedisNamespace, LeaseTTL: 30 * time.Second,
			NoEager: noEager},
			e.deps.Redis, taskapi.NewClient(e.url, e.cfg.WorkerToken), map[string]workers.Executor{"noop": e.probe.recordingNoop()}, o.Log)
		wwg.Add(1)
		go func() { defer wwg.Done(); _ = w.Run(wctx) }()
	}

	// n tenants (the first is the bench tenant), each with the chain.
	all := make([]tw, n)
	def := chainDef(2, noopStep)
	t0 := time.Now()
	var next atomic.Int64
	errc := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				id := e.tenant
				if i > 0 {
					tn, err := tenants.Create(ctx, e.deps.DB, tenants.CreateParams{Name: fmt.Sprintf("t%d", i), Plan: "enterprise", StreamShards: 4})
					if err != nil {
						errc <- err
						return
					}
					id = tn.ID
				}
				wf, err := e.workflowFor(ctx, id, def)
				if err != nil {
					errc <- err
					return
				}
				all[i] = tw{tenant: id, wf: wf}
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return Result{}, fmt.Errorf("creating tenants: %w", err)
	}
	setupTook := time.Since(t0)

	// Phase 1: the runs spread over every tenant.
	spread := func(i int) tw { return all[i%n] }
	if _, err := e.driveSpread(ctx, spread, tenantInFlight, tenantInFlight); err != nil { // warm up
		return Result{}, err
	}
	before, err := e.counters(ctx)
	if err != nil {
		return Result{}, err
	}
	e.probe.reset()
	cpu0 := cpuTime()
	starts, err := e.driveSpread(ctx, spread, tenantInFlight, runs)
	if err != nil {
		return Result{}, err
	}
	took := time.Since(minStart(starts))
	cpu := cpuTime() - cpu0
	steps := 2 * runs
	_, lat := e.chainLatencies(starts, 2)
	r := Result{Scenario: name, Steps: steps, Runs: runs, Seconds: took.Seconds(), StepsPerSec: float64(steps) / took.Seconds(), RunLatency: lat,
		Extra: map[string]any{"tenants": n, "workers": tenantWorkers, "slots_per_worker": tenantSlots, "in_flight": tenantInFlight,
			"cpu_ms_per_step": fmt.Sprintf("%.2f", float64(cpu.Microseconds())/1000/float64(steps)), "setup_seconds": fmt.Sprintf("%.1f", setupTook.Seconds())}}
	if err := e.cost(ctx, before, steps, &r); err != nil {
		return Result{}, err
	}
	if n == 1 {
		return r, nil
	}

	// Phase 2: every tenant but the first goes quiet; the first runs alone,
	// once the others count as quiet to the workers' fairness (no work for
	// 10 s: until then a worker keeps slots back for them and offers no
	// eager dispatch).
	lifecycleWait(ctx, 12*time.Second)
	before, err = e.counters(ctx)
	if err != nil {
		return Result{}, err
	}
	e.probe.reset()
	cpu0 = cpuTime()
	alone := func(int) tw { return all[0] }
	starts, err = e.driveSpread(ctx, alone, tenantInFlight, runs)
	if err != nil {
		return Result{}, err
	}
	aloneTook := time.Since(minStart(starts))
	cpu = cpuTime() - cpu0
	_, aloneLat := e.chainLatencies(starts, 2)
	var ar Result
	if err := e.cost(ctx, before, steps, &ar); err != nil {
		return Result{}, err
	}
	r.Extra["alone_after_steps_per_sec"] = fmt.Sprintf("%.0f", float64(steps)/aloneTook.Seconds())
	r.Extra["alone_after_run_latency"] = aloneLat
	r.Extra["alone_after_cpu_ms_per_step"] = fmt.Sprintf("%.2f", float64(cpu.Microseconds())/1000/float64(steps))
	r.Extra["alone_after_redis_commands_per_step"] = fmt.Sprintf("%.2f", ar.RedisCmdsPerStep)
	return r, nil
}

// tw is a tenant and its workflow.
type tw struct {
	tenant, wf uuid.UUID
	// priority is the run's (engine.StartRun.Priority).
	priority int
}

// driveSpread keeps k runs in flight until total have finished, the i-th
// run for who(i), and returns each run's start time.
func (e *env) driveSpread(ctx context.Context, who func(int) tw, k, total int) (map[uuid.UUID]time.Time, error) {
	var mu sync.Mutex
	starts := map[uuid.UUID]time.Time{}
	var next atomic.Int64
	errc := make(chan error, k)
	var wg sync.WaitGroup
	for range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < total; i = int(next.Add(1) - 1) {
				x := who(i)
				id, st, err := e.startRunAt(ctx, x.tenant, x.wf, x.priority)
				if err != nil {
					errc <- err
					return
				}
				mu.Lock()
				starts[id] = st
				mu.Unlock()
				select {
				case <-e.probe.wait(id):
				case <-time.After(2 * time.Minute):
					errc <- fmt.Errorf("run %s did not finish", id)
					return
				case <-ctx.Done():
					errc <- ctx.Err()
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return nil, err
	}
	return starts, nil
}

func minStart(starts map[uuid.UUID]time.Time) time.Time {
	var first time.Time
	for _, t := range starts {
		if first.IsZero() || t.Before(first) {
			first = t
		}
	}
	return first
}

// unlimitedStarts lifts the bench tenant's start rate and queued-task
// limits out of the way: admission still runs, it just never refuses.
func (e *env) unlimitedStarts(ctx context.Context) error {
	return tenants.Update(ctx, e.deps.DB, e.tenant, tenants.UpdateParams{Limits: &tenants.Limits{StartsPerSecond: 100_000, StartBurst: 100_000,
		MaxQueuedTasks: 10_000_000}})
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func lifecycleWait(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
