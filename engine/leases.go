package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/tenants"
)

// LeaseRequest names one attempt of one task a worker wants to run.
type LeaseRequest struct {
	RunID   uuid.UUID
	TaskID  uuid.UUID
	Attempt int
}

// Lease is the answer to one LeaseRequest. When Acquired, the worker holds
// the task until ExpiresAt (database clock) unless it renews.
type Lease struct {
	TaskID uuid.UUID
	// RunID, Attempt, Queue and TraceParent are set on an eager lease
	// (Ack.Next), which answers no request that named them.
	RunID           uuid.UUID
	Attempt         int
	Queue           string
	TraceParent     string
	Acquired        bool
	ExpiresAt       time.Time
	NodeID          string
	NodeType        string
	Input           json.RawMessage
	Config          json.RawMessage
	WorkflowID      uuid.UUID
	WorkflowVersion int
	MaxAttempts     int
}

// Holder is who a lease is taken for. Worker is the id the worker names
// itself by (the lease owner). Key, for a tenant's own worker, is the API
// key it authenticated with — the caller sets it from the credential,
// never from the request. A lease taken with a key is bound to it: it is
// renewed, handed back, released and reported only by a holder with the
// same key and worker id (a worker id alone is no capability), and only
// for a task node, the one kind of node tenant workers run. A platform
// worker has no key.
type Holder struct {
	Worker string
	Key    string
}

// maxLeaseTTL bounds a lease: a worker that wants longer renews.
const maxLeaseTTL = 10 * time.Minute

// maxKeyID bounds Holder.Key (API key ids are 12 characters).
const maxKeyID = 64

func checkLease(h Holder, ttl time.Duration, n int) error {
	if h.Worker == "" || len(h.Worker) > 200 {
		return errs.E(errs.Invalid, "a lease owner (worker id) of 1-200 characters is required")
	}
	if len(h.Key) > maxKeyID {
		return errs.E(errs.Invalid, "a lease holder's key id is at most %d characters", maxKeyID)
	}
	if ttl < time.Second || ttl > maxLeaseTTL {
		return errs.E(errs.Invalid, "lease TTL must be between 1s and %s", maxLeaseTTL)
	}
	if n > 1000 {
		return errs.E(errs.Invalid, "at most 1000 leases per call")
	}
	return nil
}

// AcquireLeases leases pending tasks of running runs to h, in one
// round trip of conditional UPDATEs on the database clock: a task already
// leased or finished, a stale attempt, or a run that is no longer running
// is not acquired — the worker drops that message. A lease never goes
// through the run lock: it changes no decision of the state machine.
//
// The tenant's running-task quota comes first: each request needs a
// permit from the slot gate, taken before the lease transaction and given
// back when the lease is not granted, so live leases never outnumber
// permits. A request refused for quota is not acquired either, and the
// returned Quota tells the worker the tenant is full.
// A holder with a key (a tenant's worker) is leased task nodes only.
func (c *Coordinator) AcquireLeases(ctx context.Context, tenant uuid.UUID, h Holder, ttl time.Duration, reqs []LeaseRequest) ([]Lease, Quota, error) {
	res, err := c.AcquireLeasesOf(ctx, h, ttl, []TenantLeases{{Tenant: tenant, Requests: reqs}})
	if err != nil {
		return nil, Quota{}, err
	}
	return res[0].Leases, res[0].Quota, nil
}

// TenantLeases are one tenant's lease requests in AcquireLeasesOf; the
// answer fills Leases (one per request, in order) and Quota.
type TenantLeases struct {
	Tenant   uuid.UUID
	Requests []LeaseRequest
	Leases   []Lease
	Quota    Quota
}

// AcquireLeasesOf is AcquireLeases for the requests of several tenants (a
// platform worker's fill spreads over tenants): each tenant's quota
// permits as there, and every lease statement in one implicit transaction
// and one round trip, each tenant's statements under its own tenant
// setting (pg.DB.PipelineTenants: row-level security applies to each
// statement as in a transaction of that tenant alone). One commit for the
// whole fill instead of one per tenant; if it fails, every tenant's
// permits go back and the worker puts the messages back.
func (c *Coordinator) AcquireLeasesOf(ctx context.Context, h Holder, ttl time.Duration, groups []TenantLeases) ([]TenantLeases, error) {
	total := 0
	for _, g := range groups {
		if g.Tenant == uuid.Nil {
			return nil, errs.E(errs.Unauthenticated, "no tenant")
		}
		total += len(g.Requests)
	}
	if err := checkLease(h, ttl, total); err != nil {
		return nil, err
	}
	type prep struct {
		idx       map[uuid.UUID][]int
		permits   []tenants.Permit
		members   []string
		permitsAt time.Time
	}
	preps := make([]prep, len(groups))
	if c.opts.Slots != nil && len(groups) > 1 {
		ids := make([]uuid.UUID, len(groups))
		for i, g := range groups {
			ids[i] = g.Tenant
		}
		if err := c.limits.load(ctx, ids); err != nil {
			return nil, err
		}
	}
	// Permits taken so far go back if a later step fails.
	giveBack := func(upTo int) {
		for i := range upTo {
			var taken []string
			for j, m := range preps[i].members {
				if preps[i].permits[j] == tenants.PermitTaken {
					taken = append(taken, m)
				}
			}
			if len(taken) > 0 {
				if rerr := c.opts.Slots.Release(context.WithoutCancel(ctx), groups[i].Tenant, taken); rerr != nil {
					c.log.Warn("giving back quota permits failed; they lapse with the lease TTL", zap.Error(rerr))
				}
			}
		}
	}
	parts := make([]pg.TenantBatch, 0, len(groups))
	for gi := range groups {
		g := &groups[gi]
		p := &preps[gi]
		g.Leases = make([]Lease, len(g.Requests))
		g.Quota = Quota{}
		p.idx = map[uuid.UUID][]int{}
		for i, r := range g.Requests {
			g.Leases[i] = Lease{TaskID: r.TaskID}
			p.idx[r.TaskID] = append(p.idx[r.TaskID], i)
		}
		p.permits = make([]tenants.Permit, len(g.Requests))
		for i := range p.permits {
			p.permits[i] = tenants.PermitHeld // no quota: nothing to take or give back
		}
		p.permitsAt = time.Now() // no earlier than the permits' own clock reading, less any skew
		if c.opts.Slots != nil {
			limit, err := c.limits.get(ctx, g.Tenant)
			if err != nil {
				giveBack(gi)
				return nil, err
			}
			if limit > 0 {
				p.members = make([]string, len(g.Requests))
				for i, r := range g.Requests {
					p.members[i] = tenants.SlotMember(r.TaskID, r.Attempt, h.Worker)
				}
				if p.permits, g.Quota.Running, err = c.opts.Slots.Acquire(ctx, g.Tenant, limit, ttl, p.members); err != nil {
					p.members = nil
					giveBack(gi)
					return nil, err
				}
				g.Quota.Limit = limit
			}
		}
		// One primary-key UPDATE per request. (A single UPDATE ... FROM
		// unnest(...) is planned, as a generic plan, as a join over every
		// pending task of the tenant.)
		b := &pgx.Batch{}
		for i, r := range g.Requests {
			if !p.permits[i].Granted() {
				continue
			}
			b.Queue(qAcquireLease,
				g.Tenant, r.RunID, r.TaskID, r.Attempt, h.Worker, ttl.Seconds(), h.Key).Query(func(rows pgx.Rows) error {
				if first := p.idx[r.TaskID][0]; first != i {
					var ignored Lease // a duplicate request in the batch gets no second lease
					return scanLease(rows, r.TaskID, &ignored)
				}
				return scanLease(rows, r.TaskID, &g.Leases[i])
			})
		}
		if b.Len() > 0 {
			parts = append(parts, pg.TenantBatch{Tenant: g.Tenant, Batch: b})
		}
	}
	var err error
	if len(parts) > 0 {
		if err = c.db.PipelineTenants(ctx, parts); err != nil {
			err = fmt.Errorf("acquire leases: %w", err)
		}
	}
	if err == nil {
		c.deferRateLimited(ctx, h.Worker, groups)
	}
	for gi := range groups {
		g, p := &groups[gi], &preps[gi]
		if p.members == nil {
			continue
		}
		if err != nil {
			for i := range g.Leases {
				g.Leases[i] = Lease{TaskID: g.Requests[i].TaskID}
			}
		}
		// Permits this call took whose lease was not granted go back (all
		// of them when the transaction failed). A permit the member already
		// held stays: it is a live lease's — this owner asked again for a
		// task it holds (a duplicate message) — and giving it back would let
		// another task run in that lease's place.
		kept := map[string]bool{}
		for i, m := range p.members {
			if err == nil && g.Leases[i].Acquired {
				kept[m] = true
			}
		}
		var unused []string
		for i, m := range p.members {
			if p.permits[i] == tenants.PermitTaken && !kept[m] {
				kept[m] = true // once: a duplicate request named the same permit
				unused = append(unused, m)
			}
		}
		// A permit lives PermitGrace longer than the TTL from when it was
		// taken; the lease, TTL from its commit. If the lease transaction
		// came late (a wait for a connection, a loaded machine), the permits
		// would lapse before their leases and let another task in: re-score
		// them from now, while they are still held (they live a whole TTL).
		if err == nil && time.Since(p.permitsAt) > tenants.PermitGrace/2 {
			var granted []string
			for i, m := range p.members {
				if g.Leases[i].Acquired {
					granted = append(granted, m)
				}
			}
			if len(granted) > 0 {
				if rerr := c.opts.Slots.Renew(context.WithoutCancel(ctx), g.Tenant, ttl, granted); rerr != nil {
					c.log.Warn("extending quota permits of late leases failed", zap.Error(rerr))
				}
			}
		}
		if len(unused) > 0 {
			if rerr := c.opts.Slots.Release(context.WithoutCancel(ctx), g.Tenant, unused); rerr != nil {
				c.log.Warn("giving back quota permits failed; they lapse with the lease TTL", zap.Error(rerr))
			}
			g.Quota.Running -= len(unused)
		}
	}
	if err != nil {
		return nil, err
	}
	return groups, nil
}

// RunningLimit is the tenant's running-task limit (0: none), as the lease
// path enforces it (cached for a few seconds).
func (c *Coordinator) RunningLimit(ctx context.Context, tenant uuid.UUID) (int, error) {
	if c.opts.Slots == nil {
		return 0, nil
	}
	return c.limits.get(ctx, tenant)
}

// ReacquireLeases hands h back leases it already holds — live, on the
// named attempts — with their input and settings, extended by ttl: a poll
// answer that never arrived is recovered by the repeated poll, so its tasks
// run now instead of waiting out their leases. A lease that is gone (run
// cancelled, expired and swept) is not acquired.
func (c *Coordinator) ReacquireLeases(ctx context.Context, tenant uuid.UUID, h Holder, ttl time.Duration, reqs []LeaseRequest) ([]Lease, error) {
	if err := checkLease(h, ttl, len(reqs)); err != nil {
		return nil, err
	}
	out := make([]Lease, len(reqs))
	b := &pgx.Batch{}
	for i, r := range reqs {
		out[i] = Lease{TaskID: r.TaskID}
		b.Queue(qReacquireLease,
			tenant, r.RunID, r.TaskID, r.Attempt, h.Worker, ttl.Seconds(), h.Key).Query(func(rows pgx.Rows) error {
			return scanLease(rows, r.TaskID, &out[i])
		})
	}
	if err := c.db.Pipeline(ctx, tenant, b); err != nil {
		return nil, fmt.Errorf("reacquire leases: %w", err)
	}
	if c.opts.Slots != nil {
		var held []string
		for i, r := range reqs {
			if out[i].Acquired {
				held = append(held, tenants.SlotMember(r.TaskID, r.Attempt, h.Worker))
			}
		}
		if err := c.opts.Slots.Renew(ctx, tenant, ttl, held); err != nil {
			c.log.Warn("renewing quota permits failed", zap.Error(err))
		}
	}
	return out, nil
}

// scanLease reads the RETURNING row of a lease statement, if any, into l.
func scanLease(rows pgx.Rows, task uuid.UUID, l *Lease) error {
	var input, config []byte
	got := Lease{TaskID: task}
	_, err := pgx.ForEachRow(rows, []any{&got.ExpiresAt, &got.NodeID, &got.NodeType, &input, &config, &got.MaxAttempts, &got.WorkflowID, &got.WorkflowVersion},
		func() error {
			got.Acquired, got.Input, got.Config = true, append(json.RawMessage(nil), input...), append(json.RawMessage(nil), config...)
			*l = got
			return nil
		})
	return err
}

// ReleaseLeases gives back leases h was granted but never received (a
// poll whose caller went away before the answer was written): each task is
// pending again on the same attempt, and its quota permit is returned. The
// caller re-queues the tasks' messages. Fenced like a report: only h's
// live lease on that attempt (taken with its key) is released.
func (c *Coordinator) ReleaseLeases(ctx context.Context, tenant uuid.UUID, h Holder, reqs []LeaseRequest) error {
	if len(reqs) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	for _, r := range reqs {
		b.Queue(qReleaseLease,
			tenant, r.RunID, r.TaskID, r.Attempt, h.Worker, h.Key)
	}
	if err := c.db.Pipeline(ctx, tenant, b); err != nil {
		return fmt.Errorf("release leases: %w", err)
	}
	if c.opts.Slots != nil {
		members := make([]string, len(reqs))
		for i, r := range reqs {
			members[i] = tenants.SlotMember(r.TaskID, r.Attempt, h.Worker)
		}
		if err := c.opts.Slots.Release(ctx, tenant, members); err != nil {
			c.log.Warn("giving back quota permits failed; they lapse with the lease TTL", zap.Error(err))
		}
	}
	return nil
}

// ExpireKeyLeases ends, now, every live lease of the tenant taken with
// the API key keyID (it was revoked: nothing its workers report can be
// accepted any more), so the sweep gives their tasks to other workers at
// its next pass instead of after the lease TTL.
func (c *Coordinator) ExpireKeyLeases(ctx context.Context, tenant uuid.UUID, keyID string) (int64, error) {
	if keyID == "" {
		return 0, nil
	}
	var n int64
	err := c.db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		tag, err := tx.Exec(ctx, qExpireKeyLeases, tenant, keyID)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("expire leases: %w", err)
	}
	return n, nil
}

// Quota is a tenant's running-task quota as a lease call left it: Limit 0
// means unlimited.
type Quota struct {
	Limit   int
	Running int
}

// Full reports whether no slot is free.
func (q Quota) Full() bool { return q.Limit > 0 && q.Running >= q.Limit }

// Renewal answers one renewal: Held is false when the lease is gone — it
// expired and was taken away, the task finished, or the run was cancelled —
// and the worker must stop.
type Renewal struct {
	TaskID    uuid.UUID
	Held      bool
	ExpiresAt time.Time
}

// RenewLeases extends h's leases, on the database clock. A lease taken
// with another key, or by another worker, is not held.
func (c *Coordinator) RenewLeases(ctx context.Context, tenant uuid.UUID, h Holder, ttl time.Duration, reqs []LeaseRequest) ([]Renewal, error) {
	if err := checkLease(h, ttl, len(reqs)); err != nil {
		return nil, err
	}
	out := make([]Renewal, len(reqs))
	for i, r := range reqs {
		out[i] = Renewal{TaskID: r.TaskID}
	}
	b := &pgx.Batch{}
	for i, r := range reqs {
		// An expired lease is not renewed, even before the sweep has taken
		// it: its quota permit has lapsed and may be another task's now.
		b.Queue(qRenewLease, tenant, r.RunID, r.TaskID, r.Attempt, h.Worker, ttl.Seconds(), h.Key).Query(func(rows pgx.Rows) error {
			var exp time.Time
			_, err := pgx.ForEachRow(rows, []any{&exp}, func() error {
				out[i] = Renewal{TaskID: r.TaskID, Held: true, ExpiresAt: exp}
				return nil
			})
			return err
		})
	}
	if err := c.db.Pipeline(ctx, tenant, b); err != nil {
		return nil, fmt.Errorf("renew leases: %w", err)
	}
	if c.opts.Slots != nil {
		var held []string
		for i, r := range reqs {
			if out[i].Held {
				held = append(held, tenants.SlotMember(r.TaskID, r.Attempt, h.Worker))
			}
		}
		// The permits follow the leases. A failure here is not the
		// worker's: its leases were renewed; the permits lapse at their
		// old expiry at worst, so the quota errs on the side of admitting.
		if err := c.opts.Slots.Renew(ctx, tenant, ttl, held); err != nil {
			c.log.Warn("renewing quota permits failed", zap.Error(err))
		}
	}
	return out, nil
}

// limitCache remembers tenants' running-task limits for a few seconds: the
// lease path asks for every batch, and limits change rarely (a change
// applies within limitTTL).
type limitCache struct {
	db *pg.DB
	mu sync.Mutex
	m  map[uuid.UUID]cachedLimit
}

type cachedLimit struct {
	limit int
	at    time.Time
}

const limitTTL = 5 * time.Second

func newLimitCache(db *pg.DB) *limitCache {
	return &limitCache{db: db, m: map[uuid.UUID]cachedLimit{}}
}

// load makes sure the cache holds a fresh limit for every tenant named,
// reading the missing ones in one round trip and one transaction (each
// read under its own tenant), so a lease call over many tenants that were
// quiet costs one read, not one per tenant.
func (l *limitCache) load(ctx context.Context, ids []uuid.UUID) error {
	var parts []pg.TenantBatch
	got := make([]int, len(ids))
	var missing []uuid.UUID
	l.mu.Lock()
	for _, id := range ids {
		if c, ok := l.m[id]; !ok || time.Since(c.at) >= limitTTL {
			missing = append(missing, id)
		}
	}
	l.mu.Unlock()
	if len(missing) < 2 {
		return nil // get reads a single one itself
	}
	for i, id := range missing {
		b := &pgx.Batch{}
		b.Queue(qRunningLimit, id).QueryRow(func(r pgx.Row) error { return r.Scan(&got[i]) })
		parts = append(parts, pg.TenantBatch{Tenant: id, Batch: b})
	}
	if err := l.db.PipelineTenants(ctx, parts); err != nil {
		return fmt.Errorf("running-task limits: %w", err)
	}
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.m) > 100_000 {
		clear(l.m)
	}
	for i, id := range missing {
		l.m[id] = cachedLimit{limit: got[i], at: now}
	}
	return nil
}

func (l *limitCache) get(ctx context.Context, tenant uuid.UUID) (int, error) {
	l.mu.Lock()
	c, ok := l.m[tenant]
	l.mu.Unlock()
	if ok && time.Since(c.at) < limitTTL {
		return c.limit, nil
	}
	var limit int
	err := l.db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		return tx.QueryRow(ctx, qRunningLimit, tenant).Scan(&limit)
	})
	if err != nil {
		return 0, fmt.Errorf("running-task limit: %w", err)
	}
	l.mu.Lock()
	if len(l.m) > 100_000 {
		clear(l.m)
	}
	l.m[tenant] = cachedLimit{limit: limit, at: time.Now()}
	l.mu.Unlock()
	return limit, nil
}
