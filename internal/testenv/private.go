package testenv

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/composer-dev/composer/migrations"
)

// PrivatePG is a PostgreSQL server of one test's own — its own data
// directory and port — for tests that restart or crash PostgreSQL without
// disturbing the others.
type PrivatePG struct {
	t       testing.TB
	bin     string // directory of initdb, pg_ctl
	dir     string // data directory
	runAs   string // OS user the server runs as ("" = this one)
	Port    int
	logFile string
}

// RedisServer is a redis-server of one test's own (no persistence) that
// the test may kill, restart empty, freeze and thaw.
type RedisServer struct {
	t    testing.TB
	bin  string
	dir  string
	Port int

	mu  sync.Mutex
	cmd *exec.Cmd
}

// WithPrivateServices returns an Env on a PostgreSQL server and a Redis
// of the test's own, migrated and with Composer's roles, plus their
// handles.
func WithPrivateServices(t testing.TB) (*Env, *PrivatePG, *RedisServer) {
	t.Helper()
	pg := startPrivatePG(t)
	rs := startRedisServer(t)
	e := &Env{RedisURL: fmt.Sprintf("redis://127.0.0.1:%d/0", rs.Port), Namespace: "composer-t-" + randomHex(6)}
	e.Redis = redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", rs.Port)})
	t.Cleanup(func() { e.Redis.Close() })
	e.DBName = "composer"
	base := fmt.Sprintf("postgres://%%s:composer@127.0.0.1:%d/composer?sslmode=disable", pg.Port)
	e.OwnerURL, e.AppURL, e.SystemURL = fmt.Sprintf(base, "composer_owner"), fmt.Sprintf(base, "composer_app"), fmt.Sprintf(base, "composer_system")
	e.App = mustPool(t, e.AppURL)
	e.System = mustPool(t, e.SystemURL)
	t.Cleanup(e.App.Close)
	t.Cleanup(e.System.Close)
	return e, pg, rs
}

func pgBinDir() (string, error) {
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(found) == 0 {
		return "", fmt.Errorf("initdb not found (install postgresql: run scripts/services.sh)")
	}
	sort.Slice(found, func(i, j int) bool { return versionOf(found[i]) < versionOf(found[j]) })
	return filepath.Dir(found[len(found)-1]), nil
}

func versionOf(p string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(p))))
	return v
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: find a free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func startPrivatePG(t testing.TB) *PrivatePG {
	t.Helper()
	bin, err := pgBinDir()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	root, err := os.MkdirTemp("", "composer-pg-")
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	pg := &PrivatePG{t: t, bin: bin, dir: filepath.Join(root, "data"), Port: freePort(t), logFile: filepath.Join(root, "postgres.log")}
	// PostgreSQL refuses to run as root: then it runs as the postgres user.
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("testenv: running as root and there is no postgres user to run a private PostgreSQL as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(root, uid, gid); err != nil {
			t.Fatalf("testenv: %v", err)
		}
		pg.runAs = "postgres"
	}
	t.Cleanup(func() {
		_ = pg.ctl("stop", "-m", "immediate")
		_ = os.RemoveAll(root)
	})
	if out, err := pg.command(filepath.Join(bin, "initdb"), "-D", pg.dir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync").CombinedOutput(); err != nil {
		t.Fatalf("testenv: initdb: %v\n%s", err, out)
	}
	// fsync off is safe for a crash of PostgreSQL alone (the OS keeps what
	// was written); commits stay synchronous, so an immediate restart
	// keeps every acknowledged commit, as in production.
	conf := fmt.Sprintf("port = %d\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\nfsync = off\nfull_page_writes = off\nmax_connections = 200\n", pg.Port, root)
	f, err := os.OpenFile(filepath.Join(pg.dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	_, _ = f.WriteString(conf)
	f.Close()
	if err := pg.ctl("start"); err != nil {
		t.Fatalf("testenv: start private PostgreSQL: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	super, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", pg.Port))
	if err != nil {
		t.Fatalf("testenv: connect to private PostgreSQL: %v", err)
	}
	defer super.Close(ctx)
	for _, stmt := range []string{
		`CREATE ROLE composer_owner LOGIN CREATEDB NOSUPERUSER NOBYPASSRLS PASSWORD 'composer'`,
		`CREATE ROLE composer_app LOGIN NOCREATEDB NOSUPERUSER NOBYPASSRLS PASSWORD 'composer'`,
		`CREATE ROLE composer_system LOGIN NOCREATEDB NOSUPERUSER BYPASSRLS PASSWORD 'composer'`,
		`CREATE DATABASE composer OWNER composer_owner`,
	} {
		if _, err := super.Exec(ctx, stmt); err != nil {
			t.Fatalf("testenv: private PostgreSQL: %s: %v", stmt, err)
		}
	}
	db, err := sql.Open("pgx", fmt.Sprintf("postgres://composer_owner:composer@127.0.0.1:%d/composer?sslmode=disable", pg.Port))
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	defer db.Close()
	if _, err := migrations.Up(ctx, db); err != nil {
		t.Fatalf("testenv: migrate private PostgreSQL: %v", err)
	}
	return pg
}

func (pg *PrivatePG) command(name string, args ...string) *exec.Cmd {
	if pg.runAs == "" {
		return exec.Command(name, args...)
	}
	return exec.Command("runuser", append([]string{"-u", pg.runAs, "--", name}, args...)...)
}

func (pg *PrivatePG) ctl(args ...string) error {
	args = append(args, "-D", pg.dir, "-l", pg.logFile, "-w", "-t", "60")
	if out, err := pg.command(filepath.Join(pg.bin, "pg_ctl"), args...).CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl %s: %v\n%s", args[0], err, out)
	}
	return nil
}

// RestartImmediate crashes the server (pg_ctl restart -m immediate: no
// checkpoint, crash recovery at start) and returns once it accepts
// connections again.
func (pg *PrivatePG) RestartImmediate() {
	pg.t.Helper()
	if err := pg.ctl("restart", "-m", "immediate"); err != nil {
		pg.t.Fatalf("testenv: %v", err)
	}
}

func startRedisServer(t testing.TB) *RedisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("testenv: redis-server not found (run scripts/services.sh): %v", err)
	}
	rs := &RedisServer{t: t, bin: bin, dir: t.TempDir(), Port: freePort(t)}
	rs.Start()
	t.Cleanup(func() {
		rs.mu.Lock()
		defer rs.mu.Unlock()
		if rs.cmd != nil {
			_ = rs.cmd.Process.Signal(syscall.SIGCONT)
			_ = rs.cmd.Process.Kill()
			_ = rs.cmd.Wait()
		}
	})
	return rs
}

// Start starts the server (empty: it keeps nothing on disk) and returns
// once it answers.
func (rs *RedisServer) Start() {
	rs.t.Helper()
	rs.mu.Lock()
	defer rs.mu.Unlock()
	cmd := exec.Command(rs.bin, "--port", strconv.Itoa(rs.Port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", rs.dir)
	if err := cmd.Start(); err != nil {
		rs.t.Fatalf("testenv: start redis-server: %v", err)
	}
	rs.cmd = cmd
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", rs.Port)})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			rs.t.Fatalf("testenv: redis-server on port %d did not start", rs.Port)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill SIGKILLs the server: everything it held is gone.
func (rs *RedisServer) Kill() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	_ = rs.cmd.Process.Signal(syscall.SIGCONT)
	_ = rs.cmd.Process.Kill()
	_ = rs.cmd.Wait()
	rs.cmd = nil
}

// Freeze stops the server (SIGSTOP): connections stay open, nothing is
// answered. Thaw resumes it.
func (rs *RedisServer) Freeze() { rs.signal(syscall.SIGSTOP) }

// Thaw resumes a frozen server (SIGCONT).
func (rs *RedisServer) Thaw() { rs.signal(syscall.SIGCONT) }

func (rs *RedisServer) signal(s syscall.Signal) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.cmd != nil {
		_ = rs.cmd.Process.Signal(s)
	}
}
