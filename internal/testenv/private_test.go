package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPrivateServicesSurviveRestarts: a private PostgreSQL comes back from
// an immediate restart with its committed data, a private Redis comes
// back empty after a kill.
func TestPrivateServicesSurviveRestarts(t *testing.T) {
	t.Parallel()
	env, pg, rs := WithPrivateServices(t)
	ctx := context.Background()
	owner := env.Owner(t)
	_, err := owner.Exec(ctx, `CREATE TABLE survivors (name text); INSERT INTO survivors VALUES ('committed')`)
	require.NoError(t, err)
	require.NoError(t, env.Redis.Set(ctx, "k", "v", 0).Err())
	start := time.Now()
	pg.RestartImmediate()
	t.Logf("PostgreSQL restarted in %s", time.Since(start).Round(time.Millisecond))
	require.Eventually(t, func() bool {
		var n int
		err := owner.QueryRow(ctx, `SELECT count(*) FROM survivors`).Scan(&n)
		if err != nil {
			t.Log(err)
		}
		return err == nil && n == 1
	}, 30*time.Second, 50*time.Millisecond, "the committed row survived the crash")
	rs.Kill()
	rs.Start()
	require.Eventually(t, func() bool {
		n, err := env.Redis.Exists(ctx, "k").Result()
		return err == nil && n == 0
	}, 10*time.Second, 20*time.Millisecond, "a restarted Redis is empty")
}

// TestPrivateClusterFailsOverAKilledMaster: the private cluster promotes
// a killed master's replica, and the Env's client follows.
func TestPrivateClusterFailsOverAKilledMaster(t *testing.T) {
	t.Parallel()
	env, pc := WithPrivateCluster(t)
	ctx := context.Background()
	key := env.Namespace + ":{t}:k"
	require.NoError(t, env.Redis.Set(ctx, key, "v", 0).Err())
	master := pc.MasterOf(key)
	direct := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", master)})
	defer direct.Close()
	// Replication is asynchronous: wait until the replica has the write.
	require.EqualValues(t, 1, direct.Do(ctx, "WAIT", 1, 5000).Val(), "the replica has the write")
	killed := time.Now()
	pc.Kill(master)
	took := pc.WaitPromoted(master, killed, 30*time.Second)
	t.Logf("the replica of a killed master serves its slots after %s", took.Round(10*time.Millisecond))
	assert.NotEqual(t, master, pc.MasterOf(key))
	require.Eventually(t, func() bool { return env.Redis.Get(ctx, key).Val() == "v" }, 10*time.Second, 20*time.Millisecond,
		"the cluster client reaches the promoted replica, which has the key")
	t.Logf("the client read the key again %s after the kill", time.Since(killed).Round(10*time.Millisecond))
}

// TestPrivateSentinelPromotesTheReplica: the Sentinel promotes the replica
// of a killed master, and the Env's client (through the Sentinel) follows.
func TestPrivateSentinelPromotesTheReplica(t *testing.T) {
	t.Parallel()
	env, ps := WithPrivateSentinel(t)
	ctx := context.Background()
	require.NoError(t, env.Redis.Set(ctx, "k", "v", 0).Err())
	require.EqualValues(t, 1, env.Redis.Do(ctx, "WAIT", 1, 5000).Val(), "the replica has the write")
	killed := time.Now()
	old := ps.KillMaster()
	took := ps.WaitPromoted(killed, 30*time.Second)
	t.Logf("the Sentinel promoted the replica %s after the master was killed", took.Round(10*time.Millisecond))
	assert.NotEqual(t, old, ps.MasterPort())
	require.Eventually(t, func() bool { return env.Redis.Get(ctx, "k").Val() == "v" }, 10*time.Second, 20*time.Millisecond)
	require.NoError(t, env.Redis.Set(ctx, "k2", "v", 0).Err(), "the new master takes writes")
}
