// Package testenv gives each test real, isolated services: its own PostgreSQL
// database cloned from a migrated template, and its own Redis key namespace.
// Tests using it may call t.Parallel freely.
//
// The template is built once per migration set (its name carries a hash of
// the migration files) under an advisory lock, so concurrent `go test`
// processes share it. A service that cannot be reached fails the test; it
// never skips.
//
// Environment:
//
//	COMPOSER_TEST_DATABASE_URL  owner-role URL of a maintenance database
//	                            (default postgres://composer_owner:composer@127.0.0.1:5432/postgres)
//	COMPOSER_TEST_ROLE_PASSWORD password of composer_app and composer_system (default composer)
//	COMPOSER_TEST_REDIS_URL     default redis://127.0.0.1:6379/0; any URL COMPOSER_REDIS_URL
//	                            takes (internal/redisconn), e.g. the local cluster of
//	                            scripts/services.sh (make test-cluster)
//	COMPOSER_TEST_REDIS_CLUSTER_URL  the cluster NewCluster uses (default DefaultClusterURL)
package testenv

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver for goose
	"github.com/redis/go-redis/v9"

	"github.com/composer-dev/composer/internal/pguuid"
	"github.com/composer-dev/composer/internal/redisconn"
	"github.com/composer-dev/composer/migrations"
)

// Env is one test's services. Fields are ready to use; everything is closed
// and dropped by t.Cleanup.
type Env struct {
	// DBName is the test's own database.
	DBName string
	// OwnerURL, AppURL and SystemURL connect to DBName as composer_owner,
	// composer_app (RLS-bound) and composer_system (BYPASSRLS).
	OwnerURL, AppURL, SystemURL string
	// App and System are pools for AppURL and SystemURL.
	App, System *pgxpool.Pool
	// RedisURL and Redis reach the shared Redis (one server, a cluster or a
	// Sentinel master, whichever the URL says); Namespace is this test's own
	// key prefix, to be passed to every component that names keys.
	RedisURL  string
	Redis     redis.UniversalClient
	Namespace string
}

// Owner opens a pool as composer_owner (for tests that inspect the catalog
// or call maintenance functions). It is closed by t.Cleanup.
func (e *Env) Owner(t testing.TB) *pgxpool.Pool {
	t.Helper()
	p := mustPool(t, e.OwnerURL)
	t.Cleanup(p.Close)
	return p
}

// New returns an Env with a fresh database and Redis namespace.
func New(t testing.TB) *Env {
	t.Helper()
	e := &Env{}
	e.newDatabase(t)
	e.newRedis(t)
	return e
}

// NewPG returns an Env with only the database part set.
func NewPG(t testing.TB) *Env {
	t.Helper()
	e := &Env{}
	e.newDatabase(t)
	return e
}

// NewRedis returns an Env with only the Redis part set.
func NewRedis(t testing.TB) *Env {
	t.Helper()
	e := &Env{}
	e.newRedis(t)
	return e
}

func getenv(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func adminURL() string {
	return getenv("COMPOSER_TEST_DATABASE_URL", "postgres://composer_owner:composer@127.0.0.1:5432/postgres?sslmode=disable")
}

// withDB returns u with its database (and optionally user) replaced.
func withDB(raw, db, user string) string {
	u, err := url.Parse(raw)
	if err != nil {
		panic(fmt.Sprintf("testenv: bad COMPOSER_TEST_DATABASE_URL: %v", err))
	}
	u.Path = "/" + db
	if user != "" {
		u.User = url.UserPassword(user, getenv("COMPOSER_TEST_ROLE_PASSWORD", "composer"))
	}
	return u.String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

var (
	templateOnce sync.Once
	templateName string
	templateErr  error
)

func (e *Env) newDatabase(t testing.TB) {
	t.Helper()
	templateOnce.Do(func() { templateName, templateErr = ensureTemplate() })
	if templateErr != nil {
		t.Fatalf("testenv: PostgreSQL template: %v\n(is PostgreSQL running? run scripts/services.sh)", templateErr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminURL())
	if err != nil {
		t.Fatalf("testenv: PostgreSQL unreachable at %s: %v (run scripts/services.sh)", redact(adminURL()), err)
	}
	defer admin.Close(ctx)

	e.DBName = fmt.Sprintf("composer_t_%d_%s", time.Now().Unix(), randomHex(4))
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", e.DBName, templateName)); err != nil {
		t.Fatalf("testenv: create database: %v", err)
	}
	t.Cleanup(func() { dropDatabase(e.DBName) })

	e.OwnerURL = withDB(adminURL(), e.DBName, "")
	e.AppURL = withDB(adminURL(), e.DBName, "composer_app")
	e.SystemURL = withDB(adminURL(), e.DBName, "composer_system")
	e.App = mustPool(t, e.AppURL)
	e.System = mustPool(t, e.SystemURL)
	t.Cleanup(e.App.Close)
	t.Cleanup(e.System.Close)
}

func mustPool(t testing.TB, u string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatalf("testenv: parse %s: %v", redact(u), err)
	}
	cfg.MaxConns = 16
	cfg.AfterConnect = pguuid.AfterConnect // as the server's pools
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("testenv: pool %s: %v", redact(u), err)
	}
	if err := p.Ping(context.Background()); err != nil {
		p.Close()
		t.Fatalf("testenv: PostgreSQL unreachable at %s: %v", redact(u), err)
	}
	return p
}

func dropDatabase(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminURL())
	if err != nil {
		return
	}
	defer admin.Close(ctx)
	_, _ = admin.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", name))
}

func redact(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparseable URL)"
	}
	return p.Redacted()
}

// migrationsHash identifies the migration set, so a changed migration builds
// a new template instead of reusing a stale one.
func migrationsHash() (string, error) {
	fsys := migrations.FS()
	var names []string
	if err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			names = append(names, p)
		}
		return err
	}); err != nil {
		return "", err
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", n, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// ensureTemplate builds (once across processes) the migrated template
// database and returns its name.
func ensureTemplate() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hash, err := migrationsHash()
	if err != nil {
		return "", fmt.Errorf("hash migrations: %w", err)
	}
	name := "composer_tpl_" + hash
	admin, err := pgx.Connect(ctx, adminURL())
	if err != nil {
		return "", fmt.Errorf("connect %s: %w", redact(adminURL()), err)
	}
	defer admin.Close(ctx)
	// One lock for every test process on this server.
	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock(7250001)"); err != nil {
		return "", err
	}
	defer admin.Exec(context.Background(), "SELECT pg_advisory_unlock(7250001)") //nolint:errcheck

	removeStale(ctx, admin, name)

	var exists bool
	if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", err
	}
	// The template's comment says when a test process last used it: another
	// checkout testing with other migrations at the same time (a worktree,
	// a CI clone) keeps its own template.
	used := fmt.Sprintf("COMMENT ON DATABASE %s IS '%d'", name, time.Now().Unix())
	if exists {
		_, _ = admin.Exec(ctx, used)
		return name, nil
	}
	building := name + "_building"
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+building+" WITH (FORCE)"); err != nil {
		return "", err
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+building); err != nil {
		return "", err
	}
	db, err := sql.Open("pgx", withDB(adminURL(), building, ""))
	if err != nil {
		return "", err
	}
	_, err = migrations.Up(ctx, db)
	db.Close()
	if err != nil {
		return "", err
	}
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+building+" RENAME TO "+name); err != nil {
		return "", err
	}
	_, _ = admin.Exec(ctx, used)
	return name, nil
}

// removeStale drops templates of other migration sets not used for two
// hours and test databases left behind by crashed runs more than two hours
// ago.
func removeStale(ctx context.Context, admin *pgx.Conn, current string) {
	rows, err := admin.Query(ctx, `SELECT datname, coalesce(shobj_description(oid, 'pg_database'), '') FROM pg_database
		WHERE (datname LIKE 'composer\_tpl\_%' AND datname <> $1) OR datname LIKE 'composer\_t\_%'`, current)
	if err != nil {
		return
	}
	type db struct{ name, comment string }
	dbs, _ := pgx.CollectRows(rows, func(r pgx.CollectableRow) (db, error) {
		var d db
		return d, r.Scan(&d.name, &d.comment)
	})
	cutoff := time.Now().Add(-2 * time.Hour).Unix()
	for _, d := range dbs {
		n := d.name
		if strings.HasPrefix(n, "composer_t_") {
			parts := strings.SplitN(strings.TrimPrefix(n, "composer_t_"), "_", 2)
			if ts, err := strconv.ParseInt(parts[0], 10, 64); err != nil || ts > cutoff {
				continue
			}
		} else if ts, err := strconv.ParseInt(d.comment, 10, 64); err == nil && ts > cutoff {
			continue // another checkout's template, in use
		}
		_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+n+" WITH (FORCE)")
	}
}

func (e *Env) newRedis(t testing.TB) {
	t.Helper()
	e.openRedis(t, getenv("COMPOSER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"), "COMPOSER_TEST_REDIS_URL")
}

// DefaultClusterURL is the Redis Cluster scripts/services.sh starts.
const DefaultClusterURL = "redis+cluster://127.0.0.1:7101?addr=127.0.0.1:7102&addr=127.0.0.1:7103"

// ClusterURL is the shared Redis Cluster's URL.
func ClusterURL() string { return getenv("COMPOSER_TEST_REDIS_CLUSTER_URL", DefaultClusterURL) }

// NewCluster returns an Env with only the Redis part set, on the shared
// Redis Cluster (whatever COMPOSER_TEST_REDIS_URL says): for tests of
// cluster behaviour itself.
func NewCluster(t testing.TB) *Env {
	t.Helper()
	e := &Env{}
	e.openRedis(t, ClusterURL(), "COMPOSER_TEST_REDIS_CLUSTER_URL")
	return e
}

// WithCluster returns an Env with a fresh database and its Redis
// namespace on the shared Redis Cluster.
func WithCluster(t testing.TB) *Env {
	t.Helper()
	e := NewCluster(t)
	e.newDatabase(t)
	return e
}

func (e *Env) openRedis(t testing.TB, rawURL, variable string) {
	t.Helper()
	e.RedisURL = rawURL
	rdb, topo, err := redisconn.Open(e.RedisURL)
	if err != nil {
		t.Fatalf("testenv: %s: %v", variable, err)
	}
	e.Redis = rdb
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.Redis.Ping(ctx).Err(); err != nil {
		e.Redis.Close()
		t.Fatalf("testenv: Redis (%s) unreachable: %v (run scripts/services.sh)", topo, err)
	}
	e.Namespace = "composer-t-" + randomHex(6)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		DeleteNamespace(ctx, e.Redis, e.Namespace)
		e.Redis.Close()
	})
}

// DeleteNamespace removes every key of a namespace (from every master of
// a cluster).
func DeleteNamespace(ctx context.Context, rdb redis.UniversalClient, ns string) {
	_ = ForEachMaster(ctx, rdb, func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, ns+":*", 500).Iterator()
		pipe := c.Pipeline()
		for iter.Next(ctx) {
			// One key per command: the keys of a batch belong to many slots.
			pipe.Unlink(ctx, iter.Val())
			if pipe.Len() == 500 {
				_, _ = pipe.Exec(ctx)
			}
		}
		if pipe.Len() > 0 {
			_, _ = pipe.Exec(ctx)
		}
		return iter.Err()
	})
}

// Keys lists the keys matching pattern on every master (KEYS on a cluster
// client asks one node only). For tests; production code never lists keys.
func Keys(ctx context.Context, rdb redis.UniversalClient, pattern string) ([]string, error) {
	var mu sync.Mutex
	var out []string
	err := ForEachMaster(ctx, rdb, func(ctx context.Context, c *redis.Client) error {
		keys, err := c.Keys(ctx, pattern).Result()
		mu.Lock()
		out = append(out, keys...)
		mu.Unlock()
		return err
	})
	sort.Strings(out)
	return out, err
}

// ForEachMaster calls fn with a client of every master (see
// redisconn.ForEachMaster).
func ForEachMaster(ctx context.Context, rdb redis.UniversalClient, fn func(context.Context, *redis.Client) error) error {
	return redisconn.ForEachMaster(ctx, rdb, fn)
}

// NewPrivateRedis starts a redis-server of the test's own on a free port
// (no persistence) and returns an Env whose Redis fields point at it: for
// tests that flush, restart or stop Redis without disturbing the others.
func NewPrivateRedis(t testing.TB) *Env {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("testenv: redis-server not found (run scripts/services.sh): %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: find a free port: %v", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatalf("testenv: start redis-server: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	e := &Env{RedisURL: fmt.Sprintf("redis://127.0.0.1:%d/0", port), Namespace: "composer-t-" + randomHex(6)}
	e.Redis = redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port)})
	t.Cleanup(func() { e.Redis.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for e.Redis.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("testenv: private redis-server on port %d did not start", port)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return e
}

// WithPrivateRedis returns an Env with a fresh database and a private Redis.
func WithPrivateRedis(t testing.TB) *Env {
	t.Helper()
	e := NewPrivateRedis(t)
	e.newDatabase(t)
	return e
}
