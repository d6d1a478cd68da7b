// Package app assembles Composer's processes from their parts: the
// connections every process opens, the server (coordinator, outbox
// enqueuer, sweeper, HTTP APIs) and the worker. cmd/composer and the
// end-to-end tests build processes only through it.
package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/audit"
	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/billing"
	"github.com/composer-dev/composer/console"
	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/engine/outbox"
	"github.com/composer-dev/composer/engine/stream"
	"github.com/composer-dev/composer/engine/taskapi"
	"github.com/composer-dev/composer/engine/taskpoll"
	"github.com/composer-dev/composer/engine/taskserver"
	"github.com/composer-dev/composer/graph"
	"github.com/composer-dev/composer/internal/config"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/lifecycle"
	"github.com/composer-dev/composer/internal/obs"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/internal/pguuid"
	"github.com/composer-dev/composer/internal/redisconn"
	"github.com/composer-dev/composer/internal/ssrf"
	"github.com/composer-dev/composer/internal/telemetry"
	"github.com/composer-dev/composer/schedules"
	"github.com/composer-dev/composer/secrets"
	"github.com/composer-dev/composer/stats"
	"github.com/composer-dev/composer/tenants"
	"github.com/composer-dev/composer/webhooks"
	"github.com/composer-dev/composer/workers"
)

// Deps are the connections of a process.
type Deps struct {
	Cfg config.Config
	Log *zap.Logger
	DB  *pg.DB
	// Redis is one server, a cluster or a Sentinel master (RedisTopology
	// says which).
	Redis         redis.UniversalClient
	RedisTopology redisconn.Topology
	// closers run at Close (unregistering metric callbacks that read the
	// pools).
	closers []func()
}

// Open connects to PostgreSQL (both runtime roles) and Redis. poolOpts
// adjust the app role's pool (tests attach query tracers).
func Open(ctx context.Context, cfg config.Config, log *zap.Logger, needDB bool, poolOpts ...func(*pgxpool.Config)) (*Deps, error) {
	d := &Deps{Cfg: cfg, Log: log}
	var pools telemetry.Pools
	if needDB {
		app, err := pool(ctx, cfg.DatabaseURL, cfg.DBMaxConns, time.Minute, poolOpts...)
		if err != nil {
			return nil, fmt.Errorf("COMPOSER_DATABASE_URL: %w", err)
		}
		// A hung background loop's transaction (e.g. an enqueuer stuck in an
		// XADD) is ended by the server, releasing the rows it claimed.
		system, err := pool(ctx, cfg.SystemDatabaseURL, max(cfg.DBMaxConns/2, 4), 30*time.Second)
		if err != nil {
			app.Close()
			return nil, fmt.Errorf("COMPOSER_SYSTEM_DATABASE_URL: %w", err)
		}
		d.DB = pg.New(app, system, false)
		pools.App, pools.System = app, system
	}
	// Deadlines of contexts bound Redis calls too (not only the socket
	// timeouts), so a stalled Redis costs a request what it budgeted; the
	// pool holds at least 64 connections (redisconn).
	rdb, topo, err := redisconn.Open(cfg.RedisURL)
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("COMPOSER_REDIS_URL: %w", err) // (redisconn never echoes a password)
	}
	d.Redis, d.RedisTopology = rdb, topo
	d.Redis.AddHook(telemetry.RedisHook{})
	pools.Redis = d.Redis
	unregister, err := telemetry.RegisterPools(pools)
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("pool metrics: %w", err)
	}
	d.closers = append(d.closers, unregister)
	obs.Prime(context.Background())
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := d.Redis.Ping(pingCtx).Err(); err != nil {
		d.Close()
		return nil, fmt.Errorf("redis (%s) unreachable: %w", topo, err)
	}
	if log != nil {
		log.Info("connected to Redis", zap.Stringer("topology", topo))
	}
	return d, nil
}

func pool(ctx context.Context, url string, maxConns int, idleInTx time.Duration, opts ...func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, errors.New("not a valid PostgreSQL URL") // never echo: it may hold a password
	}
	cfg.MaxConns = int32(maxConns)
	if cfg.ConnConfig.RuntimeParams == nil {
		cfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = fmt.Sprint(idleInTx.Milliseconds())
	// Run data is partitioned, and the plan cache keeps re-planning such
	// queries (custom plans); generic plans prune partitions at executor
	// start instead, which measured ~30% more steps per second.
	cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	cfg.AfterConnect = pguuid.AfterConnect
	cfg.ConnConfig.Tracer = telemetry.PgxTracer{}
	for _, o := range opts {
		o(cfg)
	}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := p.Ping(pingCtx); err != nil {
		p.Close()
		return nil, fmt.Errorf("PostgreSQL unreachable: %w", err)
	}
	return p, nil
}

// Close closes every connection.
func (d *Deps) Close() {
	for _, f := range d.closers {
		f()
	}
	d.closers = nil
	if d.DB != nil {
		d.DB.Close()
	}
	if d.Redis != nil {
		_ = d.Redis.Close()
	}
}

// Server is `composer server`: the APIs and every background loop.
type Server struct {
	*Deps
	Coordinator *engine.Coordinator
	Enqueuer    *outbox.Enqueuer
	Sweeper     *engine.Sweeper
	// Schedules fires the tenants' schedules.
	Schedules *schedules.Firer
	// Bulk works the tenants' bulk operations.
	Bulk    *engine.BulkRunner
	Authn   *auth.Authenticator
	Authz   *auth.Authorizer
	Live    *graph.Live
	Limiter *tenants.RateLimiter
	slots   *tenants.Slots
	// Poller serves tenant workers' polls.
	Poller *taskpoll.Poller
	// Mux is the public listener's; Admin the operator's (metrics, health).
	Mux   *http.ServeMux
	Admin *http.ServeMux
	// AdminAddr is where the admin listener listens, once Run started it.
	AdminAddr string
	// Webhooks manages endpoints; Relay delivers (nil without a secret key).
	Webhooks webhooks.Service
	Relay    *webhooks.Relay
	// Secrets is the tenants' secret store (sealed with the webhooks' keys).
	Secrets secrets.Service
	// AuditKeys key the audit log's chain (COMPOSER_AUDIT_KEY).
	AuditKeys *audit.Keyring
	caps      billing.CapCache
	// Background are the server's other loops, run by Run until it stops.
	Background []lifecycle.Service
	// draining: shutdown began; /readyz answers 503 while the listener
	// still serves, for COMPOSER_DRAIN_DELAY.
	draining atomic.Bool
}

// Hooks are what every transition writes in its own transaction: usage
// meters and, when a run ends, its webhook deliveries.
func (s *Server) Hooks() []engine.TxHook {
	return []engine.TxHook{
		s.meter().Hook,
		webhooks.Hook,
	}
}

func (s *Server) meter() billing.Meter {
	return billing.Meter{Export: s.Deps.Cfg.BillingExportURL != ""}
}

// setupWebhooks builds the endpoint service and, when the server has a
// secret key, the delivery relay.
func (s *Server) setupWebhooks() error {
	d := s.Deps
	policy, err := ssrf.NewPolicy(d.Cfg.AllowPrivateNetworks, d.Cfg.AllowedPorts...)
	if err != nil {
		return fmt.Errorf("COMPOSER_ALLOW_PRIVATE_NETWORKS or COMPOSER_ALLOWED_PORTS: %w", err)
	}
	s.Webhooks = webhooks.Service{Policy: policy, Dev: d.Cfg.Dev}
	if len(d.Cfg.WebhookSecretKeys) == 0 {
		d.Log.Warn("webhooks are off: set COMPOSER_WEBHOOK_SECRET_KEY (openssl rand -base64 32) to enable them")
		return nil
	}
	if s.Webhooks.Keys, err = webhooks.ParseKeyring(d.Cfg.WebhookSecretKeys); err != nil {
		return fmt.Errorf("COMPOSER_WEBHOOK_SECRET_KEY: %w", err)
	}
	s.Relay = &webhooks.Relay{DB: d.DB, Keys: s.Webhooks.Keys, Transport: policy.ResolvingTransport(net.DefaultResolver),
		Log: d.Log.Named("webhooks"), Meter: s.meter(), DisableAfter: d.Cfg.WebhookDisableAfter,
		Timeout: d.Cfg.WebhookTimeout, ClaimLease: 3 * d.Cfg.WebhookTimeout,
		Retention: time.Duration(d.Cfg.WebhookRetentionDays) * 24 * time.Hour}
	s.Background = append(s.Background, s.Relay)
	return nil
}

// admit refuses a new run when the tenant already has as many tasks
// waiting for a worker as its plan allows, or its usage this month reached
// a hard cap of its plan or its spend cap. It runs in the start's
// transaction before anything is written.
func (s *Server) admit(ctx context.Context, tx *pg.Tx) error {
	l, err := tenants.EffectiveLimits(ctx, tx)
	if err != nil {
		return err
	}
	full, err := engine.QueuedTasksAtLeast(ctx, tx, l.MaxQueuedTasks)
	if err != nil {
		return err
	}
	if full {
		obs.Refused(ctx, obs.RefusedQueuedTasks)
		return errs.E(errs.QuotaExceeded, "the tenant already has %d tasks waiting for a worker, the most its plan allows", l.MaxQueuedTasks)
	}
	if err := s.caps.Check(ctx, tx, time.Now()); err != nil {
		if errs.KindOf(err) == errs.QuotaExceeded {
			obs.Refused(ctx, obs.RefusedUsageCap)
		}
		return err
	}
	return nil
}

// ServerOptions adjust a server.
type ServerOptions struct {
	// OnTransition observes every committed transition (live updates,
	// benchmarks).
	OnTransition func(engine.Transition)
}

// NewServer assembles a server over d.
func NewServer(d *Deps, o ServerOptions) (*Server, error) {
	s := &Server{Deps: d, Mux: http.NewServeMux(), Admin: http.NewServeMux(), caps: billing.CapCache{TTL: 10 * time.Second}}
	jwt, err := JWTVerifier(d)
	if err != nil {
		return nil, err
	}
	if s.AuditKeys, err = AuditKeyring(d); err != nil {
		return nil, err
	}
	s.Authn = &auth.Authenticator{DB: d.DB, JWT: jwt, Logger: d.Log.Named("auth")}
	if s.Authz, err = auth.NewAuthorizer(); err != nil {
		return nil, fmt.Errorf("authorizer: %w", err)
	}
	// This process's enqueuer is woken in-process after its commits.
	d.DB.MarkLocalOutbox()
	s.Live = graph.NewLive(d.Redis, d.Cfg.RedisNamespace, graph.LiveLimits{}, d.Log.Named("live"))
	s.Limiter = tenants.NewRateLimiter(d.Redis, d.Cfg.RedisNamespace)
	if err := s.setupWebhooks(); err != nil {
		return nil, err
	}
	s.Secrets = secrets.Service{Keys: s.Webhooks.Keys}
	onTransition := func(t engine.Transition) {
		s.Live.Publish(t)
		if t.Terminal && s.Relay != nil {
			s.Relay.Wake()
		}
		if o.OnTransition != nil {
			o.OnTransition(t)
		}
	}
	s.Enqueuer = outbox.New(d.DB, d.Cfg.SystemDatabaseURL, d.Redis, stream.NewNames(d.Cfg.RedisNamespace),
		outbox.Config{PollInterval: d.Cfg.OutboxPollInterval}, d.Log.Named("outbox"))
	var sweeper *engine.Sweeper
	bulk := &engine.BulkRunner{DB: d.DB, Log: d.Log.Named("bulk"), Parallel: d.Cfg.BulkParallel, OnProgress: s.Live.PublishOp}
	slots := tenants.NewSlots(d.Redis, d.Cfg.RedisNamespace, func(err error) {
		d.Log.Warn("quota permits lapse with the lease TTL instead", zap.Error(err))
	})
	s.slots = slots
	s.Coordinator = engine.NewCoordinator(d.DB, engine.Options{Logger: d.Log.Named("coordinator"), Wake: s.Enqueuer.Wake,
		PublishNow: s.Enqueuer.PublishNow,
		WakeTimers: func() {
			if sweeper != nil {
				sweeper.WakeTimers()
			}
		}, OnTransition: onTransition, Admit: s.admit, Hooks: s.Hooks(), Slots: slots, BulkWake: bulk.Wake,
		StepLimits: tenants.NewStepLimiter(d.Redis, d.Cfg.RedisNamespace)})
	bulk.Coord = s.Coordinator
	s.Bulk = bulk
	s.Background = append(s.Background, bulk)
	s.Poller = taskpoll.New(s.Coordinator, d.Redis, stream.NewNames(d.Cfg.RedisNamespace), slots, taskpoll.Config{}, d.Log.Named("taskpoll"))
	s.Background = append(s.Background, s.Poller)
	names := stream.NewNames(d.Cfg.RedisNamespace)
	sweeper = engine.NewSweeper(s.Coordinator, d.DB, engine.SweeperConfig{Interval: d.Cfg.SweepInterval,
		LostDispatchAge: d.Cfg.LostDispatchAge, RetentionMonths: d.Cfg.RetentionMonths, AuditKeys: s.AuditKeys,
		StillQueued: func(ctx context.Context, tenant uuid.UUID, tasks []uuid.UUID) ([]bool, error) {
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			return names.StillQueued(ctx, d.Redis, tenant, tasks)
		}}, d.Log.Named("sweeper"))
	s.Sweeper = sweeper
	s.Schedules = &schedules.Firer{DB: d.DB, Coord: s.Coordinator, Limiter: s.Limiter, Log: d.Log.Named("schedules")}
	s.Background = append(s.Background, s.Schedules)
	rollup := &billing.Rollup{DB: d.DB, Log: d.Log.Named("usage"), Interval: d.Cfg.UsageRollupInterval,
		Retention: time.Duration(d.Cfg.UsageRetentionDays) * 24 * time.Hour}
	s.Background = append(s.Background, rollup)
	// Dashboard statistics: closed minutes of runs folded into rollups.
	s.Background = append(s.Background, &stats.Folder{DB: d.DB, Log: d.Log.Named("stats")})
	if d.Cfg.BillingExportURL != "" {
		exporter := &billing.Exporter{DB: d.DB, URL: d.Cfg.BillingExportURL, Token: d.Cfg.BillingExportToken, Log: d.Log.Named("usage-export")}
		s.Background = append(s.Background, exporter)
	}

	s.Mux.Handle("POST "+PathEvents, &eventsHandler{s: s})
	s.Mux.Handle("/v1/tasks/", taskserver.New(s.Coordinator, s.Poller, WorkerAuth(d.Cfg.WorkerToken, s.Authn), d.Log.Named("taskapi")).
		WithSecrets(s.secretReader()))
	s.Mux.Handle("/graphql", graph.NewHandler(graph.Options{
		Resolver: &graph.Resolver{DB: d.DB, Coord: s.Coordinator, Authz: s.Authz, Live: s.Live, Limiter: s.Limiter,
			AuditKeys: s.AuditKeys, Webhooks: s.Webhooks, Secrets: s.Secrets, Workers: s.Poller, Schedules: s.Schedules, Log: d.Log.Named("graphql")},
		Authn: s.Authn, Dev: d.Cfg.Dev, AllowedOrigins: d.Cfg.AllowedOrigins, Log: d.Log.Named("graphql"),
	}))
	s.Mux.Handle("GET /schema.graphql", graph.SchemaHandler())
	// The console takes every path no other pattern is more specific for
	// (Go 1.22 patterns: "/graphql", "/v1/tasks/" and "GET /healthz" win), and
	// answers the server's own prefixes with 404 rather than its page.
	s.Mux.Handle("/", console.Handler())
	if d.Cfg.Dev {
		s.Mux.Handle("GET /playground", graph.Playground("/graphql"))
	}
	unregister, err := engine.RegisterGauges(d.DB)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	d.closers = append(d.closers, unregister)
	// Fleet metrics are for the operator only; health is on both listeners
	// (a load balancer probes the public one).
	s.Admin.Handle("GET /metrics", telemetry.MetricsHandler())
	healthz := func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) }
	readyz := func(w http.ResponseWriter, r *http.Request) {
		if s.draining.Load() {
			http.Error(w, "draining", http.StatusServiceUnavailable)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := errors.Join(d.DB.Ping(ctx), d.Redis.Ping(ctx).Err()); err != nil {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	}
	for _, m := range []*http.ServeMux{s.Mux, s.Admin} {
		m.HandleFunc("GET /healthz", healthz)
		m.HandleFunc("GET /readyz", readyz)
	}
	return s, nil
}

// Run serves HTTP on addr and runs the background loops until ctx ends.
// ready, when not nil, receives the bound address.
func (s *Server) Run(ctx context.Context, addr string, ready chan<- string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: telemetry.Handler(s.Mux, s.Log.Named("http")), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 60 * time.Second,
		WriteTimeout: 60 * time.Second, IdleTimeout: 120 * time.Second}
	var admin *http.Server
	if s.Cfg.AdminAddr != "" {
		aln, err := net.Listen("tcp", s.Cfg.AdminAddr)
		if err != nil {
			ln.Close()
			return fmt.Errorf("COMPOSER_ADMIN_ADDR: listen on %s: %w", s.Cfg.AdminAddr, err)
		}
		s.AdminAddr = aln.Addr().String()
		admin = &http.Server{Handler: s.Admin, ReadHeaderTimeout: 10 * time.Second, WriteTimeout: 60 * time.Second}
		go func() { _ = admin.Serve(aln) }()
		defer admin.Close()
	}
	// The loops outlive ctx by the drain delay, like the listener.
	loopCtx, stopLoops := context.WithCancel(context.WithoutCancel(ctx))
	defer stopLoops()
	loops := make(chan error, 1)
	go func() {
		loops <- lifecycle.RunAll(loopCtx, append([]lifecycle.Service{s.Live, s.Enqueuer, s.Sweeper}, s.Background...)...)
	}()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	s.Log.Info("server listening", zap.String("addr", ln.Addr().String()))
	if ready != nil {
		ready <- ln.Addr().String()
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		return fmt.Errorf("http server: %w", err)
	}
	// Readiness goes red first, while everything still serves, so load
	// balancers stop sending requests before the listener closes.
	s.draining.Store(true)
	if s.Cfg.DrainDelay > 0 {
		s.Log.Info("draining: not ready, still serving", zap.Duration("for", s.Cfg.DrainDelay))
		time.Sleep(s.Cfg.DrainDelay)
	}
	stopLoops()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), s.Cfg.ShutdownTimeout)
	defer cancel()
	_ = srv.Shutdown(shutdownCtx)
	if err := <-loops; err != nil {
		s.Log.Warn("a background loop stopped with an error", zap.Error(err))
	}
	if s.slots != nil {
		s.slots.Wait() // quota permits released after the last report
	}
	return nil
}

// NewWorker assembles a platform worker that reaches the server at
// serverURL: it runs http and noop nodes of every tenant. (Task nodes are
// tenants' own code: their workers use the SDK and the poll API.)
func NewWorker(d *Deps, serverURL string) (*workers.Worker, error) {
	if strings.HasPrefix(d.Cfg.WorkerToken, auth.APIKeyPrefix) {
		return nil, errors.New("COMPOSER_WORKER_TOKEN is a tenant API key: `composer worker` is the platform's worker and needs the " +
			"platform token; a tenant runs its own code with the Go SDK (sdk/worker), which needs only the server URL and the key")
	}
	policy, err := ssrf.NewPolicy(d.Cfg.AllowPrivateNetworks, d.Cfg.AllowedPorts...)
	if err != nil {
		return nil, fmt.Errorf("COMPOSER_ALLOW_PRIVATE_NETWORKS or COMPOSER_ALLOWED_PORTS: %w", err)
	}
	executors := map[string]workers.Executor{"http": workers.NewHTTP(policy), "noop": workers.Noop}
	api := taskapi.NewClient(serverURL, d.Cfg.WorkerToken)
	return workers.New(workers.Config{Queues: d.Cfg.WorkerQueues, Concurrency: d.Cfg.WorkerConcurrency, LeaseTTL: d.Cfg.LeaseTTL,
		ClaimIdle: d.Cfg.ClaimIdle, MaxDeliveries: int64(d.Cfg.MaxDeliveries), ShutdownTimeout: d.Cfg.ShutdownTimeout,
		Namespace: d.Cfg.RedisNamespace, NoEager: !d.Cfg.WorkerEager}, d.Redis, api, executors, d.Log.Named("worker")), nil
}

// WorkerAdmin is a platform worker's operator listener: its metrics
// (steps, queue waits, hand-offs, Redis pool), /healthz (the process
// serves) and /readyz (Redis answers).
func WorkerAdmin(d *Deps) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", telemetry.MetricsHandler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := d.Redis.Ping(ctx).Err(); err != nil {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	return mux
}

// ServeAdmin serves an operator listener on addr until ctx ends; it
// returns the bound address.
func ServeAdmin(ctx context.Context, addr string, h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("COMPOSER_ADMIN_ADDR: listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, WriteTimeout: 60 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	context.AfterFunc(ctx, func() { _ = srv.Close() })
	return ln.Addr().String(), nil
}
