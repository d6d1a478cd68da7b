package workers

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/engine/stream"
	"github.com/composer-dev/composer/engine/taskapi"
	"github.com/composer-dev/composer/internal/lifecycle"
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
	mu      sync.Mutex
	tenants map[uuid.UUID]*tenantSched
	// live are the tenants that may be read: ready ones and those holding
	// bounced messages. Dormant tenants are in tenants only, and cost a
	// fill nothing, however many there are.
	live map[uuid.UUID]*tenantSched
	// hot are the tenants that had work lately or have tasks running here
	// (pruned as they cool), so "does anyone else have work" does not walk
	// every known tenant.
	hot      map[uuid.UUID]*tenantSched
	capacity int // the worker's slots
	reserve  int // slots no single tenant takes while others have work
	// prioReserve: slots a tenant's lower priorities leave to its higher
	// ones while those have work (priorityCap)
	prioReserve int
	seq         int // numbers tenants in the order they became known
}

// A tenant is ready while it may have unread messages: when first known,
// when a wake-up or the active set shows it published, and while its reads
// fill what they were granted. A read that comes back short makes it
// dormant: it is not read again until it publishes again (a wake-up, or a
// new score in the active set when a wake-up was lost), so a thousand
// tenants that went quiet cost a worker nothing per fill.
type tenantSched struct {
	route tenantShards
	seq   int
	score int
	ready bool
	// inUse counts the worker's slots holding this tenant's messages;
	// byPrio splits it by the messages' priority, and prioAt is when a
	// message of each priority was last read (see priorityCap).
	inUse  int
	byPrio [prioLevels]int
	prioAt [prioLevels]time.Time
	// lastWork is when the tenant last had work to read.
	lastWork time.Time
	// wakes counts wake-ups naming the tenant, so a wake-up that raced a
	// read that came back short is not lost.
	wakes uint64
	// published is the tenant's last publish time (the active set's score,
	// in milliseconds) as this worker has seen it.
	published float64
	// settled: the reclaim pass found the tenant's streams empty, and it
	// has not published since; it needs no reclaim pass until it does.
	settled bool
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
	// capArg bounds the messages below the tenant's top priority the read
	// may take ("<top> <budget>"; empty for no bound), see priorityCap.
	capArg string
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

func newQueueSched(capacity int) *queueSched {
	return &queueSched{tenants: map[uuid.UUID]*tenantSched{}, live: map[uuid.UUID]*tenantSched{}, hot: map[uuid.UUID]*tenantSched{},
		capacity: capacity, reserve: capacity / 8, prioReserve: prioReserveOf(capacity)}
}

// prioLevels is the number of task priorities.
const prioLevels = stream.MaxPriority - stream.MinPriority + 1

// prioIndex is a priority's index in byPrio and prioAt.
func prioIndex(p int) int {
	return min(max(p, stream.MinPriority), stream.MaxPriority) - stream.MinPriority
}

// prioReserveOf is how many of a worker's slots a tenant's lower
// priorities leave to its higher ones while those have work: an eighth,
// at least one on a worker of two slots or more.
func prioReserveOf(capacity int) int {
	if capacity < 2 {
		return 0
	}
	return max(capacity/8, 1)
}

// priorityCap is the bound a tenant's reads take for its priorities: a
// tenant whose top priority (the highest with tasks running here or read
// in the last recentWork) is above others keeps prioReserve of the
// worker's slots free of the lower ones, so that its next top-priority
// task finds a slot at once instead of waiting for a long low-priority
// step to end. It returns the top priority and how many more messages
// below it the tenant may take now, or ok false when nothing is bounded
// (one priority in use, or no reserve). Caller holds mu.
func (q *queueSched) priorityCap(ts *tenantSched, now time.Time) (top, budget int, ok bool) {
	if q.prioReserve == 0 {
		return 0, 0, false
	}
	topIdx := -1
	for i := prioLevels - 1; i >= 0; i-- {
		if ts.byPrio[i] > 0 || (!ts.prioAt[i].IsZero() && now.Sub(ts.prioAt[i]) < recentWork) {
			topIdx = i
			break
		}
	}
	if topIdx <= 0 {
		return 0, 0, false // nothing seen, or only the lowest priority
	}
	below := 0
	for i := range topIdx {
		below += ts.byPrio[i]
	}
	return topIdx + stream.MinPriority, max(q.capacity-q.prioReserve-below, 0), true
}

// counted records the priorities of messages a tenant's slots took now.
// Caller holds mu.
func (ts *tenantSched) counted(prios []int, now time.Time) {
	for _, p := range prios {
		i := prioIndex(p)
		ts.byPrio[i]++
		ts.prioAt[i] = now
	}
}

// uncount gives back one of a tenant's slots of priority p. Caller holds mu.
func (ts *tenantSched) uncount(p int) {
	if i := prioIndex(p); ts.byPrio[i] > 0 {
		ts.byPrio[i]--
	}
}

// ensure returns a tenant's state, creating it ready. Caller holds mu.
func (q *queueSched) ensure(t tenantShards) *tenantSched {
	ts := q.tenants[t.tenant]
	if ts == nil {
		q.seq++
		ts = &tenantSched{route: t, seq: q.seq, free: -1, ready: true}
		ts.route.shards = max(ts.route.shards, 1)
		q.tenants[t.tenant] = ts
		q.live[t.tenant] = ts
		return ts
	}
	// After a shard change, read every shard that may hold work.
	ts.route.shards = max(ts.route.shards, t.shards)
	if t.weight > 0 {
		ts.route.weight = t.weight
	}
	return ts
}

// readyUp makes a tenant ready (it published). Caller holds mu.
func (q *queueSched) readyUp(ts *tenantSched) {
	ts.ready, ts.settled = true, false
	q.live[ts.route.tenant] = ts
}

// heat marks a tenant as having work now. Caller holds mu.
func (q *queueSched) heat(ts *tenantSched, now time.Time) {
	ts.lastWork = now
	q.hot[ts.route.tenant] = ts
}

// woke records a wake-up naming a tenant: it has new work, published at
// the given active-set score (0 when the wake-up did not say).
func (q *queueSched) woke(t tenantShards, published float64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	ts := q.ensure(t)
	ts.wakes++
	if published > 0 {
		ts.published = published
	}
	q.readyUp(ts)
	q.heat(ts, time.Now())
}

// observe records a tenant's score in the active set and reports whether
// that made it ready: a score this worker has not seen means a publish
// whose wake-up it missed.
func (q *queueSched) observe(t tenantShards, published float64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	ts, known := q.tenants[t.tenant]
	if !known {
		ts = q.ensure(t)
		ts.published = published
		return true
	}
	q.ensure(t)
	if published == ts.published {
		return false
	}
	ts.published = published
	if ts.ready {
		ts.settled = false
		return false
	}
	q.readyUp(ts)
	return true
}

// forget drops tenants that have not published since before cutoff and
// hold nothing here: no state, no reads.
func (q *queueSched) forget(cutoff float64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for id, ts := range q.tenants {
		if ts.published < cutoff && !ts.ready && ts.inUse == 0 && len(ts.held) == 0 && ts.settled {
			delete(q.tenants, id)
			delete(q.live, id)
			delete(q.hot, id)
		}
	}
}

// took counts a slot given to a tenant's message of priority prio outside
// a plan (a reclaimed message).
func (q *queueSched) took(id uuid.UUID, prio int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	ts := q.ensure(tenantShards{tenant: id, shards: 1})
	ts.inUse++
	ts.counted([]int{prio}, time.Now())
	ts.settled = false
	q.hot[id] = ts
}

// release returns one of a tenant's slots, which held a task of priority
// prio.
func (q *queueSched) release(id uuid.UUID, prio int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ts := q.tenants[id]; ts != nil && ts.inUse > 0 {
		ts.inUse--
		ts.uncount(prio)
	}
}

// reprioritise moves one of a tenant's slots from a task of priority from
// to the next task it runs (an eager lease), of priority to.
func (q *queueSched) reprioritise(id uuid.UUID, from, to int) {
	if from == to {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if ts := q.tenants[id]; ts != nil {
		ts.uncount(from)
		ts.counted([]int{to}, time.Now())
	}
}

// working counts the tenants with tasks running here or work lately, and
// drops the cooled ones from hot. Caller holds mu.
func (q *queueSched) working(now time.Time) int {
	n := 0
	for id, o := range q.hot {
		if o.inUse > 0 || now.Sub(o.lastWork) < recentWork {
			n++
		} else {
			delete(q.hot, id)
		}
	}
	return n
}

// isWorking reports whether ts counts in working. Caller holds mu.
func (ts *tenantSched) isWorking(now time.Time) bool {
	return ts.inUse > 0 || now.Sub(ts.lastWork) < recentWork
}

// othersHaveWork reports whether a tenant other than ts has tasks running
// here or had work recently. Caller holds mu.
func (q *queueSched) othersHaveWork(ts *tenantSched, now time.Time) bool {
	n := q.working(now)
	if ts != nil && ts.isWorking(now) {
		n--
	}
	return n > 0
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
	for _, ts := range q.live {
		if len(ts.held) > 0 {
			return false
		}
	}
	for _, ts := range q.hot {
		if now.Sub(ts.lastWork) < recentWork {
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
	q.live[m.Tenant] = ts
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

// plan hands free slots out, one pick at a time, to the live tenants not
// paused and not in skip, and returns each chosen tenant's grant.
func (q *queueSched) plan(free int, now time.Time, skip map[uuid.UUID]bool) []grant {
	q.mu.Lock()
	defer q.mu.Unlock()
	var eligible []*tenantSched
	for id, ts := range q.live {
		if !ts.ready && len(ts.held) == 0 {
			delete(q.live, id) // (a held tenant whose messages were all granted)
			continue
		}
		if !skip[id] && !now.Before(ts.blockedUntil) {
			eligible = append(eligible, ts)
		}
	}
	// The order tenants became known breaks ties, as a list would.
	slices.SortFunc(eligible, func(a, b *tenantSched) int { return a.seq - b.seq })
	limits := make(map[*tenantSched]int, len(eligible))
	working := 0
	if q.reserve > 0 && len(eligible) > 0 {
		working = q.working(now)
	}
	for _, ts := range eligible {
		limits[ts] = ts.limit()
		others := working
		if ts.isWorking(now) {
			others--
		}
		if q.reserve > 0 && others > 0 {
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
		if top, budget, ok := q.priorityCap(ts, now); ok {
			g.capArg = fmt.Sprintf("%d %d", top, budget)
		}
		ts.held = ts.held[k:]
		out = append(out, g)
	}
	return out
}

// settle records what a grant got (the priorities of the messages read):
// the quota it used and, when the tenant had less to read than it was
// granted, that it banks no positive score and, unless woken meanwhile or
// capped (its read stopped at the bound of its lower priorities, so it
// has more to read), goes dormant.
func (q *queueSched) settle(g grant, prios []int, capped bool, now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	ts := q.tenants[g.id]
	if ts == nil {
		return
	}
	got := len(prios)
	if ts.free > 0 {
		ts.free = max(ts.free-got, 0)
	}
	ts.inUse += got
	ts.counted(prios, now)
	if got > 0 {
		ts.settled = false
		q.heat(ts, now)
	}
	if got < g.n {
		ts.score = min(ts.score, 0)
		if ts.wakes == g.wakes && !capped {
			ts.ready = false
			if len(ts.held) == 0 {
				delete(q.live, g.id)
			}
		}
	}
}

// nextUnblock returns when the earliest paused tenant with held messages
// may be tried again (zero when none).
func (q *queueSched) nextUnblock() time.Time {
	q.mu.Lock()
	defer q.mu.Unlock()
	var next time.Time
	for _, ts := range q.live {
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
	for _, ts := range q.live {
		out = append(out, ts.held...)
	}
	return out
}

// unsettled is what a reclaim pass looks at: the tenants not known to have
// empty streams, each with its wake count and publish score, so that
// finding them empty settles only those that did not publish meanwhile.
func (q *queueSched) unsettled() []settling {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []settling
	for _, ts := range q.tenants {
		if !ts.settled {
			out = append(out, settling{route: ts.route, wakes: ts.wakes, published: ts.published})
		}
	}
	return out
}

type settling struct {
	route     tenantShards
	wakes     uint64
	published float64
}

// settleEmpty records that a reclaim pass found a tenant's streams empty.
func (q *queueSched) settleEmpty(s settling) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ts := q.tenants[s.route.tenant]; ts != nil && ts.wakes == s.wakes && ts.published == s.published && ts.inUse == 0 &&
		len(ts.held) == 0 && ts.route.shards == s.route.shards {
		ts.settled = true
	}
}

// discovery overlap: a score this much older than the newest one seen is
// still looked at, for publishers whose clocks run behind.
const discoverOverlap = 10 * time.Second

// discover reads the tenants that published to a queue lately from the
// active set (all of the active window when full, else those since the
// newest score seen, less an overlap) and readies those whose publish this
// worker missed. It returns the newest score seen.
func (w *Worker) discover(ctx context.Context, queue string, since float64, full bool) float64 {
	min := since - float64(discoverOverlap.Milliseconds())
	if full {
		min = float64(time.Now().Add(-w.cfg.ActiveWindow).UnixMilli())
	}
	zs, err := w.rdb.ZRangeByScoreWithScores(ctx, w.names.Active(queue), &redis.ZRangeBy{Min: fmt.Sprint(int64(min)), Max: "+inf"}).Result()
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("discovering tenants failed", zap.String("queue", queue), zap.Error(err))
		}
		return since
	}
	qs := w.scheds[queue]
	newest, woke := since, false
	for _, z := range zs {
		m, _ := z.Member.(string)
		if t, n, weight, err := stream.ParseActiveMember(m); err == nil {
			woke = qs.observe(tenantShards{tenant: t, shards: n, weight: weight}, z.Score) || woke
			newest = max(newest, z.Score)
		}
	}
	if full {
		qs.forget(float64(time.Now().Add(-w.cfg.ActiveWindow).UnixMilli()))
	}
	if woke {
		w.wake(queue)
	}
	return newest
}

// discoverLoop runs discover for every queue each second, over the whole
// active window every fullDiscovery.
func (w *Worker) discoverLoop(ctx context.Context) {
	const every, fullDiscovery = time.Second, 30 * time.Second
	newest := map[string]float64{}
	var lastFull time.Time
	for ctx.Err() == nil {
		full := time.Since(lastFull) >= fullDiscovery
		for _, q := range w.cfg.Queues {
			newest[q] = w.discover(ctx, q, newest[q], full)
		}
		if full {
			lastFull = time.Now()
		}
		lifecycle.Sleep(ctx, every)
	}
}

// readLoop fills free slots from the queue's tenants in the scheduler's
// order, never taking more messages than it has free slots.
func (w *Worker) readLoop(ctx, execCtx context.Context, queue string) {
	qs := w.scheds[queue]
	for ctx.Err() == nil {
		select { // a task ending from here on is seen below
		case <-w.ended:
		default:
		}
		free := w.takeSlots(w.cfg.Concurrency)
		if free == 0 {
			select { // every slot is busy: wait for one to free
			case <-ctx.Done():
			case <-w.freed:
			}
			continue
		}
		got, capped := w.fill(ctx, execCtx, queue, qs, &free)
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
		// A capped tenant may read more when one of the worker's tasks
		// ends (its lower priorities hold fewer slots then).
		var ended <-chan struct{}
		if capped {
			ended = w.ended
		}
		select {
		case <-ctx.Done():
		case <-w.wakes[queue]:
		case <-ended:
		case <-time.After(wait):
		}
	}
}

// fill hands free slots to tenants as the scheduler plans them: each round
// reads every granted tenant in one pipelined round trip, and hands what
// it read to one lease call off the loop (its slots are already taken). A
// tenant that had less to read than its grant is left out of the rest of
// the fill, and its unused slots are planned again among the others. It
// reports how many messages it took, and whether a tenant's read stopped
// at the bound of its lower priorities (capped: a task ending may let it
// read more).
func (w *Worker) fill(ctx, execCtx context.Context, queue string, qs *queueSched, free *int) (got int, capped bool) {
	// First what a lost read may have left in this worker's pending list.
	if n := w.recoverOwn(ctx, execCtx, queue, *free); n > 0 {
		*free -= n
		got += n
	}
	var skip map[uuid.UUID]bool
	for *free > 0 && ctx.Err() == nil {
		grants := qs.plan(*free, time.Now(), skip)
		if len(grants) == 0 {
			break
		}
		batches := w.readGrants(ctx, queue, grants)
		now := time.Now()
		var round []stream.Message
		for i, g := range grants {
			msgs := batches[i].msgs
			prios := make([]int, len(msgs))
			for j, m := range msgs {
				prios[j] = stream.KeyPriority(m.Stream)
			}
			qs.settle(g, prios, batches[i].capped, now)
			capped = capped || batches[i].capped
			if len(msgs) < g.n {
				if skip == nil {
					skip = map[uuid.UUID]bool{}
				}
				skip[g.id] = true
			}
			round = append(round, msgs...)
		}
		if len(round) == 0 {
			continue
		}
		*free -= len(round)
		got += len(round)
		// One lease call (and one transaction) for the whole round,
		// whichever tenants it spread over.
		w.running.Add(1)
		go func() { defer w.running.Done(); w.dispatch(execCtx, round) }()
	}
	return got, capped
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

// route is a known tenant's route on a queue (shards and weight as last
// seen), or a one-shard route when the tenant is unknown.
func (q *queueSched) route(id uuid.UUID) tenantShards {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ts := q.tenants[id]; ts != nil {
		return ts.route
	}
	return tenantShards{tenant: id, shards: 1, weight: 1}
}
