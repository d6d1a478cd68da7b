package stream

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// Every task message lives in a stream together with a count in its
// tenant's queued hash (<ns>:{<tenant>}:queued, task id -> messages of
// that task in the tenant's streams), changed in the same script as the
// stream itself: Add, Settle and PutBack are the only ways a message is
// added or removed. So the hash is what is really in the streams — a
// Redis that lost its data lost both — and the lost-dispatch sweep asks
// it whether a waiting task's message still exists, instead of guessing
// from the task's age. (Streams are never trimmed for the same reason: a
// tenant's queued-task limit bounds them.)

// Queued is the key of a tenant's queued hash.
func (n Names) Queued(tenant uuid.UUID) string { return n.NS + ":{" + tenant.String() + "}:queued" }

// QueuedOf is the queued hash of the tenant a stream key belongs to
// (derived from the key's hash tag, so even an undecodable message is
// accounted for).
func QueuedOf(streamKey string) string {
	if i := strings.Index(streamKey, "}:"); i >= 0 {
		return streamKey[:i+1] + ":queued"
	}
	return streamKey + ":queued"
}

// addScript: KEYS stream, queued. ARGV task, then the entry's fields and
// values. Returns the entry id.
var addScript = redis.NewScript(`
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2))
redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
return id
`)

// settleScript: KEYS stream, queued. ARGV group, then pairs of entry id
// and task (empty when unknown). Acknowledges and deletes each entry; only an
// entry really deleted is uncounted, so settling twice is harmless.
var settleScript = redis.NewScript(`
for i = 2, #ARGV, 2 do
  redis.pcall('XACK', KEYS[1], ARGV[1], ARGV[i])
  if redis.call('XDEL', KEYS[1], ARGV[i]) == 1 and ARGV[i + 1] ~= '' then
    if redis.call('HINCRBY', KEYS[2], ARGV[i + 1], -1) <= 0 then
      redis.call('HDEL', KEYS[2], ARGV[i + 1])
    end
  end
end
return 0
`)

// putBackScript: KEYS stream, queued. ARGV group, old entry id, task, then
// the new entry's fields and values. Adds the new entry, then acknowledges
// and deletes the old one: the count is unchanged, unless the old entry
// was already gone.
var putBackScript = redis.NewScript(`
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 4))
redis.pcall('XACK', KEYS[1], ARGV[1], ARGV[2])
if redis.call('XDEL', KEYS[1], ARGV[2]) == 0 then
  redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
end
return id
`)

// Add appends m to the stream key and counts it. On a pipeline the
// command runs at Exec; its value is the new entry's id.
func Add(ctx context.Context, c redis.Scripter, key string, m Message) *redis.Cmd {
	args := append([]any{m.Task.String()}, m.Values()...)
	return addScript.Eval(ctx, c, []string{key, QueuedOf(key)}, args...)
}

// Settle acknowledges and deletes handled messages and uncounts them, one
// script per stream (messages without an entry id, eager leases, are
// skipped). On a pipeline the commands run at Exec.
func Settle(ctx context.Context, c redis.Scripter, msgs ...Message) []*redis.Cmd {
	var order []string
	byStream := map[string][]any{}
	for _, m := range msgs {
		if m.ID == "" || m.Stream == "" {
			continue
		}
		if _, ok := byStream[m.Stream]; !ok {
			order = append(order, m.Stream)
			byStream[m.Stream] = []any{Group}
		}
		task := ""
		if m.Task != uuid.Nil {
			task = m.Task.String()
		}
		byStream[m.Stream] = append(byStream[m.Stream], m.ID, task)
	}
	cmds := make([]*redis.Cmd, 0, len(order))
	for _, key := range order {
		cmds = append(cmds, settleScript.Eval(ctx, c, []string{key, QueuedOf(key)}, byStream[key]...))
	}
	return cmds
}

// PutBack re-adds m to its stream for the next reader and settles the
// entry it was read from, in one script.
func PutBack(ctx context.Context, c redis.Scripter, m Message) *redis.Cmd {
	args := append([]any{Group, m.ID, m.Task.String()}, m.Values()...)
	return putBackScript.Eval(ctx, c, []string{m.Stream, QueuedOf(m.Stream)}, args...)
}

// StillQueued reports, for each task of a tenant, whether a message of it
// is in the tenant's streams.
func (n Names) StillQueued(ctx context.Context, c redis.Cmdable, tenant uuid.UUID, tasks []uuid.UUID) ([]bool, error) {
	if len(tasks) == 0 {
		return nil, nil
	}
	fields := make([]string, len(tasks))
	for i, t := range tasks {
		fields[i] = t.String()
	}
	vals, err := c.HMGet(ctx, n.Queued(tenant), fields...).Result()
	if err != nil {
		return nil, fmt.Errorf("read queued tasks: %w", err)
	}
	out := make([]bool, len(tasks))
	for i, v := range vals {
		out[i] = v != nil
	}
	return out, nil
}
