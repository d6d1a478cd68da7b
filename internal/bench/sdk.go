package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/sdk/worker"
)

// Scenarios of tenant workers: the SDK over the public API.
const (
	SDKChainsK1  = "sdk-chains-k1"
	SDKChainsK16 = "sdk-chains-k16"
	SDKIdle      = "sdk-idle-500"
)

func taskStep(int) string { return `"type":"task","task":{"handler":"step"}` }

// apiKey creates an API key of the benchmark tenant.
func (e *env) apiKey(ctx context.Context, scopes ...string) (string, error) {
	var plain string
	err := e.deps.DB.WithTenant(ctx, e.tenant, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		plain, _, err = auth.Keys{}.Create(ctx, tx, "bench", scopes, nil, "bench")
		return err
	})
	return plain, err
}

// startSDKWorker runs a tenant worker in this process against url: the SDK,
// over HTTP, with a worker key, as a tenant's program would. Its one
// handler notes when each step starts.
func (e *env) startSDKWorker(ctx context.Context, url, key string, concurrency int) (stop func(), err error) {
	w, err := worker.New(url, key, worker.Options{Concurrency: concurrency, NoSignals: true, LeaseTTL: 30 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return nil, err
	}
	w.HandleRaw("step", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
		if t, ok := worker.TaskFrom(ctx); ok {
			e.probe.started(t.Run, t.NodeID)
		}
		return json.RawMessage(`{}`), nil
	})
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(runCtx) }()
	return func() { cancel(); <-done }, nil
}

// runSDKIdle measures what connected idle tenant workers cost the server:
// a `composer server` process with no worker for a window, then with n
// SDK workers (in this process, each with its own API key) holding their
// polls, for the same window.
// Reported: the server process's CPU (from /proc) and the database
// transactions per second, in both phases, and per worker.
func runSDKIdle(ctx context.Context, o Options, rep *Report, n int, window time.Duration) (Result, error) {
	e, err := setupNoWorker(ctx, o)
	if err != nil {
		return Result{}, err
	}
	defer e.stop()
	if rep.Machine.CPUs == 0 {
		rep.Machine = machine(ctx, e)
	}
	url, pid, stopServer, err := e.serverProcess(ctx)
	if err != nil {
		return Result{}, err
	}
	defer stopServer()
	measure := func() (cpu float64, xacts float64, err error) {
		c0, err := processCPU(pid)
		if err != nil {
			return 0, 0, err
		}
		x0, err := e.transactions(ctx)
		if err != nil {
			return 0, 0, err
		}
		t0 := time.Now()
		time.Sleep(window)
		c1, err := processCPU(pid)
		if err != nil {
			return 0, 0, err
		}
		x1, err := e.transactions(ctx)
		if err != nil {
			return 0, 0, err
		}
		secs := time.Since(t0).Seconds()
		return (c1 - c0).Seconds() / secs, float64(x1-x0) / secs, nil
	}
	time.Sleep(5 * time.Second) // past start-up
	baseCPU, baseX, err := measure()
	if err != nil {
		return Result{}, err
	}
	var stops []func()
	defer func() {
		var wg sync.WaitGroup
		for _, s := range stops {
			wg.Add(1)
			go func() { defer wg.Done(); s() }()
		}
		wg.Wait()
	}()
	for range n {
		// A key each, as workers of different tenants would have: no
		// authentication is shared.
		key, err := e.apiKey(ctx, auth.ScopeWorker)
		if err != nil {
			return Result{}, err
		}
		s, err := e.startSDKWorker(ctx, url, key, 4)
		if err != nil {
			return Result{}, err
		}
		stops = append(stops, s)
	}
	time.Sleep(15 * time.Second) // every worker connected and polling
	cpu, x, err := measure()
	if err != nil {
		return Result{}, err
	}
	addCPU, addX := cpu-baseCPU, x-baseX
	return Result{Scenario: SDKIdle, Seconds: window.Seconds(), Extra: map[string]any{
		"workers":                      n,
		"server_cpu_no_workers":        fmt.Sprintf("%.2f%%", 100*baseCPU),
		"server_cpu_with_workers":      fmt.Sprintf("%.2f%%", 100*cpu),
		"server_cpu_added":             fmt.Sprintf("%.2f%% of one CPU", 100*addCPU),
		"pg_xacts_per_sec_no_workers":  fmt.Sprintf("%.1f", baseX),
		"pg_xacts_per_sec_with":        fmt.Sprintf("%.1f", x),
		"pg_xacts_per_sec_per_worker":  fmt.Sprintf("%.3f", addX/float64(n)),
		"poll_wait":                    "10s (LeaseTTL/3)",
		"server_cpu_added_per_worker":  fmt.Sprintf("%.4f%%", 100*addCPU/float64(n)),
		"measurement_window_s_each":    window.Seconds(),
		"server_is_a_separate_process": true,
	}}, nil
}

// transactions counts the benchmark database's committed and rolled-back
// transactions (every statement outside an explicit transaction is one).
func (e *env) transactions(ctx context.Context) (int64, error) {
	var n int64
	err := e.deps.DB.System().QueryRow(ctx, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()`).Scan(&n)
	return n, err
}

// serverProcess runs `composer server` (this binary) on the benchmark's
// database and namespace and returns its URL and pid.
func (e *env) serverProcess(ctx context.Context) (url string, pid int, stop func(), err error) {
	self, err := os.Executable()
	if err != nil {
		return "", 0, nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", 0, nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	c := e.cfg
	cmd := exec.Command(self, "server")
	cmd.Env = append(os.Environ(), "COMPOSER_DATABASE_URL="+c.DatabaseURL, "COMPOSER_SYSTEM_DATABASE_URL="+c.SystemDatabaseURL,
		"COMPOSER_REDIS_URL="+c.RedisURL, "COMPOSER_REDIS_NAMESPACE="+c.RedisNamespace, "COMPOSER_HTTP_ADDR="+addr,
		"COMPOSER_WORKER_TOKEN="+c.WorkerToken, "COMPOSER_LOG_LEVEL=error", "COMPOSER_ADMIN_ADDR=127.0.0.1:0")
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	if err := cmd.Start(); err != nil {
		return "", 0, nil, err
	}
	stop = func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	url = "http://" + addr
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return url, cmd.Process.Pid, stop, nil
			}
		}
		if time.Now().After(deadline) {
			stop()
			return "", 0, nil, fmt.Errorf("the server process did not become ready")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
