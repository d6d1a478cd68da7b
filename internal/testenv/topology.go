package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// PrivateNodeTimeout is the cluster-node-timeout of a private cluster and
// the down-after-milliseconds of a private Sentinel: how long a dead
// master goes unnoticed before its replica is promoted.
const PrivateNodeTimeout = time.Second

// node is one redis-server process of a private topology.
type node struct {
	Port int
	dir  string

	mu  sync.Mutex
	cmd *exec.Cmd
}

// startNode starts redis-server on port with its files in dir, reading
// conf first when set (a Sentinel's configuration file), then args.
func startNode(t testing.TB, bin string, port int, dir, conf string, args ...string) *node {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	n := &node{Port: port, dir: dir}
	var all []string
	if conf != "" {
		all = append(all, conf)
	}
	all = append(all, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", filepath.Join(dir, "redis.log"))
	cmd := exec.Command(bin, append(all, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("testenv: start redis-server on %d: %v", port, err)
	}
	n.cmd = cmd
	t.Cleanup(n.Kill)
	c := redis.NewClient(&redis.Options{Addr: n.Addr()})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			t.Fatalf("testenv: redis-server on port %d did not start:\n%s", port, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return n
}

// Addr is the node's host:port.
func (n *node) Addr() string { return fmt.Sprintf("127.0.0.1:%d", n.Port) }

// Kill SIGKILLs the node (it is not restarted).
func (n *node) Kill() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		_ = n.cmd.Process.Signal(syscall.SIGCONT)
		_ = n.cmd.Process.Kill()
		_ = n.cmd.Wait()
		n.cmd = nil
	}
}

func (n *node) alive() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd != nil
}

func (n *node) client() *redis.Client { return redis.NewClient(&redis.Options{Addr: n.Addr()}) }

// PrivateCluster is a Redis Cluster of one test's own: three masters, each
// with a replica, on free ports, no persistence, a node timeout of
// PrivateNodeTimeout. The test may kill any node.
type PrivateCluster struct {
	t     testing.TB
	nodes []*node
}

// WithPrivateCluster returns an Env with a fresh database whose Redis is a
// private cluster (Env.Redis a cluster client, Env.RedisURL its
// redis+cluster:// URL naming every node), and the cluster.
func WithPrivateCluster(t testing.TB) (*Env, *PrivateCluster) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("testenv: redis-server not found (run scripts/services.sh): %v", err)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("testenv: redis-cli not found (run scripts/services.sh): %v", err)
	}
	pc := &PrivateCluster{t: t}
	root := t.TempDir()
	var addrs []string
	for i := range 6 {
		port := freePort(t)
		pc.nodes = append(pc.nodes, startNode(t, bin, port, filepath.Join(root, strconv.Itoa(port)), "",
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(root, strconv.Itoa(port), "nodes.conf"),
			"--cluster-node-timeout", strconv.Itoa(int(PrivateNodeTimeout.Milliseconds()))))
		addrs = append(addrs, pc.nodes[i].Addr())
	}
	// The first three become masters, the others their replicas.
	out, err := exec.Command(cli, append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "1", "--cluster-yes")...).CombinedOutput()
	if err != nil {
		t.Fatalf("testenv: redis-cli --cluster create: %v\n%s", err, out)
	}
	pc.WaitHealthy(30 * time.Second)
	u := "redis+cluster://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
	e := &Env{}
	e.openRedis(t, u, "private cluster")
	e.newDatabase(t)
	return e, pc
}

// WaitHealthy waits until every live node reports the cluster ok and every
// master of a slot range has a replica in sync (so a kill can be failed
// over), or fails the test.
func (pc *PrivateCluster) WaitHealthy(timeout time.Duration) {
	pc.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, why := pc.healthy()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			pc.t.Fatalf("testenv: private cluster not healthy after %s: %s", timeout, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (pc *PrivateCluster) healthy() (bool, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, n := range pc.nodes {
		if !n.alive() {
			continue
		}
		c := n.client()
		info, err := c.ClusterInfo(ctx).Result()
		c.Close()
		if err != nil || !strings.Contains(info, "cluster_state:ok") {
			return false, fmt.Sprintf("node %d: %v %s", n.Port, err, firstLine(info, "cluster_state"))
		}
	}
	masters, err := pc.masters(ctx)
	if err != nil {
		return false, err.Error()
	}
	if len(masters) < 3 {
		return false, fmt.Sprintf("%d masters hold slots", len(masters))
	}
	for _, m := range masters {
		c := m.client()
		info, err := c.Info(ctx, "replication").Result()
		c.Close()
		if err != nil || !strings.Contains(info, "connected_slaves:1") || !strings.Contains(info, "state=online") {
			return false, fmt.Sprintf("master %d has no replica online: %v", m.Port, err)
		}
	}
	return true, ""
}

func firstLine(s, prefix string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// masters lists the live nodes that are masters holding slots, as the
// cluster sees it now.
func (pc *PrivateCluster) masters(ctx context.Context) ([]*node, error) {
	slots, err := pc.slots(ctx)
	if err != nil {
		return nil, err
	}
	seen := map[int]bool{}
	var out []*node
	for _, s := range slots {
		if n := pc.byAddr(s.Nodes[0].Addr); n != nil && !seen[n.Port] {
			seen[n.Port] = true
			out = append(out, n)
		}
	}
	return out, nil
}

func (pc *PrivateCluster) slots(ctx context.Context) ([]redis.ClusterSlot, error) {
	var lastErr error
	for _, n := range pc.nodes {
		if !n.alive() {
			continue
		}
		c := n.client()
		s, err := c.ClusterSlots(ctx).Result()
		c.Close()
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, fmt.Errorf("no node answered CLUSTER SLOTS: %v", lastErr)
}

func (pc *PrivateCluster) byAddr(addr string) *node {
	for _, n := range pc.nodes {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}

// MasterOf returns the port of the master serving key now.
func (pc *PrivateCluster) MasterOf(key string) int {
	pc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := pc.nodes[0].client()
	defer c.Close()
	slot, err := c.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		pc.t.Fatalf("testenv: CLUSTER KEYSLOT: %v", err)
	}
	slots, err := pc.slots(ctx)
	if err != nil {
		pc.t.Fatalf("testenv: %v", err)
	}
	for _, s := range slots {
		if int64(s.Start) <= slot && slot <= int64(s.End) {
			addr := s.Nodes[0].Addr
			p, _ := strconv.Atoi(addr[strings.LastIndex(addr, ":")+1:])
			return p
		}
	}
	pc.t.Fatalf("testenv: no master serves slot %d", slot)
	return 0
}

// Kill SIGKILLs the node on port (it stays down).
func (pc *PrivateCluster) Kill(port int) {
	for _, n := range pc.nodes {
		if n.Port == port {
			n.Kill()
			return
		}
	}
	pc.t.Fatalf("testenv: no cluster node on port %d", port)
}

// WaitPromoted waits until no slot is served by the node on port (a
// replica took its slots over) and the cluster is ok again, and returns
// how long that took from since.
func (pc *PrivateCluster) WaitPromoted(port int, since time.Time, timeout time.Duration) time.Duration {
	pc.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		slots, err := pc.slots(ctx)
		cancel()
		moved := err == nil
		for _, s := range slots {
			if s.Nodes[0].Addr == fmt.Sprintf("127.0.0.1:%d", port) {
				moved = false
			}
		}
		if moved {
			ok := true
			for _, n := range pc.nodes {
				if !n.alive() {
					continue
				}
				c := n.client()
				info, err := c.ClusterInfo(context.Background()).Result()
				c.Close()
				ok = ok && err == nil && strings.Contains(info, "cluster_state:ok")
			}
			if ok {
				return time.Since(since)
			}
		}
		if time.Now().After(deadline) {
			pc.t.Fatalf("testenv: the slots of node %d were not taken over within %s", port, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// PrivateSentinel is a Redis master with one replica and a Sentinel
// watching them (master name "composer", down after PrivateNodeTimeout),
// of one test's own.
type PrivateSentinel struct {
	t                         testing.TB
	master, replica, sentinel *node
	// MasterName is the name the Sentinel knows the master by.
	MasterName string
}

// WithPrivateSentinel returns an Env with a fresh database whose Redis is
// reached through a private Sentinel (Env.RedisURL a redis+sentinel://
// URL), and the topology.
func WithPrivateSentinel(t testing.TB) (*Env, *PrivateSentinel) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("testenv: redis-server not found (run scripts/services.sh): %v", err)
	}
	root := t.TempDir()
	ps := &PrivateSentinel{t: t, MasterName: "composer"}
	mp := freePort(t)
	ps.master = startNode(t, bin, mp, filepath.Join(root, "master"), "")
	ps.replica = startNode(t, bin, freePort(t), filepath.Join(root, "replica"), "", "--replicaof", "127.0.0.1", strconv.Itoa(mp))
	sp := freePort(t)
	sdir := filepath.Join(root, "sentinel")
	if err := os.MkdirAll(sdir, 0o755); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	conf := filepath.Join(sdir, "sentinel.conf") // Sentinel rewrites its file: it must be its own
	ms := strconv.Itoa(int(PrivateNodeTimeout.Milliseconds()))
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d 1\n"+
		"sentinel down-after-milliseconds %[1]s %[3]s\nsentinel failover-timeout %[1]s 10000\nsentinel parallel-syncs %[1]s 1\n",
		ps.MasterName, mp, ms)), 0o644); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	ps.sentinel = startNode(t, bin, sp, sdir, conf, "--sentinel")
	ps.waitReplicaOnline(30 * time.Second)
	e := &Env{}
	e.openRedis(t, fmt.Sprintf("redis+sentinel://127.0.0.1:%d?master_name=%s", sp, ps.MasterName), "private sentinel")
	e.newDatabase(t)
	return e, ps
}

func (ps *PrivateSentinel) waitReplicaOnline(timeout time.Duration) {
	ps.t.Helper()
	deadline := time.Now().Add(timeout)
	m := ps.master.client()
	defer m.Close()
	s := redis.NewSentinelClient(&redis.Options{Addr: ps.sentinel.Addr()})
	defer s.Close()
	for {
		info, err := m.Info(context.Background(), "replication").Result()
		replicas, serr := s.Replicas(context.Background(), ps.MasterName).Result()
		if err == nil && serr == nil && strings.Contains(info, "state=online") && len(replicas) == 1 {
			return
		}
		if time.Now().After(deadline) {
			ps.t.Fatalf("testenv: the private replica did not come online (%v %v)", err, serr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// MasterPort is the port of the master the Sentinel names now.
func (ps *PrivateSentinel) MasterPort() int {
	s := redis.NewSentinelClient(&redis.Options{Addr: ps.sentinel.Addr()})
	defer s.Close()
	addr, err := s.GetMasterAddrByName(context.Background(), ps.MasterName).Result()
	if err != nil || len(addr) != 2 {
		return 0
	}
	p, _ := strconv.Atoi(addr[1])
	return p
}

// KillMaster SIGKILLs the master (it stays down) and returns its port.
func (ps *PrivateSentinel) KillMaster() int {
	ps.master.Kill()
	return ps.master.Port
}

// WaitPromoted waits until the Sentinel names the replica as the master
// and the replica answers as one, and returns how long that took from
// since.
func (ps *PrivateSentinel) WaitPromoted(since time.Time, timeout time.Duration) time.Duration {
	ps.t.Helper()
	deadline := time.Now().Add(timeout)
	r := ps.replica.client()
	defer r.Close()
	for {
		if ps.MasterPort() == ps.replica.Port {
			if info, err := r.Info(context.Background(), "replication").Result(); err == nil && strings.Contains(info, "role:master") {
				return time.Since(since)
			}
		}
		if time.Now().After(deadline) {
			ps.t.Fatalf("testenv: the Sentinel did not promote the replica within %s", timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
