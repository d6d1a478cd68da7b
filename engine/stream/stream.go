// Package stream names Composer's Redis keys and defines the task message.
//
// Each tenant's work goes to its own shards of each queue:
//
//	<ns>:{<tenant>}:q:<queue>:<shard>
//
// The {tenant} hash tag keeps one tenant's shards on one Redis Cluster slot
// (so a worker can read them in one call) while different tenants spread
// across nodes. A task's shard is a stable hash of its id; shards only
// spread load and carry no ordering promise.
//
// Messages carry references, not data: a worker receives the task's input
// and settings with its lease, so a message can never be more current than
// the database.
package stream

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// Group is the consumer group every worker of a queue joins.
const Group = "composer-workers"

// DefaultNamespace prefixes every key unless configured otherwise (tests use
// their own namespace so they can share one Redis).
const DefaultNamespace = "composer"

// Names builds the Redis keys of one namespace.
type Names struct{ NS string }

// NewNames returns the names of a namespace ("" means DefaultNamespace).
func NewNames(ns string) Names {
	if ns == "" {
		ns = DefaultNamespace
	}
	return Names{NS: ns}
}

// Stream is the key of one shard of a tenant's queue.
func (n Names) Stream(tenant uuid.UUID, queue string, shard int) string {
	return n.NS + ":{" + tenant.String() + "}:q:" + queue + ":" + strconv.Itoa(shard)
}

// Priorities of tasks (dag.MinPriority..dag.MaxPriority; the engine's
// tests check they agree): each has its own streams.
const (
	MinPriority = -2
	MaxPriority = 2
	// PriorityAging is what one priority level is worth in waiting: a
	// message is read in order of its publish time less priority ×
	// PriorityAging (workers' read script).
	PriorityAging = time.Minute
)

// PriorityStream is the key of one shard of a tenant's queue for tasks of
// one priority: Stream for priority 0 (so messages published before
// priorities existed are read as priority 0), "<Stream>:p<priority>"
// otherwise. A priority out of range is clamped.
func (n Names) PriorityStream(tenant uuid.UUID, queue string, shard, priority int) string {
	priority = min(max(priority, MinPriority), MaxPriority)
	if priority == 0 {
		return n.Stream(tenant, queue, shard)
	}
	return n.Stream(tenant, queue, shard) + ":p" + strconv.Itoa(priority)
}

// Priorities is the set of the priorities other than 0 a tenant's queue
// has streams of: the enqueuer adds a priority after publishing a message
// of it, and the workers' read drops one whose streams are all empty
// (settled), so a tenant that never used priorities is read as before.
func (n Names) Priorities(tenant uuid.UUID, queue string) string {
	return n.NS + ":{" + tenant.String() + "}:prios:" + queue
}

// KeyPriority is the priority of a PriorityStream key.
func KeyPriority(key string) int {
	i := strings.LastIndexByte(key, ':')
	if i < 0 || i+1 >= len(key) || key[i+1] != 'p' {
		return 0
	}
	p, err := strconv.Atoi(key[i+2:])
	if err != nil {
		return 0
	}
	return p
}

// Streams lists the keys of every shard of a tenant's queue, of every
// priority, the highest priority first.
func (n Names) Streams(tenant uuid.UUID, queue string, shards int) []string {
	out := make([]string, 0, shards*(MaxPriority-MinPriority+1))
	for p := MaxPriority; p >= MinPriority; p-- {
		for i := range shards {
			out = append(out, n.PriorityStream(tenant, queue, i, p))
		}
	}
	return out
}

// HandlerStream is the key of the stream of a tenant's task nodes for one
// handler on one queue: <ns>:{<tenant>}:h:<queue>:<handler>. Only the
// tenant's own workers are served from it (through the poll API, which
// reads it on their behalf), and only those that registered the handler,
// so a task can never reach a worker that cannot run it. One stream per
// handler and no shards: a tenant's keys share one cluster slot anyway.
func (n Names) HandlerStream(tenant uuid.UUID, queue, handler string) string {
	return n.NS + ":{" + tenant.String() + "}:h:" + queue + ":" + handler
}

// HandlerPriorityStream is the key of a handler's stream for tasks of one
// priority: HandlerStream for priority 0, "<HandlerStream>:p<priority>"
// otherwise (handler names are letters, digits and _, so the suffix is
// unambiguous). A priority out of range is clamped.
func (n Names) HandlerPriorityStream(tenant uuid.UUID, queue, handler string, priority int) string {
	priority = min(max(priority, MinPriority), MaxPriority)
	if priority == 0 {
		return n.HandlerStream(tenant, queue, handler)
	}
	return n.HandlerStream(tenant, queue, handler) + ":p" + strconv.Itoa(priority)
}

// HandlerPriorities is the set of a tenant's handler streams of a
// priority other than 0 that may hold messages (their keys): the enqueuer
// adds one after publishing to it, and the poll drops one it finds empty,
// so a poll of a tenant that never used priorities reads as before.
func (n Names) HandlerPriorities(tenant uuid.UUID) string {
	return n.NS + ":{" + tenant.String() + "}:hprios"
}

// HandlerWake is the pub/sub channel the enqueuer pings after publishing to
// handler streams; the payload is HandlerRoute. Servers holding tenant
// workers' polls subscribe to it. (Queue names cannot contain ':', so no
// queue's Wake channel can collide with it.)
func (n Names) HandlerWake() string { return n.NS + ":handlers:wake" }

// HandlerRoute names one handler stream in a wake-up: "tenant/queue/handler".
func HandlerRoute(tenant uuid.UUID, queue, handler string) string {
	return tenant.String() + "/" + queue + "/" + handler
}

// ParseHandlerRoute decodes a HandlerRoute.
func ParseHandlerRoute(s string) (tenant uuid.UUID, queue, handler string, err error) {
	parts := strings.Split(s, "/")
	if len(parts) != 3 || parts[1] == "" || parts[2] == "" {
		return uuid.Nil, "", "", fmt.Errorf("bad handler route %q", s)
	}
	if tenant, err = uuid.Parse(parts[0]); err != nil {
		return uuid.Nil, "", "", fmt.Errorf("bad handler route %q: %w", s, err)
	}
	return tenant, parts[1], parts[2], nil
}

// Workers is the hash of a tenant's connected workers ("<key id>/<worker
// id>" -> what it serves: a worker is the id it names under the API key it
// authenticated with), WorkersLive the sorted set of them scored by when
// they count as gone, WorkersBusy the hash of their tasks in flight.
func (n Names) Workers(tenant uuid.UUID) string { return n.NS + ":{" + tenant.String() + "}:workers" }

// WorkersLive: see Workers.
func (n Names) WorkersLive(tenant uuid.UUID) string {
	return n.NS + ":{" + tenant.String() + "}:workers:live"
}

// WorkersBusy: see Workers.
func (n Names) WorkersBusy(tenant uuid.UUID) string {
	return n.NS + ":{" + tenant.String() + "}:workers:busy"
}

// PollAnswer keeps which leases one poll of a worker was answered with,
// so a poll repeated because its answer was lost gets them back. It is
// named by the API key the poll came with, so only that key finds it.
func (n Names) PollAnswer(tenant uuid.UUID, key, worker, poll string) string {
	return n.NS + ":{" + tenant.String() + "}:poll:" + key + "/" + worker + ":" + poll
}

// Active is the sorted set of tenants with recent work on a queue: member
// "<tenant>/<shards>", score the last publish time in milliseconds. Workers
// discover tenant shards from it instead of scanning keys.
func (n Names) Active(queue string) string { return n.NS + ":active:" + queue }

// StartBucket is a tenant's start rate-limit bucket (tenants.RateLimiter).
func (n Names) StartBucket(tenant uuid.UUID) string {
	return n.NS + ":{" + tenant.String() + "}:starts"
}

// RateBucket is the bucket of one key of a tenant's step rate limit
// (tenants.StepLimiter): the theoretical arrival time, and the sorted set
// of the attempts holding a reserved token. The key's value is hashed, so
// whatever it is, the Redis key stays short.
func (n Names) RateBucket(tenant uuid.UUID, limit, key string) (tat, reserved string) {
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	base := n.NS + ":{" + tenant.String() + "}:rl:" + limit + ":" + strconv.FormatUint(h.Sum64(), 36)
	return base, base + ":res"
}

// Running is a tenant's running-task permit set (tenants.Slots).
func (n Names) Running(tenant uuid.UUID) string { return n.NS + ":{" + tenant.String() + "}:running" }

// Live is the pub/sub channel of a tenant's committed run changes
// (graph.Live).
func (n Names) Live(tenant uuid.UUID) string { return n.NS + ":live:" + tenant.String() }

// DeadLetters is the stream undecodable messages are moved to.
func (n Names) DeadLetters() string { return n.NS + ":dead" }

// Wake is the pub/sub channel the enqueuer pings after publishing to a
// queue, so idle workers read at once instead of at their next poll.
func (n Names) Wake(queue string) string { return n.NS + ":wake:" + queue }

// ActiveMember encodes a tenant, its shard count and its scheduling weight
// for the Active set.
func ActiveMember(tenant uuid.UUID, shards, weight int) string {
	return tenant.String() + "/" + strconv.Itoa(shards) + "/" + strconv.Itoa(max(weight, 1))
}

// ParseActiveMember decodes an Active set member (a missing weight is 1).
func ParseActiveMember(m string) (tenant uuid.UUID, shards, weight int, err error) {
	parts := strings.Split(m, "/")
	if len(parts) < 2 || len(parts) > 3 {
		return uuid.Nil, 0, 0, fmt.Errorf("bad active member %q", m)
	}
	if tenant, err = uuid.Parse(parts[0]); err != nil {
		return uuid.Nil, 0, 0, fmt.Errorf("bad active member %q: %w", m, err)
	}
	if shards, err = strconv.Atoi(parts[1]); err != nil || shards < 1 {
		return uuid.Nil, 0, 0, fmt.Errorf("bad active member %q", m)
	}
	weight = 1
	if len(parts) == 3 {
		if weight, err = strconv.Atoi(parts[2]); err != nil || weight < 1 {
			return uuid.Nil, 0, 0, fmt.Errorf("bad active member %q", m)
		}
	}
	return tenant, shards, weight, nil
}

// Wake-ups carry the tenant's active member and the score its publish
// wrote to the Active set, "<member>@<milliseconds>", so a worker that got
// the wake-up knows that score already, and one that sees a score it does
// not know in the Active set knows it missed a wake-up.

// WakePayload encodes a wake-up.
func WakePayload(member string, at time.Time) string {
	return member + "@" + strconv.FormatInt(at.UnixMilli(), 10)
}

// ParseWake decodes a wake-up; published is 0 when the payload has no
// score (a bare member).
func ParseWake(s string) (tenant uuid.UUID, shards, weight int, published float64, err error) {
	member, at, found := strings.Cut(s, "@")
	if found {
		ms, perr := strconv.ParseInt(at, 10, 64)
		if perr != nil {
			return uuid.Nil, 0, 0, 0, fmt.Errorf("bad wake-up %q", s)
		}
		published = float64(ms)
	}
	tenant, shards, weight, err = ParseActiveMember(member)
	return tenant, shards, weight, published, err
}

// ShardFor picks the shard of a task: a stable spread of its id.
func ShardFor(task uuid.UUID, shards int) int {
	if shards <= 1 {
		return 0
	}
	h := fnv.New32a()
	h.Write(task[:])
	return int(h.Sum32() % uint32(shards))
}

// Message is one task dispatch: which attempt of which task to run.
type Message struct {
	// ID is the stream entry id, set when the message is read.
	ID     string
	Stream string

	Tenant uuid.UUID
	Run    uuid.UUID
	Task   uuid.UUID
	Node   string
	Type   string
	Queue  string
	// Handler names a task node's handler (task nodes only).
	Handler string
	Attempt int
	// TraceParent is the W3C trace context of the run, so one trace spans
	// start, dispatch, execution and report.
	TraceParent string
	// OutboxID is the outbox row this message came from (for tracing
	// duplicates back to their source).
	OutboxID int64
	// EnqueuedAt is when the enqueuer published it.
	EnqueuedAt time.Time
	// Deliveries is how often it was delivered: by the stream (set when
	// read or reclaimed), plus Carried.
	Deliveries int64
	// Carried is how often the messages it replaced were delivered: a
	// message put back (re-added because its lease call failed) starts
	// where the old one left off, so one that can never be leased is still
	// caught by a delivery limit.
	Carried int64
}

// Values encodes the message as stream entry fields.
func (m Message) Values() []any {
	return []any{
		"v", "1",
		"t", m.Tenant.String(),
		"r", m.Run.String(),
		"k", m.Task.String(),
		"n", m.Node,
		"y", m.Type,
		"q", m.Queue,
		"h", m.Handler,
		"a", strconv.Itoa(m.Attempt),
		"tp", m.TraceParent,
		"o", strconv.FormatInt(m.OutboxID, 10),
		"ts", strconv.FormatInt(m.EnqueuedAt.UnixMicro(), 10),
		"c", strconv.FormatInt(m.Carried, 10),
	}
}

// Parse decodes a stream entry. An entry that does not decode is poison:
// the caller acknowledges and dead-letters it.
func Parse(stream string, x redis.XMessage) (Message, error) {
	m := Message{ID: x.ID, Stream: stream}
	get := func(k string) string {
		s, _ := x.Values[k].(string)
		return s
	}
	if v := get("v"); v != "1" {
		return m, fmt.Errorf("message %s: unknown format version %q", x.ID, v)
	}
	var err error
	var errsSeen []error
	parseID := func(k string) uuid.UUID {
		var id uuid.UUID
		if id, err = uuid.Parse(get(k)); err != nil {
			errsSeen = append(errsSeen, fmt.Errorf("field %s: %w", k, err))
		}
		return id
	}
	m.Tenant, m.Run, m.Task = parseID("t"), parseID("r"), parseID("k")
	m.Node, m.Type, m.Queue, m.Handler, m.TraceParent = get("n"), get("y"), get("q"), get("h"), get("tp")
	if m.Attempt, err = strconv.Atoi(get("a")); err != nil || m.Attempt < 1 {
		errsSeen = append(errsSeen, fmt.Errorf("field a: bad attempt %q", get("a")))
	}
	m.OutboxID, _ = strconv.ParseInt(get("o"), 10, 64)
	if us, err := strconv.ParseInt(get("ts"), 10, 64); err == nil {
		m.EnqueuedAt = time.UnixMicro(us)
	}
	m.Carried, _ = strconv.ParseInt(get("c"), 10, 64)
	if m.Node == "" || m.Type == "" {
		errsSeen = append(errsSeen, errors.New("node and type are required"))
	}
	if len(errsSeen) > 0 {
		return m, fmt.Errorf("message %s: %w", x.ID, errors.Join(errsSeen...))
	}
	return m, nil
}

// EnsureGroup creates the consumer group of a stream (and the stream),
// starting from the beginning so that messages added before the group
// existed — e.g. after Redis lost its data and the enqueuer re-created the
// stream — are still delivered. An existing group is left alone.
func EnsureGroup(ctx context.Context, rdb redis.Cmdable, key string) error {
	err := rdb.XGroupCreateMkStream(ctx, key, Group, "0").Err()
	if err != nil && !IsBusyGroup(err) {
		return fmt.Errorf("create consumer group on %s: %w", key, err)
	}
	return nil
}

// IsBusyGroup reports a "group already exists" error.
func IsBusyGroup(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "BUSYGROUP") }

// IsNoGroup reports that a stream or its group is missing (e.g. after Redis
// restarted without persistence).
func IsNoGroup(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "NOGROUP") }
