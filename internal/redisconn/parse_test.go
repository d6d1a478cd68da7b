package redisconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseSingleServer(t *testing.T) {
	p, err := parse("redis://app:pw@cache:6380/2")
	require.NoError(t, err)
	require.NotNil(t, p.single)
	assert.Equal(t, Topology{Kind: Single, Addrs: []string{"cache:6380"}, DB: 2}, p.topo)
	assert.Equal(t, "app", p.single.Username)
	assert.Equal(t, "pw", p.single.Password)
	assert.Equal(t, MinPoolSize, p.single.PoolSize)
	assert.True(t, p.single.ContextTimeoutEnabled)

	p, err = parse("rediss://cache/0?pool_size=200&dial_timeout=3s")
	require.NoError(t, err)
	assert.Equal(t, 200, p.single.PoolSize, "a bigger pool is kept")
	assert.Equal(t, 3*time.Second, p.single.DialTimeout)
	assert.True(t, p.topo.TLS)
	assert.NotNil(t, p.single.TLSConfig)
	assert.Equal(t, "cache:6379", p.topo.Addrs[0], "the default port")

	p, err = parse("unix:///run/redis.sock?db=3")
	require.NoError(t, err)
	assert.Equal(t, "unix", p.single.Network)
	assert.Equal(t, 3, p.topo.DB)
}

func TestParseCluster(t *testing.T) {
	p, err := parse("redis+cluster://app:pw@10.0.0.1:7000?addr=10.0.0.2:7000&addr=10.0.0.3:7001&max_redirects=5")
	require.NoError(t, err)
	require.NotNil(t, p.cluster)
	assert.Equal(t, Topology{Kind: Cluster, Addrs: []string{"10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7001"}}, p.topo)
	assert.Equal(t, []string{"10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7001"}, p.cluster.Addrs)
	assert.Equal(t, "app", p.cluster.Username)
	assert.Equal(t, "pw", p.cluster.Password)
	assert.Equal(t, 5, p.cluster.MaxRedirects)
	assert.Equal(t, MinPoolSize, p.cluster.PoolSize)
	assert.True(t, p.cluster.ContextTimeoutEnabled)
	assert.Equal(t, StateReloadInterval, p.cluster.ClusterStateReloadInterval)
	assert.Nil(t, p.cluster.TLSConfig)

	for _, u := range []string{"redis+cluster://h:1/", "redis+cluster://h:1/0"} {
		_, err := parse(u)
		require.NoError(t, err, u)
	}
	p, err = parse("rediss+cluster://h:1")
	require.NoError(t, err)
	assert.True(t, p.topo.TLS)
	assert.NotNil(t, p.cluster.TLSConfig)
	assert.Equal(t, "cluster via h:1 (TLS)", p.topo.String())
}

func TestParseSentinel(t *testing.T) {
	p, err := parse("redis+sentinel://sadmin:spw@s1:26379?master_name=mymaster&addr=s2:26380&addr=s3:26379&password=mpw&db=4")
	require.NoError(t, err)
	require.NotNil(t, p.failover)
	assert.Equal(t, Topology{Kind: Sentinel, Addrs: []string{"s1:26379", "s2:26380", "s3:26379"}, MasterName: "mymaster", DB: 4}, p.topo)
	assert.Equal(t, "mymaster", p.failover.MasterName)
	assert.Equal(t, "sadmin", p.failover.SentinelUsername, "the URL's user is Sentinel's")
	assert.Equal(t, "spw", p.failover.SentinelPassword)
	assert.Equal(t, "mpw", p.failover.Password, "password= is the master's")
	assert.Equal(t, 4, p.failover.DB)
	assert.Equal(t, MinPoolSize, p.failover.PoolSize)
	assert.True(t, p.failover.ContextTimeoutEnabled)
	assert.Equal(t, `sentinel master "mymaster" via s1:26379,s2:26380,s3:26379 db 4`, p.topo.String())
}

func TestParseRefusesWhatItCannotServe(t *testing.T) {
	for u, want := range map[string]string{
		"http://cache:6379":                                        "scheme",
		"redis+ring://a:1":                                         "scheme",
		"unix+cluster:///x":                                        "scheme",
		"redis+cluster://a:1/2":                                    "only database 0",
		"redis+cluster://a:1?addr=a:1":                             "given twice",
		"redis+cluster://a:1?addr=nohost":                          "addr",
		"redis+cluster://a:1?bogus=1":                              "unexpected option: bogus",
		"redis+sentinel://s:1":                                     "master_name",
		"redis+sentinel://s:1?master_name=m&route_by_latency=true": "route_by_latency",
		"redis+sentinel://s:1?master_name=m&addr=s:1":              "given twice",
		"redis://a:1/notanumber":                                   "database",
	} {
		_, err := Parse(u)
		require.Error(t, err, u)
		assert.Contains(t, err.Error(), want, u)
	}
}

// TestErrorsNeverEchoAPassword: whatever is wrong with the URL, no error
// carries its password (errors end up in logs and in start-up output).
func TestErrorsNeverEchoAPassword(t *testing.T) {
	for _, u := range []string{
		"redis://u:hunter2@cache:notaport",     // url.Parse's own error quotes the URL
		"redis://u:hunter2@cache:6379/hunter2", // bad database number
		"redis://u:hunter2@cache?pool_size=hunter2",
		"redis+cluster://u:hunter2@c:1?dial_timeout=hunter2",
		"redis+cluster://u:hunter2@c:1?addr=hunter2",
		"redis+cluster://u:hunter2@c:1?hunter2=1",
		"redis+sentinel://u:hunter2@s:1?master_name=m&password=hunter3&pool_size=hunter3",
		"redis+sentinel://s:1?master_name=m&password=hunter3&hunter3",
		"redis+sentinel://u:hunter%2F2@s:1?master_name=m&db=hunter/2",
	} {
		_, err := Parse(u)
		require.Error(t, err, u)
		for _, secret := range []string{"hunter2", "hunter3", "hunter/2", "hunter%2F2"} {
			assert.NotContains(t, err.Error(), secret, u)
		}
	}
}

// TestOpenBuildsTheTopologysClient: without connecting.
func TestOpenBuildsTheTopologysClient(t *testing.T) {
	for u, want := range map[string]string{
		"redis://127.0.0.1:1/0":                        "*redis.Client",
		"redis+cluster://127.0.0.1:1?addr=127.0.0.1:2": "*redis.ClusterClient",
		"redis+sentinel://127.0.0.1:1?master_name=m":   "*redis.Client",
	} {
		c, topo, err := Open(u)
		require.NoError(t, err, u)
		assert.Equal(t, want, fmt.Sprintf("%T", c), u)
		assert.NotEmpty(t, topo.Kind)
		require.NoError(t, c.Close())
	}
}

func TestTopologyMayHaveChanged(t *testing.T) {
	for err, want := range map[error]bool{
		nil:                                      false,
		redis.Nil:                                false,
		context.Canceled:                         false,
		context.DeadlineExceeded:                 true,
		io.EOF:                                   true,
		fmt.Errorf("w: %w", io.ErrUnexpectedEOF): true,
		&net.OpError{Op: "dial", Err: errors.New("connection refused")}: true,
	} {
		assert.Equal(t, want, topologyMayHaveChanged(err), "%v", err)
	}
}
