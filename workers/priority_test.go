package workers

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/engine/stream"
	"github.com/composer-dev/composer/internal/testenv"
)

// addAt publishes a task message to a tenant's stream of one priority
// with an entry id of the given time, as if it had been published then.
func addAt(t *testing.T, env *testenv.Env, n stream.Names, tenant uuid.UUID, shard, prio int, at time.Time, seq int) uuid.UUID {
	t.Helper()
	task := uuid.New()
	m := stream.Message{Tenant: tenant, Run: uuid.New(), Task: task, Node: fmt.Sprintf("p%d", prio), Type: "noop", Queue: "default", Attempt: 1}
	id := fmt.Sprintf("%d-%d", at.UnixMilli(), seq)
	require.NoError(t, env.Redis.XAdd(context.Background(), &redis.XAddArgs{Stream: n.PriorityStream(tenant, "default", shard, prio), ID: id, Values: m.Values()}).Err())
	if prio != 0 {
		require.NoError(t, env.Redis.SAdd(context.Background(), n.Priorities(tenant, "default"), prio).Err())
	}
	return task
}

func TestReadsHigherPriorityFirstAndAgesLowerOnes(t *testing.T) {
	t.Parallel()
	env := testenv.NewRedis(t)
	w := New(Config{Namespace: env.Namespace, WorkerID: "w1", Queues: []string{"default"}, Concurrency: 8}, env.Redis, nil, nil, nil)
	n := stream.NewNames(env.Namespace)
	tenant := uuid.New()
	now := time.Now()
	g := func(want int) []string {
		msgs := w.readGrants(context.Background(), "default", []grant{{id: tenant, route: tenantShards{tenant: tenant, shards: 2, weight: 1}, n: want}})[0].msgs
		var nodes []string
		for _, m := range msgs {
			nodes = append(nodes, m.Node)
		}
		return nodes
	}

	// Published in the last seconds: strictly by priority, whatever the
	// order of publishing or the shard.
	addAt(t, env, n, tenant, 0, 0, now.Add(-3*time.Second), 0)
	addAt(t, env, n, tenant, 1, -2, now.Add(-4*time.Second), 0)
	addAt(t, env, n, tenant, 1, 2, now.Add(-time.Second), 0)
	addAt(t, env, n, tenant, 0, 1, now.Add(-2*time.Second), 0)
	addAt(t, env, n, tenant, 0, 2, now, 1)
	assert.Equal(t, []string{"p2", "p2"}, g(2), "the highest first, never more than asked")
	assert.Equal(t, []string{"p1", "p0", "p-2"}, g(8))
	assert.Empty(t, g(8))

	// Aging: a priority -2 step queued 4.5 minutes ago (more than 4 levels
	// of a minute) goes before a priority 2 step queued now; a priority -1
	// step queued 2.5 minutes ago (less than its 3 levels) waits for it.
	addAt(t, env, n, tenant, 0, -2, now.Add(-270*time.Second), 0)
	addAt(t, env, n, tenant, 0, -1, now.Add(-150*time.Second), 0)
	addAt(t, env, n, tenant, 0, 2, now, 2)
	assert.Equal(t, []string{"p-2", "p2", "p-1"}, g(8))

	// Settled levels leave the set; a level published again without its
	// entry in the set (the set lost) waits for a reclaim pass or its next
	// publish, which add it back.
	members := func() []string {
		return env.Redis.SMembers(context.Background(), n.Priorities(tenant, "default")).Val()
	}
	assert.ElementsMatch(t, []string{"-2", "-1", "1", "2"}, members(), "delivered but not settled: still in use")
	for _, p := range []int{-2, -1, 1, 2} {
		for shard := range 2 {
			key := n.PriorityStream(tenant, "default", shard, p)
			ids := env.Redis.XRange(context.Background(), key, "-", "+").Val()
			for _, x := range ids {
				require.NoError(t, env.Redis.XDel(context.Background(), key, x.ID).Err())
			}
		}
	}
	assert.Empty(t, g(8))
	assert.Empty(t, members(), "every level settled")

	// More of one priority than asked: a read never takes more.
	for i := range 3 {
		addAt(t, env, n, tenant, i%2, 0, now, 10+i)
	}
	assert.Len(t, g(8), 3)
}

// TestReadHonoursTheBoundOnLowerPriorities: a read bounded to <top>
// <budget> takes every message at or above top and at most budget below
// it, and says it was capped only when it left such a message for want of
// budget.
func TestReadHonoursTheBoundOnLowerPriorities(t *testing.T) {
	t.Parallel()
	env := testenv.NewRedis(t)
	w := New(Config{Namespace: env.Namespace, WorkerID: "w1", Queues: []string{"default"}, Concurrency: 8}, env.Redis, nil, nil, nil)
	n := stream.NewNames(env.Namespace)
	read := func(tenant uuid.UUID, want int, capArg string) ([]string, bool) {
		r := w.readGrants(context.Background(), "default", []grant{{id: tenant, route: tenantShards{tenant: tenant, shards: 1, weight: 1}, n: want, capArg: capArg}})[0]
		var nodes []string
		for _, m := range r.msgs {
			nodes = append(nodes, m.Node)
		}
		return nodes, r.capped
	}
	now := time.Now()

	a := uuid.New()
	for i := range 5 {
		addAt(t, env, n, a, 0, -2, now.Add(-time.Minute), i)
	}
	addAt(t, env, n, a, 0, 2, now, 0)
	got, capped := read(a, 4, "2 1")
	assert.Equal(t, []string{"p2", "p-2"}, got, "the top, and one below it")
	assert.True(t, capped)
	got, capped = read(a, 4, "2 0")
	assert.Empty(t, got)
	assert.True(t, capped, "messages below the top were left")
	got, capped = read(a, 8, "")
	assert.Len(t, got, 4, "unbounded: the rest")
	assert.False(t, capped)
	got, capped = read(a, 8, "2 0")
	assert.Empty(t, got)
	assert.False(t, capped, "nothing left to read")

	// Only priority 0 in use, the top (read lately) above it.
	b := uuid.New()
	for i := range 3 {
		addAt(t, env, n, b, 0, 0, now, i)
	}
	got, capped = read(b, 8, "1 2")
	assert.Len(t, got, 2)
	assert.True(t, capped)
	got, capped = read(b, 8, "0 0")
	assert.Len(t, got, 1, "the top is 0 itself: not bounded")
	assert.False(t, capped)
}
