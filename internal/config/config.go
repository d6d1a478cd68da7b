// Package config reads Composer's typed configuration from environment
// variables. Every variable has a default that points at local services, so a
// development machine needs none of them; a bad value is reported with the
// variable's name.
package config

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/composer-dev/composer/internal/redisconn"
)

// Config is the whole process configuration. The zero value is not useful:
// build it with Load (or Defaults in tests).
type Config struct {
	// DatabaseURL connects as composer_app, the role bound by row-level security.
	// Every request-path and per-run transaction uses it.
	DatabaseURL string
	// SystemDatabaseURL connects as composer_system (BYPASSRLS), used only by
	// the cross-tenant loops: outbox claims, sweeps, timers, key lookups.
	SystemDatabaseURL string
	// MigrateDatabaseURL connects as composer_owner, which owns the schema.
	MigrateDatabaseURL string
	// RedisURL is the Redis that carries task streams: one server, a
	// cluster (redis+cluster://) or a Sentinel master (redis+sentinel://);
	// see internal/redisconn.
	RedisURL string
	// RedisNamespace prefixes every Redis key (several deployments, or
	// tests, may share one Redis). It holds no braces: a tenant's keys are
	// placed on a cluster by the {tenant} hash tag that follows it.
	RedisNamespace string
	// DBMaxConns bounds each PostgreSQL pool.
	DBMaxConns int

	// HTTPAddr is where `composer server` listens (GraphQL and the task API).
	HTTPAddr string
	// AdminAddr is the operator's listener: /metrics, /healthz, /readyz
	// (empty: none — COMPOSER_ADMIN_ADDR set to "" turns it off; unset
	// keeps the default). Keep it off the public network.
	AdminAddr string
	// ServerURL is where workers reach the task API.
	ServerURL string
	// WorkerToken authenticates platform workers to the task API.
	WorkerToken string

	// Dev turns on development conveniences: console logs, introspection,
	// plain-http webhook URLs. Never set it in production.
	Dev bool
	// LogLevel is debug, info, warn or error.
	LogLevel string

	// OTLPEndpoint, when set, exports traces and metrics over OTLP/HTTP.
	OTLPEndpoint string

	// LeaseTTL is how long a worker's lease lasts without renewal.
	LeaseTTL time.Duration
	// SweepInterval is how often the recovery sweeps and timers run.
	SweepInterval time.Duration
	// LostDispatchAge is how long a pending task must have waited before
	// the sweep checks that its message still exists (and dispatches it
	// again if not).
	LostDispatchAge time.Duration
	// OutboxPollInterval is the fallback poll when no NOTIFY arrives.
	OutboxPollInterval time.Duration
	// DefaultStreamShards is the shard count given to new tenants.
	DefaultStreamShards int
	// RetentionMonths is how many whole months of run data are kept.
	RetentionMonths int

	// WorkerQueues are the queues `composer worker` serves.
	WorkerQueues []string
	// WorkerConcurrency is a worker's number of execution slots.
	WorkerConcurrency int
	// WorkerEager lets a worker take a run's next task with the previous
	// step's report (eager dispatch).
	WorkerEager bool
	// ClaimIdle is how long a message may sit with a silent consumer
	// before another worker reclaims it.
	ClaimIdle time.Duration
	// MaxDeliveries bounds how often one message is delivered.
	MaxDeliveries int
	// ShutdownTimeout is how long in-flight work may finish on shutdown.
	ShutdownTimeout time.Duration
	// BulkParallel is how many runs a server's bulk-operation runner
	// changes at once.
	BulkParallel int
	// DrainDelay is how long `composer server` keeps serving after SIGTERM
	// with /readyz answering 503 (and /healthz 200), before it stops
	// accepting connections: long enough for load balancers and Kubernetes
	// endpoints to stop routing to it (5 s in the deploy files; 0 here,
	// for development and tests).
	DrainDelay time.Duration

	// JWTIssuer and JWTAudience must appear in every user token.
	JWTIssuer, JWTAudience string
	// JWTHS256Secret enables HS256 user tokens (development, `composer
	// token`); at least 32 bytes.
	JWTHS256Secret string
	// JWTPublicKeysFile is a PEM file of RS256/ES256 verification keys.
	JWTPublicKeysFile string
	// JWKSFile is a JSON Web Key Set document of the identity provider.
	JWKSFile string

	// AllowedOrigins are host patterns whose pages may open GraphQL
	// subscriptions (websockets); the gateway's own host always may.
	AllowedOrigins []string

	// AllowPrivateNetworks lists CIDRs that outbound requests to tenant URLs
	// may reach although they are private (local development and tests only).
	AllowPrivateNetworks []string

	// AllowedPorts are the ports outbound requests to public addresses may
	// use besides 80 and 443.
	AllowedPorts []int

	// BillingExportURL, when set, receives every usage record (a JSON
	// batch per POST); empty turns export off.
	BillingExportURL string
	// BillingExportToken, when set, is sent as a bearer token to the export
	// endpoint.
	BillingExportToken string
	// UsageRollupInterval is how often usage is rolled into hourly and
	// daily totals.
	UsageRollupInterval time.Duration
	// UsageRetentionDays is how long raw usage records are kept once
	// rolled up (and exported, when export is on).
	UsageRetentionDays int

	// WebhookSecretKeys seal webhook signing secrets at rest (base64, 32
	// bytes each; the first seals, all open). Without one, webhook
	// endpoints cannot be created.
	WebhookSecretKeys []string
	// AuditKeys key the audit log's chain (base64, 32 bytes each; the
	// first signs new records, all verify: list a new key first to rotate,
	// and keep the old ones while records signed under them are kept). A
	// server outside development mode does not start without one.
	AuditKeys []string

	// WebhookDisableAfter disables an endpoint failing without a success
	// for this long.
	WebhookDisableAfter time.Duration
	// WebhookRetentionDays is how long finished deliveries are kept.
	WebhookRetentionDays int
	// WebhookTimeout bounds one delivery attempt; a relay's claim on a
	// delivery lasts three times as long.
	WebhookTimeout time.Duration
}

// The defaults of the settings the engine's packages also use when they
// are built without a Config (tests, embedding): named once, here.
const (
	DefaultLeaseTTL            = 30 * time.Second
	DefaultWorkerConcurrency   = 16
	DefaultMaxDeliveries       = 5
	DefaultShutdownTimeout     = 30 * time.Second
	DefaultSweepInterval       = 5 * time.Second
	DefaultLostDispatchAge     = 10 * time.Second
	DefaultOutboxPollInterval  = time.Second
	DefaultWebhookTimeout      = 10 * time.Second
	DefaultWebhookDisableAfter = 5 * 24 * time.Hour
	DefaultBulkParallel        = 1
)

// DefaultClaimIdle is the claim idle of a lease TTL: twice it, so a
// worker that is only slow keeps its messages.
func DefaultClaimIdle(leaseTTL time.Duration) time.Duration { return 2 * leaseTTL }

// Defaults returns the configuration used when no variable is set.
func Defaults() Config {
	return Config{
		DatabaseURL:          "postgres://composer_app:composer@127.0.0.1:5432/composer?sslmode=disable",
		SystemDatabaseURL:    "postgres://composer_system:composer@127.0.0.1:5432/composer?sslmode=disable",
		MigrateDatabaseURL:   "postgres://composer_owner:composer@127.0.0.1:5432/composer?sslmode=disable",
		RedisURL:             "redis://127.0.0.1:6379/0",
		RedisNamespace:       "composer",
		DBMaxConns:           32,
		WorkerQueues:         []string{"default"},
		WorkerConcurrency:    DefaultWorkerConcurrency,
		WorkerEager:          true,
		ClaimIdle:            DefaultClaimIdle(DefaultLeaseTTL),
		MaxDeliveries:        DefaultMaxDeliveries,
		ShutdownTimeout:      DefaultShutdownTimeout,
		BulkParallel:         DefaultBulkParallel,
		HTTPAddr:             "127.0.0.1:8080",
		AdminAddr:            "127.0.0.1:9090",
		ServerURL:            "http://127.0.0.1:8080",
		LogLevel:             "info",
		LeaseTTL:             DefaultLeaseTTL,
		SweepInterval:        DefaultSweepInterval,
		LostDispatchAge:      DefaultLostDispatchAge,
		OutboxPollInterval:   DefaultOutboxPollInterval,
		DefaultStreamShards:  4,
		RetentionMonths:      3,
		JWTIssuer:            "composer",
		JWTAudience:          "composer-api",
		UsageRollupInterval:  time.Minute,
		UsageRetentionDays:   90,
		WebhookDisableAfter:  DefaultWebhookDisableAfter,
		WebhookRetentionDays: 30,
		WebhookTimeout:       DefaultWebhookTimeout,
	}
}

// Load reads the environment on top of Defaults. It returns every problem
// found, each naming its variable.
func Load() (Config, error) { return load(os.LookupEnv) }

func load(lookup func(string) (string, bool)) (Config, error) {
	c := Defaults()
	p := parser{lookup: lookup}
	p.url("COMPOSER_DATABASE_URL", &c.DatabaseURL, "postgres", "postgresql")
	p.url("COMPOSER_SYSTEM_DATABASE_URL", &c.SystemDatabaseURL, "postgres", "postgresql")
	p.url("COMPOSER_MIGRATE_DATABASE_URL", &c.MigrateDatabaseURL, "postgres", "postgresql")
	p.redisURL("COMPOSER_REDIS_URL", &c.RedisURL)
	p.str("COMPOSER_REDIS_NAMESPACE", &c.RedisNamespace)
	if strings.ContainsAny(c.RedisNamespace, "{}") {
		p.fail("COMPOSER_REDIS_NAMESPACE", "must not contain { or }: the {tenant} hash tag after it places each tenant's keys on a cluster")
	}
	p.integer("COMPOSER_DB_MAX_CONNS", &c.DBMaxConns, 2, 1000)
	p.list("COMPOSER_WORKER_QUEUES", &c.WorkerQueues)
	p.integer("COMPOSER_WORKER_CONCURRENCY", &c.WorkerConcurrency, 1, 10000)
	p.boolean("COMPOSER_WORKER_EAGER", &c.WorkerEager)
	p.integer("COMPOSER_MAX_DELIVERIES", &c.MaxDeliveries, 1, 1000)
	p.duration("COMPOSER_SHUTDOWN_TIMEOUT", &c.ShutdownTimeout, 0)
	p.integer("COMPOSER_BULK_PARALLEL", &c.BulkParallel, 1, 64)
	p.duration("COMPOSER_DRAIN_DELAY", &c.DrainDelay, 0)
	p.str("COMPOSER_HTTP_ADDR", &c.HTTPAddr)
	p.orOff("COMPOSER_ADMIN_ADDR", &c.AdminAddr)
	p.url("COMPOSER_SERVER_URL", &c.ServerURL, "http", "https")
	p.str("COMPOSER_WORKER_TOKEN", &c.WorkerToken)
	p.boolean("COMPOSER_DEV", &c.Dev)
	p.oneOf("COMPOSER_LOG_LEVEL", &c.LogLevel, "debug", "info", "warn", "error")
	p.str("COMPOSER_OTLP_ENDPOINT", &c.OTLPEndpoint)
	p.duration("COMPOSER_LEASE_TTL", &c.LeaseTTL, time.Second)
	c.ClaimIdle = DefaultClaimIdle(c.LeaseTTL) // unless set itself:
	p.duration("COMPOSER_CLAIM_IDLE", &c.ClaimIdle, 100*time.Millisecond)
	p.duration("COMPOSER_SWEEP_INTERVAL", &c.SweepInterval, 10*time.Millisecond)
	p.duration("COMPOSER_LOST_DISPATCH_AGE", &c.LostDispatchAge, 10*time.Millisecond)
	p.duration("COMPOSER_OUTBOX_POLL_INTERVAL", &c.OutboxPollInterval, time.Millisecond)
	p.integer("COMPOSER_DEFAULT_STREAM_SHARDS", &c.DefaultStreamShards, 1, 256)
	p.integer("COMPOSER_RETENTION_MONTHS", &c.RetentionMonths, 1, 1200)
	p.list("COMPOSER_ALLOW_PRIVATE_NETWORKS", &c.AllowPrivateNetworks)
	p.ports("COMPOSER_ALLOWED_PORTS", &c.AllowedPorts)
	p.list("COMPOSER_ALLOWED_ORIGINS", &c.AllowedOrigins)
	p.str("COMPOSER_JWT_ISSUER", &c.JWTIssuer)
	p.str("COMPOSER_JWT_AUDIENCE", &c.JWTAudience)
	p.str("COMPOSER_JWT_HS256_SECRET", &c.JWTHS256Secret)
	p.str("COMPOSER_JWT_PUBLIC_KEYS_FILE", &c.JWTPublicKeysFile)
	p.str("COMPOSER_JWKS_FILE", &c.JWKSFile)
	p.url("COMPOSER_BILLING_EXPORT_URL", &c.BillingExportURL, "http", "https")
	p.str("COMPOSER_BILLING_EXPORT_TOKEN", &c.BillingExportToken)
	p.duration("COMPOSER_USAGE_ROLLUP_INTERVAL", &c.UsageRollupInterval, 10*time.Millisecond)
	p.integer("COMPOSER_USAGE_RETENTION_DAYS", &c.UsageRetentionDays, 1, 3650)
	p.list("COMPOSER_WEBHOOK_SECRET_KEY", &c.WebhookSecretKeys)
	p.list("COMPOSER_AUDIT_KEY", &c.AuditKeys)
	p.duration("COMPOSER_WEBHOOK_DISABLE_AFTER", &c.WebhookDisableAfter, time.Minute)
	p.integer("COMPOSER_WEBHOOK_RETENTION_DAYS", &c.WebhookRetentionDays, 1, 3650)
	p.duration("COMPOSER_WEBHOOK_TIMEOUT", &c.WebhookTimeout, 100*time.Millisecond)
	if c.JWTHS256Secret != "" && len(c.JWTHS256Secret) < 32 {
		p.fail("COMPOSER_JWT_HS256_SECRET", "must be at least 32 bytes")
	}
	return c, errors.Join(p.errs...)
}

type parser struct {
	lookup func(string) (string, bool)
	errs   []error
}

func (p *parser) get(name string) (string, bool) {
	v, ok := p.lookup(name)
	if !ok || strings.TrimSpace(v) == "" {
		return "", false
	}
	return strings.TrimSpace(v), true
}

func (p *parser) fail(name, format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("%s: %s", name, fmt.Sprintf(format, args...)))
}

func (p *parser) str(name string, dst *string) {
	if v, ok := p.get(name); ok {
		*dst = v
	}
}

// orOff is str for a setting that an empty value turns off: unset keeps
// the default, set to "" (or blanks) clears it.
func (p *parser) orOff(name string, dst *string) {
	if v, ok := p.lookup(name); ok {
		*dst = strings.TrimSpace(v)
	}
}

func (p *parser) url(name string, dst *string, schemes ...string) {
	v, ok := p.get(name)
	if !ok {
		return
	}
	u, err := url.Parse(v)
	if err != nil {
		p.fail(name, "not a URL") // the value may hold a password: never echo it
		return
	}
	for _, s := range schemes {
		if u.Scheme == s {
			*dst = v
			return
		}
	}
	p.fail(name, "scheme %q is not one of %s", u.Scheme, strings.Join(schemes, ", "))
}

func (p *parser) redisURL(name string, dst *string) {
	v, ok := p.get(name)
	if !ok {
		return
	}
	if _, err := redisconn.Parse(v); err != nil {
		p.fail(name, "%v", err) // (redisconn never echoes a password)
		return
	}
	*dst = v
}

func (p *parser) boolean(name string, dst *bool) {
	v, ok := p.get(name)
	if !ok {
		return
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		p.fail(name, "%q is not a boolean (use true or false)", v)
		return
	}
	*dst = b
}

func (p *parser) oneOf(name string, dst *string, allowed ...string) {
	v, ok := p.get(name)
	if !ok {
		return
	}
	for _, a := range allowed {
		if v == a {
			*dst = v
			return
		}
	}
	p.fail(name, "%q is not one of %s", v, strings.Join(allowed, ", "))
}

func (p *parser) duration(name string, dst *time.Duration, minimum time.Duration) {
	v, ok := p.get(name)
	if !ok {
		return
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		p.fail(name, "%q is not a duration (e.g. 30s, 5m)", v)
		return
	}
	if d < minimum {
		p.fail(name, "%s is below the minimum %s", d, minimum)
		return
	}
	*dst = d
}

func (p *parser) integer(name string, dst *int, lo, hi int) {
	v, ok := p.get(name)
	if !ok {
		return
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		p.fail(name, "%q is not an integer", v)
		return
	}
	if n < lo || n > hi {
		p.fail(name, "%d is outside %d..%d", n, lo, hi)
		return
	}
	*dst = n
}

func (p *parser) ports(name string, dst *[]int) {
	var items []string
	p.list(name, &items)
	for _, it := range items {
		n, err := strconv.Atoi(it)
		if err != nil || n < 1 || n > 65535 {
			p.fail(name, "%q is not a port (1-65535)", it)
			continue
		}
		*dst = append(*dst, n)
	}
}

func (p *parser) list(name string, dst *[]string) {
	v, ok := p.get(name)
	if !ok {
		return
	}
	var out []string
	for _, part := range strings.Split(v, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	*dst = out
}
