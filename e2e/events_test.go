package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/sdk/client"
	"github.com/composer-dev/composer/tenants"
)

// TestAcceptedEventsSurviveASIGKILLedServer: publishers post events to a
// real `composer server` process, which is SIGKILLed mid-burst. Every
// event the server answered 200 for was recorded and started both of its
// workflows' runs; no event started a run twice, and no run exists without
// its event (a publish is one transaction). Then the same ids are
// published again to a second process: the ones already recorded start
// nothing more, the ones lost with the first process start their runs.
func TestAcceptedEventsSurviveASIGKILLedServer(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	sys := apptest.StartWith(t, env)
	ctx := context.Background()
	for _, name := range []string{"fulfil", "notify"} {
		sys.Workflow(`{"name":"` + name + `","triggers":[{"event":"order.*"}],"nodes":[{"id":"w","type":"wait","wait":{"signal":"go"}}]}`)
	}
	// A plan's start rate would refuse the burst: what is tested is what an
	// accepted event did.
	require.NoError(t, tenants.Update(ctx, sys.Deps.DB, sys.Tenant, tenants.UpdateParams{Limits: &tenants.Limits{StartsPerSecond: 100_000,
		StartBurst: 100_000, MaxQueuedTasks: 1_000_000}}))
	key := sys.APIKey(auth.ScopeEventsWrite)
	bin := apptest.Binary(t)
	addr := freeAddr(t)
	server := &proc{name: "server", args: []string{"server"}, env: append(sys.ProcessEnv(), "COMPOSER_HTTP_ADDR="+addr)}
	server.start(t, bin)
	defer server.kill()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: nil}}
	publish := func(base, id string) (int, error) {
		body, _ := json.Marshal(map[string]any{"id": id, "name": "order.created", "payload": map[string]any{"id": id}})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/events", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	apptest.Eventually(t, "the server to answer", 30*time.Second, func() bool {
		code, err := publish("http://"+addr, "warm-up")
		return err == nil && code == http.StatusOK
	})

	var mu sync.Mutex
	var accepted, sent []string
	var ok atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("e-%d-%d", g, i)
				mu.Lock()
				sent = append(sent, id)
				mu.Unlock()
				code, err := publish("http://"+addr, id)
				if err != nil {
					return // the server is gone
				}
				if code == http.StatusOK {
					ok.Add(1)
					mu.Lock()
					accepted = append(accepted, id)
					mu.Unlock()
				}
			}
		}()
	}
	apptest.Eventually(t, "a burst of accepted events", 60*time.Second, func() bool { return ok.Load() >= 150 })
	server.signal(9) // SIGKILL, mid-burst
	close(stop)
	wg.Wait()

	count := func(q string, args ...any) int {
		var n int
		require.NoError(t, env.System.QueryRow(ctx, q, args...).Scan(&n))
		return n
	}
	for _, id := range accepted {
		require.Equal(t, 2, count(`SELECT count(*) FROM event_runs r JOIN events e ON e.tenant_id = r.tenant_id AND e.id = r.event
			WHERE e.tenant_id = $1 AND e.event_id = $2 AND r.outcome = 'started'`, sys.Tenant, id), "accepted event %s started both runs", id)
	}
	events := count(`SELECT count(*) FROM events WHERE tenant_id = $1`, sys.Tenant)
	runs := count(`SELECT count(*) FROM workflow_runs WHERE tenant_id = $1`, sys.Tenant)
	assert.GreaterOrEqual(t, events, len(accepted)+1, "every accepted event is recorded (and the warm-up)")
	assert.Equal(t, 2*events, runs, "two runs per recorded event: none twice, none without its event")
	t.Logf("%d events accepted before the kill, %d recorded (some answers were lost with the process), %d runs", len(accepted), events, runs)

	// Publishing every id again, to a new process: nothing starts twice.
	addr2 := freeAddr(t)
	again := &proc{name: "server-2", args: []string{"server"}, env: append(sys.ProcessEnv(), "COMPOSER_HTTP_ADDR="+addr2)}
	again.start(t, bin)
	defer again.kill()
	apptest.Eventually(t, "the second server to answer", 30*time.Second, func() bool {
		code, err := publish("http://"+addr2, "warm-up")
		return err == nil && code == http.StatusOK
	})
	for _, id := range sent {
		code, err := publish("http://"+addr2, id)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code, id)
	}
	events = count(`SELECT count(*) FROM events WHERE tenant_id = $1`, sys.Tenant)
	assert.Equal(t, len(sent)+1, events, "every id sent is recorded once")
	assert.Equal(t, 2*events, count(`SELECT count(*) FROM workflow_runs WHERE tenant_id = $1`, sys.Tenant), "and started its two runs once")
}

// TestEventsResumeAndCancelRunsOfARealServer: a program holding an API key
// starts three runs of a real `composer server` that wait for their
// order's payment (and are cancelled by their order's cancellation),
// then publishes events with the SDK and over plain HTTP: the paid run
// completes with the event, the cancelled one is cancelled, the third
// still waits, and each event lists what it did.
func TestEventsResumeAndCancelRunsOfARealServer(t *testing.T) {
	t.Parallel()
	sys := apptest.StartWith(t, testenv.New(t))
	ctx := context.Background()
	base, c := startServer(t, sys, false)
	key := sys.APIKey(auth.ScopeAdmin)
	_, _, err := c.CreateWorkflow(ctx, "fulfil", json.RawMessage(`{
		"cancel_on": [{"event": "order.cancelled", "match": "event.payload.order == input.order"}],
		"output": {"paid": "nodes.paid.output.payload.amount"},
		"nodes": [{"id": "paid", "type": "wait", "wait": {"event": "order.paid", "match": "event.payload.order == input.order", "timeout": "1h"}}]}`))
	require.NoError(t, err)
	runs := map[string]string{}
	for _, order := range []string{"o-1", "o-2", "o-3"} {
		r, _, err := c.StartRun(ctx, client.Start{Workflow: "fulfil", Input: map[string]any{"order": order}})
		require.NoError(t, err)
		runs[order] = r.ID
	}

	ev, created, err := c.PublishEvent(ctx, "order.paid", map[string]any{"order": "o-1", "amount": 42}, "paid-o-1")
	require.NoError(t, err)
	require.True(t, created)
	require.Len(t, ev.Runs, 1)
	assert.Equal(t, client.EventRunOutcomeResumed, ev.Runs[0].Outcome)
	assert.Equal(t, runs["o-1"], *ev.Runs[0].RunId)
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	done, err := c.WaitRun(wctx, runs["o-1"])
	require.NoError(t, err)
	assert.Equal(t, "COMPLETED", done.Status)
	assert.JSONEq(t, `{"paid": 42}`, string(done.Output))

	// Over plain HTTP, as a system that cannot speak GraphQL.
	body, _ := json.Marshal(map[string]any{"id": "cancel-o-2", "name": "order.cancelled", "payload": map[string]any{"order": "o-2"}})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/events", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := (&http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: nil}}).Do(req)
	require.NoError(t, err)
	var answer struct {
		Event struct {
			Runs []struct {
				Outcome string
				RunID   string `json:"run_id"`
			}
		}
	}
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&answer))
	resp.Body.Close()
	require.Len(t, answer.Event.Runs, 1)
	assert.Equal(t, "cancelled", answer.Event.Runs[0].Outcome)
	assert.Equal(t, runs["o-2"], answer.Event.Runs[0].RunID)
	cancelled, err := c.GetRun(ctx, runs["o-2"])
	require.NoError(t, err)
	assert.Equal(t, "CANCELLED", cancelled.Status)

	waiting, err := c.GetRun(ctx, runs["o-3"])
	require.NoError(t, err)
	assert.Equal(t, "RUNNING", waiting.Status, "no event named its order")
	got, err := c.GetEvent(ctx, ev.Id)
	require.NoError(t, err)
	assert.Equal(t, ev.Runs, got.Runs, "the event lists the run it resumed")
}
