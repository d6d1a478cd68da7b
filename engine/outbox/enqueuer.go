// Package outbox publishes committed outbox rows to Redis streams.
//
// A row is inserted in the same transaction as the change it announces, so
// it exists if and only if that change committed. The Enqueuer claims due
// rows with FOR UPDATE SKIP LOCKED — any number of enqueuers, on every
// replica, drain the table in parallel without double work — publishes them
// with one pipelined round trip of XADDs, and deletes them by primary key in
// the same transaction. A crash after XADD and before COMMIT leaves the
// rows in place: they are published again (a duplicate, which the lease
// makes harmless), never lost. A hung enqueuer's rows come back when the
// server's idle-in-transaction timeout (a setting of the system role's
// connections, see internal/app) ends its transaction.
//
// Wake-ups: a statement-level trigger NOTIFYs at commit; the enqueuer
// LISTENs on its own connection, can be woken in-process (Wake) when the
// same process committed the rows, and polls as a fallback and for rows
// whose next_attempt_at has come.
//
// The fast path: a process that commits dispatches publishes them itself
// right after the commit (PublishNow) and deletes them in batches. Such
// rows are inserted due FastPathGrace later, so the polling path publishes
// them only if their process died first. Failed publishes back off exponentially
// with full jitter; a row that fails MaxAttempts times moves to
// outbox_dead_letters.
package outbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/engine/stream"
	"github.com/composer-dev/composer/internal/config"
	"github.com/composer-dev/composer/internal/obs"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/internal/redisconn"
	"github.com/composer-dev/composer/tenants"
)

// Channel is the NOTIFY channel of new outbox rows.
const Channel = "composer_outbox"

// Config configures an Enqueuer. Zero fields take the defaults.
type Config struct {
	// BatchSize is how many rows one claim takes (default 256).
	BatchSize int
	// PollInterval is the fallback poll (default 1s).
	PollInterval time.Duration
	// MaxAttempts is how often a row may fail to publish before it is
	// dead-lettered (default 12).
	MaxAttempts int
	// BaseBackoff is the first retry delay of a failed publish (default 1s).
	BaseBackoff time.Duration
	// MaxBackoff caps the retry delay (default 5m).
	MaxBackoff time.Duration
}

func (c *Config) defaults() {
	if c.BatchSize <= 0 {
		c.BatchSize = 256
	}
	if c.PollInterval <= 0 {
		c.PollInterval = config.DefaultOutboxPollInterval
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 12
	}
	if c.BaseBackoff <= 0 {
		c.BaseBackoff = time.Second
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 5 * time.Minute
	}
}

// Enqueuer moves outbox rows to streams. Run it on every replica.
type Enqueuer struct {
	db     *pg.DB
	listen string // connection string for LISTEN (system role)
	rdb    redis.UniversalClient
	names  stream.Names
	cfg    Config
	log    *zap.Logger
	wake   chan struct{}

	shardsMu sync.Mutex
	shards   map[uuid.UUID]shardEntry
	groups   sync.Map // stream key -> struct{}: consumer group ensured

	fresh chan []row // fresh rows waiting for a publisher (PublishNow)

	delMu      sync.Mutex // fresh rows published, to delete
	delTenants []uuid.UUID
	delIDs     []int64
	deleteWake chan struct{}

	// afterPublish, in tests, runs between XADD and DELETE.
	afterPublish func()
}

type shardEntry struct {
	route   tenants.Route
	expires time.Time
}

// New returns an Enqueuer. listenURL is a connection string for the
// dedicated LISTEN connection (the system role's).
func New(db *pg.DB, listenURL string, rdb redis.UniversalClient, names stream.Names, cfg Config, log *zap.Logger) *Enqueuer {
	cfg.defaults()
	if log == nil {
		log = zap.NewNop()
	}
	return &Enqueuer{db: db, listen: listenURL, rdb: rdb, names: names, cfg: cfg, log: log,
		wake: make(chan struct{}, 1), shards: map[uuid.UUID]shardEntry{}, deleteWake: make(chan struct{}, 1),
		fresh: make(chan []row, freshQueue)}
}

// Wake asks the enqueuer to drain now. It never blocks; wake-ups coalesce.
func (e *Enqueuer) Wake() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Run drains the outbox until ctx ends.
func (e *Enqueuer) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait() // every loop it started has returned
	loops := []func(context.Context){e.listenLoop, e.deleteLoop}
	for range freshPublishers {
		loops = append(loops, e.freshLoop)
	}
	for _, loop := range loops {
		wg.Add(1)
		go func() { defer wg.Done(); loop(ctx) }()
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-e.wake:
		case <-timer.C:
		}
		next, err := e.Drain(ctx)
		if err != nil && ctx.Err() == nil {
			e.log.Warn("outbox drain failed", zap.Error(err))
		}
		wait := e.cfg.PollInterval
		if !next.IsZero() {
			if d := time.Until(next); d < wait {
				wait = max(d, time.Millisecond)
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wait)
	}
}

// listenLoop turns NOTIFYs into wake-ups, reconnecting on failure.
func (e *Enqueuer) listenLoop(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := e.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		e.log.Warn("outbox listener lost; polling meanwhile", zap.Error(err))
		e.Wake() // rows may have arrived while we were not listening
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 10*time.Second)
	}
}

func (e *Enqueuer) listenOnce(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, e.listen)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+Channel); err != nil {
		return err
	}
	e.Wake()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		e.Wake()
	}
}

// Drain publishes due rows until none are left, and returns when the next
// delayed row falls due (zero when there is none).
func (e *Enqueuer) Drain(ctx context.Context) (time.Time, error) {
	for {
		n, err := e.publishBatch(ctx)
		if err != nil {
			return time.Time{}, err
		}
		if n < e.cfg.BatchSize {
			break
		}
	}
	var next *time.Time
	if err := e.db.System().QueryRow(ctx, qNextDue).Scan(&next); err != nil {
		return time.Time{}, fmt.Errorf("next due outbox row: %w", err)
	}
	if next == nil {
		return time.Time{}, nil
	}
	return *next, nil
}

type row struct {
	tenant      uuid.UUID
	id          int64
	topic       string
	queue       string
	run, task   uuid.UUID
	node, typ   string
	handler     string
	attempt     int
	traceparent string
	attempts    int
	priority    int
}

// publishBatch claims, publishes and deletes one batch in one transaction.
func (e *Enqueuer) publishBatch(ctx context.Context) (int, error) {
	var claimed int
	err := e.db.WithSystem(ctx, func(ctx context.Context, tx *pg.Tx) error {
		claimed = 0
		rows, err := tx.Query(ctx, qClaimDue, e.cfg.BatchSize)
		if err != nil {
			return fmt.Errorf("claim outbox rows: %w", err)
		}
		var batch []row
		var r row
		_, err = pgx.ForEachRow(rows, []any{&r.tenant, &r.id, &r.topic, &r.queue, &r.run, &r.task, &r.node, &r.typ, &r.handler, &r.attempt, &r.traceparent, &r.attempts, &r.priority},
			func() error { batch = append(batch, r); return nil })
		if err != nil {
			return fmt.Errorf("claim outbox rows: %w", err)
		}
		claimed = len(batch)
		if claimed == 0 {
			return nil
		}
		failed := e.publish(ctx, batch)
		if e.afterPublish != nil {
			e.afterPublish()
		}
		return e.settle(ctx, tx, batch, failed)
	})
	return claimed, err
}

// publish sends the batch in one pipeline and returns the error of each row
// that failed.
func (e *Enqueuer) publish(ctx context.Context, batch []row) map[int]error {
	routes, err := e.routes(ctx, batch)
	failed := map[int]error{}
	if err != nil {
		for i := range batch {
			failed[i] = err
		}
		return failed
	}
	now := time.Now()
	pipe := e.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(batch))
	type tq struct {
		tenant uuid.UUID
		queue  string
	}
	for i, r := range batch {
		if r.topic != "task" {
			failed[i] = fmt.Errorf("unknown outbox topic %q", r.topic)
			continue
		}
		// Task nodes go to their handler's stream, which only the tenant's
		// own workers are served from; everything else to the queue's shards.
		var key string
		if r.handler != "" {
			key = e.names.HandlerPriorityStream(r.tenant, r.queue, r.handler, r.priority)
		} else {
			key = e.names.PriorityStream(r.tenant, r.queue, stream.ShardFor(r.task, routes[r.tenant].Shards), r.priority)
		}
		if _, ok := e.groups.Load(key); !ok {
			if err := stream.EnsureGroup(ctx, e.rdb, key); err != nil {
				failed[i] = err
				continue
			}
			e.groups.Store(key, struct{}{})
		}
		msg := stream.Message{Tenant: r.tenant, Run: r.run, Task: r.task, Node: r.node, Type: r.typ, Queue: r.queue, Handler: r.handler,
			Attempt: r.attempt, TraceParent: r.traceparent, OutboxID: r.id, EnqueuedAt: now}
		// Streams are not trimmed: every message is counted in its tenant's
		// queued hash (stream.Add), which a trim would leave behind.
		cmds[i] = stream.Add(ctx, pipe, key, msg)
		switch {
		case r.priority == 0:
		case r.handler == "":
			// After the message (one slot: in order), so a reader that
			// drops a level it found empty cannot miss this message.
			pipe.SAdd(ctx, e.names.Priorities(r.tenant, r.queue), r.priority)
		default:
			pipe.SAdd(ctx, e.names.HandlerPriorities(r.tenant), key)
		}
	}
	// The active set and the wake-ups tell workers that a tenant has work,
	// and a worker that reads a tenant and finds nothing lets it rest until
	// the next such news: they must never overtake the messages. One
	// pipeline to one server runs in order; a cluster's pipeline sends each
	// node its commands concurrently, so there they follow in a second
	// round trip, once the messages are in (and only for those that are).
	wakes := pipe
	if !redisconn.PipelineKeepsOrder(e.rdb) {
		_, _ = pipe.Exec(ctx) // per-command errors are read below
		wakes = e.rdb.Pipeline()
	}
	active := map[tq]bool{}
	handlerWakes := map[string]bool{}
	for i, r := range batch {
		if cmds[i] == nil || (wakes != pipe && cmds[i].Err() != nil) {
			continue
		}
		if r.handler != "" {
			handlerWakes[stream.HandlerRoute(r.tenant, r.queue, r.handler)] = true
		} else {
			active[tq{r.tenant, r.queue}] = true
		}
	}
	for route := range handlerWakes {
		wakes.Publish(ctx, e.names.HandlerWake(), route)
	}
	for k := range active {
		member := stream.ActiveMember(k.tenant, routes[k.tenant].Shards, routes[k.tenant].Weight)
		// Every publish writes its time to the active set and names it in the
		// wake-up: workers read a tenant that published at once, and a worker
		// that missed the wake-up finds the new score in the set within a
		// second (workers do not poll tenants that went quiet).
		wakes.ZAdd(ctx, e.names.Active(k.queue), redis.Z{Score: float64(now.UnixMilli()), Member: member})
		wakes.Publish(ctx, e.names.Wake(k.queue), stream.WakePayload(member, now))
	}
	if wakes.Len() > 0 {
		_, _ = wakes.Exec(ctx) // per-command errors are read below (a lost wake-up is caught by the active set)
	}
	for i, c := range cmds {
		if c == nil {
			continue
		}
		if err := c.Err(); err != nil {
			failed[i] = err
		}
	}
	return failed
}

// settle deletes published rows and reschedules or dead-letters failed ones,
// in the claim's transaction.
func (e *Enqueuer) settle(ctx context.Context, tx *pg.Tx, batch []row, failed map[int]error) error {
	var okTenants []uuid.UUID
	var okIDs []int64
	dead := 0
	b := &pgx.Batch{}
	for i, r := range batch {
		err, bad := failed[i]
		if !bad {
			okTenants, okIDs = append(okTenants, r.tenant), append(okIDs, r.id)
			continue
		}
		if r.attempts+1 >= e.cfg.MaxAttempts {
			b.Queue(qDeadLetter,
				r.tenant, r.id, err.Error())
			dead++
			e.log.Error("outbox row dead-lettered", zap.Stringer("tenant_id", r.tenant), zap.Int64("outbox_id", r.id),
				zap.Stringer("task_id", r.task), zap.Int("attempts", r.attempts+1), zap.Error(err))
			continue
		}
		delay := Backoff(e.cfg.BaseBackoff, e.cfg.MaxBackoff, r.attempts+1)
		b.Queue(qRetryLater, r.tenant, r.id, err.Error(), delay.Seconds())
		e.log.Warn("outbox publish failed; will retry", zap.Int64("outbox_id", r.id), zap.Duration("in", delay), zap.Error(err))
	}
	if len(okIDs) > 0 {
		b.Queue(qDeletePublished, okTenants, okIDs)
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("settle outbox batch: %w", err)
	}
	tx.AfterCommit(func() { obs.DeadLettered(ctx, obs.DeadOutboxRow, dead) })
	return nil
}

// Backoff is the delay before the n-th retry (1-based): full jitter over an
// exponential window from base, capped at ceiling, so enqueuers retrying
// after a Redis outage do not all come back at once. It never returns less
// than base/2.
func Backoff(base, ceiling time.Duration, n int) time.Duration {
	window := base
	for i := 1; i < n && window < ceiling; i++ {
		window *= 2
	}
	window = min(window, ceiling)
	return base/2 + time.Duration(rand.Int64N(int64(window-base/2)+1))
}

// routes returns each batch tenant's shard count and weight, from a
// short-lived cache (they change rarely; a worker reads every shard it has
// seen).
func (e *Enqueuer) routes(ctx context.Context, batch []row) (map[uuid.UUID]tenants.Route, error) {
	out := map[uuid.UUID]tenants.Route{}
	var missing []uuid.UUID
	now := time.Now()
	e.shardsMu.Lock()
	for _, r := range batch {
		if _, seen := out[r.tenant]; seen {
			continue
		}
		if s, ok := e.shards[r.tenant]; ok && now.Before(s.expires) {
			out[r.tenant] = s.route
		} else {
			out[r.tenant] = tenants.Route{}
			missing = append(missing, r.tenant)
		}
	}
	e.shardsMu.Unlock()
	if len(missing) == 0 {
		return out, nil
	}
	found, err := tenants.Routes(ctx, e.db, missing)
	if err != nil {
		return nil, err
	}
	e.shardsMu.Lock()
	defer e.shardsMu.Unlock()
	for _, t := range missing {
		r, ok := found[t]
		if !ok {
			return nil, errors.New("outbox row of unknown tenant " + t.String())
		}
		out[t] = r
		e.shards[t] = shardEntry{route: r, expires: now.Add(time.Minute)}
	}
	return out, nil
}

// Fresh is an outbox row its committing process publishes itself, right
// after the commit (the fast path). The row was inserted due only after a
// grace period, so if the process dies before publishing it, any enqueuer
// publishes it then: the fast path can add a duplicate, never lose a row.
type Fresh struct {
	Tenant      uuid.UUID
	ID          int64
	Queue       string
	Run, Task   uuid.UUID
	Node, Type  string
	Handler     string
	Attempt     int
	TraceParent string
	// Priority picks the tenant's priority stream (stream.PriorityStream).
	Priority int
}

// FastPathGrace is how long a fresh row waits for its own process before
// any enqueuer may publish it.
const FastPathGrace = 2 * time.Second

// freshQueue bounds the commits whose fresh rows wait for a publisher;
// freshPublishers publish them, each coalescing what is waiting into one
// pipelined round trip of at most freshBatch rows.
const (
	freshQueue      = 4096
	freshPublishers = 2
	freshBatch      = 512
)

// PublishNow hands fresh rows to the enqueuer's publishers and returns at
// once: it runs after a commit on a request's path, which must never wait
// for Redis. When Redis is slow the queue fills and further rows are left
// to the polling path, which publishes them after FastPathGrace.
func (e *Enqueuer) PublishNow(_ context.Context, rows []Fresh) {
	if len(rows) == 0 {
		return
	}
	batch := make([]row, len(rows))
	for i, f := range rows {
		batch[i] = row{tenant: f.Tenant, id: f.ID, topic: "task", queue: f.Queue, run: f.Run, task: f.Task, node: f.Node,
			typ: f.Type, handler: f.Handler, attempt: f.Attempt, traceparent: f.TraceParent, priority: f.Priority}
	}
	select {
	case e.fresh <- batch:
	default:
		freshDropped.Add(context.Background(), int64(len(batch)))
	}
}

// freshLoop publishes queued fresh rows and queues them for deletion.
// Rows that fail to publish stay for the polling path.
func (e *Enqueuer) freshLoop(ctx context.Context) {
	for {
		var batch []row
		select {
		case <-ctx.Done():
			return
		case batch = <-e.fresh:
		}
	more:
		for len(batch) < freshBatch {
			select {
			case b := <-e.fresh:
				batch = append(batch, b...)
			default:
				break more
			}
		}
		e.publishFresh(ctx, batch)
	}
}

func (e *Enqueuer) publishFresh(ctx context.Context, batch []row) {
	failed := e.publish(ctx, batch)
	e.delMu.Lock()
	for i, r := range batch {
		if _, bad := failed[i]; !bad {
			e.delTenants, e.delIDs = append(e.delTenants, r.tenant), append(e.delIDs, r.id)
		}
	}
	n := len(e.delIDs)
	e.delMu.Unlock()
	if n > 0 {
		select {
		case e.deleteWake <- struct{}{}:
		default:
		}
	}
}

// deleteEvery batches the deletion of published fresh rows: one commit per
// interval instead of one per step. A row left a little longer only costs
// space; it is not due for anyone until FastPathGrace.
const deleteEvery = 20 * time.Millisecond

// deleteLoop deletes published fresh rows in batches, by primary key.
func (e *Enqueuer) deleteLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			e.flushDeletes(context.WithoutCancel(ctx))
			return
		case <-e.deleteWake:
		}
		select {
		case <-ctx.Done():
		case <-time.After(deleteEvery):
		}
		e.flushDeletes(ctx)
	}
}

func (e *Enqueuer) flushDeletes(ctx context.Context) {
	for {
		e.delMu.Lock()
		tenants, ids := e.delTenants, e.delIDs
		e.delTenants, e.delIDs = nil, nil
		e.delMu.Unlock()
		if len(ids) == 0 {
			return
		}
		_, err := e.db.System().Exec(ctx, qDeletePublished, tenants, ids)
		if err != nil {
			// Left in place, they are published again after the grace
			// period: duplicates, which leases absorb.
			e.log.Warn("deleting published outbox rows failed", zap.Int("rows", len(ids)), zap.Error(err))
		}
	}
}
