// Package workers is Composer's worker runtime: it reads task messages
// from the tenant stream shards of its queues, leases each task before
// running it, renews the leases as its heartbeat, reports every result
// with its attempt number, and acknowledges the message only after the
// report is acknowledged.
//
// Guarantees and their mechanisms:
//   - a worker fetches only as many messages as it has free execution
//     slots (a bounded hand-off), so work stays spread across the fleet;
//   - a message whose task is already leased or finished is dropped (the
//     lease is the duplicate filter);
//   - every lease is renewed every TTL/3; when a renewal says the lease is
//     gone, the execution is cancelled with ErrLeaseLost and its result is
//     discarded;
//   - a lease call that fails for a reason that may pass (the server or its
//     database restarting) is retried with backoff for up to a lease TTL;
//     after that its messages are put back on their streams at once;
//   - messages left pending by a dead consumer are reclaimed (XAUTOCLAIM)
//     after ClaimIdle; one delivered more than MaxDeliveries times without
//     ever running is reported as a failed attempt instead;
//   - a success report may offer the slot it frees to the run's next task
//     (eager dispatch): the answer then carries that task's lease and the
//     slot runs it, with no stream message; offered only while nobody
//     else has work here and within EagerWindow of the slot's last read;
//   - on shutdown the worker stops reading, lets running tasks finish
//     within ShutdownTimeout, then cancels and reports the rest.
//
// Workers talk to the engine only through the task API (engine/taskapi).
// A Worker is safe for concurrent use; run one per process.
package workers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/engine/stream"
	"github.com/composer-dev/composer/engine/taskapi"
	"github.com/composer-dev/composer/internal/config"
	"github.com/composer-dev/composer/internal/lifecycle"
	"github.com/composer-dev/composer/internal/obs"
)

// ErrLeaseLost is the cancellation cause of an execution whose lease is gone.
var ErrLeaseLost = errors.New("lease lost")

// ErrShutdown is the cancellation cause of executions still running when
// the shutdown deadline passes.
var ErrShutdown = errors.New("worker shutting down")

// TaskAPI is what a worker needs of the server; *taskapi.Client has it.
type TaskAPI interface {
	Acquire(context.Context, taskapi.AcquireRequest) (taskapi.AcquireResponse, error)
	Renew(context.Context, taskapi.RenewRequest) (taskapi.RenewResponse, error)
	Complete(context.Context, taskapi.CompleteRequest) (taskapi.ReportResponse, error)
	Fail(context.Context, taskapi.FailRequest) (taskapi.ReportResponse, error)
}

// SecretsAPI is the part of the task API that reads a leased http task's
// secrets; *taskapi.Client has it. A TaskAPI without it runs no task that
// reads secrets.
type SecretsAPI interface {
	Secrets(context.Context, taskapi.SecretsRequest) (taskapi.SecretsResponse, error)
}

// Config configures a Worker. Zero fields take the defaults.
type Config struct {
	// Queues to serve (default ["default"]).
	Queues []string
	// Concurrency is the number of execution slots (default 16).
	Concurrency int
	// LeaseTTL is asked for each lease; renewals come every TTL/3 (default 30s).
	LeaseTTL time.Duration
	// ClaimIdle is how long a message may sit unacknowledged with another
	// consumer before this worker reclaims it (default 2×LeaseTTL).
	ClaimIdle time.Duration
	// MaxDeliveries bounds how often one message is delivered (default 5).
	MaxDeliveries int64
	// ShutdownTimeout is how long running tasks may finish after shutdown
	// begins (default 30s).
	ShutdownTimeout time.Duration
	// WorkerID names this worker: its consumer name and lease owner
	// (default host-pid-random).
	WorkerID string
	// Namespace prefixes Redis keys (default "composer").
	Namespace string
	// IdlePoll is how long an idle read loop waits for a wake-up before
	// looking again at the tenants that are ready (default 1s); a tenant
	// whose wake-up was lost becomes ready when the active-set discovery
	// (every second) sees its new score.
	IdlePoll time.Duration
	// ActiveWindow is how long a worker remembers a tenant that published
	// (default 24h); one not seen for longer is forgotten.
	ActiveWindow time.Duration
	// NoEager turns eager dispatch off: every task then comes through its
	// stream (see taskapi.EagerOffer).
	NoEager bool
	// EagerWindow bounds how long one slot keeps taking a run's next tasks
	// with its reports before it goes back to the read loops and the fair
	// picks (default 1s, the same bound the active-set discovery puts on
	// finding work whose wake-up was lost): a chain of short steps yields its slot at least
	// that often, and a chain of long steps is not kept eagerly at all.
	EagerWindow time.Duration
}

func (c *Config) defaults() {
	if len(c.Queues) == 0 {
		c.Queues = []string{"default"}
	}
	if c.Concurrency <= 0 {
		c.Concurrency = config.DefaultWorkerConcurrency
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = config.DefaultLeaseTTL
	}
	if c.ClaimIdle <= 0 {
		c.ClaimIdle = config.DefaultClaimIdle(c.LeaseTTL)
	}
	if c.MaxDeliveries <= 0 {
		c.MaxDeliveries = config.DefaultMaxDeliveries
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = config.DefaultShutdownTimeout
	}
	if c.WorkerID == "" {
		host, _ := os.Hostname()
		c.WorkerID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), uuid.NewString()[:8])
	}
	if c.IdlePoll <= 0 {
		c.IdlePoll = time.Second
	}
	if c.ActiveWindow <= 0 {
		c.ActiveWindow = 24 * time.Hour
	}
	if c.EagerWindow <= 0 {
		c.EagerWindow = time.Second
	}
}

// Worker executes tasks.
type Worker struct {
	cfg   Config
	rdb   redis.UniversalClient
	names stream.Names
	api   TaskAPI
	exec  map[string]Executor
	log   *zap.Logger

	slots chan struct{} // one token per busy slot
	freed chan struct{} // pinged when a slot frees
	ended chan struct{} // pinged when a task's slot frees (not a read's unused one)

	mu       sync.Mutex
	inflight map[uuid.UUID]*execution
	running  sync.WaitGroup

	wakeMu sync.Mutex
	wakes  map[string]chan struct{}

	// scheds picks, per queue, whose messages to read next.
	scheds map[string]*queueSched
	// own knows, per queue, the messages this worker holds (ownpending.go).
	own map[string]*ownPending

	// pauseRenewals, in tests, stops renewing (a worker frozen by a GC
	// pause or SIGSTOP as far as the server can tell).
	pauseRenewals atomic.Bool

	// nodeTypes are the node types the worker has executors for, offered
	// with eager offers; stopping is set once shutdown begins.
	nodeTypes         []string
	stopping          atomic.Bool
	eagerRefusedUntil atomic.Int64 // unix nanoseconds
	eagerStarts       atomic.Int64
	reclaimPasses     atomic.Int64
}

type tenantShards struct {
	tenant uuid.UUID
	shards int
	weight int
}

type execution struct {
	ref    taskapi.Ref
	node   string
	cancel context.CancelCauseFunc
}

// New returns a worker. executors maps node types ("http", "task", "noop")
// to what runs them.
func New(cfg Config, rdb redis.UniversalClient, api TaskAPI, executors map[string]Executor, log *zap.Logger) *Worker {
	cfg.defaults()
	if log == nil {
		log = zap.NewNop()
	}
	w := &Worker{cfg: cfg, rdb: rdb, names: stream.NewNames(cfg.Namespace), api: api, exec: executors,
		log: log.With(zap.String("worker_id", cfg.WorkerID)), slots: make(chan struct{}, cfg.Concurrency),
		freed: make(chan struct{}, 1), ended: make(chan struct{}, 1), inflight: map[uuid.UUID]*execution{}, wakes: map[string]chan struct{}{},
		scheds: map[string]*queueSched{}, own: map[string]*ownPending{}}
	for _, q := range cfg.Queues {
		w.wakes[q] = make(chan struct{}, 1)
		w.scheds[q] = newQueueSched(cfg.Concurrency)
		w.own[q] = newOwnPending()
	}
	for t := range executors {
		w.nodeTypes = append(w.nodeTypes, t)
	}
	slices.Sort(w.nodeTypes)
	return w
}

// EagerStarts counts the tasks this worker ran from eager leases (handed
// over with the previous step's report) rather than from stream messages.
func (w *Worker) EagerStarts() int64 { return w.eagerStarts.Load() }

// ReclaimPasses counts the reclaim passes the worker has completed.
func (w *Worker) ReclaimPasses() int64 { return w.reclaimPasses.Load() }

// ID returns the worker's id (consumer name and lease owner).
func (w *Worker) ID() string { return w.cfg.WorkerID }

// Run serves the queues until ctx ends, then shuts down gracefully.
func (w *Worker) Run(ctx context.Context) error {
	// Executions outlive ctx by up to ShutdownTimeout.
	execCtx, cancelExec := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelExec(ErrShutdown)

	// starters are the loops that start executions (w.running.Add): they
	// end before the shutdown waits on w.running, so no execution is added
	// while it waits.
	var loops, starters sync.WaitGroup
	loops.Add(3)
	go func() { defer loops.Done(); w.wakeLoop(ctx) }()
	go func() { defer loops.Done(); w.discoverLoop(ctx) }()
	go func() { defer loops.Done(); w.renewLoop(execCtx) }()
	starters.Add(1)
	go func() { defer starters.Done(); w.reclaimLoop(ctx, execCtx) }()
	for _, q := range w.cfg.Queues {
		starters.Add(1)
		go func() { defer starters.Done(); w.readLoop(ctx, execCtx, q) }()
	}
	w.log.Info("worker started", zap.Strings("queues", w.cfg.Queues), zap.Int("concurrency", w.cfg.Concurrency))
	<-ctx.Done()
	w.stopping.Store(true)

	deadline := time.After(w.cfg.ShutdownTimeout)
	done := make(chan struct{})
	go func() { starters.Wait(); w.running.Wait(); close(done) }()
	select {
	case <-done:
	case <-deadline:
		w.log.Warn("shutdown deadline passed; cancelling running tasks")
		cancelExec(ErrShutdown)
		<-done
	}
	cancelExec(ErrShutdown)
	loops.Wait()
	w.log.Info("worker stopped")
	return nil
}

func (w *Worker) takeSlots(n int) int {
	got := 0
	for ; got < n; got++ {
		select {
		case w.slots <- struct{}{}:
		default:
			return got
		}
	}
	return got
}

// releaseFor returns the slot a message held (its task was of priority
// prio).
func (w *Worker) releaseFor(m stream.Message, prio int) {
	if s := w.scheds[m.Queue]; s != nil {
		s.release(m.Tenant, prio)
	}
	w.releaseSlot()
	select {
	case w.ended <- struct{}{}:
	default:
	}
}

func (w *Worker) releaseSlot() {
	<-w.slots
	select {
	case w.freed <- struct{}{}:
	default:
	}
}

// wakeLoop turns the enqueuer's publishes into wake-ups of the read loops.
func (w *Worker) wakeLoop(ctx context.Context) {
	channels := make([]string, 0, len(w.cfg.Queues))
	byChannel := map[string]string{}
	for _, q := range w.cfg.Queues {
		ch := w.names.Wake(q)
		channels = append(channels, ch)
		byChannel[ch] = q
	}
	for ctx.Err() == nil {
		ps := w.rdb.Subscribe(ctx, channels...)
		msgs := ps.Channel()
	recv:
		for {
			select {
			case <-ctx.Done():
				break recv
			case m, ok := <-msgs:
				if !ok {
					break recv
				}
				q := byChannel[m.Channel]
				if t, n, weight, at, err := stream.ParseWake(m.Payload); err == nil {
					w.scheds[q].woke(tenantShards{tenant: t, shards: n, weight: weight}, at)
				}
				w.wake(q)
			}
		}
		_ = ps.Close()
		lifecycle.Sleep(ctx, 100*time.Millisecond)
	}
}

func (w *Worker) wake(queue string) {
	if ch := w.wakes[queue]; ch != nil {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// readScript reads up to ARGV[3] new messages for consumer ARGV[2] of
// group ARGV[1] from one tenant's streams of a queue (one cluster slot):
// KEYS[1] is the set of priorities other than 0 in use
// (stream.Names.Priorities), KEYS[2..] the shards of every priority, and
// ARGV[4+i] the priority of KEYS[i] (i ≥ 2), ARGV[4] the aging in
// milliseconds per priority level. One round trip however many streams
// are empty, and never more messages than asked. Only priority 0 and the
// priorities in use are looked at; with nothing but priority 0 it reads
// shard after shard until it has them, as before priorities. With several,
// it takes messages one at a time in order of *virtual time* — the
// message's publish time (its id, on Redis's clock) less priority × aging,
// ties to the higher priority — so a higher priority goes first, and a
// lower one waits at most the difference × aging behind work published
// after it (bounded aging: never starved). A stream's head is the first
// entry after the group's last-delivered id. A priority whose streams are
// all empty (every message settled) leaves the set; the enqueuer adds it
// again after its next message. A stream without the group (Redis lost its
// data and the enqueuer re-created the stream) gets it, from the start,
// and is read at once; a missing stream is empty. ARGV[5], when not
// empty, is "<top> <budget>": at most budget messages of priorities below
// top are taken (the worker's reserve for the tenant's top priority, see
// queueSched.priorityCap), and a read that left such a message for want
// of budget ends its answer with {"", 1} (capped). It returns {key,
// entries} per read that answered, or {key, error} for one that failed.
var readScript = redis.NewScript(`
local want = tonumber(ARGV[3])
local aging = tonumber(ARGV[4])
local out = {}
local top, budget = nil, 0
if ARGV[5] ~= '' then
  local a, b = string.match(ARGV[5], '^(-?%d+) (%d+)$')
  top, budget = tonumber(a), tonumber(b)
end
local capped = false
local function finish()
  if capped then out[#out + 1] = {'', 1} end
  return out
end
local function read(i, n)
  local res = redis.pcall('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', n, 'STREAMS', KEYS[i], '>')
  if type(res) == 'table' and res.err and string.find(res.err, 'NOGROUP', 1, true) then
    if redis.call('EXISTS', KEYS[i]) == 0 then return nil end
    redis.pcall('XGROUP', 'CREATE', KEYS[i], ARGV[1], '0')
    res = redis.pcall('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', n, 'STREAMS', KEYS[i], '>')
  end
  if type(res) == 'table' and res.err then
    out[#out + 1] = {KEYS[i], res.err}
    return nil
  elseif res then
    out[#out + 1] = {KEYS[i], res[1][2]}
    return res[1][2]
  end
  return nil
end
local inuse = {}
local levels = 0
for _, p in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if p ~= '0' then inuse[p] = true; levels = levels + 1 end
end
if levels == 0 then
  local bounded = top ~= nil and top > 0
  for i = 2, #KEYS do
    if want <= 0 then break end
    if ARGV[4 + i] == '0' then
      local n = want
      if bounded then
        if budget <= 0 then
          if redis.call('XLEN', KEYS[i]) > 0 then capped = true end
          n = 0
        else
          n = math.min(n, budget)
        end
      end
      if n > 0 then
        local got = read(i, n)
        if got then
          want = want - #got
          if bounded then budget = budget - #got end
          if bounded and budget <= 0 and want > 0 and #got == n then capped = true end
        end
      end
    end
  end
  return finish()
end
local live = {}
for i = 2, #KEYS do
  if ARGV[4 + i] == '0' or inuse[ARGV[4 + i]] then live[#live + 1] = i end
end
local function vtime(i, after)
  local r = redis.pcall('XRANGE', KEYS[i], '(' .. after, '+', 'COUNT', 1)
  if type(r) ~= 'table' or r.err or #r == 0 then return nil end
  return tonumber(string.match(r[1][1], '^(%d+)')) - tonumber(ARGV[4 + i]) * aging
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
      if name == ARGV[1] and lid then last = lid end
    end
  end
  heads[i] = vtime(i, last)
end
while want > 0 do
  local best, bv = nil, nil
  for _, i in ipairs(live) do
    local v = heads[i]
    if v and top ~= nil and budget <= 0 and tonumber(ARGV[4 + i]) < top then
      capped, v = true, nil
    end
    if v and (bv == nil or v < bv) then best, bv = i, v end
  end
  if best == nil then break end
  local got = read(best, 1)
  if got and #got > 0 then
    want = want - 1
    if top ~= nil and tonumber(ARGV[4 + best]) < top then budget = budget - 1 end
    heads[best] = vtime(best, got[#got][1])
  else
    heads[best] = nil
  end
end
local empty = {}
for p in pairs(inuse) do empty[p] = true end
for _, i in ipairs(live) do
  local p = ARGV[4 + i]
  if empty[p] and redis.call('XLEN', KEYS[i]) > 0 then empty[p] = nil end
end
for p in pairs(empty) do redis.call('SREM', KEYS[1], p) end
return finish()
`)

// slowRead is how long a read's round trip takes before its answer is
// doubted: reads take milliseconds, and the client's read timeout is
// seconds.
const slowRead = time.Second

// readResult is what one grant's read got: its messages, and whether the
// read stopped at the bound on the tenant's lower priorities with more
// of them to read.
type readResult struct {
	msgs   []stream.Message
	capped bool
}

// readGrants reads what each grant may still take (its held messages
// first) from its tenant's shards: all grants in one pipelined round trip.
// A read that failed may have delivered what it read all the same, and so
// may one that took longer than slowRead (the client retries a pipeline
// that timed out: the answer is the retry's, while the first try may
// have run once Redis caught up): their streams become suspect
// (recoverOwn).
func (w *Worker) readGrants(ctx context.Context, queue string, grants []grant) []readResult {
	own := w.own[queue]
	own.mu.Lock()
	defer own.mu.Unlock()
	pipe := w.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(grants))
	keys := make([][]string, len(grants))
	for i, g := range grants {
		need := g.n - len(g.held)
		if need <= 0 {
			continue
		}
		streams := w.names.Streams(g.id, queue, g.route.shards)
		// Rotate which shard of each priority comes first, so none is
		// favoured.
		n := max(g.route.shards, 1)
		rot := int(time.Now().UnixNano() % int64(n))
		for j := 0; j+n <= len(streams); j += n {
			level := streams[j : j+n]
			rotated := append(append([]string(nil), level[rot:]...), level[:rot]...)
			copy(level, rotated)
		}
		keys[i] = streams
		args := make([]any, 0, 5+len(streams))
		args = append(args, stream.Group, w.cfg.WorkerID, need, stream.PriorityAging.Milliseconds(), g.capArg)
		for _, k := range streams {
			args = append(args, stream.KeyPriority(k))
		}
		cmds[i] = readScript.Eval(ctx, pipe, append([]string{w.names.Priorities(g.id, queue)}, streams...), args...)
	}
	slow := false
	if pipe.Len() > 0 {
		began := time.Now()
		_, _ = pipe.Exec(ctx) // per-command errors are read below
		slow = time.Since(began) > slowRead
	}
	out := make([]readResult, len(grants))
	for i, g := range grants {
		out[i].msgs = g.held
		if cmds[i] != nil {
			msgs, capped := w.collectRead(ctx, cmds[i])
			own.learn(msgs)
			out[i].msgs = append(out[i].msgs, msgs...)
			out[i].capped = capped
			if err := cmds[i].Err(); slow || (err != nil && err != redis.Nil) {
				for _, k := range keys[i] {
					own.suspect[k] = struct{}{}
				}
			}
		}
	}
	return out
}

// collectRead decodes one readScript answer: the messages, and whether the
// read was capped.
func (w *Worker) collectRead(ctx context.Context, c *redis.Cmd) (out []stream.Message, capped bool) {
	res, err := c.Slice()
	if err != nil {
		if err != redis.Nil && ctx.Err() == nil {
			w.log.Warn("reading streams failed", zap.Error(err))
		}
		return nil, false
	}
	for _, r := range res {
		pair, _ := r.([]any)
		if len(pair) != 2 {
			continue
		}
		key, _ := pair[0].(string)
		switch v := pair[1].(type) {
		case string:
			if ctx.Err() == nil {
				w.log.Warn("reading stream failed", zap.String("stream", key), zap.String("error", v))
			}
		case int64:
			capped = capped || (key == "" && v == 1)
		case []any:
			w.collect(ctx, key, entries(v), &out)
		}
	}
	return out, capped
}

// entries decodes stream entries from a script's answer.
func entries(v []any) []redis.XMessage {
	out := make([]redis.XMessage, 0, len(v))
	for _, e := range v {
		pair, _ := e.([]any)
		if len(pair) != 2 {
			continue
		}
		id, _ := pair[0].(string)
		fields, _ := pair[1].([]any)
		values := make(map[string]any, len(fields)/2)
		for i := 0; i+1 < len(fields); i += 2 {
			if k, ok := fields[i].(string); ok {
				values[k] = fields[i+1]
			}
		}
		out = append(out, redis.XMessage{ID: id, Values: values})
	}
	return out
}

// collect appends the decodable messages of one read of a stream to out,
// dead-letters the undecodable ones and reports those delivered too often.
func (w *Worker) collect(ctx context.Context, key string, xs []redis.XMessage, out *[]stream.Message) {
	for _, x := range xs {
		m, err := stream.Parse(key, x)
		if err != nil {
			w.deadLetter(ctx, key, x, err)
			continue
		}
		m.Deliveries = 1 + m.Carried
		if m.Deliveries > w.cfg.MaxDeliveries {
			w.poison(ctx, m)
			continue
		}
		*out = append(*out, m)
	}
}

// deadLetter moves an undecodable message aside so it is never delivered
// again, keeping it for inspection.
func (w *Worker) deadLetter(ctx context.Context, key string, x redis.XMessage, cause error) {
	obs.DeadLettered(ctx, obs.DeadStreamMessage, 1)
	w.log.Error("poison message dead-lettered", zap.String("stream", key), zap.String("message_id", x.ID), zap.Error(cause))
	pipe := w.rdb.Pipeline()
	pipe.XAdd(ctx, &redis.XAddArgs{Stream: w.names.DeadLetters(), MaxLen: 10_000, Approx: true,
		Values: map[string]any{"stream": key, "id": x.ID, "error": cause.Error(), "values": fmt.Sprint(x.Values)}})
	m := stream.Message{ID: x.ID, Stream: key}
	if task, ok := x.Values["k"].(string); ok {
		m.Task, _ = uuid.Parse(task) // uncount it if the task is readable
	}
	stream.Settle(ctx, pipe, m)
	_, _ = pipe.Exec(ctx)
}

// ack acknowledges and deletes handled messages: the database is the
// truth, so a stream only needs what is still to be done.
func (w *Worker) ack(ctx context.Context, msgs ...stream.Message) {
	pipe := w.rdb.Pipeline()
	stream.Settle(ctx, pipe, msgs...) // (an eager lease has no message: skipped)
	if pipe.Len() == 0 {
		return
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, context.Canceled) {
		w.log.Warn("acknowledging messages failed; they will be reclaimed and dropped", zap.Error(err))
	}
	w.forgetSettled(msgs)
}

// dispatch leases a batch of messages (of one or more tenants) in one call and starts
// each acquired task in the slot taken for it. A message not acquired
// because the tenant's quota is full is held (it stays in this worker's
// pending list) and retried when the tenant has room; any other is a
// duplicate or stale and is dropped.
func (w *Worker) dispatch(execCtx context.Context, msgs []stream.Message) {
	dispatched := time.Now()
	refs := make([]taskapi.Ref, len(msgs))
	for i, m := range msgs {
		refs[i] = taskapi.Ref{Tenant: m.Tenant, Run: m.Run, Task: m.Task, Attempt: m.Attempt}
	}
	res, err := w.acquire(execCtx, taskapi.AcquireRequest{WorkerID: w.cfg.WorkerID, TTLMillis: w.cfg.LeaseTTL.Milliseconds(), Leases: refs})
	if err == nil && len(res.Leases) != len(msgs) {
		err = fmt.Errorf("the server answered %d leases for %d messages", len(res.Leases), len(msgs))
	}
	if err != nil {
		// Give the messages back to their streams for the next reader,
		// rather than leaving them in this worker's pending list until
		// ClaimIdle.
		w.log.Warn("acquiring leases failed; the messages go back to their streams", zap.Int("messages", len(msgs)), zap.Error(err))
		w.putBack(context.WithoutCancel(execCtx), msgs)
		for _, m := range msgs {
			w.releaseFor(m, stream.KeyPriority(m.Stream))
		}
		return
	}
	full := map[uuid.UUID]bool{}
	for _, q := range res.Quotas {
		full[q.Tenant] = q.Full()
		if s := w.scheds[msgs[0].Queue]; s != nil {
			s.quota(q)
		}
	}
	var dropped []stream.Message
	handedAt := time.Since(dispatched).Seconds()
	for i, l := range res.Leases {
		m := msgs[i]
		switch {
		case l.Acquired:
			handoff.Record(execCtx, handedAt, byQueue.Get(m.Queue))
			w.start(execCtx, m, l)
			continue
		case full[m.Tenant] && w.scheds[m.Queue] != nil:
			w.scheds[m.Queue].hold(m)
		default:
			dropped = append(dropped, m)
		}
		w.releaseFor(m, stream.KeyPriority(m.Stream))
	}
	w.ack(execCtx, dropped...)
}

// acquire asks for leases, retrying a failure that may pass — the server
// or its database restarting — with backoff for up to a lease TTL, so a
// short outage costs the tasks that long and not ClaimIdle.
func (w *Worker) acquire(ctx context.Context, req taskapi.AcquireRequest) (taskapi.AcquireResponse, error) {
	giveUp := time.Now().Add(w.cfg.LeaseTTL)
	for backoff := 100 * time.Millisecond; ; backoff = min(backoff*2, 2*time.Second) {
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		res, err := w.api.Acquire(cctx, req)
		cancel()
		var apiErr *taskapi.APIError
		if err == nil || ctx.Err() != nil || (errors.As(err, &apiErr) && !apiErr.Temporary()) {
			return res, err
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		if time.Now().Add(wait).After(giveUp) {
			return res, err
		}
		w.log.Debug("acquiring leases failed; retrying", zap.Duration("in", wait), zap.Error(err))
		select {
		case <-ctx.Done():
			return res, err
		case <-time.After(wait):
		}
	}
}

// putBack re-adds messages to their streams (and settles the entries they
// were read from) so that the next read of any worker gets them. One that
// fails stays pending here and is reclaimed after ClaimIdle.
func (w *Worker) putBack(ctx context.Context, msgs []stream.Message) {
	pipe := w.rdb.Pipeline()
	news := w.rdb.Pipeline()
	now := time.Now()
	woken := map[string]bool{}
	for _, m := range msgs {
		if m.ID == "" {
			continue
		}
		m.EnqueuedAt, m.Carried = now, m.Deliveries
		stream.PutBack(ctx, pipe, m)
		if s := w.scheds[m.Queue]; s != nil && !woken[m.Queue+"/"+m.Tenant.String()] {
			// Workers read only tenants that published: this is a publish.
			woken[m.Queue+"/"+m.Tenant.String()] = true
			r := s.route(m.Tenant)
			member := stream.ActiveMember(m.Tenant, r.shards, r.weight)
			news.ZAdd(ctx, w.names.Active(m.Queue), redis.Z{Score: float64(now.UnixMilli()), Member: member})
			news.Publish(ctx, w.names.Wake(m.Queue), stream.WakePayload(member, now))
			s.woke(r, 0) // this worker reads it again, whatever becomes of the news
		}
	}
	if pipe.Len() == 0 {
		return
	}
	if _, err := pipe.Exec(ctx); err != nil {
		w.log.Warn("putting messages back failed; they are reclaimed later", zap.Error(err))
	}
	w.forgetSettled(msgs)
	// The news goes out once the messages are in: on a cluster a pipeline
	// runs each node's commands concurrently, and a worker woken before
	// the message landed would find the tenant empty and let it rest.
	if news.Len() > 0 {
		if _, err := news.Exec(ctx); err != nil {
			w.log.Warn("announcing put-back messages failed; only this worker reads them until the tenant publishes again", zap.Error(err))
		}
	}
}

// start runs an acquired task in the slot taken for its message. The slot
// stays with the goroutine while the server hands it the run's next task
// eagerly (an answer's Next): it goes back when a report comes back with
// nothing more to run.
func (w *Worker) start(execCtx context.Context, m stream.Message, l taskapi.Lease) {
	ctx, t, done := w.hold(execCtx, m, l)
	w.running.Add(1)
	go func() {
		defer w.running.Done()
		prio := stream.KeyPriority(m.Stream)
		defer func() { w.releaseFor(m, prio) }() // an eager lease is on m's queue, of m's tenant
		cur, since := m, time.Now()
		for {
			next := w.execute(ctx, execCtx, cur, t, since)
			done()
			if next == nil {
				return
			}
			cur = stream.Message{Queue: next.Queue, Tenant: next.Tenant, Run: next.Run, Task: next.Task, Node: next.NodeID,
				Type: next.NodeType, Attempt: next.Attempt, TraceParent: next.TraceParent}
			w.eagerStarts.Add(1)
			ctx, t, done = w.hold(execCtx, cur, *next)
			if s := w.scheds[m.Queue]; s != nil {
				s.reprioritise(m.Tenant, prio, t.Config.Priority)
			}
			prio = t.Config.Priority
		}
	}()
}

// hold registers a leased task for renewals and returns its execution
// context, what to run, and the function that unregisters it.
func (w *Worker) hold(execCtx context.Context, m stream.Message, l taskapi.Lease) (context.Context, Task, func()) {
	var cfg taskapi.TaskConfig
	if len(l.Config) > 0 {
		if err := json.Unmarshal(l.Config, &cfg); err != nil {
			w.log.Error("bad task config", zap.Stringer("task_id", m.Task), zap.Error(err))
		}
	}
	t := Task{Tenant: m.Tenant, Run: m.Run, ID: m.Task, NodeID: l.NodeID, NodeType: l.NodeType, Attempt: m.Attempt,
		MaxAttempts: l.MaxAttempts, WorkflowID: l.WorkflowID, WorkflowVersion: l.WorkflowVersion, Input: l.Input, Config: cfg}
	ctx, cancel := context.WithCancelCause(execCtx)
	e := &execution{ref: taskapi.Ref{Tenant: m.Tenant, Run: m.Run, Task: m.Task, Attempt: m.Attempt}, node: l.NodeID, cancel: cancel}
	if api, ok := w.api.(SecretsAPI); ok {
		t.Secrets = func(ctx context.Context) (map[string]string, error) {
			res, err := api.Secrets(ctx, taskapi.SecretsRequest{Ref: e.ref, WorkerID: w.cfg.WorkerID})
			return res.Secrets, err
		}
	}
	w.mu.Lock()
	w.inflight[m.Task] = e
	w.mu.Unlock()
	return ctx, t, func() {
		w.mu.Lock()
		delete(w.inflight, m.Task)
		w.mu.Unlock()
		cancel(nil)
	}
}

// eagerOffer is what the worker offers with a result of m's tenant, from
// a slot taken from a read at since: the slot, for the run's next task,
// when the fair picks would give it to the same tenant anyway — nobody
// else has work on m's queue, and the worker's other queues are quiet —
// and the slot has not kept taking next tasks for longer than EagerWindow.
// Not once shutdown began, nor after the server refused an offer.
func (w *Worker) eagerOffer(m stream.Message, since time.Time) *taskapi.EagerOffer {
	now := time.Now()
	if w.cfg.NoEager || w.stopping.Load() || now.UnixNano() < w.eagerRefusedUntil.Load() {
		return nil
	}
	if now.Sub(since) >= w.cfg.EagerWindow || w.scheds[m.Queue] == nil || !w.scheds[m.Queue].mayKeep(m.Tenant, now) {
		return nil
	}
	for q, s := range w.scheds {
		if q != m.Queue && !s.quiet(now) {
			return nil
		}
	}
	return &taskapi.EagerOffer{Queue: m.Queue, NodeTypes: w.nodeTypes, TTLMillis: w.cfg.LeaseTTL.Milliseconds()}
}

// shutdownReport bounds the report of an execution the shutdown deadline
// cancelled.
const shutdownReport = 5 * time.Second

// eagerPause is how long a worker stops offering after a server refused
// an offer (an older server, perhaps one of several during an upgrade).
const eagerPause = time.Minute

// complete reports a success with an eager offer. A server that does not
// know offers (an older version) refuses the request's unknown field: the
// report is sent again without it, and this worker stops offering for
// eagerPause.
func (w *Worker) complete(ctx context.Context, log *zap.Logger, req taskapi.CompleteRequest) (taskapi.ReportResponse, error) {
	res, err := w.api.Complete(ctx, req)
	var apiErr *taskapi.APIError
	if req.Eager == nil || !errors.As(err, &apiErr) || apiErr.Code != taskapi.CodeUnknownField || apiErr.Field != "eager" {
		return res, err
	}
	w.eagerRefusedUntil.Store(time.Now().Add(eagerPause).UnixNano())
	log.Warn("the server does not take eager offers; reporting without one, and not offering for a while",
		zap.Duration("for", eagerPause), zap.Error(err))
	req.Eager = nil
	return w.api.Complete(ctx, req)
}

// execute runs one task and reports its result; it returns the run's next
// task when the report's answer leased one to this worker.
func (w *Worker) execute(ctx, execCtx context.Context, m stream.Message, t Task, since time.Time) *taskapi.Lease {
	if m.TraceParent != "" {
		ctx = otel.GetTextMapPropagator().Extract(ctx, propagation.MapCarrier{"traceparent": m.TraceParent})
	}
	// The tracer is looked up per execution: the global provider may be
	// replaced after start-up (tests do), and a cached tracer would keep
	// the first one.
	ctx, span := otel.Tracer("github.com/composer-dev/composer/workers").Start(ctx, "execute "+t.NodeType, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("composer.tenant_id", t.Tenant.String()), attribute.String("composer.run_id", t.Run.String()),
			attribute.String("composer.task_id", t.ID.String()), attribute.String("composer.node_id", t.NodeID), attribute.Int("composer.attempt", t.Attempt)))
	defer span.End()
	log := w.log.With(zap.Stringer("tenant_id", t.Tenant), zap.Stringer("run_id", t.Run), zap.Stringer("task_id", t.ID),
		zap.Int("attempt", t.Attempt), zap.String("trace_id", span.SpanContext().TraceID().String()))
	recordWait(ctx, m.Queue, m.EnqueuedAt)
	began := time.Now()

	runCtx := ctx
	if t.Config.TimeoutMS > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeout(ctx, time.Duration(t.Config.TimeoutMS)*time.Millisecond)
		defer cancel()
	}
	var out json.RawMessage
	var err error
	if ex := w.exec[t.NodeType]; ex == nil {
		err = Retryable("no_executor", "this worker has no executor for %q nodes", t.NodeType)
	} else {
		out, err = safeExecute(runCtx, ex, t)
	}
	if cause := context.Cause(ctx); errors.Is(cause, ErrLeaseLost) {
		// Someone else owns the task now (or the run was cancelled): the
		// result is not ours to report.
		recordStep(ctx, m.Queue, outcomeLeaseLost, began)
		log.Info("lease lost; result discarded")
		span.SetStatus(codes.Error, "lease lost")
		w.ack(execCtx, m)
		return nil
	}
	// Reports outlive the execution's context but belong to its trace, so
	// the next step's dispatch continues the same trace. An execution cut
	// off by the shutdown deadline (execCtx is done) still gets its report
	// out, within shutdownReport, so its task is retried at once rather
	// than when its lease expires.
	reportCtx := trace.ContextWithSpan(execCtx, span)
	if execCtx.Err() != nil {
		var cancel context.CancelFunc
		reportCtx, cancel = context.WithTimeout(context.WithoutCancel(reportCtx), shutdownReport)
		defer cancel()
	}
	if err == nil {
		recordStep(ctx, m.Queue, outcomeCompleted, began)
		offer := w.eagerOffer(m, since)
		res := w.report(reportCtx, log, m, func(ctx context.Context) (taskapi.ReportResponse, error) {
			return w.complete(ctx, log, taskapi.CompleteRequest{Ref: refOf(m), NodeID: t.NodeID, WorkerID: w.cfg.WorkerID, Output: out, Eager: offer})
		})
		if res.Next != nil && res.Next.Acquired {
			return res.Next
		}
		return nil
	}
	f := asFailure(err)
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, ErrShutdown):
		f = Retryable(taskapi.CodeWorkerShutdown, "the worker shut down before the task finished")
	case runCtx.Err() == context.DeadlineExceeded && ctx.Err() == nil:
		f = Retryable(taskapi.CodeExecutionTimeout, "the attempt exceeded its timeout of %s", time.Duration(t.Config.TimeoutMS)*time.Millisecond)
	}
	span.SetStatus(codes.Error, f.Code)
	recordStep(ctx, m.Queue, outcomeFailed, began)
	w.report(reportCtx, log, m, func(ctx context.Context) (taskapi.ReportResponse, error) {
		return w.api.Fail(ctx, taskapi.FailRequest{Ref: refOf(m), NodeID: t.NodeID, WorkerID: w.cfg.WorkerID, Retryable: f.Retryable,
			RetryAfterMillis: f.RetryAfter.Milliseconds(), Error: taskapi.Error{Code: f.Code, Message: f.Message, Details: f.Details}})
	})
	return nil
}

// safeExecute turns an executor panic into a retryable failure.
func safeExecute(ctx context.Context, ex Executor, t Task) (out json.RawMessage, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, Retryable("panic", "executor panicked: %v", r)
		}
	}()
	return ex.Execute(ctx, t)
}

func refOf(m stream.Message) taskapi.Ref {
	return taskapi.Ref{Tenant: m.Tenant, Run: m.Run, Task: m.Task, Attempt: m.Attempt}
}

// report sends a result until the server acknowledges it, then acks the
// message, and returns the server's answer. A report the server cannot
// take (a client error) is final.
func (w *Worker) report(ctx context.Context, log *zap.Logger, m stream.Message, send func(context.Context) (taskapi.ReportResponse, error)) taskapi.ReportResponse {
	backoff := 100 * time.Millisecond
	for {
		callCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
		res, err := send(callCtx)
		cancel()
		if err == nil {
			if res.Ignored {
				log.Info("report ignored by the server", zap.String("reason", res.Reason))
			}
			w.ack(ctx, m)
			return res
		}
		var apiErr *taskapi.APIError
		if errors.As(err, &apiErr) && !apiErr.Temporary() {
			log.Error("report rejected", zap.Error(err))
			w.ack(ctx, m)
			return taskapi.ReportResponse{}
		}
		if ctx.Err() != nil {
			log.Warn("report abandoned at shutdown; the lease will expire and the task be retried", zap.Error(err))
			return taskapi.ReportResponse{}
		}
		log.Warn("report failed; retrying", zap.Error(err), zap.Duration("in", backoff))
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// renewLoop renews every held lease every TTL/3 in one call, and cancels
// the executions whose lease is gone.
func (w *Worker) renewLoop(ctx context.Context) {
	t := time.NewTicker(w.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if w.pauseRenewals.Load() {
			continue
		}
		w.mu.Lock()
		var execs []*execution
		for _, e := range w.inflight {
			execs = append(execs, e)
		}
		w.mu.Unlock()
		if len(execs) == 0 {
			continue
		}
		refs := make([]taskapi.Ref, len(execs))
		for i, e := range execs {
			refs[i] = e.ref
		}
		callCtx, cancel := context.WithTimeout(ctx, w.cfg.LeaseTTL/3)
		res, err := w.api.Renew(callCtx, taskapi.RenewRequest{WorkerID: w.cfg.WorkerID, TTLMillis: w.cfg.LeaseTTL.Milliseconds(), Leases: refs})
		cancel()
		if err != nil || len(res.Leases) != len(execs) {
			// Transient: the lease lasts until its TTL, and two more tries fit.
			w.log.Warn("renewing leases failed", zap.Error(err))
			continue
		}
		for i, r := range res.Leases {
			if !r.Held {
				w.log.Info("lease lost", zap.Stringer("task_id", execs[i].ref.Task), zap.Int("attempt", execs[i].ref.Attempt))
				execs[i].cancel(ErrLeaseLost)
			}
		}
	}
}

// reclaimLoop takes over messages a dead consumer left pending. It looks
// only where something can be pending: at tenants not known to have empty
// streams (a tenant found empty is settled until it publishes again), and
// of those only at the shards that hold a message idle for ClaimIdle, so
// quiet tenants cost it nothing and it takes slots only to run what it
// claims.
func (w *Worker) reclaimLoop(ctx, execCtx context.Context) {
	interval := max(w.cfg.ClaimIdle/2, 100*time.Millisecond)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.keepHeld(ctx)
		for _, q := range w.cfg.Queues {
			w.reclaimQueue(ctx, execCtx, q)
		}
		w.reclaimPasses.Add(1)
	}
}

// reclaimChunk bounds the tenants probed in one pipelined round trip.
const reclaimChunk = 256

// reclaimQueue runs one reclaim pass over a queue.
func (w *Worker) reclaimQueue(ctx, execCtx context.Context, queue string) {
	qs := w.scheds[queue]
	cands := qs.unsettled()
	for len(cands) > 0 && ctx.Err() == nil {
		part := cands[:min(reclaimChunk, len(cands))]
		cands = cands[len(part):]
		pipe := w.rdb.Pipeline()
		lens := make([][]*redis.IntCmd, len(part))
		keys := make([][]string, len(part))
		for i, c := range part {
			keys[i] = w.names.Streams(c.route.tenant, queue, c.route.shards)
			for _, key := range keys[i] {
				lens[i] = append(lens[i], pipe.XLen(ctx, key))
			}
		}
		_, _ = pipe.Exec(ctx) // per-command errors are read below
		var busy []string
		heal := w.rdb.Pipeline()
		for i, c := range part {
			empty := true
			for k, l := range lens[i] {
				if n, err := l.Result(); err != nil || n > 0 {
					empty = false
					if err == nil {
						busy = append(busy, keys[i][k])
						// A priority with messages is in the tenant's set
						// (the enqueuer adds it; this heals a set lost
						// without its streams).
						if p := stream.KeyPriority(keys[i][k]); p != 0 {
							heal.SAdd(ctx, w.names.Priorities(c.route.tenant, queue), p)
						}
					}
				}
			}
			if empty {
				qs.settleEmpty(c)
			}
		}
		if heal.Len() > 0 {
			_, _ = heal.Exec(ctx) // best effort
		}
		if len(busy) == 0 {
			continue
		}
		pipe = w.rdb.Pipeline()
		idle := make([]*redis.XPendingExtCmd, len(busy))
		for i, key := range busy {
			idle[i] = pipe.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: key, Group: stream.Group, Idle: w.cfg.ClaimIdle, Start: "-", End: "+", Count: 1})
		}
		_, _ = pipe.Exec(ctx)
		for i, key := range busy {
			if p, err := idle[i].Result(); err == nil && len(p) > 0 {
				w.reclaim(ctx, execCtx, queue, key)
			}
		}
	}
}

// reclaim runs one reclaim pass over a stream.
func (w *Worker) reclaim(ctx, execCtx context.Context, queue, key string) {
	free := w.takeSlots(w.cfg.Concurrency)
	defer func() {
		for range free {
			w.releaseSlot()
		}
	}()
	if free == 0 {
		return
	}
	own := w.own[queue]
	own.mu.Lock()
	xs, _, err := w.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{Stream: key, Group: stream.Group, Consumer: w.cfg.WorkerID,
		MinIdle: w.cfg.ClaimIdle, Start: "0-0", Count: int64(free)}).Result()
	if err != nil {
		if err != redis.Nil && !stream.IsNoGroup(err) {
			// A claim whose answer was lost may have claimed all the same.
			own.suspect[key] = struct{}{}
			if ctx.Err() == nil {
				w.log.Warn("reclaiming failed", zap.String("stream", key), zap.Error(err))
			}
		}
		own.mu.Unlock()
		return
	}
	run, settle := w.claimed(ctx, own, key, xs)
	own.mu.Unlock()
	settle()
	if len(run) > 0 {
		// Hand the reclaimed messages the slots taken for them.
		free -= len(run)
		w.dispatch(execCtx, run)
	}
}

// poison reports a message delivered too often as a failed attempt (it
// applies only if nobody ever leased that attempt) and drops it.
func (w *Worker) poison(ctx context.Context, m stream.Message) {
	w.log.Error("message delivered too many times; reporting a failed attempt", zap.Stringer("task_id", m.Task),
		zap.Int64("deliveries", m.Deliveries), zap.Int("attempt", m.Attempt))
	_, err := w.api.Fail(ctx, taskapi.FailRequest{Ref: refOf(m), NodeID: m.Node, WorkerID: w.cfg.WorkerID, Unleased: true, Retryable: true,
		Error: taskapi.Error{Code: taskapi.CodeMaxDeliveries, Message: fmt.Sprintf("the message was delivered %d times without completing", m.Deliveries)}})
	if err != nil {
		w.log.Warn("reporting a poison message failed; it stays pending", zap.Error(err))
		return
	}
	obs.DeadLettered(ctx, obs.DeadMaxDeliveries, 1)
	w.ack(ctx, m)
}
