package config

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestLoadDefaultsPointAtLocalServices(t *testing.T) {
	c, err := load(env(nil))
	require.NoError(t, err)
	assert.Equal(t, Defaults(), c)
	assert.Contains(t, c.DatabaseURL, "127.0.0.1")
	assert.Contains(t, c.RedisURL, "127.0.0.1")
}

func TestLoadReadsVariables(t *testing.T) {
	c, err := load(env(map[string]string{
		"COMPOSER_DATABASE_URL":           "postgres://a@db:5432/x",
		"COMPOSER_REDIS_URL":              "redis://cache:6379/2",
		"COMPOSER_DEV":                    "true",
		"COMPOSER_LEASE_TTL":              "3s",
		"COMPOSER_DEFAULT_STREAM_SHARDS":  "8",
		"COMPOSER_ALLOW_PRIVATE_NETWORKS": "127.0.0.0/8, ::1/128",
		"COMPOSER_AUDIT_KEY":              "bmV3, b2xk",
	}))
	require.NoError(t, err)
	assert.Equal(t, []string{"bmV3", "b2xk"}, c.AuditKeys, "the signing key first, then the old ones")
	assert.Equal(t, "postgres://a@db:5432/x", c.DatabaseURL)
	assert.Equal(t, "redis://cache:6379/2", c.RedisURL)
	assert.True(t, c.Dev)
	assert.Equal(t, 3*time.Second, c.LeaseTTL)
	assert.Equal(t, 8, c.DefaultStreamShards)
	assert.Equal(t, []string{"127.0.0.0/8", "::1/128"}, c.AllowPrivateNetworks)
}

func TestLoadNamesEveryBadVariable(t *testing.T) {
	_, err := load(env(map[string]string{
		"COMPOSER_DATABASE_URL":          "mysql://secret-password@x/y",
		"COMPOSER_DEV":                   "maybe",
		"COMPOSER_LEASE_TTL":             "soon",
		"COMPOSER_DEFAULT_STREAM_SHARDS": "0",
		"COMPOSER_LOG_LEVEL":             "loud",
	}))
	require.Error(t, err)
	msg := err.Error()
	for _, name := range []string{"COMPOSER_DATABASE_URL", "COMPOSER_DEV", "COMPOSER_LEASE_TTL",
		"COMPOSER_DEFAULT_STREAM_SHARDS", "COMPOSER_LOG_LEVEL"} {
		assert.Contains(t, msg, name)
	}
	assert.NotContains(t, msg, "secret-password", "a URL's credentials must never be echoed")
}

// TestClaimIdleFollowsTheLeaseTTL: unless set, a message is reclaimed
// after twice the lease TTL — a longer lease moves it along.
func TestClaimIdleFollowsTheLeaseTTL(t *testing.T) {
	c, err := load(env(map[string]string{}))
	require.NoError(t, err)
	assert.Equal(t, time.Minute, c.ClaimIdle)
	c, err = load(env(map[string]string{"COMPOSER_LEASE_TTL": "2m"}))
	require.NoError(t, err)
	assert.Equal(t, 4*time.Minute, c.ClaimIdle)
	c, err = load(env(map[string]string{"COMPOSER_LEASE_TTL": "2m", "COMPOSER_CLAIM_IDLE": "30s"}))
	require.NoError(t, err)
	assert.Equal(t, 30*time.Second, c.ClaimIdle, "an explicit setting wins")
}

func TestRedisURLTakesEveryTopologyAndNeverEchoesAPassword(t *testing.T) {
	for _, u := range []string{
		"redis://:pw@cache:6379/2",
		"rediss://cache:6380/0",
		"redis+cluster://c1:7000?addr=c2:7000&addr=c3:7000",
		"redis+sentinel://s1:26379?master_name=mymaster&addr=s2:26379",
	} {
		c, err := load(env(map[string]string{"COMPOSER_REDIS_URL": u}))
		require.NoError(t, err, u)
		assert.Equal(t, u, c.RedisURL)
	}
	for _, u := range []string{
		"http://:hunter2@cache:6379",
		"redis+sentinel://:hunter2@s1:26379",                     // no master name
		"redis+cluster://:hunter2@c1:7000/3",                     // a cluster has only database 0
		"redis://:hunter2@cache:6379/0?pool_size=hunter2",        // a bad option quoting the password
		"redis+sentinel://s1:1?master_name=m&password=hunter2&x", // an unknown option
	} {
		_, err := load(env(map[string]string{"COMPOSER_REDIS_URL": u}))
		require.Error(t, err, u)
		assert.Contains(t, err.Error(), "COMPOSER_REDIS_URL")
		assert.NotContains(t, err.Error(), "hunter2", u)
	}
}

func TestRedisNamespaceHoldsNoHashTag(t *testing.T) {
	_, err := load(env(map[string]string{"COMPOSER_REDIS_NAMESPACE": "prod{eu}"}))
	require.ErrorContains(t, err, "COMPOSER_REDIS_NAMESPACE")
}

// TestAnEmptyAdminAddrTurnsTheListenerOff: COMPOSER_ADMIN_ADDR set to ""
// means no operator listener, as the README says; unset keeps the
// default; set, it is used.
func TestAnEmptyAdminAddrTurnsTheListenerOff(t *testing.T) {
	c, err := load(env(nil))
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:9090", c.AdminAddr, "unset: the default")
	for _, off := range []string{"", "  "} {
		c, err = load(env(map[string]string{"COMPOSER_ADMIN_ADDR": off}))
		require.NoError(t, err)
		assert.Empty(t, c.AdminAddr, "set to %q: off", off)
	}
	c, err = load(env(map[string]string{"COMPOSER_ADMIN_ADDR": " 127.0.0.1:9191 "}))
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:9191", c.AdminAddr)
}
