package workers

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/engine/stream"
)

// A read's answer can be lost after Redis ran it: the client timed out
// (Redis frozen or slow, a failover) or the connection broke while the
// answer was on its way. The XREADGROUP inside the read script has then
// delivered messages to this worker's consumer that the worker never saw.
// Their tasks are pending in the database with their messages still
// queued, so the sweep's lost-dispatch check rightly leaves them alone;
// only another worker's reclaim would free them, after ClaimIdle (two
// lease TTLs). ownPending bounds that to the worker's next read of the
// queue: the worker knows every message it holds (read or claimed, not
// yet settled), marks the streams of a read that failed as suspect, and
// before reading again takes back from its own pending list of those
// streams what it does not know (recoverOwn).
type ownPending struct {
	// mu is held from a read's or a claim's round trip until what it got
	// is known, and through a recovery's look at the pending list: a
	// recovery cannot take a message a concurrent read or reclaim was
	// given for a lost one.
	mu      sync.Mutex
	suspect map[string]struct{} // stream keys

	// knownMu guards known alone, so settling a message never waits for
	// a read's round trip. A message is forgotten only once its
	// settlement ran: one forgotten while a recovery looks is no longer
	// pending, and claiming it takes nothing.
	knownMu sync.Mutex
	known   map[msgRef]struct{}
}

type msgRef struct{ stream, id string }

func newOwnPending() *ownPending {
	return &ownPending{suspect: map[string]struct{}{}, known: map[msgRef]struct{}{}}
}

// learn records messages this worker was given.
func (o *ownPending) learn(msgs []stream.Message) {
	o.knownMu.Lock()
	defer o.knownMu.Unlock()
	for _, m := range msgs {
		if m.ID != "" {
			o.known[msgRef{m.Stream, m.ID}] = struct{}{}
		}
	}
}

// forget drops settled (or put back) messages.
func (o *ownPending) forget(m stream.Message) {
	o.knownMu.Lock()
	defer o.knownMu.Unlock()
	delete(o.known, msgRef{m.Stream, m.ID})
}

func (o *ownPending) knows(key, id string) bool {
	o.knownMu.Lock()
	defer o.knownMu.Unlock()
	_, ok := o.known[msgRef{key, id}]
	return ok
}

// OwnPending reports how many unsettled messages the worker knows it
// holds and how many streams it suspects of holding ones it was never
// given, across its queues.
func (w *Worker) OwnPending() (known, suspect int) {
	for _, o := range w.own {
		o.mu.Lock()
		suspect += len(o.suspect)
		o.mu.Unlock()
		o.knownMu.Lock()
		known += len(o.known)
		o.knownMu.Unlock()
	}
	return known, suspect
}

// forgetSettled drops messages from what their queues' workers know.
func (w *Worker) forgetSettled(msgs []stream.Message) {
	for _, m := range msgs {
		if o := w.own[m.Queue]; o != nil && m.ID != "" {
			o.forget(m)
		}
	}
}

// ownPendingPage bounds the pending entries one recovery lists per stream
// (a worker holds at most its concurrency plus what it holds for quota).
const ownPendingPage = 1000

// recoverChunk bounds the suspect streams one recovery looks at.
const recoverChunk = 1024

// recoverOwn takes back, from this worker's own pending list of the
// queue's suspect streams, the messages it does not know, at most free of
// them, and hands them to dispatch (off the loop, as fill does). It
// returns how many it took. A stream it could not look at stays suspect.
func (w *Worker) recoverOwn(ctx, execCtx context.Context, queue string, free int) int {
	o := w.own[queue]
	o.mu.Lock()
	if len(o.suspect) == 0 {
		o.mu.Unlock()
		return 0
	}
	// One pipelined look at up to recoverChunk suspect streams (a slow read
	// of many tenants makes all their streams suspect at once).
	keys := make([]string, 0, min(len(o.suspect), recoverChunk))
	for key := range o.suspect {
		if len(keys) == recoverChunk {
			break
		}
		keys = append(keys, key)
	}
	pipe := w.rdb.Pipeline()
	pends := make([]*redis.XPendingExtCmd, len(keys))
	for i, key := range keys {
		pends[i] = pipe.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: key, Group: stream.Group,
			Start: "-", End: "+", Count: ownPendingPage, Consumer: w.cfg.WorkerID})
	}
	_, _ = pipe.Exec(ctx) // per-command errors are read below
	var got []stream.Message
	var settles []func()
	for i, key := range keys {
		if free-len(got) <= 0 {
			break
		}
		pend, err := pends[i].Result()
		if err != nil {
			if err == redis.Nil || stream.IsNoGroup(err) {
				delete(o.suspect, key) // no stream, or no group: nothing pending
			}
			continue
		}
		var lost []string
		for _, p := range pend {
			if !o.knows(key, p.ID) {
				lost = append(lost, p.ID)
			}
		}
		if room := free - len(got); len(lost) > room {
			lost = lost[:room] // the rest next time: the stream stays suspect
		} else if len(pend) < ownPendingPage {
			delete(o.suspect, key)
		}
		if len(lost) == 0 {
			continue
		}
		xs, err := w.rdb.XClaim(ctx, &redis.XClaimArgs{Stream: key, Group: stream.Group, Consumer: w.cfg.WorkerID, Messages: lost}).Result()
		if err != nil {
			o.suspect[key] = struct{}{}
			continue
		}
		w.log.Warn("took back messages a lost read delivered to this worker", zap.String("stream", key), zap.Int("messages", len(xs)))
		run, settle := w.claimed(ctx, o, key, xs)
		got = append(got, run...)
		settles = append(settles, settle)
	}
	o.mu.Unlock()
	for _, settle := range settles {
		settle()
	}
	if len(got) > 0 {
		w.running.Add(1)
		go func() { defer w.running.Done(); w.dispatch(execCtx, got) }()
	}
	return len(got)
}

// claimed turns messages claimed from key (by a reclaim or a recovery,
// with o.mu held) into what to dispatch, known and counted to their
// tenants. What must not be dispatched — undecodable messages, to be
// dead-lettered, and ones delivered too often, to be reported as failed
// attempts — is left to settle, which the caller runs once o.mu is
// released (a report may wait for the server).
func (w *Worker) claimed(ctx context.Context, o *ownPending, key string, xs []redis.XMessage) (run []stream.Message, settle func()) {
	if len(xs) == 0 {
		return nil, func() {}
	}
	// Delivery counts, to stop a message that keeps coming back.
	pipe := w.rdb.Pipeline()
	counts := make([]*redis.XPendingExtCmd, len(xs))
	for i, x := range xs {
		counts[i] = pipe.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: key, Group: stream.Group, Start: x.ID, End: x.ID, Count: 1})
	}
	_, _ = pipe.Exec(ctx)
	type bad struct {
		x   redis.XMessage
		err error
	}
	var undecodable []bad
	var poisoned []stream.Message
	for i, x := range xs {
		m, err := stream.Parse(key, x)
		if err != nil {
			undecodable = append(undecodable, bad{x, err})
			continue
		}
		if p, err := counts[i].Result(); err == nil && len(p) == 1 {
			m.Deliveries = p[0].RetryCount + m.Carried
		}
		if m.Deliveries > w.cfg.MaxDeliveries {
			poisoned = append(poisoned, m)
			continue
		}
		run = append(run, m)
	}
	o.learn(run)
	o.learn(poisoned) // forgotten when poison settles them
	for _, m := range run {
		if s := w.scheds[m.Queue]; s != nil {
			s.took(m.Tenant, stream.KeyPriority(m.Stream))
		}
	}
	return run, func() {
		for _, b := range undecodable {
			w.deadLetter(ctx, key, b.x, b.err)
		}
		for _, m := range poisoned {
			w.poison(ctx, m)
		}
	}
}
