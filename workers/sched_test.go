package workers

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/engine/stream"
	"github.com/composer-dev/composer/engine/taskapi"
)

// learn makes a tenant known, as a first wake-up or discovery would.
func (q *queueSched) learn(t tenantShards) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.ensure(t)
}

// simNow is the simulated clock serve advances.
var simNow = time.Now()

// serve simulates a worker whose slots free perFill at a time against
// tenants whose backlogs are given (absent: endless), and counts the slots
// each tenant gets. Every fill is at a later instant than the last; a
// tenant found empty goes dormant until woken.
func serve(q *queueSched, slots, perFill int, backlog map[uuid.UUID]int) (map[uuid.UUID]int, []uuid.UUID) {
	got := map[uuid.UUID]int{}
	var seq []uuid.UUID
	for given := 0; given < slots; {
		simNow = simNow.Add(time.Millisecond)
		now := simNow
		free, skip := min(perFill, slots-given), map[uuid.UUID]bool{}
		progress := false
		for free > 0 {
			grants := q.plan(free, now, skip)
			if len(grants) == 0 {
				break
			}
			for _, g := range grants {
				take := g.n
				if b, limited := backlog[g.id]; limited {
					take = min(g.n, b)
					backlog[g.id] -= take
				}
				q.settle(g, make([]int, take), false, now)
				if take < g.n {
					skip[g.id] = true
				}
				got[g.id] += take
				given += take
				free -= take
				progress = progress || take > 0
				for range take {
					seq = append(seq, g.id)
				}
			}
		}
		if !progress {
			break
		}
	}
	return got, seq
}

func TestSchedSharesSlotsByWeight(t *testing.T) {
	for _, perFill := range []int{1, 3, 16} {
		q := newQueueSched(0)
		a, b, c := uuid.New(), uuid.New(), uuid.New()
		q.learn(tenantShards{tenant: a, shards: 1, weight: 1})
		q.learn(tenantShards{tenant: b, shards: 1, weight: 4})
		q.learn(tenantShards{tenant: c, shards: 1, weight: 16})
		got, _ := serve(q, 21*100, perFill, map[uuid.UUID]int{})
		assert.InDelta(t, 100, got[a], 2, "weight 1, %d slots per fill", perFill)
		assert.InDelta(t, 400, got[b], 8, "weight 4, %d slots per fill", perFill)
		assert.InDelta(t, 1600, got[c], 32, "weight 16, %d slots per fill", perFill)
	}
}

// TestSchedInterleaves: with equal weights a tenant never waits for more
// than one other tenant's slot between two of its own.
func TestSchedInterleaves(t *testing.T) {
	q := newQueueSched(0)
	a, b := uuid.New(), uuid.New()
	q.learn(tenantShards{tenant: a, shards: 1, weight: 4})
	q.learn(tenantShards{tenant: b, shards: 1, weight: 4})
	_, seq := serve(q, 200, 1, map[uuid.UUID]int{})
	for i := 2; i < len(seq); i++ {
		assert.False(t, seq[i] == seq[i-1] && seq[i] == seq[i-2], "three in a row at %d", i)
	}
}

func TestSchedIdleTenantBanksNothing(t *testing.T) {
	q := newQueueSched(0)
	busy, idle := uuid.New(), uuid.New()
	q.learn(tenantShards{tenant: busy, shards: 1, weight: 1})
	q.learn(tenantShards{tenant: idle, shards: 1, weight: 1})
	backlog := map[uuid.UUID]int{idle: 0}
	got, _ := serve(q, 1000, 1, backlog)
	assert.Equal(t, 1000, got[busy], "the idle tenant's share goes to the busy one")
	backlog[idle] = 1 << 30
	q.woke(tenantShards{tenant: idle, shards: 1, weight: 1}, 0)
	got, _ = serve(q, 100, 1, backlog)
	assert.InDelta(t, 50, got[idle], 1, "no burst from the idle period")
}

// TestSchedLeavesAnEmptyTenantAloneUntilItPublishes: a tenant found empty
// is not read again, however many fills pass, until it publishes: a
// wake-up, or a score in the active set the worker has not seen (a lost
// wake-up). A score it has seen changes nothing.
func TestSchedLeavesAnEmptyTenantAloneUntilItPublishes(t *testing.T) {
	q := newQueueSched(0)
	busy, quiet := uuid.New(), uuid.New()
	route := tenantShards{tenant: quiet, shards: 1, weight: 1}
	q.learn(tenantShards{tenant: busy, shards: 1, weight: 1})
	q.learn(route)
	now := time.Now()
	reads := map[uuid.UUID]int{}
	fill := func(at time.Time) {
		for _, g := range q.plan(1, at, nil) {
			reads[g.id]++
			took := g.n
			if g.id == quiet {
				took = 0
			}
			q.settle(g, make([]int, took), false, at)
		}
	}
	for i := range 1000 {
		fill(now.Add(time.Duration(i) * time.Second))
	}
	assert.LessOrEqual(t, reads[quiet], 1, "read once, found empty, left alone for good")
	q.woke(route, 5000)
	before := reads[quiet]
	fill(now.Add(2000 * time.Second))
	fill(now.Add(2001 * time.Second))
	assert.Equal(t, before+1, reads[quiet], "a wake-up brings it back at once")

	assert.False(t, q.observe(route, 5000), "the wake-up's own score is not news")
	for i := range 10 {
		fill(now.Add(3000*time.Second + time.Duration(i)*time.Second))
	}
	assert.Equal(t, before+1, reads[quiet])
	assert.True(t, q.observe(route, 6000), "a score not seen: a publish whose wake-up was lost")
	fill(now.Add(4000 * time.Second))
	fill(now.Add(4001 * time.Second))
	assert.Equal(t, before+2, reads[quiet])
	assert.True(t, q.observe(route, 5500), "a lower score is news too (a publisher whose clock is behind)")

	// A wake-up racing an empty read is not lost.
	fill(now.Add(5000 * time.Second))
	gs := q.plan(1, now.Add(5000*time.Second), map[uuid.UUID]bool{busy: true})
	require.Len(t, gs, 1)
	q.woke(route, 0)
	q.settle(gs[0], make([]int, 0), false, now.Add(5000*time.Second))
	gs = q.plan(1, now.Add(5000*time.Second), map[uuid.UUID]bool{busy: true})
	assert.Len(t, gs, 1, "still eligible: woken after its read")
}

// TestSchedCostIsFlatInDormantTenants: ten thousand dormant tenants add
// nothing to what a fill looks at.
func TestSchedCostIsFlatInDormantTenants(t *testing.T) {
	q := newQueueSched(16)
	busy := uuid.New()
	q.learn(tenantShards{tenant: busy, shards: 1, weight: 1})
	now := time.Now()
	for range 10_000 {
		id := uuid.New()
		q.learn(tenantShards{tenant: id, shards: 4, weight: 1})
	}
	// One fill finds them all empty.
	skip := map[uuid.UUID]bool{}
	for {
		gs := q.plan(16, now, skip)
		if len(gs) == 0 {
			break
		}
		for _, g := range gs {
			took := 0
			if g.id == busy {
				took = g.n
			}
			q.settle(g, make([]int, took), false, now)
			skip[g.id] = true
		}
	}
	assert.Len(t, q.live, 1, "only the busy tenant is left to look at")
	for range 100 {
		gs := q.plan(16, now.Add(time.Minute), nil)
		require.Len(t, gs, 1)
		assert.Equal(t, busy, gs[0].id)
		assert.Equal(t, 16, gs[0].n, "the busy tenant gets every slot")
		q.settle(gs[0], make([]int, 0), false, now.Add(time.Minute))
		q.woke(tenantShards{tenant: busy, shards: 1, weight: 1}, 0)
	}
}

// TestSchedSettlesOnlyWhatDidNotPublish: a reclaim pass that found a
// tenant's streams empty settles it only if it did not publish (or get
// slots here) while the pass ran; a publish unsettles it.
func TestSchedSettlesOnlyWhatDidNotPublish(t *testing.T) {
	q := newQueueSched(4)
	a, b := uuid.New(), uuid.New()
	q.learn(tenantShards{tenant: a, shards: 2, weight: 1})
	q.learn(tenantShards{tenant: b, shards: 2, weight: 1})
	pass := q.unsettled()
	require.Len(t, pass, 2)
	q.woke(tenantShards{tenant: b, shards: 2, weight: 1}, 0) // b publishes mid-pass
	for _, s := range pass {
		q.settleEmpty(s)
	}
	left := q.unsettled()
	require.Len(t, left, 1)
	assert.Equal(t, b, left[0].route.tenant)
	q.settleEmpty(left[0])
	assert.Empty(t, q.unsettled())
	q.observe(tenantShards{tenant: a, shards: 2, weight: 1}, 42)
	require.Len(t, q.unsettled(), 1, "a new score in the active set")
	q.settleEmpty(q.unsettled()[0])
	q.took(a, 0)
	assert.Len(t, q.unsettled(), 1, "a reclaimed message of the tenant runs here")
}

func TestSchedHonoursQuota(t *testing.T) {
	q := newQueueSched(0)
	full, other := uuid.New(), uuid.New()
	q.learn(tenantShards{tenant: full, shards: 1, weight: 16})
	q.learn(tenantShards{tenant: other, shards: 1, weight: 1})
	q.quota(taskapi.TenantQuota{Tenant: full, Limit: 3, Running: 3})
	gs := q.plan(8, time.Now(), nil)
	n := map[uuid.UUID]int{}
	for _, g := range gs {
		n[g.id] = g.n
	}
	assert.Equal(t, 1, n[full], "a full tenant gets one probe, not its weight")
	assert.Equal(t, 7, n[other])

	q.quota(taskapi.TenantQuota{Tenant: full, Limit: 5, Running: 3})
	gs = q.plan(8, time.Now(), nil)
	for _, g := range gs {
		n[g.id] = g.n
	}
	assert.Equal(t, 2, n[full], "at most its free quota")

	// A held (bounced) message pauses the tenant until its block ends.
	q.hold(stream.Message{Tenant: full, ID: "1-0"})
	for _, g := range q.plan(4, time.Now(), nil) {
		assert.Equal(t, other, g.id)
	}
	var heldGrant *grant
	for _, g := range q.plan(4, time.Now().Add(maxBlock), nil) {
		if g.id == full {
			heldGrant = &g
		}
	}
	require.NotNil(t, heldGrant, "tried again once the block ends")
	assert.Len(t, heldGrant.held, 1, "the held message first")
}

// TestSchedKeepsSlotsForOthers: alone, a tenant may fill the worker; while
// another tenant has work, it leaves capacity/8 slots free, and gets them
// back when the other has been quiet for a while.
func TestSchedKeepsSlotsForOthers(t *testing.T) {
	q := newQueueSched(32)
	heavy, light := uuid.New(), uuid.New()
	q.learn(tenantShards{tenant: heavy, shards: 1, weight: 16})
	q.learn(tenantShards{tenant: light, shards: 1, weight: 1})
	now := time.Now()
	free := 32
	take := func(at time.Time, lightHasWork bool) map[uuid.UUID]int { // one fill
		got, skip := map[uuid.UUID]int{}, map[uuid.UUID]bool{}
		for free > 0 {
			gs := q.plan(free, at, skip)
			if len(gs) == 0 {
				break
			}
			for _, g := range gs {
				n := g.n
				if g.id == light && !lightHasWork {
					n, skip[light] = 0, true
				}
				q.settle(g, make([]int, n), false, at)
				got[g.id] += n
				free -= n
			}
		}
		return got
	}
	assert.Equal(t, 32, take(now, false)[heavy], "alone: every slot")
	for range 32 {
		q.release(heavy, 0)
	}
	free = 32
	q.woke(tenantShards{tenant: light, shards: 1, weight: 1}, 0)
	got := take(time.Now(), true)
	assert.Equal(t, 28, got[heavy], "four slots kept while the light tenant has work")
	assert.Equal(t, 4, got[light])
	for range 4 {
		q.release(light, 0)
	}
	free = 4
	assert.Equal(t, 0, take(time.Now(), false)[heavy], "the kept slots stay free for the light tenant")
	assert.Equal(t, 4, take(time.Now().Add(recentWork+time.Second), false)[heavy], "until it has been quiet for a while")
}

func TestSchedEmpty(t *testing.T) {
	assert.Empty(t, newQueueSched(0).plan(4, time.Now(), nil))
}

// TestSchedMayKeepOnlyWhileAlone: a freed slot goes straight to the same
// tenant's next task (eager dispatch) only when the fair picks would give
// it that slot anyway: nobody else has work here, and the tenant is
// neither quota-paused nor holding bounced messages.
func TestSchedMayKeepOnlyWhileAlone(t *testing.T) {
	q := newQueueSched(8)
	a, b := uuid.New(), uuid.New()
	now := time.Now()
	assert.False(t, q.mayKeep(a, now), "unknown tenant")
	q.learn(tenantShards{tenant: a, shards: 1, weight: 1})
	q.took(a, 0)
	assert.True(t, q.mayKeep(a, now), "alone")

	q.learn(tenantShards{tenant: b, shards: 1, weight: 1})
	assert.True(t, q.mayKeep(a, now), "another tenant known but without work")
	q.woke(tenantShards{tenant: b, shards: 1, weight: 1}, 0)
	assert.False(t, q.mayKeep(a, time.Now()), "another tenant was just woken")
	assert.True(t, q.mayKeep(a, time.Now().Add(recentWork+time.Second)), "quiet long enough")
	q.took(b, 0)
	assert.False(t, q.mayKeep(a, time.Now().Add(recentWork+time.Second)), "another tenant's task runs here")
	q.release(b, 0)

	q.hold(stream.Message{Tenant: a})
	assert.False(t, q.mayKeep(a, time.Now().Add(recentWork+time.Second)), "quota-bounced messages wait first")
}

// TestEagerOfferRules: a worker offers its slot with a result only within
// the eager window of the slot's last read, while the tenant is alone on
// the queue and the worker's other queues are quiet, and never while
// shutting down, when turned off, or for a while after a server refused an
// offer.
func TestEagerOfferRules(t *testing.T) {
	w := New(Config{Queues: []string{"default", "other"}}, nil, nil, map[string]Executor{"noop": Noop, "http": Noop}, nil)
	a := uuid.New()
	m := stream.Message{Queue: "default", Tenant: a}
	w.scheds["default"].learn(tenantShards{tenant: a, shards: 1, weight: 1})
	w.scheds["default"].took(a, 0)

	o := w.eagerOffer(m, time.Now())
	require.NotNil(t, o)
	assert.Equal(t, "default", o.Queue)
	assert.Equal(t, []string{"http", "noop"}, o.NodeTypes)
	assert.Equal(t, w.cfg.LeaseTTL.Milliseconds(), o.TTLMillis)

	assert.Nil(t, w.eagerOffer(m, time.Now().Add(-w.cfg.EagerWindow)), "the slot kept chains for its whole window")
	w.scheds["other"].woke(tenantShards{tenant: uuid.New(), shards: 1, weight: 1}, 0)
	assert.Nil(t, w.eagerOffer(m, time.Now()), "another queue has work")

	w = New(Config{}, nil, nil, map[string]Executor{"noop": Noop}, nil)
	w.scheds["default"].learn(tenantShards{tenant: a, shards: 1, weight: 1})
	require.NotNil(t, w.eagerOffer(m, time.Now()))
	w.eagerRefusedUntil.Store(time.Now().Add(time.Minute).UnixNano())
	assert.Nil(t, w.eagerOffer(m, time.Now()), "a server refused offers lately")
	w.eagerRefusedUntil.Store(time.Now().Add(-time.Second).UnixNano())
	require.NotNil(t, w.eagerOffer(m, time.Now()), "and offers resume after the pause")
	w.stopping.Store(true)
	assert.Nil(t, w.eagerOffer(m, time.Now()), "shutting down")
	w.stopping.Store(false)
	w.cfg.NoEager = true
	assert.Nil(t, w.eagerOffer(m, time.Now()), "turned off")
}

func TestSchedQuiet(t *testing.T) {
	q := newQueueSched(4)
	assert.True(t, q.quiet(time.Now()))
	q.learn(tenantShards{tenant: uuid.New(), shards: 1})
	assert.True(t, q.quiet(time.Now()), "a known tenant without work")
	b := uuid.New()
	q.woke(tenantShards{tenant: b, shards: 1}, 0)
	assert.False(t, q.quiet(time.Now()))
	assert.True(t, q.quiet(time.Now().Add(recentWork+time.Second)))
	q.hold(stream.Message{Tenant: b})
	assert.False(t, q.quiet(time.Now().Add(recentWork+time.Second)), "held messages wait")
}

// TestPriorityCapLeavesAReserveToTheTopPriority: while a tenant's highest
// priority has tasks here or was read lately, its lower priorities get at
// most capacity - prioReserve of the worker's slots; the bound lifts when
// the top priority has been quiet for recentWork, and a tenant with one
// priority is never bounded.
func TestPriorityCapLeavesAReserveToTheTopPriority(t *testing.T) {
	q := newQueueSched(16)
	require.Equal(t, 2, q.prioReserve)
	a := uuid.New()
	now := time.Now()
	q.learn(tenantShards{tenant: a, shards: 1, weight: 1})
	capOf := func(at time.Time) string {
		gs := q.plan(1, at, nil)
		require.Len(t, gs, 1)
		return gs[0].capArg
	}
	assert.Empty(t, capOf(now), "nothing read yet")
	q.settle(grant{id: a, n: 8}, []int{-2, -2, -2, -2, -2, -2, -2, -2}, false, now)
	assert.Empty(t, capOf(now), "one priority in use: the whole worker")
	q.settle(grant{id: a, n: 1}, []int{2}, false, now)
	assert.Equal(t, "2 6", capOf(now), "16 slots - 2 reserved - 8 below the top")
	q.release(a, 2)
	assert.Equal(t, "2 6", capOf(now.Add(recentWork-time.Second)), "the top priority was read lately")
	assert.Empty(t, capOf(now.Add(recentWork+time.Second)), "quiet for recentWork: the bound lifts")
	later := now.Add(recentWork + time.Second)
	q.settle(grant{id: a, n: 1}, []int{0}, false, later)
	assert.Equal(t, "0 6", capOf(later), "priority 0 above -2: the bound is for -2 only")
	for range 8 {
		q.release(a, -2)
	}
	assert.Equal(t, "0 14", capOf(later))
	now = later

	// A capped read keeps the tenant ready: it has more to read.
	ready := func() bool { q.mu.Lock(); defer q.mu.Unlock(); return q.tenants[a].ready }
	q.settle(grant{id: a, n: 4, wakes: q.tenants[a].wakes}, nil, true, now)
	assert.True(t, ready(), "capped, not empty")
	q.settle(grant{id: a, n: 4, wakes: q.tenants[a].wakes}, nil, false, now)
	assert.False(t, ready(), "a short read that was not capped makes it dormant")

	assert.Equal(t, 0, prioReserveOf(1))
	assert.Equal(t, 1, prioReserveOf(4))
	assert.Equal(t, 4, prioReserveOf(32))
}
