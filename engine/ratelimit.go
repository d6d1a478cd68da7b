package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/engine/taskapi"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/tenants"
)

// StepLimits takes tokens of tenants' step rate limits
// (tenants.StepLimiter): zero to run now, else how long to wait.
type StepLimits interface {
	Take(ctx context.Context, reqs []tenants.StepRequest) ([]time.Duration, error)
}

// qDeferTask gives a just-granted lease back — the task pending again on
// the same attempt — and re-dispatches it through the outbox when its
// token is due ($6 seconds from now), with a `rate_limited` timeline entry
// naming the limit ($7), the key ($8) and the wait, so a reader sees why
// the step waits. Fenced like a release: only this owner's live lease on
// that attempt.
const qDeferTask = `WITH released AS (
		UPDATE task_instances SET state = 'pending', lease_owner = NULL, lease_expires_at = NULL, started_at = NULL,
		       dispatch_at = now(), updated_at = now()
		 WHERE tenant_id = $1 AND run_id = $2 AND id = $3 AND attempt = $4 AND state = 'running' AND lease_owner = $5
		RETURNING tenant_id, run_id, id, node_id, node_type, queue, config, attempt
	), dispatched AS (
		INSERT INTO outbox (tenant_id, queue, run_id, task_id, node_id, node_type, handler, attempt, traceparent, next_attempt_at, priority)
		SELECT t.tenant_id, coalesce(t.queue, 'default'), t.run_id, t.id, t.node_id, t.node_type, t.config->'task'->>'handler', t.attempt,
		       r.traceparent, now() + make_interval(secs => $6), coalesce((t.config->>'priority')::int, 0)
		  FROM released t JOIN workflow_runs r ON r.tenant_id = t.tenant_id AND r.id = t.run_id
	)
	INSERT INTO run_events (tenant_id, run_id, kind, node_id, task_id, attempt, detail)
	SELECT tenant_id, run_id, 'rate_limited', node_id, id, attempt,
	       jsonb_build_object('status', 'running', 'limit', $7::text, 'key', $8::text, 'wait_ms', round($6 * 1000))
	  FROM released`

const qRateLimitOf = `SELECT per_second, burst FROM rate_limits WHERE tenant_id = $1 AND name = $2`

// rateLimited is a granted lease whose step takes a token first.
type rateLimited struct {
	group, idx int
	req        tenants.StepRequest
}

// deferRateLimited takes the tokens of the rate-limited steps among the
// leases just granted. A step whose token is not due yet is not run: its
// lease is given back (same attempt: nothing is spent, nothing failed) and
// it is re-dispatched for when its reserved token is due; its Lease reads
// not acquired, so the worker drops the message and the permit goes back.
// If Redis or the database fails here the step runs (fail open; logged).
func (c *Coordinator) deferRateLimited(ctx context.Context, owner string, groups []TenantLeases) {
	if c.opts.StepLimits == nil {
		return
	}
	var todo []rateLimited
	for gi := range groups {
		g := &groups[gi]
		for i := range g.Leases {
			l := &g.Leases[i]
			if !l.Acquired || !bytes.Contains(l.Config, []byte(`"rate_limit"`)) {
				continue
			}
			var cfg taskapi.TaskConfig
			if err := json.Unmarshal(l.Config, &cfg); err != nil || cfg.RateLimit == nil {
				continue
			}
			def, ok, err := c.rateLimits.get(ctx, g.Tenant, cfg.RateLimit.Name)
			if err != nil {
				c.log.Warn("reading a rate limit failed; the step runs", zap.Error(err))
				continue
			}
			if !ok {
				continue // deleted since: the step runs unlimited
			}
			todo = append(todo, rateLimited{group: gi, idx: i, req: tenants.StepRequest{Tenant: g.Tenant, Limit: cfg.RateLimit.Name,
				Key: cfg.RateLimit.Key, Task: l.TaskID, Attempt: g.Requests[i].Attempt, PerSecond: def.perSecond, Burst: def.burst}})
		}
	}
	if len(todo) == 0 {
		return
	}
	reqs := make([]tenants.StepRequest, len(todo))
	for i, t := range todo {
		reqs[i] = t.req
	}
	waits, err := c.opts.StepLimits.Take(ctx, reqs)
	if err != nil {
		c.log.Warn("step rate limits unavailable; steps run", zap.Error(err))
	}
	byTenant := map[int]*pgx.Batch{}
	var deferred []rateLimited
	for i, t := range todo {
		if waits[i] <= 0 {
			continue
		}
		b := byTenant[t.group]
		if b == nil {
			b = &pgx.Batch{}
			byTenant[t.group] = b
		}
		r := groups[t.group].Requests[t.idx]
		b.Queue(qDeferTask, groups[t.group].Tenant, r.RunID, r.TaskID, r.Attempt, owner, waits[i].Seconds(), t.req.Limit, t.req.Key)
		deferred = append(deferred, t)
	}
	if len(deferred) == 0 {
		return
	}
	parts := make([]pg.TenantBatch, 0, len(byTenant))
	for gi, b := range byTenant {
		parts = append(parts, pg.TenantBatch{Tenant: groups[gi].Tenant, Batch: b})
	}
	if err := c.db.PipelineTenants(context.WithoutCancel(ctx), parts); err != nil {
		c.log.Warn("deferring rate-limited steps failed; they run now", zap.Error(err))
		return
	}
	for _, t := range deferred {
		groups[t.group].Leases[t.idx] = Lease{TaskID: groups[t.group].Leases[t.idx].TaskID}
	}
	c.rateDeferred.Add(int64(len(deferred)))
	if c.opts.Wake != nil {
		c.opts.Wake() // the enqueuer sleeps until its next due row
	}
}

// RateDeferred is how many steps this coordinator deferred for their rate
// limit (tests, benchmarks).
func (c *Coordinator) RateDeferred() int64 { return c.rateDeferred.Load() }

// rateLimitCache remembers tenants' rate limits for RateLimitCacheTTL.
type rateLimitCache struct {
	db *pg.DB
	mu sync.Mutex
	m  map[rateLimitKey]cachedRateLimit
}

type rateLimitKey struct {
	tenant uuid.UUID
	name   string
}

type cachedRateLimit struct {
	found     bool
	perSecond float64
	burst     int
	at        time.Time
}

// RateLimitCacheTTL is how soon a changed or deleted rate limit applies
// to the lease path.
const RateLimitCacheTTL = 5 * time.Second

func newRateLimitCache(db *pg.DB) *rateLimitCache {
	return &rateLimitCache{db: db, m: map[rateLimitKey]cachedRateLimit{}}
}

func (r *rateLimitCache) get(ctx context.Context, tenant uuid.UUID, name string) (cachedRateLimit, bool, error) {
	k := rateLimitKey{tenant, name}
	r.mu.Lock()
	c, ok := r.m[k]
	r.mu.Unlock()
	if ok && time.Since(c.at) < RateLimitCacheTTL {
		return c, c.found, nil
	}
	c = cachedRateLimit{}
	err := r.db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		err := tx.QueryRow(ctx, qRateLimitOf, tenant, name).Scan(&c.perSecond, &c.burst)
		if err == pgx.ErrNoRows {
			return nil
		}
		c.found = err == nil
		return err
	})
	if err != nil {
		return cachedRateLimit{}, false, fmt.Errorf("rate limit %q: %w", name, err)
	}
	c.at = time.Now()
	r.mu.Lock()
	if len(r.m) > 100_000 {
		clear(r.m)
	}
	r.m[k] = c
	r.mu.Unlock()
	return c, c.found, nil
}
