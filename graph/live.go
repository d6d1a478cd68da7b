package graph

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/engine"
)

// Live carries committed run changes to subscriptions on every gateway
// replica: the process that commits a transition publishes it (after
// commit) on a per-tenant Redis channel; each replica subscribes to the
// channels of the tenants it has subscribers for and fans changes out.
// Changes name the run, not its content: subscribers read the run through
// their own authorization, so nothing crosses a tenant boundary by
// construction. Delivery is best effort (a dropped change is corrected by
// the next one, or by a refetch); the database stays the truth.
type Live struct {
	rdb redis.UniversalClient
	ns  string
	log *zap.Logger
	out chan Change

	mu     sync.Mutex
	ps     *redis.PubSub
	subs   map[uuid.UUID]map[chan Change]struct{}
	closed bool
}

// Change is one committed change of a run.
type Change struct {
	Tenant   uuid.UUID `json:"tenant"`
	Run      uuid.UUID `json:"run"`
	Event    string    `json:"event"`
	Status   string    `json:"status"`
	Terminal bool      `json:"terminal"`
}

// NewLive returns a Live using namespace ns for its channels.
func NewLive(rdb redis.UniversalClient, ns string, log *zap.Logger) *Live {
	if log == nil {
		log = zap.NewNop()
	}
	return &Live{rdb: rdb, ns: ns, log: log, out: make(chan Change, 4096), subs: map[uuid.UUID]map[chan Change]struct{}{}}
}

func (l *Live) channel(tenant uuid.UUID) string { return l.ns + ":live:" + tenant.String() }

// Publish queues a committed transition for publishing; it never blocks
// the transition (a full queue drops the change).
func (l *Live) Publish(t engine.Transition) {
	select {
	case l.out <- Change{Tenant: t.Tenant, Run: t.RunID, Event: t.Event, Status: string(t.Status), Terminal: t.Terminal}:
	default:
	}
}

// Run publishes queued changes and delivers received ones until ctx ends.
func (l *Live) Run(ctx context.Context) {
	l.mu.Lock()
	l.ps = l.rdb.Subscribe(ctx)
	ps := l.ps
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.closed = true
		_ = l.ps.Close()
		for _, subs := range l.subs {
			for ch := range subs {
				close(ch)
			}
		}
		l.subs = map[uuid.UUID]map[chan Change]struct{}{}
		l.mu.Unlock()
	}()
	go func() {
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
			return
		case m, ok := <-msgs:
			if !ok {
				return
			}
			var c Change
			if json.Unmarshal([]byte(m.Payload), &c) != nil {
				continue
			}
			l.mu.Lock()
			for ch := range l.subs[c.Tenant] {
				select {
				case ch <- c:
				default: // a slow subscriber misses a change, not the others
				}
			}
			l.mu.Unlock()
		}
	}
}

// Subscribe returns the changes of a tenant's runs until cancel is called.
func (l *Live) Subscribe(ctx context.Context, tenant uuid.UUID) (<-chan Change, func(), error) {
	ch := make(chan Change, 64)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ps == nil || l.closed {
		return nil, nil, errLiveDown
	}
	if len(l.subs[tenant]) == 0 {
		if err := l.ps.Subscribe(ctx, l.channel(tenant)); err != nil {
			return nil, nil, err
		}
		l.subs[tenant] = map[chan Change]struct{}{}
	}
	l.subs[tenant][ch] = struct{}{}
	var once sync.Once
	cancel := func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if _, ok := l.subs[tenant][ch]; !ok {
				return // closed by Run
			}
			delete(l.subs[tenant], ch)
			close(ch)
			if len(l.subs[tenant]) == 0 {
				delete(l.subs, tenant)
				_ = l.ps.Unsubscribe(context.Background(), l.channel(tenant))
			}
		})
	}
	return ch, cancel, nil
}
