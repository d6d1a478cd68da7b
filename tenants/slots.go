package tenants

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/composer-dev/composer/engine/stream"
)

// Slots is the running-task quota: a counting semaphore per tenant whose
// permits are leases. A permit is a member of a sorted set scored by its
// expiry on Redis's clock; taking permits drops the expired ones first, so
// a worker that dies holding permits gives them back when its leases
// expire, with no sweep. Permits are named "task:attempt:owner", so a
// worker that retries an acquire call does not take a second permit, and
// a worker that loses a race for a task gives back only its own.
//
// The database stays the truth of who runs what: a permit is taken before
// the lease transaction and given back if the lease is not granted, so
// the leases never outnumber the permits.
type Slots struct {
	rdb redis.UniversalClient
	ns  string

	mu       sync.Mutex
	pending  map[uuid.UUID][]string // releases not yet sent
	flushing bool
	flushes  sync.WaitGroup
	onError  func(error)
}

// NewSlots returns the quota semaphores, keyed under namespace ns. onError,
// when set, hears of background releases that failed.
func NewSlots(rdb redis.UniversalClient, ns string, onError func(error)) *Slots {
	return &Slots{rdb: rdb, ns: ns, pending: map[uuid.UUID][]string{}, onError: onError}
}

func (s *Slots) key(tenant uuid.UUID) string { return stream.NewNames(s.ns).Running(tenant) }

// Key is the Redis key of a tenant's permits (a sorted set of members
// scored by expiry in milliseconds on Redis's clock), for scripts that
// read it alongside the tenant's other keys.
func (s *Slots) Key(tenant uuid.UUID) string { return s.key(tenant) }

// SlotMember names one lease's permit.
func SlotMember(task uuid.UUID, attempt int, owner string) string {
	return fmt.Sprintf("%s:%d:%s", task, attempt, owner)
}

// acquireScript: KEYS[1] the set; ARGV: limit, ttl ms, members. Returns
// the permits held after the call, then per member 1 (taken), 2 (already
// held: refreshed) or 0 (refused).
var acquireScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local n = redis.call('ZCARD', KEYS[1])
local out = {0}
for i = 3, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], now + ttl, ARGV[i])
    out[#out + 1] = 2
  elseif n < limit then
    redis.call('ZADD', KEYS[1], now + ttl, ARGV[i])
    n = n + 1
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
out[1] = n
redis.call('PEXPIRE', KEYS[1], ttl + 60000)
return out
`)

// renewScript: KEYS[1] the set; ARGV: ttl ms, members. Re-adds missing
// members too, so permits lost with Redis's data come back at the next
// renewal.
var renewScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[i])
end
local e = redis.call('PTTL', KEYS[1])
if e < ttl + 60000 then redis.call('PEXPIRE', KEYS[1], ttl + 60000) end
return 0
`)

// transferScript: KEYS[1] the set; ARGV: ttl ms, from, to. Replaces one
// permit by another, valid for ttl from now; the count does not change.
var transferScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[3])
local e = redis.call('PTTL', KEYS[1])
if e < ttl + 60000 then redis.call('PEXPIRE', KEYS[1], ttl + 60000) end
return 0
`)

// PermitGrace is how much longer a permit lives than the lease it stands
// for. A lease is granted (and renewed) in a transaction that commits a
// moment after its permit was taken, so a permit of exactly the lease's TTL
// would lapse just before the lease does, and another task could take it
// while the first still held a live lease.
const PermitGrace = 250 * time.Millisecond

// Permit is what Acquire did for one member.
type Permit int8

// Permits.
const (
	// PermitRefused: the tenant holds its limit.
	PermitRefused Permit = iota
	// PermitTaken: a new permit.
	PermitTaken
	// PermitHeld: the member already held a permit (a lease it names is
	// live, or this call named it twice); it was refreshed. Such a permit
	// belongs to whoever took it, and is never given back on behalf of
	// this call.
	PermitHeld
)

// Granted reports whether the member holds a permit after the call.
func (p Permit) Granted() bool { return p != PermitRefused }

// Acquire takes a permit for each member while the tenant holds fewer than
// limit, each valid for ttl (plus PermitGrace). It reports what it did for
// each member and how many permits the tenant holds now.
func (s *Slots) Acquire(ctx context.Context, tenant uuid.UUID, limit int, ttl time.Duration, members []string) ([]Permit, int, error) {
	args := make([]any, 0, len(members)+2)
	args = append(args, limit, (ttl + PermitGrace).Milliseconds())
	for _, m := range members {
		args = append(args, m)
	}
	res, err := acquireScript.Run(ctx, s.rdb, []string{s.key(tenant)}, args...).Int64Slice()
	if err != nil {
		return nil, 0, fmt.Errorf("running-task quota: %w", err)
	}
	if len(res) != len(members)+1 {
		return nil, 0, fmt.Errorf("running-task quota: %d answers for %d members", len(res)-1, len(members))
	}
	out := make([]Permit, len(members))
	for i := range members {
		out[i] = Permit(res[i+1])
	}
	return out, int(res[0]), nil
}

// Renew extends the members' permits (the leases were renewed).
func (s *Slots) Renew(ctx context.Context, tenant uuid.UUID, ttl time.Duration, members []string) error {
	if len(members) == 0 {
		return nil
	}
	args := make([]any, 0, len(members)+1)
	args = append(args, (ttl + PermitGrace).Milliseconds())
	for _, m := range members {
		args = append(args, m)
	}
	if err := renewScript.Run(ctx, s.rdb, []string{s.key(tenant)}, args...).Err(); err != nil {
		return fmt.Errorf("running-task quota: %w", err)
	}
	return nil
}

// Release gives the members' permits back (their leases ended or were
// never granted).
func (s *Slots) Release(ctx context.Context, tenant uuid.UUID, members []string) error {
	if len(members) == 0 {
		return nil
	}
	args := make([]any, len(members))
	for i, m := range members {
		args[i] = m
	}
	if err := s.rdb.ZRem(ctx, s.key(tenant), args...).Err(); err != nil {
		return fmt.Errorf("running-task quota: %w", err)
	}
	return nil
}

// Transfer hands the permit of one lease (from) to another (to), valid for
// ttl (plus PermitGrace): an attempt that ended gave its slot to the next
// task of its run, leased to the same worker in the same transaction. The
// tenant holds as many permits after as before. (Should from have lapsed,
// to is still added: it names a live lease, and the quota counts leases.)
func (s *Slots) Transfer(ctx context.Context, tenant uuid.UUID, ttl time.Duration, from, to string) error {
	if err := transferScript.Run(ctx, s.rdb, []string{s.key(tenant)}, (ttl + PermitGrace).Milliseconds(), from, to).Err(); err != nil {
		return fmt.Errorf("running-task quota: %w", err)
	}
	return nil
}

// ReleaseLater gives permits back in the background: releases queued while
// one round trip is in flight leave together in the next, so the steady
// state costs a fraction of a round trip per finished task and adds none
// to the caller's latency. A release lost with the process lapses with the
// lease TTL.
func (s *Slots) ReleaseLater(tenant uuid.UUID, members ...string) {
	s.mu.Lock()
	s.pending[tenant] = append(s.pending[tenant], members...)
	start := !s.flushing
	s.flushing = true
	s.mu.Unlock()
	if start {
		s.flushes.Add(1)
		go func() {
			defer s.flushes.Done()
			s.flush()
		}()
	}
}

// Wait returns once the releases queued so far have been sent (or have
// failed): a process that stops calls it after its last report.
func (s *Slots) Wait() { s.flushes.Wait() }

func (s *Slots) flush() {
	for {
		s.mu.Lock()
		batch := s.pending
		if len(batch) == 0 {
			s.flushing = false
			s.mu.Unlock()
			return
		}
		s.pending = map[uuid.UUID][]string{}
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		pipe := s.rdb.Pipeline()
		for tenant, members := range batch {
			args := make([]any, len(members))
			for i, m := range members {
				args[i] = m
			}
			pipe.ZRem(ctx, s.key(tenant), args...)
		}
		_, err := pipe.Exec(ctx)
		cancel()
		if err != nil && s.onError != nil {
			s.onError(fmt.Errorf("running-task quota: releasing permits: %w", err))
		}
	}
}

// heldScript: KEYS[1] the set. Counts the live permits on the clock of the
// node holding them (on a cluster another node's clock may differ).
var heldScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
`)

// Held counts the tenant's live permits.
func (s *Slots) Held(ctx context.Context, tenant uuid.UUID) (int, error) {
	n, err := heldScript.Run(ctx, s.rdb, []string{s.key(tenant)}).Int()
	return n, err
}
