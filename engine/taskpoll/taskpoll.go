// Package taskpoll serves the work polls of tenants' own workers: programs
// a tenant runs with the SDK, holding only an API key with the worker
// scope and the server's URL. Such a worker never touches Redis or
// PostgreSQL. It names the queues and task handlers it serves and how
// many slots are free; the server reads that tenant's handler streams on
// its behalf, leases at most that many tasks to it, and answers — at
// once when work is there, else as soon as a wake-up says work arrived,
// else with nothing when the poll's wait runs out.
//
// What keeps it safe and live:
//   - a poll reads only the caller's tenant's keys, named from the
//     authenticated credential, never from the request;
//   - a worker is the id it names under the API key it authenticated
//     with: its leases are taken with that key (engine.Holder) and its
//     kept answers are filed under it, so another key of the tenant naming
//     the same worker and poll ids finds, renews and reports nothing of
//     them;
//   - a message is settled (acknowledged and deleted) in the same poll
//     that leased it: from then on the lease is the truth, and a worker
//     that dies is recovered by the lease sweep like any other;
//   - messages the quota bounced, or whose lease call failed after a
//     short bounded retry, are put back at once (re-added, then
//     acknowledged) for the next poll; a server that dies between reading
//     and settling leaves them pending, and any poll of the tenant takes
//     them over after ReclaimIdle;
//   - a caller that went away before its answer was written gets its
//     leases released (pending again, same attempt); an answer lost on
//     the way is recovered by the worker repeating the poll with the same
//     poll id, which hands back the leases that answer carried;
//   - every poll refreshes the worker's entry in the tenant's list of
//     connected workers (bounded per tenant), which the API shows.
//
// A Poller is safe for concurrent use; run one per server replica, with
// Run started.
package taskpoll

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/engine/dag"
	"github.com/composer-dev/composer/engine/stream"
	"github.com/composer-dev/composer/engine/taskapi"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/lifecycle"
	"github.com/composer-dev/composer/internal/redisconn"
	"github.com/composer-dev/composer/tenants"
)

// Config configures a Poller. Zero fields take the defaults.
type Config struct {
	// MaxWait is the longest a poll is held (default 20s).
	MaxWait time.Duration
	// ReclaimIdle is how long a message read by a poll may stay unsettled
	// before another poll takes it over: its server died in between
	// (default 15s; a poll settles within its lease retry).
	ReclaimIdle time.Duration
	// MaxWorkers bounds a tenant's connected workers (default 1000).
	MaxWorkers int
	// LeaseRetry is how long a lease call that fails is retried before the
	// messages go back to their streams (default 2s).
	LeaseRetry time.Duration
}

// Defaults of Config.
const (
	DefaultMaxWait     = 20 * time.Second
	DefaultReclaimIdle = 15 * time.Second
	DefaultMaxWorkers  = 1000
	DefaultLeaseRetry  = 2 * time.Second
)

func (c *Config) defaults() {
	c.MaxWait = cmpOr(c.MaxWait, DefaultMaxWait)
	c.ReclaimIdle = cmpOr(c.ReclaimIdle, DefaultReclaimIdle)
	c.MaxWorkers = cmpOr(c.MaxWorkers, DefaultMaxWorkers)
	c.LeaseRetry = cmpOr(c.LeaseRetry, DefaultLeaseRetry)
}

func cmpOr[T comparable](v, d T) T {
	var zero T
	if v == zero {
		return d
	}
	return v
}

// Limits of one poll request.
const (
	MaxQueues   = 20
	MaxSlots    = 1000
	MaxCapacity = 10000
	maxLabel    = 200
	maxVersion  = 64
)

// consumer is the consumer name of every poll in the handler streams'
// group: a poll settles what it read before it answers, so who read a
// message only matters while it is unsettled, and ReclaimIdle covers that.
const consumer = "poll"

// Poller serves tenant workers' polls.
type Poller struct {
	coord *engine.Coordinator
	rdb   redis.UniversalClient
	names stream.Names
	slots *tenants.Slots
	cfg   Config
	log   *zap.Logger
	hub   *hub
}

// New returns a Poller. slots is the running-task quota the coordinator
// enforces (nil when there is none): a poll reads no more than the
// tenant's free permits.
func New(coord *engine.Coordinator, rdb redis.UniversalClient, names stream.Names, slots *tenants.Slots, cfg Config, log *zap.Logger) *Poller {
	cfg.defaults()
	if log == nil {
		log = zap.NewNop()
	}
	return &Poller{coord: coord, rdb: rdb, names: names, slots: slots, cfg: cfg, log: log, hub: newHub(rdb, names.HandlerWake(), log)}
}

// Run keeps the wake-up subscription until ctx ends.
func (p *Poller) Run(ctx context.Context) error {
	p.hub.run(ctx)
	return ctx.Err()
}

// Caller is the authenticated worker: its tenant and the API key it used
// (required: the worker's leases are bound to it).
type Caller struct {
	Tenant uuid.UUID
	KeyID  string
	// Recheck, when set, authenticates the caller again: a poll that was
	// held calls it before leasing anything, so a key revoked while the
	// poll waited gets nothing.
	Recheck func(context.Context) error
}

var (
	workerIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:@+-]{0,127}$`)
	pollIDPattern   = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
)

// poll is a validated request.
type poll struct {
	taskapi.PollRequest
	ttl, wait time.Duration
	keys      []string        // the handler streams, in request order
	prioKeys  []string        // their streams of other priorities
	routes    map[string]bool // "queue/handler"
}

func (p *Poller) check(c Caller, r taskapi.PollRequest) (*poll, error) {
	var bad []string
	if !workerIDPattern.MatchString(r.WorkerID) {
		bad = append(bad, "worker_id must be 1-128 letters, digits or _.:@+- (starting with a letter or digit)")
	}
	if !pollIDPattern.MatchString(r.PollID) {
		bad = append(bad, "poll_id must be 1-64 letters, digits, _ or -")
	}
	if len(r.Queues) == 0 || len(r.Queues) > MaxQueues {
		bad = append(bad, fmt.Sprintf("name 1-%d queues", MaxQueues))
	}
	for _, q := range r.Queues {
		if !dag.ValidQueue(q) {
			bad = append(bad, fmt.Sprintf("invalid queue name %q", q))
		}
	}
	if len(r.Handlers) == 0 || len(r.Handlers) > engine.MaxWorkerHandlers {
		bad = append(bad, fmt.Sprintf("name 1-%d handlers", engine.MaxWorkerHandlers))
	}
	for _, h := range r.Handlers {
		if !dag.ValidHandler(h) {
			bad = append(bad, fmt.Sprintf("invalid handler name %q", h))
		}
	}
	if len(dedupe(r.Queues))*len(dedupe(r.Handlers)) > engine.MaxWorkerHandlers {
		bad = append(bad, fmt.Sprintf("serve at most %d queue and handler pairs", engine.MaxWorkerHandlers))
	}
	if r.Slots < 0 || r.Slots > MaxSlots {
		bad = append(bad, fmt.Sprintf("slots must be between 0 and %d", MaxSlots))
	}
	if r.Capacity < 1 || r.Capacity > MaxCapacity || r.InFlight < 0 || r.InFlight > r.Capacity || r.Slots > r.Capacity {
		bad = append(bad, fmt.Sprintf("capacity must be 1-%d, with slots and in_flight within it", MaxCapacity))
	}
	ttl := time.Duration(r.TTLMillis) * time.Millisecond
	if ttl < time.Second || ttl > 10*time.Minute {
		bad = append(bad, "ttl_ms must be between 1s and 10m")
	}
	wait := time.Duration(r.WaitMillis) * time.Millisecond
	if wait < 0 || wait > p.cfg.MaxWait {
		bad = append(bad, fmt.Sprintf("wait_ms must be between 0 and %d", p.cfg.MaxWait.Milliseconds()))
	}
	if !printable(r.Label, maxLabel) || !printable(r.Version, maxVersion) {
		bad = append(bad, fmt.Sprintf("label and version must be printable text of at most %d and %d characters", maxLabel, maxVersion))
	}
	if len(bad) > 0 {
		e := errs.E(errs.Invalid, "invalid poll: %s", bad[0])
		for _, b := range bad {
			e.Fields = append(e.Fields, errs.Field{Message: b})
		}
		return nil, e
	}
	out := &poll{PollRequest: r, ttl: ttl, wait: wait, routes: map[string]bool{}}
	for _, q := range dedupe(r.Queues) {
		for _, h := range dedupe(r.Handlers) {
			out.routes[q+"/"+h] = true
			out.keys = append(out.keys, p.names.HandlerStream(c.Tenant, q, h))
			for prio := stream.MaxPriority; prio >= stream.MinPriority; prio-- {
				if prio != 0 {
					out.prioKeys = append(out.prioKeys, p.names.HandlerPriorityStream(c.Tenant, q, h, prio))
				}
			}
		}
	}
	return out, nil
}

// holder is who the poll's leases are for: the worker under the caller's key.
func (c Caller) holder(worker string) engine.Holder {
	return engine.Holder{Worker: worker, Key: c.KeyID}
}

// member is the worker's name in the tenant's registry: its id under the
// caller's key, so one key's entry is not another's.
func (c Caller) member(worker string) string { return c.KeyID + "/" + worker }

func printable(s string, n int) bool {
	if len(s) > n {
		return false
	}
	for _, r := range s {
		if r < ' ' || r == 0x7f || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) {
			return false
		}
	}
	return true
}

func dedupe(xs []string) []string {
	out := slices.Clone(xs)
	slices.Sort(out)
	return slices.Compact(out)
}

// Poll answers one poll (see taskapi.PollRequest): leases of the caller's
// tenant's tasks, each with its queue and trace context, or none when the
// wait ran out (or the caller went away).
func (p *Poller) Poll(ctx context.Context, c Caller, r taskapi.PollRequest) ([]engine.Lease, error) {
	if c.KeyID == "" {
		return nil, errs.E(errs.Unauthenticated, "a tenant's worker polls with its API key")
	}
	q, err := p.check(c, r)
	if err != nil {
		return nil, err
	}
	if q.Retry {
		if leases, err := p.answerAgain(ctx, c, q); err != nil {
			p.log.Warn("recovering the leases of a lost poll answer failed", zap.Stringer("tenant_id", c.Tenant), zap.Error(err))
		} else if len(leases) > 0 {
			return leases, nil
		}
	}
	w := p.hub.add(c.Tenant, q.routes)
	defer p.hub.remove(c.Tenant, w)
	deadline := time.Now().Add(q.wait)
	var quotaWait time.Duration
	for held := false; ; held = true {
		msgs, full, err := p.read(ctx, c, q)
		if err != nil {
			return nil, err
		}
		if len(msgs) > 0 && held && c.Recheck != nil {
			if err := c.Recheck(ctx); err != nil {
				p.settle(context.WithoutCancel(ctx), c, q, nil, msgs, nil)
				return nil, err
			}
		}
		if len(msgs) > 0 {
			leases, bounced, err := p.lease(ctx, c, q, msgs)
			if err != nil || len(leases) > 0 {
				return leases, err
			}
			if !bounced {
				continue // all duplicates or stale: look again at once
			}
			full = true // the quota filled meanwhile
		}
		left := time.Until(deadline)
		if q.Slots == 0 || left <= 0 {
			return nil, nil
		}
		wait := p.hub.fallback(left)
		if full {
			// Permits free without a wake-up: look again soon, backing off.
			quotaWait = min(max(quotaWait*2, 20*time.Millisecond), 250*time.Millisecond)
			wait = min(wait, quotaWait)
		} else {
			quotaWait = 0
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, nil
		case <-w.ch:
		case <-t.C:
		}
		t.Stop()
	}
}

// pollScript refreshes the worker's entry in the tenant's registry, then
// reads up to n messages from the handler streams, taking over messages
// left unsettled for ReclaimIdle first — never more than the tenant's free
// running-task permits. Every key carries the tenant's hash tag, so the
// script touches one cluster slot.
//
// The streams are each handler's priority-0 stream (in request order) and
// its streams of other priorities (stream.HandlerPriorityStream); only the
// latter in the tenant's set of priority streams in use are looked at, and
// one found empty (every message settled) leaves the set. With none in
// use, new messages are read stream after stream, as before priorities;
// with some, one at a time in order of virtual time — the message's publish
// time less priority × aging, ties to the higher priority — as the
// platform workers read their queues (so a higher priority goes first and
// a lower one is never starved).
//
// KEYS: workers, live, busy, running permits, priority streams in use,
// streams...
// ARGV: worker, info, gone-after ms, max workers, in flight, n, limit,
// group, consumer, reclaim idle ms, aging ms per priority level.
// Returns {status, key, id, fields, key, id, fields, ...}: status 0 (read),
// -1 (quota full), -2 (too many workers).
var pollScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 100)
for _, id in ipairs(gone) do
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[1], id)
  redis.call('HDEL', KEYS[3], id)
end
local w = ARGV[1]
if not redis.call('ZSCORE', KEYS[2], w) and redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[4]) then
  return {-2}
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), w)
redis.call('HSET', KEYS[1], w, ARGV[2])
redis.call('HSET', KEYS[3], w, ARGV[5] .. ' ' .. now)
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], 86400000) end
local n = tonumber(ARGV[6])
local limit = tonumber(ARGV[7])
if n > 0 and limit > 0 then
  local held = redis.call('ZCOUNT', KEYS[4], '(' .. now, '+inf')
  if held >= limit then return {-1} end
  n = math.min(n, limit - held)
end
local out = {0}
local function take(key, entries)
  for _, e in ipairs(entries) do
    if e[2] then -- (a deleted entry has no fields)
      out[#out + 1] = key
      out[#out + 1] = e[1]
      out[#out + 1] = e[2]
      n = n - 1
    end
  end
end
local inuse = {}
for _, k in ipairs(redis.call('SMEMBERS', KEYS[5])) do inuse[k] = true end
local live, prio, levels = {}, {}, false
for i = 6, #KEYS do
  local p = tonumber(string.match(KEYS[i], ':p(%-?%d+)$') or '0')
  if (p == 0 or inuse[KEYS[i]]) and redis.call('EXISTS', KEYS[i]) == 1 then
    live[#live + 1] = i
    prio[i] = p
    if p ~= 0 then levels = true end
  end
end
for _, i in ipairs(live) do
  if n <= 0 then break end
  local key = KEYS[i]
  local r = redis.pcall('XAUTOCLAIM', key, ARGV[8], ARGV[9], ARGV[10], '0-0', 'COUNT', n)
  if type(r) == 'table' and r.err then
    if string.find(r.err, 'NOGROUP', 1, true) then
      redis.call('XGROUP', 'CREATE', key, ARGV[8], '0')
    else
      return redis.error_reply(r.err)
    end
  else
    take(key, r[2])
  end
end
local function readOne(i, count)
  local x = redis.call('XREADGROUP', 'GROUP', ARGV[8], ARGV[9], 'COUNT', count, 'STREAMS', KEYS[i], '>')
  if x then
    take(KEYS[i], x[1][2])
    return x[1][2]
  end
  return nil
end
if not levels then
  for _, i in ipairs(live) do
    if n <= 0 then break end
    readOne(i, n)
  end
  return out
end
local aging = tonumber(ARGV[11])
local function vtime(i, after)
  local r = redis.pcall('XRANGE', KEYS[i], '(' .. after, '+', 'COUNT', 1)
  if type(r) ~= 'table' or r.err or #r == 0 then return nil end
  return tonumber(string.match(r[1][1], '^(%d+)')) - prio[i] * aging
end
local heads = {}
for _, i in ipairs(live) do
  local last = '0-0'
  local groups = redis.pcall('XINFO', 'GROUPS', KEYS[i])
  if type(groups) == 'table' and not groups.err then
    for _, g in ipairs(groups) do
      local name, lid
      for j = 1, #g, 2 do
        if g[j] == 'name' then name = g[j + 1] elseif g[j] == 'last-delivered-id' then lid = g[j + 1] end
      end
      if name == ARGV[8] and lid then last = lid end
    end
  end
  heads[i] = vtime(i, last)
end
while n > 0 do
  local best, bv = nil, nil
  for _, i in ipairs(live) do
    local v = heads[i]
    if v and (bv == nil or v < bv or (v == bv and prio[i] > prio[best])) then best, bv = i, v end
  end
  if best == nil then break end
  local got = readOne(best, 1)
  if got and #got > 0 then
    heads[best] = vtime(best, got[#got][1])
  else
    heads[best] = nil
  end
end
for _, i in ipairs(live) do
  if prio[i] ~= 0 and redis.call('XLEN', KEYS[i]) == 0 then redis.call('SREM', KEYS[5], KEYS[i]) end
end
return out
`)

// entry is what the tenant's list of workers shows of one worker.
type entry struct {
	Label       string   `json:"label,omitempty"`
	Version     string   `json:"version,omitempty"`
	Queues      []string `json:"queues"`
	Handlers    []string `json:"handlers"`
	Capacity    int      `json:"capacity"`
	KeyID       string   `json:"key_id,omitempty"`
	ConnectedAt int64    `json:"connected_at_ms"`
}

// goneAfter is how long a worker that makes no call counts as connected:
// twice the longest gap between its calls (a poll's wait, or the renewal
// interval while every slot is busy), and a few seconds.
func goneAfter(q *poll) time.Duration {
	return 2*max(q.wait, q.ttl/3) + 5*time.Second
}

func (p *Poller) read(ctx context.Context, c Caller, q *poll) (msgs []stream.Message, full bool, err error) {
	limit := 0
	if p.slots != nil && q.Slots > 0 {
		if limit, err = p.coord.RunningLimit(ctx, c.Tenant); err != nil {
			return nil, false, errs.Wrap(errs.Unavailable, err, "the task service is unavailable; try again")
		}
	}
	info, _ := json.Marshal(entry{Label: q.Label, Version: q.Version, Queues: dedupe(q.Queues), Handlers: dedupe(q.Handlers),
		Capacity: q.Capacity, KeyID: c.KeyID, ConnectedAt: time.Now().UnixMilli()})
	keys := []string{p.names.Workers(c.Tenant), p.names.WorkersLive(c.Tenant), p.names.WorkersBusy(c.Tenant), p.quotaKey(c.Tenant),
		p.names.HandlerPriorities(c.Tenant)}
	// Start at a random stream so no handler is favoured when slots are few.
	rot := rand.IntN(len(q.keys))
	keys = append(keys, q.keys[rot:]...)
	keys = append(keys, q.keys[:rot]...)
	keys = append(keys, q.prioKeys...)
	res, err := pollScript.Run(ctx, p.rdb, keys, c.member(q.WorkerID), info, goneAfter(q).Milliseconds(), p.cfg.MaxWorkers, q.InFlight,
		q.Slots, limit, stream.Group, consumer, p.cfg.ReclaimIdle.Milliseconds(), stream.PriorityAging.Milliseconds()).Slice()
	if err != nil {
		if ctx.Err() != nil {
			return nil, false, nil
		}
		return nil, false, errs.Wrap(errs.Unavailable, err, "the task service is unavailable; try again")
	}
	switch status, _ := res[0].(int64); status {
	case -1:
		return nil, true, nil
	case -2:
		return nil, false, errs.E(errs.QuotaExceeded, "the tenant already has %d workers connected, the most it may have", p.cfg.MaxWorkers)
	}
	for i := 1; i+2 < len(res); i += 3 {
		key, _ := res[i].(string)
		id, _ := res[i+1].(string)
		fields, _ := res[i+2].([]any)
		values := make(map[string]any, len(fields)/2)
		for j := 0; j+1 < len(fields); j += 2 {
			k, _ := fields[j].(string)
			values[k] = fields[j+1]
		}
		m, err := stream.Parse(key, redis.XMessage{ID: id, Values: values})
		if err != nil || m.Tenant != c.Tenant {
			// Undecodable (or, impossibly, another tenant's): never deliver it.
			p.log.Error("poison message dropped from a handler stream", zap.String("stream", key), zap.String("message_id", id), zap.Error(err))
			p.settle(context.WithoutCancel(ctx), c, nil, []stream.Message{{ID: id, Stream: key, Task: m.Task}}, nil, nil)
			continue
		}
		msgs = append(msgs, m)
	}
	return msgs, false, nil
}

// quotaKey is the tenant's permit set (any key of its slot when there is
// no quota: the script then never reads it).
func (p *Poller) quotaKey(tenant uuid.UUID) string {
	if p.slots == nil {
		return p.names.Workers(tenant)
	}
	return p.slots.Key(tenant)
}

// leaseTimeout bounds the leasing and settling of one poll's messages,
// which continue after the caller goes away so nothing is left half done.
const leaseTimeout = 10 * time.Second

// lease leases the messages to the worker and settles them: leased,
// duplicate and stale messages are acknowledged and deleted; those the
// quota bounced go back to their streams, and so does everything when the
// lease call keeps failing or the caller went away meanwhile (its leases
// are released first).
func (p *Poller) lease(ctx context.Context, c Caller, q *poll, msgs []stream.Message) (leased []engine.Lease, bounced bool, err error) {
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseTimeout)
	defer cancel()
	reqs := make([]engine.LeaseRequest, len(msgs))
	for i, m := range msgs {
		reqs[i] = engine.LeaseRequest{RunID: m.Run, TaskID: m.Task, Attempt: m.Attempt}
	}
	var leases []engine.Lease
	var quota engine.Quota
	retryUntil := time.Now().Add(p.cfg.LeaseRetry)
	for backoff := 50 * time.Millisecond; ; backoff = min(backoff*2, 500*time.Millisecond) {
		leases, quota, err = p.coord.AcquireLeases(bg, c.Tenant, c.holder(q.WorkerID), q.ttl, reqs)
		if err == nil || errs.KindOf(err) == errs.Invalid || time.Now().Add(backoff).After(retryUntil) {
			break
		}
		lifecycle.Sleep(bg, backoff)
	}
	if err != nil {
		p.log.Warn("leasing polled tasks failed; their messages go back to the streams", zap.Stringer("tenant_id", c.Tenant),
			zap.Int("messages", len(msgs)), zap.Error(err))
		p.settle(bg, c, q, nil, msgs, nil)
		return nil, false, errs.Wrap(errs.Unavailable, err, "the task service is unavailable; try again")
	}
	var done, back []stream.Message
	var out []engine.Lease
	var refs []engine.LeaseRequest
	for i, l := range leases {
		m := msgs[i]
		switch {
		case l.Acquired:
			l.RunID, l.Attempt, l.Queue, l.TraceParent = m.Run, m.Attempt, m.Queue, m.TraceParent
			out = append(out, l)
			refs = append(refs, reqs[i])
			done = append(done, m)
		case quota.Full():
			back = append(back, m)
		default:
			done = append(done, m)
		}
	}
	if len(out) > 0 && ctx.Err() != nil {
		// The caller is gone: nobody will run these.
		if err := p.coord.ReleaseLeases(bg, c.Tenant, c.holder(q.WorkerID), refs); err != nil {
			p.log.Warn("releasing the leases of an abandoned poll failed; they are recovered when they expire",
				zap.Stringer("tenant_id", c.Tenant), zap.Error(err))
		} else {
			back = msgs
			done = nil
		}
		out = nil
	}
	p.settle(bg, c, q, done, back, out)
	return out, len(back) > 0, nil
}

// answer is one lease a poll answered with, kept so a repeat of the poll
// can hand it back.
type answer struct {
	Run         uuid.UUID `json:"r"`
	Task        uuid.UUID `json:"t"`
	Attempt     int       `json:"a"`
	Queue       string    `json:"q"`
	TraceParent string    `json:"tp,omitempty"`
}

// settle acknowledges and deletes done messages, puts back the back ones
// (re-added, then acknowledged, so the next poll reads them) and keeps the
// poll's answer for a repeat, in one round trip (two on a cluster when
// messages go back). A message whose put-back fails stays pending and is
// taken over after ReclaimIdle.
func (p *Poller) settle(ctx context.Context, c Caller, q *poll, done, back []stream.Message, leased []engine.Lease) {
	pipe := p.rdb.Pipeline()
	stream.Settle(ctx, pipe, done...)
	for _, m := range back {
		m.EnqueuedAt = time.Now()
		stream.PutBack(ctx, pipe, m)
	}
	// The wake-ups must not overtake the messages put back (a poll woken
	// early finds nothing and waits): on a cluster they follow once the
	// put-backs are in (see redisconn.PipelineKeepsOrder).
	wakes := pipe
	if len(back) > 0 && !redisconn.PipelineKeepsOrder(p.rdb) {
		if _, err := pipe.Exec(ctx); err != nil {
			p.log.Warn("settling polled messages failed; they are taken over later", zap.Stringer("tenant_id", c.Tenant), zap.Error(err))
		}
		wakes = p.rdb.Pipeline()
	}
	woken := map[string]bool{}
	for _, m := range back {
		if r := stream.HandlerRoute(c.Tenant, m.Queue, m.Handler); !woken[r] {
			woken[r] = true
			wakes.Publish(ctx, p.names.HandlerWake(), r)
		}
	}
	pipe = wakes
	if len(leased) > 0 && q != nil {
		kept := make([]answer, len(leased))
		for i, l := range leased {
			kept[i] = answer{Run: l.RunID, Task: l.TaskID, Attempt: l.Attempt, Queue: l.Queue, TraceParent: l.TraceParent}
		}
		b, _ := json.Marshal(kept)
		pipe.Set(ctx, p.names.PollAnswer(c.Tenant, c.KeyID, q.WorkerID, q.PollID), b, q.ttl)
	}
	if pipe.Len() == 0 {
		return
	}
	if _, err := pipe.Exec(ctx); err != nil {
		p.log.Warn("settling polled messages failed; they are taken over later", zap.Stringer("tenant_id", c.Tenant), zap.Error(err))
	}
}

// answerAgain hands back the leases the poll's earlier answer carried,
// when they are still the worker's under the same key (the answer is
// filed under the key, and the leases are fenced on it).
func (p *Poller) answerAgain(ctx context.Context, c Caller, q *poll) ([]engine.Lease, error) {
	b, err := p.rdb.Get(ctx, p.names.PollAnswer(c.Tenant, c.KeyID, q.WorkerID, q.PollID)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var kept []answer
	if err := json.Unmarshal(b, &kept); err != nil {
		return nil, err
	}
	reqs := make([]engine.LeaseRequest, len(kept))
	for i, a := range kept {
		reqs[i] = engine.LeaseRequest{RunID: a.Run, TaskID: a.Task, Attempt: a.Attempt}
	}
	leases, err := p.coord.ReacquireLeases(ctx, c.Tenant, c.holder(q.WorkerID), q.ttl, reqs)
	if err != nil {
		return nil, err
	}
	var out []engine.Lease
	for i, l := range leases {
		if l.Acquired {
			l.RunID, l.Attempt, l.Queue, l.TraceParent = kept[i].Run, kept[i].Attempt, kept[i].Queue, kept[i].TraceParent
			out = append(out, l)
		}
	}
	return out, nil
}

// renewScript refreshes a worker's registry entry from its lease renewal
// (a worker with every slot busy does not poll). KEYS: live, busy; ARGV:
// worker, gone-after ms, in flight.
var renewScript = redis.NewScript(`
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3] .. ' ' .. now)
return 1
`)

// Renewed records that a tenant worker renewed its leases: it is still
// connected, with inFlight tasks. Failures are only logged: the renewal
// itself succeeded.
func (p *Poller) Renewed(ctx context.Context, c Caller, worker string, ttl time.Duration, inFlight int) {
	gone := 2*ttl/3 + 5*time.Second + 2*p.cfg.MaxWait
	err := renewScript.Run(ctx, p.rdb, []string{p.names.WorkersLive(c.Tenant), p.names.WorkersBusy(c.Tenant)},
		c.member(worker), gone.Milliseconds(), inFlight).Err()
	if err != nil && ctx.Err() == nil {
		p.log.Warn("refreshing a worker's registry entry failed", zap.Stringer("tenant_id", c.Tenant), zap.Error(err))
	}
}

// Worker is a connected tenant worker, as the tenant's API shows it. Two
// workers of the same id under different keys are two workers.
type Worker struct {
	ID          string
	Label       string
	Version     string
	Queues      []string
	Handlers    []string
	Capacity    int
	InFlight    int
	KeyID       string
	ConnectedAt time.Time
	LastSeenAt  time.Time

	member string // its registry entry
}

// Workers lists the tenant's connected workers, by id.
func (p *Poller) Workers(ctx context.Context, tenant uuid.UUID) ([]Worker, error) {
	pipe := p.rdb.Pipeline()
	info := pipe.HGetAll(ctx, p.names.Workers(tenant))
	live := pipe.ZRangeByScoreWithScores(ctx, p.names.WorkersLive(tenant), &redis.ZRangeBy{Min: strconv.FormatInt(time.Now().UnixMilli(), 10), Max: "+inf"})
	busy := pipe.HGetAll(ctx, p.names.WorkersBusy(tenant))
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, errs.Wrap(errs.Unavailable, err, "the list of workers is unavailable; try again")
	}
	var out []Worker
	for _, z := range live.Val() {
		m, _ := z.Member.(string)
		var e entry
		if err := json.Unmarshal([]byte(info.Val()[m]), &e); err != nil {
			continue
		}
		// "<key id>/<worker id>"; an entry of the previous release is the
		// bare worker id.
		id := m
		if key, worker, ok := strings.Cut(m, "/"); ok && key == e.KeyID {
			id = worker
		}
		w := Worker{ID: id, Label: e.Label, Version: e.Version, Queues: e.Queues, Handlers: e.Handlers, Capacity: e.Capacity,
			KeyID: e.KeyID, ConnectedAt: time.UnixMilli(e.ConnectedAt), member: m}
		var seen int64
		if _, err := fmt.Sscanf(busy.Val()[m], "%d %d", &w.InFlight, &seen); err == nil {
			w.LastSeenAt = time.UnixMilli(seen)
		}
		out = append(out, w)
	}
	slices.SortFunc(out, func(a, b Worker) int { return cmp.Or(strings.Compare(a.ID, b.ID), strings.Compare(a.KeyID, b.KeyID)) })
	return out, nil
}

// KeyRevoked ends the live leases taken with the revoked key at once —
// none of its workers' reports can be accepted any more — so the sweep
// gives those tasks to other workers now rather than when the leases
// expire, and drops the key's workers from the list of workers.
func (p *Poller) KeyRevoked(ctx context.Context, tenant uuid.UUID, keyID string) error {
	if _, err := p.coord.ExpireKeyLeases(ctx, tenant, keyID); err != nil {
		return err
	}
	all, err := p.Workers(ctx, tenant)
	if err != nil {
		return err
	}
	var ids []string
	for _, w := range all {
		if w.KeyID == keyID {
			ids = append(ids, w.member)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	members := make([]any, len(ids))
	for i, id := range ids {
		members[i] = id
	}
	pipe := p.rdb.Pipeline()
	pipe.ZRem(ctx, p.names.WorkersLive(tenant), members...)
	pipe.HDel(ctx, p.names.Workers(tenant), ids...)
	pipe.HDel(ctx, p.names.WorkersBusy(tenant), ids...)
	_, err = pipe.Exec(ctx)
	return err
}
