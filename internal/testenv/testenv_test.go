package testenv

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEnvIsIsolatedAndUsesTheRightRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := New(t), New(t)
	assert.NotEqual(t, a.DBName, b.DBName)
	assert.NotEqual(t, a.Namespace, b.Namespace)

	var user, db string
	require.NoError(t, a.App.QueryRow(ctx, "SELECT current_user, current_database()").Scan(&user, &db))
	assert.Equal(t, "composer_app", user)
	assert.Equal(t, a.DBName, db)
	require.NoError(t, a.System.QueryRow(ctx, "SELECT current_user").Scan(&user))
	assert.Equal(t, "composer_system", user)

	// The template was migrated: the baseline's helper exists.
	var v string
	require.NoError(t, a.App.QueryRow(ctx, "SELECT composer_uuidv7()::text").Scan(&v))
	assert.Equal(t, byte('7'), v[14], "version nibble of %s", v)

	require.NoError(t, a.Redis.Set(ctx, a.Namespace+":k", "1", 0).Err())
	n, err := b.Redis.Exists(ctx, a.Namespace+":k").Result()
	require.NoError(t, err)
	assert.EqualValues(t, 1, n, "both share one Redis; isolation is by namespace")
}

func TestParallelEnvsDoNotInterfere(t *testing.T) {
	for i := 0; i < 6; i++ {
		t.Run("env", func(t *testing.T) {
			t.Parallel()
			e := NewPG(t)
			_, err := e.Owner(t).Exec(context.Background(), "CREATE TABLE scratch (x int)")
			require.NoError(t, err, "each test owns its database, so the same table name never collides")
		})
	}
}
