// Package apptest runs a whole Composer system in-process for end-to-end
// tests, on real PostgreSQL and Redis (a fresh database and namespace per
// test), the way httptest runs a server: start it, use it, and t.Cleanup
// stops it.
package apptest

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/multitracer"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/engine/taskapi"
	"github.com/composer-dev/composer/internal/app"
	"github.com/composer-dev/composer/internal/config"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/internal/ssrf"
	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/sdk/worker"
	"github.com/composer-dev/composer/tenants"
	"github.com/composer-dev/composer/workers"
)

// System is a running server (coordinator, enqueuer, sweeper, task API)
// with one tenant.
type System struct {
	T      testing.TB
	Env    *testenv.Env
	Cfg    config.Config
	Deps   *app.Deps
	Server *app.Server
	URL    string
	Tenant uuid.UUID
	Log    *zap.Logger
	// Logs holds every log entry at info and above, for tests that check
	// what was logged.
	Logs *observer.ObservedLogs
}

// Config returns the configuration tests run with: short leases and sweeps,
// loopback allowed for HTTP steps.
func Config(env *testenv.Env) config.Config {
	c := config.Defaults()
	c.DatabaseURL, c.SystemDatabaseURL, c.MigrateDatabaseURL = env.AppURL, env.SystemURL, env.OwnerURL
	c.RedisURL, c.RedisNamespace = env.RedisURL, env.Namespace
	c.HTTPAddr = "127.0.0.1:0"
	c.AdminAddr = "127.0.0.1:0"
	c.WorkerToken = "test-worker-token"
	c.LeaseTTL = 2 * time.Second
	c.SweepInterval = 100 * time.Millisecond
	c.LostDispatchAge = 2 * time.Second
	c.OutboxPollInterval = 200 * time.Millisecond
	c.ClaimIdle = time.Second
	c.ShutdownTimeout = 5 * time.Second
	c.AllowPrivateNetworks = []string{"127.0.0.0/8", "::1/128"}
	c.JWTHS256Secret = app.DevJWTSecret
	c.WebhookSecretKeys = []string{app.DevWebhookKey}
	c.AuditKeys = []string{app.DevAuditKey}
	c.Dev = true
	return c
}

// Start runs a system; mod adjusts its configuration first.
func Start(t testing.TB, mod ...func(*config.Config)) *System {
	t.Helper()
	return StartWith(t, testenv.New(t), mod...)
}

// StartWith runs a system on the given services (e.g. a private Redis).
func StartWith(t testing.TB, env *testenv.Env, mod ...func(*config.Config)) *System {
	t.Helper()
	return StartTraced(t, env, nil, mod...)
}

// StartTraced is StartWith with a query tracer on the app role's pool.
func StartTraced(t testing.TB, env *testenv.Env, tracer pgx.QueryTracer, mod ...func(*config.Config)) *System {
	t.Helper()
	cfg := Config(env)
	for _, m := range mod {
		m(&cfg)
	}
	var poolOpts []func(*pgxpool.Config)
	if tracer != nil {
		poolOpts = append(poolOpts, func(c *pgxpool.Config) { c.ConnConfig.Tracer = multitracer.New(c.ConnConfig.Tracer, tracer) })
	}
	observed, logs := observer.New(zap.InfoLevel)
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel), zaptest.WrapOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewTee(c, observed)
	})))
	ctx, cancel := context.WithCancel(context.Background())
	d, err := app.Open(ctx, cfg, log, true, poolOpts...)
	require.NoError(t, err)
	srv, err := app.NewServer(d, app.ServerOptions{})
	require.NoError(t, err)
	tn, err := tenants.Create(ctx, d.DB, tenants.CreateParams{Name: "tenant-under-test", Plan: "pro", StreamShards: 2})
	require.NoError(t, err)
	ready := make(chan string, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Run(ctx, cfg.HTTPAddr, ready); err != nil {
			t.Errorf("server: %v", err)
		}
	}()
	addr := <-ready
	t.Cleanup(func() {
		cancel()
		<-done
		d.Close()
	})
	return &System{T: t, Env: env, Cfg: cfg, Deps: d, Server: srv, URL: "http://" + addr, Tenant: tn.ID, Log: log, Logs: logs}
}

// Coordinator returns the system's coordinator.
func (s *System) Coordinator() *engine.Coordinator { return s.Server.Coordinator }

// WorkerOptions adjust a platform worker started by StartWorker.
type WorkerOptions struct {
	// Noop, when set, runs noop nodes instead of completing them at once
	// (tests of the platform runtime give it behaviour of their own).
	Noop   workers.Executor
	Config func(*workers.Config)
	// API replaces the HTTP task API client (e.g. to intercept calls).
	API workers.TaskAPI
	// Redis replaces the worker's Redis client (e.g. one whose
	// connections a test breaks).
	Redis redis.UniversalClient
}

// StartWorker runs an in-process worker against the system until the test
// ends (or stop is called).
func (s *System) StartWorker(o WorkerOptions) (w *workers.Worker, stop func()) {
	s.T.Helper()
	policy, err := ssrf.NewPolicy(s.Cfg.AllowPrivateNetworks, s.Cfg.AllowedPorts...)
	require.NoError(s.T, err)
	executors := map[string]workers.Executor{"http": workers.NewHTTP(policy), "noop": workers.Noop}
	if o.Noop != nil {
		executors["noop"] = o.Noop
	}
	cfg := workers.Config{Queues: []string{"default"}, Concurrency: 8, LeaseTTL: s.Cfg.LeaseTTL, ClaimIdle: s.Cfg.ClaimIdle,
		ShutdownTimeout: 2 * time.Second, Namespace: s.Cfg.RedisNamespace, IdlePoll: 200 * time.Millisecond}
	if o.Config != nil {
		o.Config(&cfg)
	}
	api := o.API
	if api == nil {
		api = taskapi.NewClient(s.URL, s.Cfg.WorkerToken)
	}
	rdb := o.Redis
	if rdb == nil {
		rdb = s.Deps.Redis
	}
	w = workers.New(cfg, rdb, api, executors, s.Log.Named(cfg.WorkerID))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	s.T.Cleanup(stop)
	return w, stop
}

// APIKey creates an API key of the system's tenant with the given scopes
// and returns it.
func (s *System) APIKey(scopes ...string) string {
	s.T.Helper()
	var plain string
	err := s.Deps.DB.WithTenant(context.Background(), s.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		plain, _, err = auth.Keys{}.Create(ctx, tx, "test key", scopes, nil, "apptest")
		return err
	})
	require.NoError(s.T, err)
	return plain
}

// SDKWorkerOptions adjust a tenant worker started by StartSDKWorker.
type SDKWorkerOptions struct {
	// Key is the worker's API key (default: a new key of the worker scope).
	Key string
	// Options adjusts the SDK's options (which start with the system's
	// lease TTL and a short shutdown).
	Options func(*worker.Options)
}

// StartSDKWorker runs a tenant's own code in-process as a program using
// the SDK does: it reaches the system only through its public HTTP API,
// with an API key. register adds the handlers. The worker stops when the
// test ends (or stop is called); Run's error, if any, fails the test
// unless the test expects it (done receives it).
func (s *System) StartSDKWorker(register func(*worker.Worker), o SDKWorkerOptions) (w *worker.Worker, stop func(), done <-chan error) {
	s.T.Helper()
	key := o.Key
	if key == "" {
		key = s.APIKey(auth.ScopeWorker)
	}
	opts := worker.Options{LeaseTTL: s.Cfg.LeaseTTL, ShutdownTimeout: 2 * time.Second, NoSignals: true, Concurrency: 8,
		Logger: slog.New(slog.NewTextHandler(testWriter{s.T}, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	if o.Options != nil {
		o.Options(&opts)
	}
	w, err := worker.New(s.URL, key, opts)
	require.NoError(s.T, err)
	register(w)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	finished := make(chan struct{})
	go func() { defer close(finished); errc <- w.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-finished }) }
	s.T.Cleanup(stop)
	return w, stop, errc
}

// testWriter sends log lines to the test's log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// Workflow creates a workflow and returns its id.
func (s *System) Workflow(def string) uuid.UUID {
	s.T.Helper()
	w, _, err := s.Coordinator().CreateWorkflow(context.Background(), s.Tenant, "wf-"+uuid.NewString()[:8], "", []byte(def))
	require.NoError(s.T, err)
	return w.ID
}

// StartRun starts a run and returns its id.
func (s *System) StartRun(wf uuid.UUID, input string) uuid.UUID {
	s.T.Helper()
	res, err := s.Coordinator().StartRun(context.Background(), s.Tenant, engine.StartRun{WorkflowID: wf, Input: json.RawMessage(input)})
	require.NoError(s.T, err)
	return res.RunID
}

// Run reads a run and its tasks.
func (s *System) Run(id uuid.UUID) (engine.RunView, map[string]engine.TaskView) {
	s.T.Helper()
	var run engine.RunView
	tasks := map[string]engine.TaskView{}
	err := s.Deps.DB.WithTenant(context.Background(), s.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		if run, err = engine.GetRun(ctx, tx, id); err != nil {
			return err
		}
		list, err := engine.TasksOfRuns(ctx, tx, []uuid.UUID{id})
		for _, t := range list {
			tasks[t.NodeID] = t
		}
		return err
	})
	require.NoError(s.T, err)
	return run, tasks
}

// WaitRun waits until the run is terminal and returns it.
func (s *System) WaitRun(id uuid.UUID, timeout time.Duration) (engine.RunView, map[string]engine.TaskView) {
	s.T.Helper()
	var run engine.RunView
	var tasks map[string]engine.TaskView
	Eventually(s.T, fmt.Sprintf("run %s to finish", id), timeout, func() bool {
		run, tasks = s.Run(id)
		return run.Status != "running" && run.Status != "queued"
	})
	return run, tasks
}

// Eventually polls cond until it holds or the timeout passes.
func Eventually(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var (
	buildMu sync.Mutex
	built   = map[string]*buildResult{}
)

type buildResult struct {
	once sync.Once
	path string
	err  error
}

// Binary builds cmd/composer once per test process and returns its path,
// for tests that run and kill real processes.
func Binary(t testing.TB) string {
	t.Helper()
	return Build(t, "./cmd/composer")
}

// Build builds the main package at pkg (a path relative to the module
// root, e.g. "./examples/worker") once per test process and returns the
// binary's path.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	buildMu.Lock()
	b := built[pkg]
	if b == nil {
		b = &buildResult{}
		built[pkg] = b
	}
	buildMu.Unlock()
	b.once.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..")
		dir, err := os.MkdirTemp("", "composer-bin-")
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, filepath.Base(pkg))
		cmd := exec.Command("go", "build", "-o", b.path, pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	})
	require.NoError(t, b.err)
	return b.path
}

// ProcessEnv is the environment that points a composer process at this
// system's database, Redis and server.
func (s *System) ProcessEnv() []string {
	c := s.Cfg
	return append(os.Environ(),
		"COMPOSER_DATABASE_URL="+c.DatabaseURL, "COMPOSER_SYSTEM_DATABASE_URL="+c.SystemDatabaseURL,
		"COMPOSER_MIGRATE_DATABASE_URL="+c.MigrateDatabaseURL, "COMPOSER_REDIS_URL="+c.RedisURL,
		"COMPOSER_REDIS_NAMESPACE="+c.RedisNamespace, "COMPOSER_SERVER_URL="+s.URL, "COMPOSER_WORKER_TOKEN="+c.WorkerToken,
		"COMPOSER_LEASE_TTL="+c.LeaseTTL.String(), "COMPOSER_CLAIM_IDLE="+c.ClaimIdle.String(),
		"COMPOSER_SWEEP_INTERVAL="+c.SweepInterval.String(), "COMPOSER_LOST_DISPATCH_AGE="+c.LostDispatchAge.String(),
		"COMPOSER_ALLOW_PRIVATE_NETWORKS=127.0.0.0/8,::1/128", "COMPOSER_LOG_LEVEL=warn", "COMPOSER_ADMIN_ADDR=127.0.0.1:0",
		"COMPOSER_AUDIT_KEY="+strings.Join(c.AuditKeys, ","))
}
