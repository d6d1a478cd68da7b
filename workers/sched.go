package workers

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/engine/stream"
	"github.com/composer-dev/composer/engine/taskapi"
)

// queueSched decides, for one queue, whose messages the worker reads next:
// smooth weighted round-robin (the interleaving nginx uses for upstreams)
// over the queue's tenants, weighted by plan. Each slot goes to the
// eligible tenant with the highest running score; every pick adds each
// eligible tenant's weight to its score and takes the total from the
// winner's. Over any stretch of picks a tenant's share is its weight over
// the eligible total, and the picks are spread evenly (weights 4:4 give
// ABAB…, not AAAABBBB…), so a small tenant waits for at most about one
// freed slot per heavier tenant. A tenant that has nothing to read drops
// out for the rest of the fill and banks no positive score (idle tenants
// bank nothing); a tenant whose running-task quota is full gets one probe
// message, not its share; a tenant whose message the quota bounced is
// paused. A tenant with a million queued tasks and one with ten therefore
// both progress, in proportion to their weights, and neither takes more
// slots than its quota allows.
//
// Fair picks alone do not keep a worker responsive: when one tenant's long
// tasks occupy every slot, another tenant's task waits for one of them to
// end, however fair the next pick. So while any other tenant has work
// (tasks running here, or work seen in the last 10 seconds) no tenant may
// hold more than capacity - reserve of the worker's slots; with nobody else
// about, a tenant may use them all.
type queueSched struct {
	mu       sync.Mutex
	tenants  map[uuid.UUID]*tenantSched
	order    []uuid.UUID
	capacity int // the worker's slots
	reserve  int // slots no single tenant takes while others have work
	// recheck is how long a tenant found with nothing to read is left out
	// unless a wake-up names it: workers know every tenant active in the
	// last day, and must not read each one's streams for every freed slot.
	recheck time.Duration
}

type tenantSched struct {
	route tenantShards
	score int
	// inUse counts the worker's slots holding this tenant's messages.
	inUse int
	// lastWork is when the tenant last had work to read.
	lastWork time.Time
	// idleUntil: found empty; not read again before then unless woken.
	idleUntil time.Time
	// wakes counts wake-ups naming the tenant, so a wake-up that raced a
	// read that came back empty is not lost.
	wakes uint64
	// free is the tenant's free quota as the last lease call saw it; -1
	// when unknown or unlimited.
	free         int
	blockedUntil time.Time
	backoff      time.Duration
	// held are messages bounced by a full quota: still in this worker's
	// pending list, retried before new ones.
	held []stream.Message
}

// grant is what one tenant may read in a fill: n messages, the held ones
// first.
type grant struct {
	id    uuid.UUID
	route tenantShards
	n     int
	held  []stream.Message
	wakes uint64
}

const (
	minBlock = 20 * time.Millisecond
	maxBlock = 250 * time.Millisecond
	// recentWork is how long a tenant counts as having work after it last
	// had something to read: long enough to span the pauses of an
	// interactive tenant's runs (a step's HTTP call, a short sleep, the
	// next start), short enough that a lone busy tenant soon gets the
	// whole worker back.
	recentWork = 10 * time.Second
)

func newQueueSched(capacity int, recheck time.Duration) *queueSched {
	return &queueSched{tenants: map[uuid.UUID]*tenantSched{}, capacity: capacity, reserve: capacity / 8, recheck: recheck}
}

func (q *queueSched) ensure(t tenantShards) *tenantSched {
	ts := q.tenants[t.tenant]
	if ts == nil {
		ts = &tenantSched{route: t, free: -1}
		q.tenants[t.tenant] = ts
		q.order = append(q.order, t.tenant)
		return ts
	}
	// After a shard change, read every shard that may hold work.
	ts.route.shards = max(ts.route.shards, t.shards)
	if t.weight > 0 {
		ts.route.weight = t.weight
	}
	return ts
}

// learn records a discovered tenant.
func (q *queueSched) learn(t tenantShards) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.ensure(t)
}

// woke records a wake-up naming a tenant: it has new work.
func (q *queueSched) woke(t tenantShards) {
	q.mu.Lock()
	defer q.mu.Unlock()
	ts := q.ensure(t)
	ts.wakes++
	ts.idleUntil = time.Time{}
	ts.lastWork = time.Now()
}

// took counts slots given to a tenant's messages outside a plan (reclaimed
// messages).
func (q *queueSched) took(id uuid.UUID, n int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.ensure(tenantShards{tenant: id, shards: 1}).inUse += n
}

// release returns one of a tenant's slots.
func (q *queueSched) release(id uuid.UUID) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ts := q.tenants[id]; ts != nil && ts.inUse > 0 {
		ts.inUse--
	}
}

// othersHaveWork reports whether a tenant other than ts has tasks running
// here or had work recently. Caller holds mu.
func (q *queueSched) othersHaveWork(ts *tenantSched, now time.Time) bool {
	for _, o := range q.tenants {
		if o != ts && (o.inUse > 0 || now.Sub(o.lastWork) < recentWork) {
			return true
		}
	}
	return false
}

// mayKeep reports whether a slot a tenant's task frees may go straight to
// the same tenant's next task (eager dispatch) without bypassing the fair
// picks: only while no other tenant has work here, the tenant holds no
// quota-bounced messages, and it is not paused.
func (q *queueSched) mayKeep(id uuid.UUID, now time.Time) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	ts := q.tenants[id]
	return ts != nil && len(ts.held) == 0 && !now.Before(ts.blockedUntil) && !q.othersHaveWork(ts, now)
}

// quiet reports whether no tenant of the queue has had work recently or
// holds bounced messages: nothing here waits for a slot.
func (q *queueSched) quiet(now time.Time) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, ts := range q.tenants {
		if len(ts.held) > 0 || now.Sub(ts.lastWork) < recentWork {
			return false
		}
	}
	return true
}

// quota records a tenant's quota from a lease answer.
func (q *queueSched) quota(tq taskapi.TenantQuota) {
	q.mu.Lock()
	defer q.mu.Unlock()
	ts := q.tenants[tq.Tenant]
	if ts == nil {
		return
	}
	if tq.Limit <= 0 {
		ts.free = -1
	} else {
		ts.free = max(tq.Limit-tq.Running, 0)
	}
	if ts.free != 0 {
		ts.backoff = 0
	}
}

// hold keeps a message bounced by a full quota and pauses its tenant.
func (q *queueSched) hold(m stream.Message) {
	q.mu.Lock()
	defer q.mu.Unlock()
	ts := q.ensure(tenantShards{tenant: m.Tenant, shards: 1})
	ts.held = append(ts.held, m)
	ts.backoff = min(max(ts.backoff*2, minBlock), maxBlock)
	ts.blockedUntil = time.Now().Add(ts.backoff)
	ts.free = 0
}

// limit is how many messages ts may take in one fill. Caller holds mu.
func (ts *tenantSched) limit() int {
	switch {
	case ts.free > 0:
		return ts.free
	case ts.free == 0:
		// Full as last seen: its held messages, or one message to re-read
		// the quota without flooding.
		return max(len(ts.held), 1)
	default:
		return math.MaxInt
	}
}

// plan hands free slots out, one pick at a time, to the tenants not paused
// and not in skip, and returns each chosen tenant's grant.
func (q *queueSched) plan(free int, now time.Time, skip map[uuid.UUID]bool) []grant {
	q.mu.Lock()
	defer q.mu.Unlock()
	var eligible []*tenantSched
	for _, id := range q.order {
		ts := q.tenants[id]
		if !skip[id] && !now.Before(ts.blockedUntil) && !now.Before(ts.idleUntil) {
			eligible = append(eligible, ts)
		}
	}
	limits := make(map[*tenantSched]int, len(eligible))
	for _, ts := range eligible {
		limits[ts] = ts.limit()
		if q.reserve > 0 && q.othersHaveWork(ts, now) {
			limits[ts] = min(limits[ts], max(q.capacity-q.reserve-ts.inUse, 0))
		}
	}
	taken := make(map[*tenantSched]int, len(eligible))
	var picked []*tenantSched
	for range free {
		var best *tenantSched
		total := 0
		for _, ts := range eligible {
			if taken[ts] >= limits[ts] {
				continue
			}
			w := max(ts.route.weight, 1)
			ts.score += w
			total += w
			if best == nil || ts.score > best.score {
				best = ts
			}
		}
		if best == nil {
			break
		}
		best.score -= total
		if taken[best] == 0 {
			picked = append(picked, best)
		}
		taken[best]++
	}
	out := make([]grant, 0, len(picked))
	for _, ts := range picked {
		n := taken[ts]
		k := min(n, len(ts.held))
		g := grant{id: ts.route.tenant, route: ts.route, n: n, held: append([]stream.Message(nil), ts.held[:k]...), wakes: ts.wakes}
		ts.held = ts.held[k:]
		out = append(out, g)
	}
	return out
}

// settle records what a grant got: the quota it used and, when the tenant
// had less to read than it was granted, that it banks no positive score
// and, unless woken meanwhile, is idle for a while.
func (q *queueSched) settle(g grant, got int, now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	ts := q.tenants[g.id]
	if ts == nil {
		return
	}
	if ts.free > 0 {
		ts.free = max(ts.free-got, 0)
	}
	ts.inUse += got
	if got > 0 {
		ts.lastWork = now
	}
	if got < g.n {
		ts.score = min(ts.score, 0)
		if ts.wakes == g.wakes && len(ts.held) == 0 {
			ts.idleUntil = now.Add(q.recheck)
		}
	}
}

// nextUnblock returns when the earliest paused tenant with held messages
// may be tried again (zero when none).
func (q *queueSched) nextUnblock() time.Time {
	q.mu.Lock()
	defer q.mu.Unlock()
	var next time.Time
	for _, ts := range q.tenants {
		if len(ts.held) > 0 && (next.IsZero() || ts.blockedUntil.Before(next)) {
			next = ts.blockedUntil
		}
	}
	return next
}

// heldMessages lists every held message (to keep them claimed).
func (q *queueSched) heldMessages() []stream.Message {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []stream.Message
	for _, ts := range q.tenants {
		out = append(out, ts.held...)
	}
	return out
}

// replace sets the known tenants from a discovery, keeping their state.
func (q *queueSched) replace(found []tenantShards) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, t := range found {
		q.ensure(t)
	}
}

// discover refreshes the tenants with recent work on a queue from the
// active set (no key scans).
func (w *Worker) discover(ctx context.Context, queue string) {
	from := time.Now().Add(-w.cfg.ActiveWindow).UnixMilli()
	members, err := w.rdb.ZRangeByScore(ctx, w.names.Active(queue), &redis.ZRangeBy{Min: fmt.Sprint(from), Max: "+inf"}).Result()
	if err != nil {
		w.log.Warn("discovering tenants failed", zap.String("queue", queue), zap.Error(err))
		return
	}
	var found []tenantShards
	for _, m := range members {
		if t, n, weight, err := stream.ParseActiveMember(m); err == nil {
			found = append(found, tenantShards{tenant: t, shards: n, weight: weight})
		}
	}
	w.scheds[queue].replace(found)
}

// readLoop fills free slots from the queue's tenants in the scheduler's
// order, never taking more messages than it has free slots.
func (w *Worker) readLoop(ctx, execCtx context.Context, queue string) {
	qs := w.scheds[queue]
	var lastDiscover time.Time
	for ctx.Err() == nil {
		if time.Since(lastDiscover) > 5*time.Second {
			w.discover(ctx, queue)
			lastDiscover = time.Now()
		}
		free := w.takeSlots(w.cfg.Concurrency)
		if free == 0 {
			select { // every slot is busy: wait for one to free
			case <-ctx.Done():
			case <-w.freed:
			}
			continue
		}
		got := w.fill(ctx, execCtx, queue, qs, &free)
		for range free {
			w.releaseSlot()
		}
		if got > 0 || ctx.Err() != nil {
			continue
		}
		wait := w.cfg.IdlePoll
		if next := qs.nextUnblock(); !next.IsZero() {
			wait = min(wait, max(time.Until(next), time.Millisecond))
		}
		select {
		case <-ctx.Done():
		case <-w.wakes[queue]:
		case <-time.After(wait):
		}
	}
}

// fill hands free slots to tenants as the scheduler plans them, each
// batch to a lease call off the loop (its slots are already taken). A
// tenant that had less to read than its grant is left out of the rest of
// the fill, and its unused slots are planned again among the others.
func (w *Worker) fill(ctx, execCtx context.Context, queue string, qs *queueSched, free *int) int {
	got := 0
	var skip map[uuid.UUID]bool
	for *free > 0 && ctx.Err() == nil {
		grants := qs.plan(*free, time.Now(), skip)
		if len(grants) == 0 {
			break
		}
		for _, g := range grants {
			msgs := g.held
			if len(msgs) < g.n {
				msgs = append(msgs, w.read(ctx, queue, g.route, g.n-len(msgs))...)
			}
			qs.settle(g, len(msgs), time.Now())
			if len(msgs) < g.n {
				if skip == nil {
					skip = map[uuid.UUID]bool{}
				}
				skip[g.id] = true
			}
			if len(msgs) == 0 {
				continue
			}
			*free -= len(msgs)
			got += len(msgs)
			w.running.Add(1)
			go func() { defer w.running.Done(); w.dispatch(execCtx, msgs) }()
		}
	}
	return got
}

// keepHeld re-claims held messages to this worker without counting a
// delivery (XCLAIM JUSTID), so a long wait for quota does not look like a
// dead consumer to other workers, nor like a poison message.
func (w *Worker) keepHeld(ctx context.Context) {
	for _, qs := range w.scheds {
		byStream := map[string][]string{}
		for _, m := range qs.heldMessages() {
			byStream[m.Stream] = append(byStream[m.Stream], m.ID)
		}
		for key, ids := range byStream {
			err := w.rdb.XClaimJustID(ctx, &redis.XClaimArgs{Stream: key, Group: stream.Group, Consumer: w.cfg.WorkerID, MinIdle: 0, Messages: ids}).Err()
			if err != nil && err != redis.Nil && ctx.Err() == nil {
				w.log.Warn("keeping held messages failed", zap.String("stream", key), zap.Error(err))
			}
		}
	}
}

// routes lists the tenants' routes.
func (q *queueSched) routes() []tenantShards {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make([]tenantShards, 0, len(q.tenants))
	for _, ts := range q.tenants {
		out = append(out, ts.route)
	}
	return out
}
