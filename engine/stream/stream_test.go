package stream

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/internal/testenv"
)

func TestStreamKeysCarryTheTenantHashTag(t *testing.T) {
	tenant := uuid.MustParse("0190e6a8-0000-7000-8000-000000000001")
	n := NewNames("")
	assert.Equal(t, "composer:{0190e6a8-0000-7000-8000-000000000001}:q:default:3", n.Stream(tenant, "default", 3))
	// Every shard of every priority, the highest first; priority 0 keeps
	// the key it had before priorities.
	all := n.Streams(tenant, "http", 4)
	assert.Len(t, all, 4*(MaxPriority-MinPriority+1))
	assert.Equal(t, n.PriorityStream(tenant, "http", 0, MaxPriority), all[0])
	assert.Equal(t, n.PriorityStream(tenant, "http", 3, MinPriority), all[len(all)-1])
	assert.Equal(t, n.Stream(tenant, "http", 2), n.PriorityStream(tenant, "http", 2, 0))
	for _, p := range []int{-2, -1, 0, 1, 2} {
		for _, q := range []string{"http", "p1", "payments"} {
			assert.Equal(t, p, KeyPriority(n.PriorityStream(tenant, q, 1, p)), q)
		}
	}
	assert.Equal(t, MaxPriority, KeyPriority(n.PriorityStream(tenant, "http", 1, 9)), "clamped")
	tat, res := n.RateBucket(tenant, "partner-api", "acct_1")
	assert.NotEqual(t, tat, res)
	// Every key of one tenant carries its hash tag: one cluster slot, so
	// scripts may touch them together.
	for _, k := range []string{n.HandlerStream(tenant, "default", "charge"), n.Queued(tenant), n.Running(tenant), n.StartBucket(tenant),
		n.Workers(tenant), n.WorkersLive(tenant), n.WorkersBusy(tenant), n.PollAnswer(tenant, "k", "w", "p"), QueuedOf(n.Stream(tenant, "default", 1)), tat, res} {
		assert.Contains(t, k, "composer:{"+tenant.String()+"}:", k)
	}
	id, shards, weight, err := ParseActiveMember(ActiveMember(tenant, 8, 4))
	require.NoError(t, err)
	assert.Equal(t, tenant, id)
	assert.Equal(t, 8, shards)
	assert.Equal(t, 4, weight)
	_, _, weight, err = ParseActiveMember(tenant.String() + "/2")
	require.NoError(t, err)
	assert.Equal(t, 1, weight, "a member without a weight weighs 1")
	for _, bad := range []string{"", "x/1", tenant.String() + "/0", tenant.String(), tenant.String() + "/1/0", tenant.String() + "/1/2/3"} {
		_, _, _, err := ParseActiveMember(bad)
		assert.Error(t, err, bad)
	}
}

// TestWakePayloadCarriesThePublishScore: a wake-up names the tenant and
// the score its publish wrote to the active set; a bare member (an older
// enqueuer) still decodes, with no score.
func TestWakePayloadCarriesThePublishScore(t *testing.T) {
	tenant := uuid.New()
	at := time.UnixMilli(1_790_000_000_123)
	id, shards, weight, published, err := ParseWake(WakePayload(ActiveMember(tenant, 4, 2), at))
	require.NoError(t, err)
	assert.Equal(t, tenant, id)
	assert.Equal(t, 4, shards)
	assert.Equal(t, 2, weight)
	assert.Equal(t, float64(at.UnixMilli()), published)
	_, _, _, published, err = ParseWake(ActiveMember(tenant, 1, 1))
	require.NoError(t, err)
	assert.Zero(t, published)
	for _, bad := range []string{tenant.String() + "/1/1@x", "@1", "x/1@5"} {
		_, _, _, _, err := ParseWake(bad)
		assert.Error(t, err, bad)
	}
}

func TestShardForIsStableAndSpreads(t *testing.T) {
	counts := make([]int, 8)
	for i := 0; i < 8000; i++ {
		id := uuid.Must(uuid.NewV7())
		s := ShardFor(id, 8)
		assert.Equal(t, s, ShardFor(id, 8))
		counts[s]++
	}
	for i, c := range counts {
		assert.Greater(t, c, 700, "shard %d got %d of 8000", i, c)
	}
	assert.Equal(t, 0, ShardFor(uuid.New(), 1))
}

func TestMessageRoundTripsThroughRedis(t *testing.T) {
	t.Parallel()
	env := testenv.NewRedis(t)
	ctx := context.Background()
	key := NewNames(env.Namespace).Stream(uuid.New(), "default", 0)
	require.NoError(t, EnsureGroup(ctx, env.Redis, key))
	require.NoError(t, EnsureGroup(ctx, env.Redis, key), "an existing group is fine")

	in := Message{Tenant: uuid.New(), Run: uuid.New(), Task: uuid.New(), Node: "charge", Type: "http", Queue: "default",
		Attempt: 3, TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", OutboxID: 42, EnqueuedAt: time.UnixMicro(time.Now().UnixMicro())}
	require.NoError(t, env.Redis.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: in.Values()}).Err())
	res, err := env.Redis.XReadGroup(ctx, &redis.XReadGroupArgs{Group: Group, Consumer: "c1", Streams: []string{key, ">"}, Count: 1}).Result()
	require.NoError(t, err)
	out, err := Parse(key, res[0].Messages[0])
	require.NoError(t, err)
	in.ID, in.Stream = out.ID, key
	assert.Equal(t, in, out)
}

func TestGroupCreatedLateStillSeesEarlierMessages(t *testing.T) {
	t.Parallel()
	env := testenv.NewRedis(t)
	ctx := context.Background()
	key := NewNames(env.Namespace).Stream(uuid.New(), "default", 0)
	// As after FLUSHALL: the enqueuer re-creates the stream by publishing,
	// and only then does a worker (re)create the group.
	require.NoError(t, env.Redis.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []any{"v", "1"}}).Err())
	err := env.Redis.XReadGroup(ctx, &redis.XReadGroupArgs{Group: Group, Consumer: "c", Streams: []string{key, ">"}, Block: -1}).Err()
	assert.True(t, IsNoGroup(err), "got %v", err)
	require.NoError(t, EnsureGroup(ctx, env.Redis, key))
	res, err := env.Redis.XReadGroup(ctx, &redis.XReadGroupArgs{Group: Group, Consumer: "c", Streams: []string{key, ">"}, Count: 10, Block: -1}).Result()
	require.NoError(t, err)
	assert.Len(t, res[0].Messages, 1)
}

func TestParseRejectsPoison(t *testing.T) {
	_, err := Parse("s", redis.XMessage{ID: "1-0", Values: map[string]any{"v": "1", "t": "nope", "a": "0"}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "field t")
	assert.Contains(t, err.Error(), "field a")
	_, err = Parse("s", redis.XMessage{ID: "1-0", Values: map[string]any{"v": "9"}})
	assert.ErrorContains(t, err, "format version")
}
