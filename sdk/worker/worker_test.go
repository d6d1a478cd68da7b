package worker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/sdk/worker"
)

type chargeIn struct {
	Amount   int    `json:"amount"`
	Currency string `json:"currency"`
}

type receipt struct {
	ID      string `json:"id"`
	Charged int    `json:"charged"`
	Attempt int    `json:"attempt"`
}

// TestTypedHandlersRunTaskNodes: a typed handler gets its node's input
// decoded and its output is the node's; the task's identity is in its
// context.
func TestTypedHandlersRunTaskNodes(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	sys.StartSDKWorker(func(w *worker.Worker) {
		worker.Handle(w, "charge", func(ctx context.Context, in chargeIn) (receipt, error) {
			tk, ok := worker.TaskFrom(ctx)
			if !ok {
				return receipt{}, errors.New("no task in the context")
			}
			return receipt{ID: tk.ID.String(), Charged: in.Amount, Attempt: tk.Attempt}, nil
		})
	}, apptest.SDKWorkerOptions{})
	wf := sys.Workflow(`{"nodes":[{"id":"pay","type":"task","task":{"handler":"charge"},"input":{"amount":"input.total * 2","currency":"'EUR'"}}]}`)
	run, tasks := sys.WaitRun(sys.StartRun(wf, `{"total": 21}`), 20*time.Second)
	require.Equal(t, "completed", run.Status, "error: %s", run.Error)
	assert.JSONEq(t, fmt.Sprintf(`{"id":%q,"charged":42,"attempt":1}`, tasks["pay"].ID), string(tasks["pay"].Output))
}

// TestHandlerErrorsFollowTheirKind: a plain error is retried, a panic is
// retried, Permanent fails at once, and input that does not fit the typed
// handler fails at once (retrying cannot fix it).
func TestHandlerErrorsFollowTheirKind(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	var flaky, panicky, permanent atomic.Int32
	sys.StartSDKWorker(func(w *worker.Worker) {
		w.HandleRaw("flaky", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			if flaky.Add(1) < 3 {
				return nil, errors.New("upstream down")
			}
			return json.RawMessage(`{"ok":true}`), nil
		})
		w.HandleRaw("panicky", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			if panicky.Add(1) == 1 {
				panic("boom")
			}
			return nil, nil
		})
		w.HandleRaw("permanent", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			permanent.Add(1)
			return nil, worker.Permanent(errors.New("card declined"))
		})
		worker.Handle(w, "typed", func(_ context.Context, in chargeIn) (receipt, error) { return receipt{}, nil })
	}, apptest.SDKWorkerOptions{})
	node := func(h string) string {
		return fmt.Sprintf(`{"nodes":[{"id":"n","type":"task","task":{"handler":%q},"retry":{"max_attempts":5,"backoff":"10ms"}}]}`, h)
	}
	run, tasks := sys.WaitRun(sys.StartRun(sys.Workflow(node("flaky")), `{}`), 20*time.Second)
	assert.Equal(t, "completed", run.Status)
	assert.Equal(t, 3, tasks["n"].Attempt)
	run, tasks = sys.WaitRun(sys.StartRun(sys.Workflow(node("panicky")), `{}`), 20*time.Second)
	assert.Equal(t, "completed", run.Status)
	assert.Equal(t, 2, tasks["n"].Attempt)
	assert.Contains(t, string(tasks["n"].LastError), "panic")
	run, tasks = sys.WaitRun(sys.StartRun(sys.Workflow(node("permanent")), `{}`), 20*time.Second)
	assert.Equal(t, "failed", run.Status)
	assert.Equal(t, 1, tasks["n"].Attempt)
	assert.EqualValues(t, 1, permanent.Load())
	typed := `{"nodes":[{"id":"n","type":"task","task":{"handler":"typed"},"input":{"amount":"'not a number'"},"retry":{"max_attempts":5}}]}`
	run, tasks = sys.WaitRun(sys.StartRun(sys.Workflow(typed), `{}`), 20*time.Second)
	assert.Equal(t, "failed", run.Status)
	assert.Equal(t, 1, tasks["n"].Attempt)
	assert.Contains(t, string(tasks["n"].LastError), "bad_input")
}

// TestLeaseLostCancelsTheHandler: cancelling a run makes the next
// heartbeat answer "lost", which cancels the running handler's context
// with ErrLeaseLost.
func TestLeaseLostCancelsTheHandler(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	started := make(chan struct{}, 1)
	cause := make(chan error, 1)
	sys.StartSDKWorker(func(w *worker.Worker) {
		w.HandleRaw("long", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			started <- struct{}{}
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return nil, ctx.Err()
		})
	}, apptest.SDKWorkerOptions{})
	run := sys.StartRun(sys.Workflow(`{"nodes":[{"id":"l","type":"task","task":{"handler":"long"}}]}`), `{}`)
	<-started
	_, err := sys.Coordinator().CancelRun(context.Background(), sys.Tenant, run, "stop")
	require.NoError(t, err)
	select {
	case c := <-cause:
		assert.ErrorIs(t, c, worker.ErrLeaseLost)
	case <-time.After(10 * time.Second):
		t.Fatal("the handler was not cancelled")
	}
}

// TestShutdownDrainsThenReportsWhatItCancels: stopping a worker lets a
// running handler finish and report; one still running at the deadline is
// cancelled with ErrShutdown and reported as retryable, so it runs again
// at once rather than after its lease.
func TestShutdownDrainsThenReportsWhatItCancels(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	started := make(chan string, 2)
	_, stop, _ := sys.StartSDKWorker(func(w *worker.Worker) {
		w.HandleRaw("quick", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			started <- "quick"
			time.Sleep(200 * time.Millisecond)
			return json.RawMessage(`{"finished":true}`), nil
		})
		w.HandleRaw("stuck", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			started <- "stuck"
			<-ctx.Done()
			return nil, ctx.Err()
		})
	}, apptest.SDKWorkerOptions{Options: func(o *worker.Options) {
		o.ShutdownTimeout = 500 * time.Millisecond
		o.LeaseTTL = time.Minute // the lease would outlast the test: only the report can requeue it
	}})
	quick := sys.StartRun(sys.Workflow(`{"nodes":[{"id":"q","type":"task","task":{"handler":"quick"}}]}`), `{}`)
	stuck := sys.StartRun(sys.Workflow(`{"nodes":[{"id":"s","type":"task","task":{"handler":"stuck"},"retry":{"max_attempts":3}}]}`), `{}`)
	<-started
	<-started
	stop()
	got, _ := sys.Run(quick)
	assert.Equal(t, "completed", got.Status, "the running handler finished and reported before the worker exited")
	_, tasks := sys.Run(stuck)
	assert.Equal(t, "pending", tasks["s"].State, "the cancelled attempt was reported")
	assert.Equal(t, 2, tasks["s"].Attempt)
	assert.Contains(t, string(tasks["s"].LastError), "worker_shutdown")
}

// TestRevokedKeyStopsTheWorker: revoking the worker's key (through the
// API, as a tenant's admin does) stops the worker within a heartbeat
// interval with ErrUnauthorized, and its running task goes back to the
// queue at once — another worker finishes it well before the revoked
// worker's lease would have expired.
func TestRevokedKeyStopsTheWorker(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	const ttl = 6 * time.Second
	key := sys.APIKey(auth.ScopeWorker)
	started := make(chan struct{}, 1)
	_, _, done := sys.StartSDKWorker(func(w *worker.Worker) {
		w.HandleRaw("work", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			started <- struct{}{}
			<-ctx.Done()
			return nil, ctx.Err()
		})
	}, apptest.SDKWorkerOptions{Key: key, Options: func(o *worker.Options) { o.LeaseTTL = ttl }})
	run := sys.StartRun(sys.Workflow(`{"nodes":[{"id":"t","type":"task","task":{"handler":"work"},"retry":{"max_attempts":3}}]}`), `{}`)
	<-started

	admin := sys.APIKey(auth.ScopeAdmin)
	var keys struct {
		APIKeys []struct{ ID, KeyID string } `json:"apiKeys"`
	}
	sys.GraphQL(admin, `{ apiKeys { id keyId } }`, nil).Decode(t, &keys)
	var id string
	for _, k := range keys.APIKeys {
		if strings.Contains(key, "_"+k.KeyID+"_") {
			id = k.ID
		}
	}
	require.NotEmpty(t, id)
	revoked := time.Now()
	res := sys.GraphQL(admin, `mutation($id: ID!) { revokeApiKey(id: $id) { revokedAt } }`, map[string]any{"id": id})
	require.Empty(t, res.Errors)
	select {
	case err := <-done:
		assert.ErrorIs(t, err, worker.ErrUnauthorized)
		assert.Less(t, time.Since(revoked), ttl/3+2*time.Second, "stopped within a heartbeat interval")
	case <-time.After(20 * time.Second):
		t.Fatal("the worker kept running with a revoked key")
	}
	sys.StartSDKWorker(func(w *worker.Worker) {
		w.HandleRaw("work", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			return json.RawMessage(`{"by":"second"}`), nil
		})
	}, apptest.SDKWorkerOptions{})
	got, tasks := sys.WaitRun(run, 20*time.Second)
	require.Equal(t, "completed", got.Status)
	assert.Less(t, time.Since(revoked), ttl, "the task came back before the revoked worker's lease would have expired")
	assert.Equal(t, 2, tasks["t"].Attempt, "the revoked worker's attempt went back to the queue")
	assert.JSONEq(t, `{"by":"second"}`, string(tasks["t"].Output))
}

// TestKeyWithoutWorkerScopeIsRefused: Run stops at once with a clear error.
func TestKeyWithoutWorkerScopeIsRefused(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	_, _, done := sys.StartSDKWorker(func(w *worker.Worker) {
		w.HandleRaw("work", func(context.Context, json.RawMessage) (json.RawMessage, error) { return nil, nil })
	}, apptest.SDKWorkerOptions{Key: sys.APIKey(auth.ScopeRunsRead, auth.ScopeRunsWrite)})
	select {
	case err := <-done:
		assert.ErrorIs(t, err, worker.ErrUnauthorized)
		assert.Contains(t, err.Error(), "worker scope")
	case <-time.After(10 * time.Second):
		t.Fatal("the worker did not stop")
	}
}

// losingTransport loses the first poll answer that carries leases: the
// server answered, the worker never heard.
type losingTransport struct {
	base http.RoundTripper
	lost atomic.Int32
}

func (l *losingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := l.base.RoundTrip(r)
	if err != nil || !strings.HasSuffix(r.URL.Path, "/poll") {
		return resp, err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if bytes.Contains(body, []byte(`"acquired":true`)) && l.lost.CompareAndSwap(0, 1) {
		return nil, errors.New("connection reset by peer")
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return resp, nil
}

// TestLostPollAnswerIsRecovered: the answer carrying a lease is lost; the
// worker repeats its poll, gets the same lease back, and runs the task on
// its first attempt — the only one its node allows.
func TestLostPollAnswerIsRecovered(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	tr := &losingTransport{base: http.DefaultTransport}
	var runs atomic.Int32
	sys.StartSDKWorker(func(w *worker.Worker) {
		w.HandleRaw("once", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			runs.Add(1)
			return json.RawMessage(`{}`), nil
		})
	}, apptest.SDKWorkerOptions{Options: func(o *worker.Options) {
		o.HTTPClient = &http.Client{Transport: tr}
		o.LeaseTTL = time.Minute // recovery must not come from the lease expiring
	}})
	run, tasks := sys.WaitRun(sys.StartRun(sys.Workflow(`{"nodes":[{"id":"t","type":"task","task":{"handler":"once"},"retry":{"max_attempts":1}}]}`), `{}`), 20*time.Second)
	require.Equal(t, "completed", run.Status, "error: %s", run.Error)
	assert.EqualValues(t, 1, tr.lost.Load(), "an answer was lost")
	assert.Equal(t, 1, tasks["t"].Attempt)
	assert.EqualValues(t, 1, runs.Load())
}

// TestChainRunsThroughEagerHandOffs: a chain of task steps completes with
// every output flowing to the next step, each step executed once.
func TestChainRunsThroughEagerHandOffs(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	var mu sync.Mutex
	calls := map[string]int{}
	sys.StartSDKWorker(func(w *worker.Worker) {
		worker.Handle(w, "inc", func(ctx context.Context, in struct{ N int }) (struct{ N int }, error) {
			tk, _ := worker.TaskFrom(ctx)
			mu.Lock()
			calls[tk.Run.String()+"/"+tk.NodeID]++
			mu.Unlock()
			return struct{ N int }{in.N + 1}, nil
		})
	}, apptest.SDKWorkerOptions{})
	def := `{"nodes":[{"id":"s0","type":"task","task":{"handler":"inc"}}`
	for i := 1; i < 20; i++ {
		def += fmt.Sprintf(`,{"id":"s%d","type":"task","task":{"handler":"inc"},"depends_on":["s%d"],"input":{"N":"nodes.s%d.output.N"}}`, i, i-1, i-1)
	}
	wf := sys.Workflow(def + `]}`)
	var ids []uuid.UUID
	for range 4 {
		ids = append(ids, sys.StartRun(wf, `{}`))
	}
	for _, id := range ids {
		run, _ := sys.WaitRun(id, 30*time.Second)
		require.Equal(t, "completed", run.Status)
		assert.JSONEq(t, `{"s19":{"N":20}}`, string(run.Output))
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, calls, 80)
	for k, n := range calls {
		assert.Equal(t, 1, n, "%s executed once", k)
	}
}

func TestRegistrationMistakesPanic(t *testing.T) {
	w, err := worker.New("http://127.0.0.1:1", "cmp_x", worker.Options{NoSignals: true})
	require.NoError(t, err)
	noop := func(context.Context, json.RawMessage) (json.RawMessage, error) { return nil, nil }
	assert.Panics(t, func() { w.HandleRaw("bad-name", noop) })
	w.HandleRaw("ok", noop)
	assert.Panics(t, func() { w.HandleRaw("ok", noop) }, "twice")
	_, err = worker.New("127.0.0.1:8080", "cmp_x", worker.Options{})
	assert.ErrorContains(t, err, "must start with https://")
	_, err = worker.New("https://x", "secret", worker.Options{})
	assert.ErrorContains(t, err, "cmp_")
	empty, err := worker.New("http://127.0.0.1:1", "cmp_x", worker.Options{NoSignals: true})
	require.NoError(t, err)
	assert.ErrorContains(t, empty.Run(context.Background()), "register at least one handler")
}

// TestACompletedTaskIsNoLostLease: a heartbeat sent while the task runs is
// answered after the task's success was reported — the server no longer
// holds the lease, because the task is done. The worker does not take
// that for a lost lease: no "lease lost" is logged and the run completes.
// The test's transport holds the heartbeat until the report's answer
// arrived, so the race happens every time.
func TestACompletedTaskIsNoLostLease(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	renewSent := make(chan struct{})
	reported := make(chan struct{})
	answered := make(chan []bool, 1)
	var sentOnce, reportedOnce sync.Once
	transport := roundTrip(func(r *http.Request) (*http.Response, error) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/tasks/renew"):
			sentOnce.Do(func() { close(renewSent) })
			select {
			case <-reported:
			case <-r.Context().Done():
				return nil, r.Context().Err()
			}
			resp, err := http.DefaultTransport.RoundTrip(r)
			if err != nil {
				return resp, err
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			resp.Body = io.NopCloser(bytes.NewReader(body))
			var out struct{ Leases []struct{ Held bool } }
			if json.Unmarshal(body, &out) == nil && err == nil {
				held := make([]bool, len(out.Leases))
				for i, l := range out.Leases {
					held[i] = l.Held
				}
				select {
				case answered <- held:
				default:
				}
			}
			return resp, err
		case strings.HasSuffix(r.URL.Path, "/tasks/complete"):
			resp, err := http.DefaultTransport.RoundTrip(r)
			if err == nil {
				reportedOnce.Do(func() { close(reported) })
			}
			return resp, err
		}
		return http.DefaultTransport.RoundTrip(r)
	})
	logs := &logged{}
	_, stop, _ := sys.StartSDKWorker(func(w *worker.Worker) {
		w.HandleRaw("quick", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			<-renewSent // a heartbeat for this task is on its way
			return json.RawMessage(`{"ok": true}`), nil
		})
	}, apptest.SDKWorkerOptions{Options: func(o *worker.Options) {
		o.LeaseTTL = 3 * time.Second // a heartbeat every second, each given a second
		o.HTTPClient = &http.Client{Transport: transport}
		o.Logger = slog.New(logs)
	}})
	run, _ := sys.WaitRun(sys.StartRun(sys.Workflow(`{"nodes":[{"id":"q","type":"task","task":{"handler":"quick"}}]}`), `{}`), 20*time.Second)
	require.Equal(t, "completed", run.Status)
	var held []bool
	select {
	case held = <-answered:
	case <-time.After(20 * time.Second):
		t.Fatal("the held heartbeat was never answered")
	}
	assert.Equal(t, []bool{false}, held, "the heartbeat was answered after the task was done")
	stop() // the renew loop has handled the answer once Run returned
	assert.Contains(t, logs.messages(), "worker stopped")
	assert.NotContains(t, logs.messages(), "lease lost")
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// logged is a slog handler keeping the messages the worker logged (safe
// for its goroutines).
type logged struct {
	mu  sync.Mutex
	msg []string
}

func (l *logged) Enabled(context.Context, slog.Level) bool { return true }
func (l *logged) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logged) WithGroup(string) slog.Handler            { return l }

func (l *logged) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msg = append(l.msg, r.Message)
	return nil
}

func (l *logged) messages() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.msg...)
}
