package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/composer-dev/composer/auth"
)

// StartThroughput is the concurrent-start scenario.
const StartThroughput = "start-throughput"

// startClients is how many API clients start runs at once.
const startClients = 32

// runStartThroughput starts `starts` runs through GraphQL's startRun, from
// startClients concurrent HTTP clients authenticated by an API key, each
// start with an idempotency key, on a tenant whose admission (start rate,
// queued-task limit, spend cap) and metering are on, with limits set high
// enough not to refuse: what is measured is what a start costs, not the
// plan. The workflow's first node waits for a signal, so the workers have
// nothing to run and the starts have the machine. Reported: starts per
// second and the latency of one start (the HTTP round trip).
func runStartThroughput(ctx context.Context, o Options, rep *Report, starts int) (Result, error) {
	e, err := setup(ctx, o, nil, nil)
	if err != nil {
		return Result{}, err
	}
	defer e.stop()
	if rep.Machine.CPUs == 0 {
		rep.Machine = machine(ctx, e)
	}
	if err := e.unlimitedStarts(ctx); err != nil {
		return Result{}, err
	}
	wf, err := e.workflow(ctx, `{"nodes":[{"id":"w","type":"wait","wait":{"signal":"go","timeout":"1h"}}]}`)
	if err != nil {
		return Result{}, err
	}
	key, err := e.apiKey(ctx, auth.ScopeRunsWrite)
	if err != nil {
		return Result{}, err
	}
	client := &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: startClients}}
	const mutation = `mutation($in: StartRunInput!) { startRun(input: $in) { run { id status } } }`
	start := func(idem string) (time.Duration, error) {
		body, _ := json.Marshal(map[string]any{"query": mutation, "variables": map[string]any{"in": map[string]any{
			"workflowId": wf.String(), "input": map[string]any{"order": idem}, "idempotencyKey": idem}}})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.url+"/graphql", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		t0 := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		took := time.Since(t0)
		if err != nil {
			return 0, err
		}
		var out struct {
			Data struct {
				StartRun struct{ Run struct{ ID, Status string } }
			}
			Errors []any
		}
		if err := json.Unmarshal(data, &out); err != nil || len(out.Errors) > 0 || out.Data.StartRun.Run.ID == "" {
			return 0, fmt.Errorf("startRun answered %d: %s", resp.StatusCode, data)
		}
		return took, nil
	}
	drive := func(total int) ([]time.Duration, time.Duration, error) {
		var mu sync.Mutex
		var lat []time.Duration
		var next atomic.Int64
		errc := make(chan error, startClients)
		t0 := time.Now()
		var wg sync.WaitGroup
		for range startClients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(total) {
					took, err := start(uuid.NewString())
					if err != nil {
						errc <- err
						return
					}
					mu.Lock()
					lat = append(lat, took)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		close(errc)
		return lat, time.Since(t0), <-errc
	}
	if _, _, err := drive(startClients * 4); err != nil { // warm up
		return Result{}, err
	}
	before, err := e.counters(ctx)
	if err != nil {
		return Result{}, err
	}
	cpu0 := cpuTime()
	lat, took, err := drive(starts)
	if err != nil {
		return Result{}, err
	}
	cpu := cpuTime() - cpu0
	r := Result{Scenario: StartThroughput, Runs: starts, Seconds: took.Seconds(), RunLatency: percentiles(lat),
		Extra: map[string]any{"starts_per_sec": fmt.Sprintf("%.0f", float64(starts)/took.Seconds()), "clients": startClients,
			"note":                    "run latency = HTTP round trip of one startRun (API key, idempotency key, admission, metering)",
			"server_cpu_ms_per_start": fmt.Sprintf("%.2f", float64(cpu.Microseconds())/1000/float64(starts))}}
	if err := e.cost(ctx, before, starts, &r); err != nil {
		return Result{}, err
	}
	r.Extra["pg_commits_per_start"] = fmt.Sprintf("%.2f", r.CommitsPerStep)
	r.Extra["wal_bytes_per_start"] = fmt.Sprintf("%.0f", r.WALBytesPerStep)
	r.Extra["redis_commands_per_start"] = fmt.Sprintf("%.2f", r.RedisCmdsPerStep)
	r.CommitsPerStep, r.WALBytesPerStep, r.RedisCmdsPerStep = 0, 0, 0
	return r, nil
}
