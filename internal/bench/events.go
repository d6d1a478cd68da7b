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

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/workers"
)

// EventIngest is the event-publishing scenario.
const EventIngest = "event-ingest"

// runEventIngest publishes `events` events through POST /v1/events from
// startClients concurrent clients with an events:write key, each event id
// sent three times (by different clients, interleaved), to a tenant with
// two workflows triggered by the event name (one noop step each). It
// measures unique events accepted per second, the publish round trip, and
// the latency from an event's first publish to its runs' first steps
// running; and it checks that exactly two runs were started per event.
func runEventIngest(ctx context.Context, o Options, rep *Report, events int) (Result, error) {
	var mu sync.Mutex
	firstStep := map[string]time.Time{} // event id -> first step of its runs to start
	e, err := setup(ctx, o, func(c *workers.Config) { c.Concurrency = 32 }, func(p *probe) map[string]workers.Executor {
		return map[string]workers.Executor{"noop": workers.ExecutorFunc(func(_ context.Context, t workers.Task) (json.RawMessage, error) {
			now := time.Now()
			var in struct{ Event struct{ ID string } }
			_ = json.Unmarshal(t.Input, &in)
			mu.Lock()
			if _, ok := firstStep[in.Event.ID]; !ok {
				firstStep[in.Event.ID] = now
			}
			mu.Unlock()
			return json.RawMessage(`{}`), nil
		})}
	})
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
	for _, name := range []string{"fulfil", "notify"} {
		if _, err := e.workflowFor(ctx, e.tenant, `{"name":"`+name+`","triggers":[{"event":"order.*"}],"nodes":[{"id":"n0","type":"noop"}]}`); err != nil {
			return Result{}, err
		}
	}
	key, err := e.apiKey(ctx, auth.ScopeEventsWrite)
	if err != nil {
		return Result{}, err
	}
	client := &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: startClients}}
	publish := func(id string, n int) (time.Duration, error) {
		body, _ := json.Marshal(map[string]any{"id": id, "name": "order.created", "payload": map[string]any{"order": n}})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.url+"/v1/events", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		t0 := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("POST /v1/events answered %d: %s", resp.StatusCode, data)
		}
		return time.Since(t0), nil
	}
	var lat []time.Duration
	firstPublish := make([]time.Time, events)
	var next atomic.Int64
	errc := make(chan error, startClients)
	t0 := time.Now()
	var wg sync.WaitGroup
	for range startClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < 3*events; i = int(next.Add(1) - 1) {
				n := i / 3 // each event three times, by consecutive picks of different clients
				at := time.Now()
				took, err := publish(fmt.Sprintf("e-%d", n), n)
				if err != nil {
					errc <- err
					return
				}
				mu.Lock()
				lat = append(lat, took)
				if firstPublish[n].IsZero() || at.Before(firstPublish[n]) {
					firstPublish[n] = at
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	took := time.Since(t0)
	close(errc)
	if err := <-errc; err != nil {
		return Result{}, err
	}
	// Every event's runs run their step.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		mu.Lock()
		n := len(firstStep)
		mu.Unlock()
		if n >= events {
			break
		}
		if time.Now().After(deadline) {
			return Result{}, fmt.Errorf("only %d of %d events' runs ran", n, events)
		}
		time.Sleep(50 * time.Millisecond) // a benchmark's poll, not a test's synchronisation
	}
	var runs, recorded int
	if err := e.deps.DB.System().QueryRow(ctx, `SELECT (SELECT count(*) FROM workflow_runs WHERE tenant_id = $1),
		(SELECT count(*) FROM events WHERE tenant_id = $1)`, e.tenant).Scan(&runs, &recorded); err != nil {
		return Result{}, err
	}
	if runs != 2*events || recorded != events {
		return Result{}, fmt.Errorf("%d events published 3 times each recorded %d events and started %d runs, want %d and %d",
			events, recorded, runs, events, 2*events)
	}
	var toStep []time.Duration
	mu.Lock()
	for i := range events {
		if s, ok := firstStep[fmt.Sprintf("e-%d", i)]; ok {
			toStep = append(toStep, s.Sub(firstPublish[i]))
		}
	}
	mu.Unlock()
	return Result{Scenario: EventIngest, Runs: runs, Seconds: took.Seconds(), RunLatency: percentiles(toStep),
		Extra: map[string]any{
			"events":                    events,
			"publishes":                 3 * events,
			"clients":                   startClients,
			"events_per_sec":            fmt.Sprintf("%.0f", float64(events)/took.Seconds()),
			"publishes_per_sec":         fmt.Sprintf("%.0f", float64(3*events)/took.Seconds()),
			"publish_round_trip":        percentiles(lat),
			"runs_started":              runs,
			"note":                      "run latency = an event's first publish to the first step of its runs running",
			"matching_workflows":        2,
			"each_id_published_n_times": 3,
		}}, nil
}
