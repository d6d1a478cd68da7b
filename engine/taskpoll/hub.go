package taskpoll

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/engine/stream"
)

// hub turns the enqueuer's wake-ups on the handler-wake channel into
// wake-ups of the polls this server holds, by tenant and route. One
// subscription per server, whatever the number of polls. Whenever the
// subscription is (re)established — at start, after a lost connection —
// every held poll is woken to read again, since wake-ups published while
// nobody listened are gone; until it is established polls fall back to
// reading every second.
type hub struct {
	rdb     redis.UniversalClient
	channel string
	log     *zap.Logger

	mu      sync.Mutex
	waiters map[uuid.UUID]map[*waiter]struct{}
	up      atomic.Bool
}

// waiter is one held poll: the routes ("queue/handler") it serves and a
// channel that is pinged when one of them may have work.
type waiter struct {
	routes map[string]bool
	ch     chan struct{}
}

func (w *waiter) wake() {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

func newHub(rdb redis.UniversalClient, channel string, log *zap.Logger) *hub {
	return &hub{rdb: rdb, channel: channel, log: log, waiters: map[uuid.UUID]map[*waiter]struct{}{}}
}

func (h *hub) add(tenant uuid.UUID, routes map[string]bool) *waiter {
	w := &waiter{routes: routes, ch: make(chan struct{}, 1)}
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.waiters[tenant]
	if m == nil {
		m = map[*waiter]struct{}{}
		h.waiters[tenant] = m
	}
	m[w] = struct{}{}
	return w
}

func (h *hub) remove(tenant uuid.UUID, w *waiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if m := h.waiters[tenant]; m != nil {
		delete(m, w)
		if len(m) == 0 {
			delete(h.waiters, tenant)
		}
	}
}

// notify wakes the tenant's polls that serve the route.
func (h *hub) notify(tenant uuid.UUID, route string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.waiters[tenant] {
		if w.routes[route] {
			w.wake()
		}
	}
}

func (h *hub) notifyAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range h.waiters {
		for w := range m {
			w.wake()
		}
	}
}

// fallback is how long a held poll waits before reading again without a
// wake-up: its whole wait while the subscription is up, a second while it
// is not.
func (h *hub) fallback(wait time.Duration) time.Duration {
	if h.up.Load() {
		return wait
	}
	return min(wait, time.Second)
}

// receiveTimeout is how long the subscription may stay silent before it is
// pinged; a second silence of that length means the connection is dead.
const receiveTimeout = 15 * time.Second

// run keeps the subscription until ctx ends.
func (h *hub) run(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := h.subscribe(ctx)
		h.up.Store(false)
		if ctx.Err() != nil {
			return
		}
		h.log.Warn("handler wake-up subscription lost; held polls read every second meanwhile", zap.Error(err))
		h.notifyAll()
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

func (h *hub) subscribe(ctx context.Context) error {
	ps := h.rdb.Subscribe(ctx, h.channel)
	// A blocked read does not watch ctx: closing the subscription ends it.
	stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
	defer stop()
	defer ps.Close()
	silent := 0
	for {
		msg, err := ps.ReceiveTimeout(ctx, receiveTimeout)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if isTimeout(err) && silent == 0 {
				silent++
				if err := ps.Ping(ctx); err != nil {
					return err
				}
				continue
			}
			return err
		}
		silent = 0
		switch m := msg.(type) {
		case *redis.Subscription:
			// (Re)subscribed: anything published meanwhile was missed.
			h.up.Store(true)
			h.notifyAll()
		case *redis.Message:
			if t, q, hd, err := stream.ParseHandlerRoute(m.Payload); err == nil {
				h.notify(t, q+"/"+hd)
			}
		}
	}
}

func isTimeout(err error) bool {
	t, ok := err.(interface{ Timeout() bool })
	return ok && t.Timeout()
}
