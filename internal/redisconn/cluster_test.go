package redisconn_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/engine/stream"
	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/tenants"
)

// tenantsOnEveryMaster returns tenants whose keys live on different
// masters, at least one per master.
func tenantsOnEveryMaster(t *testing.T, rdb *redis.ClusterClient, names stream.Names) []uuid.UUID {
	t.Helper()
	ctx := context.Background()
	var count atomic.Int32 // (ForEachMaster calls concurrently)
	require.NoError(t, rdb.ForEachMaster(ctx, func(context.Context, *redis.Client) error { count.Add(1); return nil }))
	masters := int(count.Load())
	require.GreaterOrEqual(t, masters, 3, "the test cluster has three masters")
	seen := map[string]bool{}
	var out []uuid.UUID
	for i := 0; len(seen) < masters; i++ {
		require.Less(t, i, 1000)
		tenant := uuid.New()
		m, err := rdb.MasterForKey(ctx, names.Queued(tenant))
		require.NoError(t, err)
		if addr := m.Options().Addr; !seen[addr] {
			seen[addr] = true
			out = append(out, tenant)
		}
	}
	return out
}

// TestScriptsAndMultiKeyCommandsOnACluster runs every script and
// pipeline of engine/stream and tenants against the shared Redis Cluster
// for tenants on every master, in pipelines that span nodes: a key outside
// its script's slot, or a multi-key command over several slots, fails at
// once with CROSSSLOT (the other packages' tests run on the cluster with
// make test-cluster).
func TestScriptsAndMultiKeyCommandsOnACluster(t *testing.T) {
	t.Parallel()
	env := testenv.NewCluster(t)
	cluster, ok := env.Redis.(*redis.ClusterClient)
	require.True(t, ok, "NewCluster opens a cluster client (%T)", env.Redis)
	ctx := context.Background()
	names := stream.NewNames(env.Namespace)
	ts := tenantsOnEveryMaster(t, cluster, names)

	// Streams and their queued hash: Add, read, PutBack, Settle, StillQueued.
	pipe := env.Redis.Pipeline()
	var msgs []stream.Message
	for _, tenant := range ts {
		for shard := 0; shard < 2; shard++ {
			key := names.Stream(tenant, "default", shard)
			require.NoError(t, stream.EnsureGroup(ctx, env.Redis, key))
			m := stream.Message{Tenant: tenant, Run: uuid.New(), Task: uuid.New(), Node: "a", Type: "noop", Queue: "default", Attempt: 1, EnqueuedAt: time.Now()}
			stream.Add(ctx, pipe, key, m)
			m.Stream = key
			msgs = append(msgs, m)
		}
		key := names.HandlerStream(tenant, "default", "charge")
		require.NoError(t, stream.EnsureGroup(ctx, env.Redis, key))
		stream.Add(ctx, pipe, key, stream.Message{Tenant: tenant, Run: uuid.New(), Task: uuid.New(), Node: "t", Type: "task", Queue: "default", Handler: "charge", Attempt: 1})
	}
	_, err := pipe.Exec(ctx)
	require.NoError(t, err, "one pipeline adds to every master")
	for i, m := range msgs {
		res, err := env.Redis.XReadGroup(ctx, &redis.XReadGroupArgs{Group: stream.Group, Consumer: "c", Streams: []string{m.Stream, ">"}, Count: 1, Block: -1}).Result()
		require.NoError(t, err)
		msgs[i], err = stream.Parse(m.Stream, res[0].Messages[0])
		require.NoError(t, err)
	}
	pipe = env.Redis.Pipeline()
	for _, m := range msgs {
		stream.PutBack(ctx, pipe, m)
	}
	_, err = pipe.Exec(ctx)
	require.NoError(t, err)
	for _, tenant := range ts {
		q, err := names.StillQueued(ctx, env.Redis, tenant, []uuid.UUID{msgs[0].Task, uuid.New()})
		require.NoError(t, err)
		assert.Equal(t, tenant == msgs[0].Tenant, q[0], "only the first tenant holds the first task")
		assert.False(t, q[1])
	}
	var again []stream.Message
	for _, m := range msgs {
		res, err := env.Redis.XReadGroup(ctx, &redis.XReadGroupArgs{Group: stream.Group, Consumer: "c", Streams: []string{m.Stream, ">"}, Count: 1, Block: -1}).Result()
		require.NoError(t, err, "the put-back message is read again")
		x, err := stream.Parse(m.Stream, res[0].Messages[0])
		require.NoError(t, err)
		again = append(again, x)
	}
	pipe = env.Redis.Pipeline()
	stream.Settle(ctx, pipe, again...)
	_, err = pipe.Exec(ctx)
	require.NoError(t, err, "settling across nodes in one pipeline")
	for _, m := range again {
		q, err := names.StillQueued(ctx, env.Redis, m.Tenant, []uuid.UUID{m.Task})
		require.NoError(t, err)
		assert.False(t, q[0], "settled messages are uncounted")
	}

	// Running-task permits and the start rate limit.
	slots := tenants.NewSlots(env.Redis, env.Namespace, func(err error) { t.Errorf("release: %v", err) })
	limiter := tenants.NewRateLimiter(env.Redis, env.Namespace)
	for _, tenant := range ts {
		got, held, err := slots.Acquire(ctx, tenant, 2, time.Minute, []string{"a", "b", "c"})
		require.NoError(t, err)
		assert.Equal(t, []tenants.Permit{tenants.PermitTaken, tenants.PermitTaken, tenants.PermitRefused}, got)
		assert.Equal(t, 2, held)
		require.NoError(t, slots.Renew(ctx, tenant, time.Minute, []string{"a", "b"}))
		require.NoError(t, slots.Transfer(ctx, tenant, time.Minute, "b", "c"))
		require.NoError(t, slots.Release(ctx, tenant, []string{"a"}))
		slots.ReleaseLater(tenant, "c")
		wait, err := limiter.Allow(ctx, tenant, 1, 1)
		require.NoError(t, err)
		assert.Zero(t, wait)
		wait, err = limiter.Allow(ctx, tenant, 1, 1)
		require.NoError(t, err)
		assert.Positive(t, wait, "the bucket is shared")
	}
	slots.Wait()
	for _, tenant := range ts {
		held, err := slots.Held(ctx, tenant)
		require.NoError(t, err)
		assert.Zero(t, held)
	}

	keys, err := testenv.Keys(ctx, env.Redis, env.Namespace+":*")
	require.NoError(t, err)
	assert.NotEmpty(t, keys)
	testenv.DeleteNamespace(ctx, env.Redis, env.Namespace)
	keys, err = testenv.Keys(ctx, env.Redis, env.Namespace+":*")
	require.NoError(t, err)
	assert.Empty(t, keys, "DeleteNamespace empties every master")
}

// TestPubSubReachesEverySubscriberOnACluster: classic PUBLISH is broadcast
// to every node of a cluster, so one subscription (one connection, to one
// node) hears the channels of tenants whose keys live anywhere, and a
// publish through any node reaches it. This is why Composer keeps classic
// pub/sub rather than sharded (SSUBSCRIBE needs a connection per slot's
// node and moves with the slot).
func TestPubSubReachesEverySubscriberOnACluster(t *testing.T) {
	t.Parallel()
	env := testenv.NewCluster(t)
	cluster := env.Redis.(*redis.ClusterClient)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	names := stream.NewNames(env.Namespace)
	ts := tenantsOnEveryMaster(t, cluster, names)
	channels := []string{names.HandlerWake(), names.Wake("default")}
	for _, tenant := range ts {
		channels = append(channels, names.Live(tenant))
	}
	ps := env.Redis.Subscribe(ctx, channels...)
	defer ps.Close()
	for range channels {
		_, err := ps.ReceiveTimeout(ctx, 10*time.Second) // the subscription confirmations
		require.NoError(t, err)
	}
	want := map[string]bool{}
	for _, ch := range channels {
		want[ch] = true
		// Through each master in turn.
		require.NoError(t, cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return c.Publish(ctx, ch, c.Options().Addr).Err()
		}))
	}
	got := map[string]int{}
	for i := 0; i < 3*len(channels); i++ {
		msg, err := ps.ReceiveMessage(ctx)
		require.NoError(t, err)
		got[msg.Channel]++
	}
	for ch := range want {
		assert.Equal(t, 3, got[ch], "%s heard from every master", ch)
	}
}
