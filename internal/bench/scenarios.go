package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/engine/outbox"
	"github.com/composer-dev/composer/internal/ssrf"
	"github.com/composer-dev/composer/workers"
)

// Scenario names.
const (
	ChainsK1   = "chains-k1"
	ChainsK16  = "chains-k16"
	ChainsK64  = "chains-k64"
	FanOut     = "fanout-100"
	StartLat   = "start-latency"
	HTTPChains = "http-chains-k16"
	Ceiling    = "sql-ceiling-k16"
	// The same chains and ceiling with eager dispatch off: every step
	// through the outbox, a stream and a lease call.
	ChainsK16Stream = "chains-k16-stream"
	CeilingStream   = "sql-ceiling-k16-stream"
)

// All lists every scenario in the order they run.
var All = []string{ChainsK1, ChainsK16, SDKChainsK1, SDKChainsK16, ChainsK64, FanOut, StartLat, HTTPChains, Ceiling, ChainsK16Stream,
	CeilingStream, GraphQLRuns, NoisyNeighbour, PriorityBacklog, SDKIdle, BacklogAtQuota, Tenants1, Tenants1Stream, Tenants100, Tenants1000, Tenants10000, StartThroughput, EventIngest, BulkCancel, ChainsK16Scraped}

// StepPath are the scenarios a change on the step path is compared on
// (`composer bench -baseline`, `make bench`).
var StepPath = []string{ChainsK1, ChainsK16, ChainsK64, SDKChainsK16, Tenants1000}

// Run runs the selected scenarios and returns the report.
func Run(ctx context.Context, o Options) (Report, error) {
	if o.Scale <= 0 {
		o.Scale = 1
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	want := map[string]bool{}
	for _, s := range o.Scenarios {
		want[s] = true
	}
	rep := Report{When: time.Now().UTC()}
	n := func(x int) int { return max(1, int(float64(x)*o.Scale)) }
	for _, name := range All {
		if len(want) > 0 && !want[name] {
			continue
		}
		o.Log.Info("scenario", zap.String("name", name))
		var r Result
		var err error
		switch name {
		case ChainsK1:
			r, err = runChains(ctx, o, &rep, name, 1, 20, n(600))
		case ChainsK16:
			r, err = runChains(ctx, o, &rep, name, 16, 20, n(6000))
		case SDKChainsK1:
			r, err = chainScenario(ctx, o, &rep, name, 1, 20, n(600), taskStep, 16, nil, nil, true)
		case SDKChainsK16:
			r, err = chainScenario(ctx, o, &rep, name, 16, 20, n(6000), taskStep, 16, nil, nil, true)
		case SDKIdle:
			r, err = runSDKIdle(ctx, o, &rep, 500, 30*time.Second)
		case ChainsK64:
			r, err = runChains(ctx, o, &rep, name, 64, 20, n(6000))
		case FanOut:
			r, err = runFanOut(ctx, o, &rep, n(5))
		case StartLat:
			r, err = runStartLatency(ctx, o, &rep, n(200))
		case HTTPChains:
			r, err = runHTTPChains(ctx, o, &rep, 16, 10, n(2000))
		case Ceiling:
			r, err = runCeiling(ctx, o, &rep, name, true, 16, 20, n(6000))
		case ChainsK16Stream:
			r, err = chainScenario(ctx, o, &rep, name, 16, 20, n(6000), noopStep, 16, nil, func(c *workers.Config) { c.NoEager = true }, false)
		case CeilingStream:
			r, err = runCeiling(ctx, o, &rep, name, false, 16, 20, n(6000))
		case GraphQLRuns:
			r, err = runGraphQLRuns(ctx, o, &rep, n(1_000_000), 300)
		case NoisyNeighbour:
			r, err = runNoisyNeighbour(ctx, o, &rep, n(20_000), n(200))
		case PriorityBacklog:
			r, err = runPriorityBacklog(ctx, o, &rep, n(5000), n(200))
		case BacklogAtQuota:
			r, err = runBacklogAtQuota(ctx, o, &rep, n(100_000), 2*time.Minute)
		case Tenants1:
			r, err = runManyTenants(ctx, o, &rep, name, 1, n(2000), false)
		case EventIngest:
			r, err = runEventIngest(ctx, o, &rep, n(10_000))
		case ChainsK16Scraped:
			r, err = runChainsScraped(ctx, o, &rep, 1_000_000, n(12_000))
		case BulkCancel:
			r, err = runBulkCancel(ctx, o, &rep, n(10_000), n(400))
		case StartThroughput:
			r, err = runStartThroughput(ctx, o, &rep, n(10_000))
		case Tenants1Stream:
			r, err = runManyTenants(ctx, o, &rep, name, 1, n(2000), true)
		case Tenants100:
			r, err = runManyTenants(ctx, o, &rep, name, 100, n(2000), false)
		case Tenants1000:
			r, err = runManyTenants(ctx, o, &rep, name, 1000, n(2000), false)
		case Tenants10000:
			r, err = runManyTenants(ctx, o, &rep, name, 10_000, n(2000), false)
		}
		if err != nil {
			return rep, fmt.Errorf("%s: %w", name, err)
		}
		rep.Results = append(rep.Results, r)
	}
	// Each scenario is compared with the ceiling of its own dispatch path.
	ceilings := map[string]float64{}
	for _, r := range rep.Results {
		if r.Scenario == Ceiling || r.Scenario == CeilingStream {
			ceilings[r.Scenario] = r.StepsPerSec
		}
	}
	for i := range rep.Results {
		r := &rep.Results[i]
		ceiling := ceilings[Ceiling]
		if strings.HasSuffix(r.Scenario, "-stream") {
			ceiling = ceilings[CeilingStream]
		}
		if ceiling > 0 && r.Scenario != Ceiling && r.Scenario != CeilingStream && r.Steps > 0 {
			if r.Extra == nil {
				r.Extra = map[string]any{}
			}
			r.Extra["of_ceiling"] = fmt.Sprintf("%.0f%%", 100*r.StepsPerSec/ceiling)
		}
	}
	// Tenant workers against the platform's, in the same run.
	byName := map[string]Result{}
	for _, r := range rep.Results {
		byName[r.Scenario] = r
	}
	for i := range rep.Results {
		r := &rep.Results[i]
		if base, ok := byName[strings.TrimPrefix(r.Scenario, "sdk-")]; ok && r.Scenario != base.Scenario && base.StepsPerSec > 0 {
			if r.Extra == nil {
				r.Extra = map[string]any{}
			}
			r.Extra["vs_"+base.Scenario] = fmt.Sprintf("%.2fx", r.StepsPerSec/base.StepsPerSec)
		}
	}
	if o.Out != "" {
		if err := rep.Save(o.Out); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

func chainDef(length int, step func(i int) string) string {
	var nodes []string
	for i := 0; i < length; i++ {
		deps := "[]"
		if i > 0 {
			deps = fmt.Sprintf(`["n%d"]`, i-1)
		}
		nodes = append(nodes, fmt.Sprintf(`{"id":"n%d",%s,"depends_on":%s}`, i, step(i), deps))
	}
	return `{"nodes":[` + strings.Join(nodes, ",") + `]}`
}

func noopStep(int) string { return `"type":"noop"` }

func (e *env) workflow(ctx context.Context, def string) (uuid.UUID, error) {
	return e.workflowFor(ctx, e.tenant, def)
}

func (e *env) workflowFor(ctx context.Context, tenant uuid.UUID, def string) (uuid.UUID, error) {
	w, _, err := e.server.Coordinator.CreateWorkflow(ctx, tenant, "wf-"+uuid.NewString()[:8], "", []byte(def))
	return w.ID, err
}

func (e *env) startRun(ctx context.Context, tenant, wf uuid.UUID) (uuid.UUID, time.Time, error) {
	return e.startRunAt(ctx, tenant, wf, 0)
}

// startRunAt is startRun at a priority.
func (e *env) startRunAt(ctx context.Context, tenant, wf uuid.UUID, priority int) (uuid.UUID, time.Time, error) {
	t0 := time.Now()
	res, err := e.server.Coordinator.StartRun(ctx, tenant, engine.StartRun{WorkflowID: wf, Priority: priority})
	return res.RunID, t0, err
}

// drive keeps k runs of wf in flight until total runs have finished, and
// returns each run's start time.
func (e *env) drive(ctx context.Context, wf uuid.UUID, k, total int) (map[uuid.UUID]time.Time, time.Duration, error) {
	return e.driveFor(ctx, e.tenant, wf, k, total)
}

// driveFor is drive for any tenant.
func (e *env) driveFor(ctx context.Context, tenant, wf uuid.UUID, k, total int) (map[uuid.UUID]time.Time, time.Duration, error) {
	t0 := time.Now()
	starts, err := e.driveSpread(ctx, func(int) tw { return tw{tenant: tenant, wf: wf} }, k, total)
	return starts, time.Since(t0), err
}

func runChains(ctx context.Context, o Options, rep *Report, name string, k, length, steps int) (Result, error) {
	return chainScenario(ctx, o, rep, name, k, length, steps, noopStep, max(16, k), nil, nil, false)
}

// chainScenario keeps k chains of length steps in flight until steps have
// run, after one warm-up round, and measures them. With sdk the steps are
// task nodes run by a tenant's SDK worker over the public task API (the
// platform's worker then has nothing to do).
func chainScenario(ctx context.Context, o Options, rep *Report, name string, k, length, steps int, step func(int) string,
	concurrency int, executors func(*probe) map[string]workers.Executor, workerCfg func(*workers.Config), sdk bool) (Result, error) {
	e, err := setup(ctx, o, func(c *workers.Config) {
		c.Concurrency = concurrency
		if workerCfg != nil {
			workerCfg(c)
		}
	}, executors)
	if err != nil {
		return Result{}, err
	}
	defer e.stop()
	if rep.Machine.CPUs == 0 {
		rep.Machine = machine(ctx, e)
	}
	if sdk {
		key, err := e.apiKey(ctx, auth.ScopeWorker)
		if err != nil {
			return Result{}, err
		}
		stop, err := e.startSDKWorker(ctx, e.url, key, concurrency)
		if err != nil {
			return Result{}, err
		}
		defer stop()
	}
	wf, err := e.workflow(ctx, chainDef(length, step))
	if err != nil {
		return Result{}, err
	}
	if _, _, err := e.drive(ctx, wf, k, k); err != nil { // warm up
		return Result{}, err
	}
	e.probe.reset()
	runs := max(1, steps/length)
	before, err := e.counters(ctx)
	if err != nil {
		return Result{}, err
	}
	eager0 := e.worker.EagerStarts()
	starts, took, err := e.drive(ctx, wf, k, runs)
	if err != nil {
		return Result{}, err
	}
	r := Result{Scenario: name, Steps: runs * length, Runs: runs, Seconds: took.Seconds(), StepsPerSec: float64(runs*length) / took.Seconds()}
	r.Handoff, r.RunLatency = e.chainLatencies(starts, length)
	if !sdk {
		// The share of steps the worker took with the previous step's report.
		r.Extra = map[string]any{"eager": fmt.Sprintf("%.0f%%", 100*float64(e.worker.EagerStarts()-eager0)/float64(r.Steps))}
	}
	return r, e.cost(ctx, before, r.Steps, &r)
}

// chainLatencies computes step handoffs (step k's result commit → step k+1
// starts executing) and run latencies (start call → terminal commit).
func (e *env) chainLatencies(starts map[uuid.UUID]time.Time, length int) (Percentiles, Percentiles) {
	p := e.probe
	p.mu.Lock()
	defer p.mu.Unlock()
	var handoffs, runs []time.Duration
	for run, st := range starts {
		if end, ok := p.ends[run]; ok {
			runs = append(runs, end.Sub(st))
		}
		for i := 0; i+1 < length; i++ {
			c, ok1 := p.commits[key{run, fmt.Sprintf("n%d", i)}]
			s, ok2 := p.starts[key{run, fmt.Sprintf("n%d", i+1)}]
			if ok1 && ok2 {
				handoffs = append(handoffs, s.Sub(c))
			}
		}
	}
	return percentiles(handoffs), percentiles(runs)
}

func runFanOut(ctx context.Context, o Options, rep *Report, runs int) (Result, error) {
	e, err := setup(ctx, o, func(c *workers.Config) { c.Concurrency = 64 }, nil)
	if err != nil {
		return Result{}, err
	}
	defer e.stop()
	nodes := []string{`{"id":"root","type":"noop"}`}
	var fan []string
	for i := 0; i < 100; i++ {
		nodes = append(nodes, fmt.Sprintf(`{"id":"f%d","type":"noop","depends_on":["root"]}`, i))
		fan = append(fan, fmt.Sprintf(`"f%d"`, i))
	}
	nodes = append(nodes, `{"id":"join","type":"noop","depends_on":[`+strings.Join(fan, ",")+`]}`)
	wf, err := e.workflow(ctx, `{"nodes":[`+strings.Join(nodes, ",")+`]}`)
	if err != nil {
		return Result{}, err
	}
	if _, _, err := e.drive(ctx, wf, 1, 1); err != nil {
		return Result{}, err
	}
	e.probe.reset()
	before, err := e.counters(ctx)
	if err != nil {
		return Result{}, err
	}
	starts, took, err := e.drive(ctx, wf, 1, runs)
	if err != nil {
		return Result{}, err
	}
	steps := runs * 102
	r := Result{Scenario: FanOut, Steps: steps, Runs: runs, Seconds: took.Seconds(), StepsPerSec: float64(steps) / took.Seconds()}
	p := e.probe
	p.mu.Lock()
	var handoffs, lat, joins []time.Duration
	for run, st := range starts {
		lat = append(lat, p.ends[run].Sub(st))
		root := p.commits[key{run, "root"}]
		var last time.Time
		for i := 0; i < 100; i++ {
			handoffs = append(handoffs, p.starts[key{run, fmt.Sprintf("f%d", i)}].Sub(root))
			if c := p.commits[key{run, fmt.Sprintf("f%d", i)}]; c.After(last) {
				last = c
			}
		}
		joins = append(joins, p.starts[key{run, "join"}].Sub(last))
	}
	p.mu.Unlock()
	r.Handoff, r.RunLatency = percentiles(handoffs), percentiles(lat)
	r.Extra = map[string]any{"fanout_handoff_is": "root commit → each branch starts", "join_handoff": percentiles(joins)}
	return r, e.cost(ctx, before, steps, &r)
}

func runStartLatency(ctx context.Context, o Options, rep *Report, runs int) (Result, error) {
	e, err := setup(ctx, o, nil, nil)
	if err != nil {
		return Result{}, err
	}
	defer e.stop()
	wf, err := e.workflow(ctx, chainDef(1, noopStep))
	if err != nil {
		return Result{}, err
	}
	if _, _, err := e.drive(ctx, wf, 1, 3); err != nil {
		return Result{}, err
	}
	e.probe.reset()
	before, err := e.counters(ctx)
	if err != nil {
		return Result{}, err
	}
	starts, took, err := e.drive(ctx, wf, 1, runs)
	if err != nil {
		return Result{}, err
	}
	p := e.probe
	p.mu.Lock()
	var first, lat []time.Duration
	for run, st := range starts {
		first = append(first, p.firstRun[run].Sub(st))
		lat = append(lat, p.ends[run].Sub(st))
	}
	p.mu.Unlock()
	r := Result{Scenario: StartLat, Steps: runs, Runs: runs, Seconds: took.Seconds(), StepsPerSec: float64(runs) / took.Seconds(),
		RunLatency: percentiles(lat), Extra: map[string]any{"start_to_first_step_running": percentiles(first)}}
	return r, e.cost(ctx, before, runs, &r)
}

func runHTTPChains(ctx context.Context, o Options, rep *Report, k, length, steps int) (Result, error) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	defer srv.Close()
	policy, err := ssrf.NewPolicy([]string{"127.0.0.0/8"})
	if err != nil {
		return Result{}, err
	}
	httpExec := workers.NewHTTP(policy)
	step := func(int) string {
		return fmt.Sprintf(`"type":"http","http":{"method":"POST","url":"%s/step"}`, srv.URL)
	}
	return chainScenario(ctx, o, rep, HTTPChains, k, length, steps, step, 32, func(p *probe) map[string]workers.Executor {
		return map[string]workers.Executor{"http": workers.ExecutorFunc(func(ctx context.Context, t workers.Task) (json.RawMessage, error) {
			p.started(t.Run, t.NodeID)
			return httpExec.Execute(ctx, t)
		})}
	}, nil, false)
}

// runCeiling runs the engine's per-step SQL with the engine's transaction
// boundaries from k concurrent chains, without Redis, HTTP or a worker
// runtime in between: what PostgreSQL allows this schema and these
// statements to do on this machine. With eager dispatch, a chain's first
// step is leased from its dispatch and each completion carries an eager
// offer, so later steps commit only their transition (as the engine's
// worker does while its tenant is alone on it); without, every step is
// lease acquisition, the coordinator's transition and the batched delete
// of its published outbox row.
func runCeiling(ctx context.Context, o Options, rep *Report, name string, eager bool, k, length, steps int) (Result, error) {
	e, err := setupNoWorker(ctx, o)
	if err != nil {
		return Result{}, err
	}
	defer e.stop()
	wf, err := e.workflow(ctx, chainDef(length, noopStep))
	if err != nil {
		return Result{}, err
	}
	// The engine's outbox fast path without Redis: after each commit the
	// fresh rows are handed straight to the goroutine driving their run
	// (where the engine XADDs them), and deleted in batches as the
	// enqueuer's delete loop does.
	rt := &router{routes: map[uuid.UUID]chan dispatch{}, pending: map[uuid.UUID][]dispatch{}}
	var delMu sync.Mutex
	var delTenants []uuid.UUID
	var delIDs []int64
	// The server's transition hooks (usage meters, webhook enqueue) are part
	// of what one step commits.
	c := engine.NewCoordinator(e.deps.DB, engine.Options{Hooks: e.server.Hooks(), PublishNow: func(_ context.Context, rows []outbox.Fresh) {
		out := make([]routed, len(rows))
		delMu.Lock()
		for i, r := range rows {
			out[i] = routed{r.Run, dispatch{r.Task, r.Attempt}}
			delTenants, delIDs = append(delTenants, r.Tenant), append(delIDs, r.ID)
		}
		delMu.Unlock()
		rt.deliver(out)
	}})
	dctx, stopDelete := context.WithCancel(ctx)
	defer stopDelete()
	go func() {
		for dctx.Err() == nil {
			time.Sleep(20 * time.Millisecond)
			delMu.Lock()
			ts, ids := delTenants, delIDs
			delTenants, delIDs = nil, nil
			delMu.Unlock()
			if len(ids) > 0 {
				_, _ = e.deps.DB.System().Exec(dctx, `DELETE FROM outbox o USING unnest($1::uuid[], $2::bigint[]) AS d(tenant_id, id)
					WHERE o.tenant_id = d.tenant_id AND o.id = d.id`, ts, ids)
			}
		}
	}()
	chain := func(ctx context.Context) error {
		res, err := c.StartRun(ctx, e.tenant, engine.StartRun{WorkflowID: wf})
		if err != nil {
			return err
		}
		id := res.RunID
		ch := rt.register(id)
		defer rt.unregister(id)
		var offer *engine.EagerOffer
		if eager {
			offer = &engine.EagerOffer{Queue: "default", NodeTypes: []string{"noop"}, TTL: 30 * time.Second}
		}
		var next *engine.Lease
		for i := 0; i < length; i++ {
			var d dispatch
			if next != nil {
				d = dispatch{next.TaskID, next.Attempt}
			} else {
				select {
				case d = <-ch:
				case <-time.After(30 * time.Second):
					return fmt.Errorf("run %s: no dispatch of step %d", id, i)
				}
				ls, _, err := c.AcquireLeases(ctx, e.tenant, engine.Holder{Worker: "ceiling"}, 30*time.Second, []engine.LeaseRequest{{RunID: id, TaskID: d.task, Attempt: d.attempt}})
				if err != nil || !ls[0].Acquired {
					return fmt.Errorf("lease: %v", err)
				}
			}
			ack, err := c.CompleteTask(ctx, e.tenant, engine.Report{RunID: id, TaskID: d.task, NodeID: fmt.Sprintf("n%d", i), Attempt: d.attempt,
				LeaseOwner: "ceiling", Output: json.RawMessage(`{}`), Eager: offer})
			if err != nil {
				return err
			}
			next = ack.Next
		}
		return nil
	}
	runs := max(1, steps/length)
	var left atomic.Int64
	left.Store(int64(runs))
	before, err := e.counters(ctx)
	if err != nil {
		return Result{}, err
	}
	t0 := time.Now()
	errc := make(chan error, k)
	var wg sync.WaitGroup
	for i := 0; i < k; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left.Add(-1) >= 0 {
				if err := chain(ctx); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(t0)
	close(errc)
	if err := <-errc; err != nil {
		return Result{}, err
	}
	r := Result{Scenario: name, Steps: runs * length, Runs: runs, Seconds: took.Seconds(), StepsPerSec: float64(runs*length) / took.Seconds()}
	return r, e.cost(ctx, before, r.Steps, &r)
}

type dispatch struct {
	task    uuid.UUID
	attempt int
}

type routed struct {
	run uuid.UUID
	d   dispatch
}

// router hands dispatches to the goroutine driving each run, keeping those
// that arrive before the run is registered.
type router struct {
	mu      sync.Mutex
	routes  map[uuid.UUID]chan dispatch
	pending map[uuid.UUID][]dispatch
}

func (r *router) register(run uuid.UUID) chan dispatch {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch := make(chan dispatch, 64)
	for _, d := range r.pending[run] {
		ch <- d
	}
	delete(r.pending, run)
	r.routes[run] = ch
	return ch
}

func (r *router) unregister(run uuid.UUID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.routes, run)
}

func (r *router) deliver(ds []routed) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, x := range ds {
		if ch, ok := r.routes[x.run]; ok {
			ch <- x.d
		} else {
			r.pending[x.run] = append(r.pending[x.run], x.d)
		}
	}
}
