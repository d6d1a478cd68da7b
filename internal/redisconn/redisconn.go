// Package redisconn opens Composer's Redis from COMPOSER_REDIS_URL, in one
// of three topologies, always as a redis.UniversalClient:
//
//	redis://[user:password@]host:port/db      one server (rediss:// for TLS, unix:// for a socket)
//	redis+cluster://[user:password@]h1:p1?addr=h2:p2&addr=h3:p3
//	                                          a Redis Cluster, from any of its nodes (rediss+cluster:// for TLS)
//	redis+sentinel://[user:password@]s1:p1?master_name=mymaster&addr=s2:p2[&password=...]
//	                                          the master Sentinel names (rediss+sentinel:// for TLS);
//	                                          user:password are Sentinel's own, username= and
//	                                          password= the master's
//
// The query takes go-redis's URL options (pool_size, dial_timeout, ...)
// of that topology. Whatever the URL says, the pool holds at least 64
// connections (per node on a cluster) and deadlines of contexts bound
// every call. No error of this package repeats a password.
//
// Composer's keys are built for a cluster (engine/stream): every key of a
// tenant carries the {tenant} hash tag, so each script and multi-key
// command touches one slot. See docs/ARCHITECTURE.md, "Redis topologies".
package redisconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Kind is a Redis topology.
type Kind string

// Topologies.
const (
	Single   Kind = "single"
	Cluster  Kind = "cluster"
	Sentinel Kind = "sentinel"
)

// Topology describes a connection without its credentials, for logs.
type Topology struct {
	Kind Kind
	// Addrs: the server, the cluster nodes given, or the sentinels.
	Addrs []string
	// MasterName is the master Sentinel names.
	MasterName string
	// DB is the database number (always 0 on a cluster).
	DB  int
	TLS bool
}

func (t Topology) String() string {
	s := string(t.Kind)
	switch t.Kind {
	case Cluster:
		s += " via " + strings.Join(t.Addrs, ",")
	case Sentinel:
		s += fmt.Sprintf(" master %q via %s db %d", t.MasterName, strings.Join(t.Addrs, ","), t.DB)
	default:
		s += fmt.Sprintf(" %s db %d", strings.Join(t.Addrs, ","), t.DB)
	}
	if t.TLS {
		s += " (TLS)"
	}
	return s
}

// MinPoolSize is the least number of connections the pool holds (per node
// on a cluster): the worker and the enqueuer keep many calls in flight.
const MinPoolSize = 64

// StateReloadInterval bounds how long a cluster client goes on with a
// topology it has not re-read (go-redis re-reads it at once after MOVED,
// and this package after a connection error too).
const StateReloadInterval = 5 * time.Second

// parsed is a URL turned into the options of one topology.
type parsed struct {
	topo     Topology
	single   *redis.Options
	cluster  *redis.ClusterOptions
	failover *redis.FailoverOptions
}

// Parse checks a URL and describes what it connects to, without
// connecting.
func Parse(rawURL string) (Topology, error) {
	p, err := parse(rawURL)
	return p.topo, err
}

// Open returns a client for the URL. It does not wait for Redis: the first
// command connects (callers ping to check).
func Open(rawURL string) (redis.UniversalClient, Topology, error) {
	p, err := parse(rawURL)
	if err != nil {
		return nil, Topology{}, err
	}
	switch p.topo.Kind {
	case Cluster:
		c := redis.NewClusterClient(p.cluster)
		h := reloadOnConnError{c}
		c.AddHook(h)
		// (Nodes are created lazily, so every node gets the dial hook.)
		c.OnNewNode(func(n *redis.Client) { n.AddHook(h) })
		return c, p.topo, nil
	case Sentinel:
		return redis.NewFailoverClient(p.failover), p.topo, nil
	default:
		return redis.NewClient(p.single), p.topo, nil
	}
}

func parse(rawURL string) (parsed, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Parse's error quotes the URL, password and all.
		return parsed{}, errors.New("not a valid URL")
	}
	secrets := secretsOf(u)
	p, err := parseURL(u)
	if err != nil {
		return parsed{}, scrub(err, secrets)
	}
	return p, nil
}

func parseURL(u *url.URL) (parsed, error) {
	base, topo, _ := strings.Cut(u.Scheme, "+")
	if base != "redis" && base != "rediss" && !(base == "unix" && topo == "") {
		return parsed{}, fmt.Errorf("scheme %q is not one of redis, rediss, unix, redis+cluster, rediss+cluster, redis+sentinel, rediss+sentinel", u.Scheme)
	}
	plain := *u
	plain.Scheme = base
	p := parsed{topo: Topology{TLS: base == "rediss"}}
	switch topo {
	case "":
		o, err := redis.ParseURL(plain.String())
		if err != nil {
			return parsed{}, err
		}
		o.PoolSize = max(o.PoolSize, MinPoolSize)
		o.ContextTimeoutEnabled = true
		p.single = o
		p.topo.Kind, p.topo.Addrs, p.topo.DB = Single, []string{o.Addr}, o.DB
	case "cluster":
		if path := strings.Trim(u.Path, "/"); path != "" && path != "0" {
			return parsed{}, fmt.Errorf("a cluster has only database 0 (the URL's path is /%s)", path)
		}
		plain.Path = ""
		o, err := redis.ParseClusterURL(plain.String())
		if err != nil {
			return parsed{}, err
		}
		if err := checkAddrs(o.Addrs); err != nil {
			return parsed{}, err
		}
		o.PoolSize = max(o.PoolSize, MinPoolSize)
		o.ContextTimeoutEnabled = true
		if o.ClusterStateReloadInterval == 0 {
			o.ClusterStateReloadInterval = StateReloadInterval
		}
		p.cluster = o
		p.topo.Kind, p.topo.Addrs = Cluster, o.Addrs
	case "sentinel":
		q := u.Query()
		if q.Get("master_name") == "" {
			return parsed{}, errors.New("a Sentinel URL needs master_name=<the master's name>")
		}
		// NewFailoverClient panics on these (they need a failover cluster client).
		for _, k := range []string{"route_by_latency", "route_randomly"} {
			if q.Has(k) {
				return parsed{}, fmt.Errorf("option %s is not supported with Sentinel", k)
			}
		}
		o, err := redis.ParseFailoverURL(plain.String())
		if err != nil {
			return parsed{}, err
		}
		if err := checkAddrs(o.SentinelAddrs); err != nil {
			return parsed{}, err
		}
		o.PoolSize = max(o.PoolSize, MinPoolSize)
		o.ContextTimeoutEnabled = true
		p.failover = o
		p.topo.Kind, p.topo.Addrs, p.topo.MasterName, p.topo.DB = Sentinel, o.SentinelAddrs, o.MasterName, o.DB
	default:
		return parsed{}, fmt.Errorf("scheme %q is not one of redis, rediss, unix, redis+cluster, rediss+cluster, redis+sentinel, rediss+sentinel", u.Scheme)
	}
	return p, nil
}

// checkAddrs refuses an address list naming one node twice (a typo that
// would leave a cluster or Sentinel with fewer seeds than it seems to have).
func checkAddrs(addrs []string) error {
	seen := map[string]bool{}
	for _, a := range addrs {
		if seen[a] {
			return fmt.Errorf("address %s is given twice", a)
		}
		seen[a] = true
	}
	return nil
}

// secretsOf lists the passwords a URL holds.
func secretsOf(u *url.URL) []string {
	var out []string
	if u.User != nil {
		if pw, ok := u.User.Password(); ok && pw != "" {
			out = append(out, pw, url.QueryEscape(pw), url.PathEscape(pw))
		}
	}
	for k, vs := range u.Query() {
		if strings.Contains(strings.ToLower(k), "password") {
			for _, v := range vs {
				if v != "" {
					out = append(out, v, url.QueryEscape(v))
				}
			}
		}
	}
	return out
}

// scrub replaces every secret in err's text (go-redis's parse errors may
// quote option values).
func scrub(err error, secrets []string) error {
	msg := err.Error()
	for _, s := range secrets {
		msg = strings.ReplaceAll(msg, s, "xxxxx")
	}
	return errors.New(msg)
}

// reloadOnConnError makes a cluster client re-read the topology as soon as
// a node cannot be reached — dialled in vain, or a command failed for want
// of an answer (a master died: its replica is promoted within the
// cluster's node timeout, and go-redis would otherwise keep sending that
// master's slots to the dead node until its periodic reload). Reloads are
// coalesced by go-redis (at most one per 200 ms). On the cluster client it
// watches commands; on each node's client, dials.
type reloadOnConnError struct{ c *redis.ClusterClient }

func (h reloadOnConnError) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil && !errors.Is(err, context.Canceled) {
			h.c.ReloadState(ctx)
		}
		return conn, err
	}
}

func (h reloadOnConnError) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if topologyMayHaveChanged(err) {
			h.c.ReloadState(ctx)
		}
		return err
	}
}

func (h reloadOnConnError) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if topologyMayHaveChanged(c.Err()) {
				h.c.ReloadState(ctx)
				break
			}
		}
		return err
	}
}

// topologyMayHaveChanged: the error is not an answer of a healthy node
// (a connection that failed or timed out, or a cluster that is down or
// failing over).
func topologyMayHaveChanged(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, context.Canceled) {
		return false
	}
	if redis.IsClusterDownError(err) || redis.IsTryAgainError(err) || redis.IsMasterDownError(err) || redis.IsReadOnlyError(err) {
		return true
	}
	var re redis.Error
	if errors.As(err, &re) {
		return false // the node answered
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded)
}

// PipelineKeepsOrder reports whether the commands of one pipeline run in
// the order they were queued, whatever their keys: true for one server
// (or a Sentinel's master: one connection), false for a cluster, whose
// pipeline sends each node its commands concurrently. Code that must make
// one write visible before another on a different slot — a message
// before the wake-up announcing it — executes the first pipeline before
// queuing the second when it does not.
func PipelineKeepsOrder(rdb redis.UniversalClient) bool {
	_, cluster := rdb.(*redis.ClusterClient)
	return !cluster
}

// ForEachMaster calls fn with a client of every master: the server itself
// (or the Sentinel's master), or each master of a cluster, concurrently.
// For what must visit every key — cleaning a namespace up — since SCAN and
// KEYS on a cluster client see one node only.
func ForEachMaster(ctx context.Context, rdb redis.UniversalClient, fn func(context.Context, *redis.Client) error) error {
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, fn)
	case *redis.Client:
		return fn(ctx, c)
	default:
		return fmt.Errorf("redisconn: unknown Redis client %T", rdb)
	}
}
