package graph

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/engine/stream"
	"github.com/composer-dev/composer/internal/errs"
)

// Live carries committed run changes to subscriptions on every gateway
// replica: the process that commits a transition publishes it (after
// commit) on a per-tenant Redis channel; each replica subscribes to the
// channels of the tenants it has subscribers for. A change names the run,
// never its content. When one arrives, the replica reads the run — with
// its tasks and workflow — once, in the tenant's own scope, and hands that
// snapshot to every subscriber of the tenant that wants it: one read per
// changed run per replica, however many subscribers. (Changes to a run
// arriving while it is being read are folded into one more read, so a
// burst costs two.) Each subscriber checks its own connection's credential
// before it pushes. Delivery is best effort (a missed change is corrected
// by the next one, or a refetch); the database stays the truth.
//
// Bulk operations' progress travels the same way (Change.Bulk: the id is
// the operation's, read with readOp; PublishOp after each batch).
//
// Subscriptions are capped per connection, per principal and per tenant
// on each replica (LiveLimits): past a cap, a new one is QUOTA_EXCEEDED.
type Live struct {
	rdb    redis.UniversalClient
	ns     string
	log    *zap.Logger
	out    chan Change
	limits LiveLimits
	// read reads a run for a tenant's subscribers (set by the resolver).
	read func(ctx context.Context, tenant, run uuid.UUID) (*engine.RunView, error)
	// readOp reads a bulk operation for a tenant's subscribers.
	readOp func(ctx context.Context, tenant, op uuid.UUID) (*engine.BulkOperation, error)
	reads  chan struct{} // bounds the reads in flight

	fetches sync.WaitGroup // fetches in flight

	mu      sync.Mutex
	ps      *redis.PubSub
	ctx     context.Context
	tenants map[uuid.UUID]*tenantSubs
	closed  bool
}

// LiveLimits cap live subscriptions on one replica.
type LiveLimits struct {
	PerConnection int // default 25
	PerPrincipal  int // default 100
	PerTenant     int // default 500
}

// Default live subscription limits.
const (
	DefaultSubscriptionsPerConnection = 25
	DefaultSubscriptionsPerPrincipal  = 100
	DefaultSubscriptionsPerTenant     = 500
)

// Change is one committed change of a run.
type Change struct {
	Tenant   uuid.UUID `json:"tenant"`
	Run      uuid.UUID `json:"run"`
	Event    string    `json:"event"`
	Status   string    `json:"status"`
	Terminal bool      `json:"terminal"`
	// Bulk marks a bulk operation's progress: Run is the operation's id.
	Bulk bool `json:"bulk,omitempty"`
}

// Update is what a subscriber receives: the run as read after a change
// (or, for a bulk operation's subscription, the operation).
type Update struct {
	Event string
	Run   *engine.RunView
	Op    *engine.BulkOperation
}

type tenantSubs struct {
	subs       map[*liveSub]struct{}
	principals map[string]int
	reading    map[uuid.UUID]*readState
}

type readState struct {
	dirty bool
	event string
}

type liveSub struct {
	run       uuid.UUID // uuid.Nil: every run of the tenant
	bulk      bool      // run is a bulk operation's id
	principal string
	ch        chan Update
	latest    bool // keep only the newest update (one run's subscription)
}

// NewLive returns a Live using namespace ns for its channels.
func NewLive(rdb redis.UniversalClient, ns string, limits LiveLimits, log *zap.Logger) *Live {
	if log == nil {
		log = zap.NewNop()
	}
	limits.PerConnection = cmpOr(limits.PerConnection, DefaultSubscriptionsPerConnection)
	limits.PerPrincipal = cmpOr(limits.PerPrincipal, DefaultSubscriptionsPerPrincipal)
	limits.PerTenant = cmpOr(limits.PerTenant, DefaultSubscriptionsPerTenant)
	return &Live{rdb: rdb, ns: ns, log: log, out: make(chan Change, 4096), limits: limits, reads: make(chan struct{}, 16),
		tenants: map[uuid.UUID]*tenantSubs{}}
}

func cmpOr(v, d int) int {
	if v <= 0 {
		return d
	}
	return v
}

func (l *Live) channel(tenant uuid.UUID) string { return stream.NewNames(l.ns).Live(tenant) }

// Publish queues a committed transition for publishing; it never blocks
// the transition (a full queue drops the change).
func (l *Live) Publish(t engine.Transition) {
	select {
	case l.out <- Change{Tenant: t.Tenant, Run: t.RunID, Event: t.Event, Status: string(t.Status), Terminal: t.Terminal}:
	default:
	}
}

// PublishOp queues a bulk operation's progress for publishing, as Publish.
func (l *Live) PublishOp(tenant, op uuid.UUID, status string) {
	select {
	case l.out <- Change{Tenant: tenant, Run: op, Event: "bulk_progress", Status: status, Bulk: true, Terminal: status != engine.BulkRunning}:
	default:
	}
}

// Run publishes queued changes and delivers received ones until ctx ends,
// and returns once its publisher and every read it started have.
func (l *Live) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	l.mu.Lock()
	l.ps = l.rdb.Subscribe(ctx)
	l.ctx = ctx
	ps := l.ps
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.closed = true
		_ = l.ps.Close()
		for _, ts := range l.tenants {
			for s := range ts.subs {
				close(s.ch)
			}
		}
		l.tenants = map[uuid.UUID]*tenantSubs{}
		l.mu.Unlock()
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case c := <-l.out:
				b, _ := json.Marshal(c)
				if err := l.rdb.Publish(ctx, l.channel(c.Tenant), b).Err(); err != nil && ctx.Err() == nil {
					l.log.Warn("publishing a live change failed", zap.Error(err))
				}
			}
		}
	}()
	msgs := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			l.fetches.Wait()
			return ctx.Err()
		case m, ok := <-msgs:
			if !ok {
				l.fetches.Wait()
				return ctx.Err()
			}
			var c Change
			if json.Unmarshal([]byte(m.Payload), &c) == nil {
				l.changed(c)
			}
		}
	}
}

// changed schedules the read of a changed run if anyone here wants it.
func (l *Live) changed(c Change) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ts := l.tenants[c.Tenant]
	if ts == nil || !ts.wants(c.Run, c.Bulk) {
		return
	}
	if st := ts.reading[c.Run]; st != nil {
		st.dirty, st.event = true, c.Event
		return
	}
	ts.reading[c.Run] = &readState{event: c.Event}
	l.fetches.Add(1)
	go func() {
		defer l.fetches.Done()
		l.fetch(c.Tenant, c.Run, c.Bulk)
	}()
}

func (s *liveSub) wants(run uuid.UUID, bulk bool) bool {
	return s.bulk == bulk && (s.run == uuid.Nil || s.run == run)
}

func (ts *tenantSubs) wants(run uuid.UUID, bulk bool) bool {
	for s := range ts.subs {
		if s.wants(run, bulk) {
			return true
		}
	}
	return false
}

// fetch reads a run once and hands it to its subscribers, again while
// changes came in during the read.
func (l *Live) fetch(tenant, run uuid.UUID, bulk bool) {
	for {
		l.mu.Lock()
		ts := l.tenants[tenant]
		if ts == nil || ts.reading[run] == nil {
			l.mu.Unlock()
			return // every subscriber left
		}
		ctx, st := l.ctx, ts.reading[run]
		event := st.event
		st.dirty = false
		l.mu.Unlock()
		l.reads <- struct{}{}
		var u Update
		var err error
		if bulk {
			u.Op, err = l.readOp(ctx, tenant, run)
		} else {
			u.Run, err = l.read(ctx, tenant, run)
		}
		<-l.reads
		if err != nil && errs.KindOf(err) != errs.NotFound && ctx.Err() == nil {
			l.log.Warn("reading a changed run for live updates failed", zap.Stringer("tenant_id", tenant), zap.Error(err))
		}
		l.mu.Lock()
		ts = l.tenants[tenant]
		if ts == nil || ts.reading[run] == nil {
			l.mu.Unlock()
			return
		}
		if err == nil {
			u.Event = event
			for s := range ts.subs {
				if s.wants(run, bulk) {
					s.deliver(u)
				}
			}
		}
		if !ts.reading[run].dirty {
			delete(ts.reading, run)
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
	}
}

// deliver never blocks: a run's own subscription keeps the newest state, a
// tenant-wide one drops a change when it is too far behind.
func (s *liveSub) deliver(u Update) {
	if s.latest {
		select {
		case <-s.ch:
		default:
		}
	}
	select {
	case s.ch <- u:
	default:
	}
}

// Subscriptions counts the live subscriptions this replica holds (tests
// wait for theirs to be registered before making a change).
func (l *Live) Subscriptions() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, ts := range l.tenants {
		n += len(ts.subs)
	}
	return n
}

// Subscribe returns the updates of one run of a tenant (run set) or of
// all its runs (run nil) for the principal, until cancel is called.
func (l *Live) Subscribe(ctx context.Context, tenant uuid.UUID, principal string, run uuid.UUID) (<-chan Update, func(), error) {
	return l.subscribe(ctx, tenant, principal, run, false)
}

// SubscribeOp returns the progress of one bulk operation of a tenant, as
// Subscribe (the same caps).
func (l *Live) SubscribeOp(ctx context.Context, tenant uuid.UUID, principal string, op uuid.UUID) (<-chan Update, func(), error) {
	return l.subscribe(ctx, tenant, principal, op, true)
}

func (l *Live) subscribe(ctx context.Context, tenant uuid.UUID, principal string, run uuid.UUID, bulk bool) (<-chan Update, func(), error) {
	sess := sessionFrom(ctx)
	if sess != nil {
		if err := sess.take(l.limits.PerConnection); err != nil {
			return nil, nil, err
		}
	}
	fail := func(err error) (<-chan Update, func(), error) {
		if sess != nil {
			sess.give()
		}
		return nil, nil, err
	}
	s := &liveSub{run: run, bulk: bulk, principal: principal, latest: run != uuid.Nil}
	if s.latest {
		s.ch = make(chan Update, 1)
	} else {
		s.ch = make(chan Update, 64)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ps == nil || l.closed {
		return fail(errLiveDown)
	}
	ts := l.tenants[tenant]
	switch {
	case ts != nil && len(ts.subs) >= l.limits.PerTenant:
		return fail(errs.E(errs.QuotaExceeded, "the tenant has %d live subscriptions on this server, the most it may have", l.limits.PerTenant))
	case ts != nil && ts.principals[principal] >= l.limits.PerPrincipal:
		return fail(errs.E(errs.QuotaExceeded, "at most %d live subscriptions per principal", l.limits.PerPrincipal))
	}
	if ts == nil {
		if err := l.ps.Subscribe(ctx, l.channel(tenant)); err != nil {
			return fail(err)
		}
		ts = &tenantSubs{subs: map[*liveSub]struct{}{}, principals: map[string]int{}, reading: map[uuid.UUID]*readState{}}
		l.tenants[tenant] = ts
	}
	ts.subs[s] = struct{}{}
	ts.principals[principal]++
	var once sync.Once
	cancel := func() {
		once.Do(func() {
			if sess != nil {
				sess.give()
			}
			l.mu.Lock()
			defer l.mu.Unlock()
			ts := l.tenants[tenant]
			if ts == nil {
				return // closed by Run
			}
			if _, ok := ts.subs[s]; !ok {
				return
			}
			delete(ts.subs, s)
			close(s.ch)
			if ts.principals[principal]--; ts.principals[principal] == 0 {
				delete(ts.principals, principal)
			}
			if len(ts.subs) == 0 {
				delete(l.tenants, tenant)
				_ = l.ps.Unsubscribe(context.Background(), l.channel(tenant))
			}
		})
	}
	return s.ch, cancel, nil
}
