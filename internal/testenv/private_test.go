package testenv

import (
	"context"
	"testing"
	"time"

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
