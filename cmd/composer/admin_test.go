package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/composer-dev/composer/internal/config"
	"github.com/composer-dev/composer/internal/testenv"
)

// TestTenantsCreateSurvivesKilledConnections: `composer tenants create`
// whose database connection's backend is terminated just before its
// transaction reaches it — as a load-time connection kill does — still
// creates the tenant, once, and prints it with its key.
func TestTenantsCreateSurvivesKilledConnections(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	proxy, systemURL := testenv.ProxyURL(t, env.SystemURL)
	var once sync.Once
	killed := make(chan error, 1)
	proxy.Before(func(_ string, chunk []byte) {
		if !bytes.Contains(chunk, []byte("INSERT INTO tenants")) {
			return
		}
		once.Do(func() {
			// Every backend of the system role ends before the statement
			// arrives (the one behind this connection included).
			ctx := context.Background()
			c, err := pgx.Connect(ctx, env.SystemURL)
			if err == nil {
				defer c.Close(ctx)
				_, err = c.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
					WHERE datname = current_database() AND usename = current_user AND pid <> pg_backend_pid()`)
			}
			for err == nil {
				var left int
				if err = c.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
					AND usename = current_user AND pid <> pg_backend_pid()`).Scan(&left); left == 0 {
					break
				}
			}
			killed <- err
		})
	})
	cfg := config.Defaults()
	cfg.DatabaseURL, cfg.SystemDatabaseURL, cfg.RedisURL, cfg.RedisNamespace = env.AppURL, systemURL, env.RedisURL, env.Namespace
	var out bytes.Buffer
	err := runTenants(context.Background(), &environment{cfg: cfg, log: zaptest.NewLogger(t), out: &out}, []string{"create", "--name", "acme-killed", "--plan", "pro"})
	require.NoError(t, err)
	require.NoError(t, <-killed, "the backends were terminated")

	var printed struct {
		TenantID string `json:"tenant_id"`
		APIKey   string `json:"api_key"`
	}
	require.NoError(t, json.Unmarshal(out.Bytes(), &printed), out.String())
	assert.True(t, strings.HasPrefix(printed.APIKey, "cmp_"))
	// (The test's own pool of the system role lost its connections too.)
	check, err := pgx.Connect(context.Background(), env.SystemURL)
	require.NoError(t, err)
	defer check.Close(context.Background())
	var ids []string
	require.NoError(t, check.QueryRow(context.Background(), `SELECT coalesce(array_agg(id::text), '{}') FROM tenants WHERE name = 'acme-killed'`).Scan(&ids))
	require.Len(t, ids, 1, "created once")
	id := ids[0]
	assert.Equal(t, printed.TenantID, id)
}
