// Package bench measures Composer end to end on one machine: a server and
// a worker run in-process against the local PostgreSQL and Redis, in a
// database and Redis namespace of their own, and each scenario reports
// throughput, handoff and run latency percentiles, and the cost of a step
// in PostgreSQL commits, WAL bytes and Redis commands. The ceiling scenario
// runs the engine's own per-step SQL, with the same transaction
// boundaries, from concurrent clients, so the engine's throughput can be
// read as a fraction of what the database allows.
package bench

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/engine"
	sm "github.com/composer-dev/composer/engine/statemachine"
	"github.com/composer-dev/composer/engine/taskapi"
	"github.com/composer-dev/composer/internal/app"
	"github.com/composer-dev/composer/internal/config"
	"github.com/composer-dev/composer/internal/redisconn"
	"github.com/composer-dev/composer/migrations"
	"github.com/composer-dev/composer/tenants"
	"github.com/composer-dev/composer/workers"
)

// Options configures a benchmark run.
type Options struct {
	// Config supplies the database URLs (their credentials and host) and
	// the Redis URL; the benchmark creates a database of its own.
	Config config.Config
	// Scenarios to run ("" runs all).
	Scenarios []string
	// Scale multiplies the step counts (1 = the documented figures).
	Scale float64
	// Out, when set, receives the JSON report.
	Out string
	Log *zap.Logger
}

// Percentiles summarises a latency distribution.
type Percentiles struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_ms"`
	P90 float64 `json:"p90_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
}

func percentiles(ds []time.Duration) Percentiles {
	if len(ds) == 0 {
		return Percentiles{}
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	at := func(q float64) float64 {
		i := int(q*float64(len(ds))+0.5) - 1
		i = max(0, min(i, len(ds)-1))
		return float64(ds[i].Microseconds()) / 1000
	}
	return Percentiles{N: len(ds), P50: at(0.50), P90: at(0.90), P99: at(0.99), Max: float64(ds[len(ds)-1].Microseconds()) / 1000}
}

// Result is one scenario's figures.
type Result struct {
	Scenario         string      `json:"scenario"`
	Steps            int         `json:"steps"`
	Runs             int         `json:"runs"`
	Seconds          float64     `json:"seconds"`
	StepsPerSec      float64     `json:"steps_per_sec"`
	Handoff          Percentiles `json:"handoff"`
	RunLatency       Percentiles `json:"run_latency"`
	CommitsPerStep   float64     `json:"pg_commits_per_step"`
	WALBytesPerStep  float64     `json:"wal_bytes_per_step"`
	RedisCmdsPerStep float64     `json:"redis_commands_per_step"`
	// CPUPerStepMs is the benchmark process's CPU time (user + system: the
	// server, its loops and the workers, all in this process) per step;
	// PGCPUPerStepMs is PostgreSQL's (every backend of the local cluster),
	// when its processes can be read (0 otherwise).
	CPUPerStepMs   float64        `json:"cpu_ms_per_step"`
	PGCPUPerStepMs float64        `json:"pg_cpu_ms_per_step,omitempty"`
	Extra          map[string]any `json:"extra,omitempty"`
}

// Report is the whole benchmark run.
type Report struct {
	When    time.Time `json:"when"`
	Machine Machine   `json:"machine"`
	Results []Result  `json:"results"`
}

// Machine describes where the figures come from.
type Machine struct {
	CPUs       int    `json:"cpus"`
	GoVersion  string `json:"go"`
	PostgreSQL string `json:"postgresql"`
	Redis      string `json:"redis"`
	SyncCommit string `json:"synchronous_commit"`
}

// env is one benchmark's system.
type env struct {
	opts   Options
	cfg    config.Config
	deps   *app.Deps
	server *app.Server
	url    string
	tenant uuid.UUID
	probe  *probe
	worker *workers.Worker
	dbName string
	stop   func()
}

// probe timestamps commits and execution starts.
type probe struct {
	mu       sync.Mutex
	commits  map[key]time.Time
	starts   map[key]time.Time
	ends     map[uuid.UUID]time.Time
	firstRun map[uuid.UUID]time.Time
	waiters  map[uuid.UUID]chan struct{}
}

type key struct {
	run  uuid.UUID
	node string
}

func newProbe() *probe {
	return &probe{commits: map[key]time.Time{}, starts: map[key]time.Time{}, ends: map[uuid.UUID]time.Time{},
		firstRun: map[uuid.UUID]time.Time{}, waiters: map[uuid.UUID]chan struct{}{}}
}

func (p *probe) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.commits, p.starts, p.ends, p.firstRun = map[key]time.Time{}, map[key]time.Time{}, map[uuid.UUID]time.Time{}, map[uuid.UUID]time.Time{}
}

func (p *probe) onTransition(t engine.Transition) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if t.Event == sm.KindNodeCompleted {
		p.commits[key{t.RunID, t.Node}] = now
	}
	if t.Terminal {
		p.ends[t.RunID] = now
		if w := p.waiters[t.RunID]; w != nil {
			close(w)
			delete(p.waiters, t.RunID)
		}
	}
}

// wait returns a channel closed when the run ends. Register before starting
// the run's last step can finish: in practice right after StartRun, since
// ends are also checked.
func (p *probe) wait(run uuid.UUID) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	ch := make(chan struct{})
	if _, done := p.ends[run]; done {
		close(ch)
		return ch
	}
	p.waiters[run] = ch
	return ch
}

func (p *probe) started(run uuid.UUID, node string) {
	now := time.Now()
	p.mu.Lock()
	p.starts[key{run, node}] = now
	if _, ok := p.firstRun[run]; !ok {
		p.firstRun[run] = now
	}
	p.mu.Unlock()
}

// recordingNoop is the benchmark's noop executor: it notes when each step
// starts executing.
func (p *probe) recordingNoop() workers.Executor {
	return workers.ExecutorFunc(func(_ context.Context, t workers.Task) (json.RawMessage, error) {
		p.started(t.Run, t.NodeID)
		return json.RawMessage(`{}`), nil
	})
}

// setupNoWorker is setup without a worker (the SQL ceiling drives the
// engine directly).
func setupNoWorker(ctx context.Context, opts Options) (*env, error) {
	return setupWith(ctx, opts, nil, nil, false)
}

// setup creates the benchmark's database and namespace and starts a server
// and a worker in-process.
// executors, when not nil, builds the worker's executors around the
// system's probe (which times step starts).
func setup(ctx context.Context, opts Options, workerCfg func(*workers.Config), executors func(*probe) map[string]workers.Executor) (*env, error) {
	return setupWith(ctx, opts, workerCfg, executors, true)
}

func setupWith(ctx context.Context, opts Options, workerCfg func(*workers.Config), executorsFor func(*probe) map[string]workers.Executor, withWorker bool) (*env, error) {
	cfg := opts.Config
	e := &env{opts: opts, probe: newProbe()}
	e.dbName = fmt.Sprintf("composer_bench_%d", time.Now().UnixNano())
	admin, err := pgx.Connect(ctx, withDB(cfg.MigrateDatabaseURL, "postgres"))
	if err != nil {
		return nil, fmt.Errorf("connect as owner: %w", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+e.dbName); err != nil {
		return nil, fmt.Errorf("create database: %w", err)
	}
	cfg.MigrateDatabaseURL = withDB(cfg.MigrateDatabaseURL, e.dbName)
	cfg.DatabaseURL = withDB(cfg.DatabaseURL, e.dbName)
	cfg.SystemDatabaseURL = withDB(cfg.SystemDatabaseURL, e.dbName)
	db, err := sql.Open("pgx", cfg.MigrateDatabaseURL)
	if err != nil {
		return nil, err
	}
	_, err = migrations.Up(ctx, db)
	db.Close()
	if err != nil {
		return nil, err
	}
	cfg.RedisNamespace = "composer-bench-" + uuid.NewString()[:8]
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.AdminAddr = "127.0.0.1:0"
	if cfg.WorkerToken == "" {
		cfg.WorkerToken = "bench-token"
	}
	cfg.AllowPrivateNetworks = []string{"127.0.0.0/8"}
	e.cfg = cfg
	log := opts.Log
	e.deps, err = app.Open(ctx, cfg, log, true)
	if err != nil {
		return nil, err
	}
	e.server, err = app.NewServer(e.deps, app.ServerOptions{OnTransition: e.probe.onTransition})
	if err != nil {
		return nil, err
	}
	tn, err := tenants.Create(ctx, e.deps.DB, tenants.CreateParams{Name: "bench", Plan: "enterprise", StreamShards: 4})
	if err != nil {
		return nil, err
	}
	e.tenant = tn.ID
	runCtx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	var wg sync.WaitGroup
	wg.Add(2)
	if withWorker {
		go func() { defer wg.Done(); _ = e.server.Run(runCtx, cfg.HTTPAddr, ready) }()
		e.url = "http://" + <-ready
	} else {
		wg.Done() // the SQL ceiling runs no server loops: it is the enqueuer itself
	}
	executors := map[string]workers.Executor{}
	if executorsFor != nil {
		executors = executorsFor(e.probe)
	}
	if executors["noop"] == nil {
		executors["noop"] = e.probe.recordingNoop()
	}
	wcfg := workers.Config{Queues: []string{"default"}, Concurrency: 64, Namespace: cfg.RedisNamespace, LeaseTTL: 30 * time.Second}
	if workerCfg != nil {
		workerCfg(&wcfg)
	}
	w := workers.New(wcfg, e.deps.Redis, taskapi.NewClient(e.url, cfg.WorkerToken), executors, log)
	e.worker = w
	if withWorker {
		go func() { defer wg.Done(); _ = w.Run(runCtx) }()
	} else {
		wg.Done()
	}
	e.stop = func() {
		cancel()
		wg.Wait()
		e.deps.Close()
		dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer dcancel()
		if a, err := pgx.Connect(dctx, withDB(opts.Config.MigrateDatabaseURL, "postgres")); err == nil {
			_, _ = a.Exec(dctx, "DROP DATABASE IF EXISTS "+e.dbName+" WITH (FORCE)")
			a.Close(dctx)
		}
		// Every master of a cluster holds some of the namespace's keys.
		if rdb, _, err := redisconn.Open(cfg.RedisURL); err == nil {
			_ = redisconn.ForEachMaster(dctx, rdb, func(ctx context.Context, c *redis.Client) error {
				iter := c.Scan(ctx, 0, cfg.RedisNamespace+":*", 1000).Iterator()
				for iter.Next(ctx) {
					c.Unlink(ctx, iter.Val())
				}
				return iter.Err()
			})
			rdb.Close()
		}
	}
	return e, nil
}

func withDB(raw, db string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	u.Path = "/" + db
	return u.String()
}

// counters are the cost meters read before and after a scenario.
type counters struct {
	commits  int64
	walLSN   string
	redisCmd int64
	cpu      time.Duration // this process
	pgCPU    time.Duration // the PostgreSQL cluster's processes (0 when unreadable)
}

func (e *env) counters(ctx context.Context) (counters, error) {
	var c counters
	// Backends publish their statistics when idle, at most once a second
	// and otherwise up to ten seconds later; a backend that exits publishes
	// at once. So the pools' connections are closed first (they reconnect
	// on demand), and the statistics read a moment later are complete.
	e.deps.DB.Reset()
	time.Sleep(300 * time.Millisecond)
	c.cpu = selfCPU()
	c.pgCPU = postgresCPU(ctx, e)
	err := e.deps.DB.System().QueryRow(ctx, `SELECT xact_commit, pg_current_wal_lsn()::text FROM pg_stat_database WHERE datname = current_database()`).Scan(&c.commits, &c.walLSN)
	if err != nil {
		return c, err
	}
	info, err := e.deps.Redis.Info(ctx, "commandstats").Result()
	if err != nil {
		return c, err
	}
	for _, line := range strings.Split(info, "\n") {
		if i := strings.Index(line, "calls="); i >= 0 && strings.HasPrefix(line, "cmdstat_") {
			var n int64
			fmt.Sscanf(line[i+len("calls="):], "%d", &n)
			c.redisCmd += n
		}
	}
	return c, nil
}

func (e *env) cost(ctx context.Context, before counters, steps int, r *Result) error {
	after, err := e.counters(ctx)
	if err != nil {
		return err
	}
	var wal int64
	if err := e.deps.DB.System().QueryRow(ctx, `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint`, after.walLSN, before.walLSN).Scan(&wal); err != nil {
		return err
	}
	r.CommitsPerStep = float64(after.commits-before.commits) / float64(steps)
	r.WALBytesPerStep = float64(wal) / float64(steps)
	r.RedisCmdsPerStep = float64(after.redisCmd-before.redisCmd) / float64(steps)
	r.CPUPerStepMs = float64((after.cpu - before.cpu).Microseconds()) / 1000 / float64(steps)
	if before.pgCPU > 0 && after.pgCPU > before.pgCPU {
		r.PGCPUPerStepMs = float64((after.pgCPU - before.pgCPU).Microseconds()) / 1000 / float64(steps)
	}
	return nil
}

// Print writes the report as a table.
func (r Report) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "scenario\tsteps\tsteps/s\thandoff p50\tp90\tp99\tmax\trun p50\tp99\tcommits/step\tWAL B/step\tredis cmd/step\tCPU ms/step\tPG CPU ms/step\t\n")
	for _, x := range r.Results {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\t%.1f\t%.1f\t%.2f\t%.0f\t%.2f\t%.3f\t%.3f\t\n", x.Scenario, x.Steps, x.StepsPerSec,
			x.Handoff.P50, x.Handoff.P90, x.Handoff.P99, x.Handoff.Max, x.RunLatency.P50, x.RunLatency.P99,
			x.CommitsPerStep, x.WALBytesPerStep, x.RedisCmdsPerStep, x.CPUPerStepMs, x.PGCPUPerStepMs)
	}
	tw.Flush()
	for _, x := range r.Results {
		if len(x.Extra) > 0 {
			b, _ := json.Marshal(x.Extra)
			fmt.Fprintf(w, "  %s: %s\n", x.Scenario, b)
		}
	}
	fmt.Fprintf(w, "machine: %d CPUs, %s, PostgreSQL %s (synchronous_commit=%s), Redis %s\n", r.Machine.CPUs, r.Machine.GoVersion,
		r.Machine.PostgreSQL, r.Machine.SyncCommit, r.Machine.Redis)
}

// Save writes the JSON report.
func (r Report) Save(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func machine(ctx context.Context, e *env) Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version()}
	_ = e.deps.DB.System().QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('synchronous_commit')`).Scan(&m.PostgreSQL, &m.SyncCommit)
	if info, err := e.deps.Redis.Info(ctx, "server").Result(); err == nil {
		for _, l := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "redis_version:"); ok {
				m.Redis = v
			}
		}
	}
	return m
}
