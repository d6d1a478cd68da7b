package workers_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/engine/stream"
	"github.com/composer-dev/composer/engine/taskapi"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/tenants"
	"github.com/composer-dev/composer/workers"
)

// sink is an HTTP endpoint that records every request.
type sink struct {
	mu   sync.Mutex
	reqs []sinkReq
}

type sinkReq struct {
	Path, Method, IdempotencyKey, Attempt string
	Body                                  map[string]any
}

func (s *sink) record(r *http.Request) sinkReq {
	body, _ := io.ReadAll(r.Body)
	var m map[string]any
	_ = json.Unmarshal(body, &m)
	req := sinkReq{Path: r.URL.Path, Method: r.Method, IdempotencyKey: r.Header.Get("Idempotency-Key"), Attempt: r.Header.Get("Composer-Attempt"), Body: m}
	s.mu.Lock()
	s.reqs = append(s.reqs, req)
	s.mu.Unlock()
	return req
}

func (s *sink) requests() []sinkReq {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sinkReq(nil), s.reqs...)
}

func TestForkJoinOfHTTPStepsCompletes(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	rec := &sink{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := rec.record(r)
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/price":
			_, _ = fmt.Fprint(w, `{"amount": 21, "currency": "EUR"}`)
		case "/double":
			_, _ = fmt.Fprintf(w, `{"doubled": %v}`, req.Body["amount"].(float64)*2)
		default:
			_, _ = fmt.Fprint(w, `{"ok": true}`)
		}
	}))
	defer srv.Close()
	sys.StartWorker(apptest.WorkerOptions{})
	wf := sys.Workflow(fmt.Sprintf(`{"nodes":[
		{"id":"price","type":"http","http":{"method":"GET","url":"%[1]s/price"}},
		{"id":"double","type":"http","depends_on":["price"],"http":{"method":"POST","url":"%[1]s/double"},
		 "input":{"amount":"nodes.price.output.body.amount"}},
		{"id":"audit","type":"http","depends_on":["price"],"if":"nodes.price.output.body.currency == 'USD'",
		 "http":{"method":"POST","url":"%[1]s/audit"}},
		{"id":"report","type":"http","depends_on":["double","audit"],"http":{"method":"POST","url":"%[1]s/report"},
		 "input":{"total":"nodes.double.output.body.doubled","audited":"nodes.audit.status == 'completed'"}}],
		"output":{"total":"nodes.double.output.body.doubled"}}`, srv.URL))
	run, tasks := sys.WaitRun(sys.StartRun(wf, `{}`), 20*time.Second)
	require.Equal(t, "completed", run.Status, "error: %s", run.Error)
	assert.JSONEq(t, `{"total": 42}`, string(run.Output))
	assert.Equal(t, "skipped", tasks["audit"].State, "the if skipped the USD branch")
	assert.Equal(t, "completed", tasks["report"].State)
	assert.JSONEq(t, `{"total": 42, "audited": false}`, string(tasks["report"].Input))

	reqs := rec.requests()
	require.Len(t, reqs, 3, "price, double, report; audit never ran")
	for _, r := range reqs {
		var node string
		for n, tk := range tasks {
			if tk.ID.String() == r.IdempotencyKey {
				node = n
			}
		}
		assert.NotEmpty(t, node, "%s carried its task id as Idempotency-Key", r.Path)
		assert.Equal(t, "1", r.Attempt)
	}
}

// interceptAPI wraps the task API client to fail or observe some calls.
type interceptAPI struct {
	workers.TaskAPI
	failRenew   atomic.Bool
	failAcquire func(taskapi.Ref) bool
	completes   chan taskapi.ReportResponse
}

func (a *interceptAPI) Renew(ctx context.Context, r taskapi.RenewRequest) (taskapi.RenewResponse, error) {
	if a.failRenew.Load() {
		return taskapi.RenewResponse{}, errors.New("frozen: no renewal reaches the server")
	}
	return a.TaskAPI.Renew(ctx, r)
}

func (a *interceptAPI) Acquire(ctx context.Context, r taskapi.AcquireRequest) (taskapi.AcquireResponse, error) {
	if a.failAcquire != nil {
		for _, ref := range r.Leases {
			if a.failAcquire(ref) {
				return taskapi.AcquireResponse{}, errors.New("server unreachable")
			}
		}
	}
	return a.TaskAPI.Acquire(ctx, r)
}

func (a *interceptAPI) Complete(ctx context.Context, r taskapi.CompleteRequest) (taskapi.ReportResponse, error) {
	res, err := a.TaskAPI.Complete(ctx, r)
	if err == nil && a.completes != nil {
		a.completes <- res
	}
	return res, err
}

// TestZombieWorkerIsFencedOut: a worker stops renewing (as if paused) past
// its lease; the task goes to another worker as attempt 2; the first
// worker's late report for attempt 1 is rejected, and the run's result is
// the second worker's.
func TestZombieWorkerIsFencedOut(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	wf := sys.Workflow(`{"nodes":[{"id":"work","type":"noop","retry":{"max_attempts":3}}]}`)

	release := make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	started := make(chan struct{}, 1)
	zombie := workers.ExecutorFunc(func(ctx context.Context, t workers.Task) (json.RawMessage, error) {
		started <- struct{}{}
		<-release // the pause: it ignores its context, like a frozen process
		return json.RawMessage(`{"by": "zombie"}`), nil
	})
	api := &interceptAPI{TaskAPI: taskapi.NewClient(sys.URL, sys.Cfg.WorkerToken), completes: make(chan taskapi.ReportResponse, 1)}
	api.failRenew.Store(true)
	// One slot: the frozen attempt holds it, so the zombie takes nothing else.
	sys.StartWorker(apptest.WorkerOptions{Noop: zombie, API: api, Config: func(c *workers.Config) { c.Concurrency = 1 }})
	t.Cleanup(free) // runs before the worker's stop, which waits for the handler

	run := sys.StartRun(wf, `{}`)
	<-started
	healthy := workers.ExecutorFunc(func(ctx context.Context, t workers.Task) (json.RawMessage, error) {
		return json.RawMessage(fmt.Sprintf(`{"by": "healthy", "attempt": %d}`, t.Attempt)), nil
	})
	sys.StartWorker(apptest.WorkerOptions{Noop: healthy})
	got, tasks := sys.WaitRun(run, 20*time.Second)
	require.Equal(t, "completed", got.Status)
	assert.Equal(t, 2, tasks["work"].Attempt)
	assert.JSONEq(t, `{"by": "healthy", "attempt": 2}`, string(tasks["work"].Output))

	free() // the zombie wakes and reports attempt 1
	res := <-api.completes
	assert.True(t, res.Acknowledged)
	assert.True(t, res.Ignored, "the late report was fenced out")
	got, tasks = sys.Run(run)
	assert.JSONEq(t, `{"work": {"by": "healthy", "attempt": 2}}`, string(got.Output), "the result is the second worker's")
	assert.JSONEq(t, `{"by": "healthy", "attempt": 2}`, string(tasks["work"].Output))
}

// TestDuplicateMessageExecutesOnce delivers the same stream message twice,
// to two workers: the lease lets exactly one execute it.
func TestDuplicateMessageExecutesOnce(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	var runs atomic.Int32
	h := workers.ExecutorFunc(func(ctx context.Context, t workers.Task) (json.RawMessage, error) {
		runs.Add(1)
		time.Sleep(50 * time.Millisecond)
		return json.RawMessage(`{}`), nil
	})
	wf := sys.Workflow(`{"nodes":[{"id":"once","type":"noop"}]}`)
	run := sys.StartRun(wf, `{}`)

	// Wait for the enqueuer to publish, then publish a copy of the message.
	names := stream.NewNames(sys.Cfg.RedisNamespace)
	var key string
	var msg redis.XMessage
	apptest.Eventually(t, "the dispatch to reach a stream", 10*time.Second, func() bool {
		for _, k := range names.Streams(sys.Tenant, "default", 2) {
			if xs, _ := sys.Deps.Redis.XRange(ctx, k, "-", "+").Result(); len(xs) == 1 {
				key, msg = k, xs[0]
				return true
			}
		}
		return false
	})
	require.NoError(t, sys.Deps.Redis.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: msg.Values}).Err())

	for i := 0; i < 2; i++ {
		sys.StartWorker(apptest.WorkerOptions{Noop: h, Config: func(c *workers.Config) { c.Concurrency = 1 }})
	}
	got, _ := sys.WaitRun(run, 20*time.Second)
	require.Equal(t, "completed", got.Status)
	apptest.Eventually(t, "both copies to be acknowledged", 10*time.Second, func() bool {
		n, _ := sys.Deps.Redis.XLen(ctx, key).Result()
		return n == 0
	})
	assert.EqualValues(t, 1, runs.Load(), "the task executed once")
}

// TestKilledWorkerProcessTaskIsReclaimed runs `composer worker` as a real
// process, SIGKILLs it in the middle of an HTTP step, and checks the run
// still completes: the lease expires, the sweep re-dispatches attempt 2,
// another worker runs it with the same Idempotency-Key.
func TestKilledWorkerProcessTaskIsReclaimed(t *testing.T) {
	t.Parallel()
	bin := apptest.Binary(t)
	sys := apptest.Start(t)
	rec := &sink{}
	hang := make(chan struct{})
	first := make(chan struct{})
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.record(r)
		if calls.Add(1) == 1 {
			close(first)
			select { // the first attempt never finishes: its worker dies first
			case <-hang:
			case <-r.Context().Done():
			}
			return
		}
		_, _ = fmt.Fprint(w, `{"charged": true}`)
	}))
	defer srv.Close()
	defer close(hang) // before srv.Close, which waits for the hanging handler
	wf := sys.Workflow(fmt.Sprintf(`{"nodes":[{"id":"charge","type":"http","http":{"method":"POST","url":"%s/charge"}}]}`, srv.URL))
	run := sys.StartRun(wf, `{"amount": 10}`)

	cmd := exec.Command(bin, "worker", "--concurrency", "2")
	cmd.Env = sys.ProcessEnv()
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	select {
	case <-first:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("the worker process never called the step; its output:\n%s", out.String())
	}
	_, tasks := sys.Run(run)
	require.Equal(t, "running", tasks["charge"].State, "the process holds the lease")
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	err := cmd.Wait()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	require.True(t, exit.Sys().(syscall.WaitStatus).Signaled())

	sys.StartWorker(apptest.WorkerOptions{})
	got, tasks := sys.WaitRun(run, 30*time.Second)
	require.Equal(t, "completed", got.Status, "error: %s", got.Error)
	assert.Equal(t, 2, tasks["charge"].Attempt, "attempt 1 died with its worker")
	reqs := rec.requests()
	require.Len(t, reqs, 2)
	assert.Equal(t, reqs[0].IdempotencyKey, reqs[1].IdempotencyKey, "both attempts carry the task id")
	assert.Equal(t, tasks["charge"].ID.String(), reqs[1].IdempotencyKey)
	assert.Equal(t, []string{"1", "2"}, []string{reqs[0].Attempt, reqs[1].Attempt})
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	return len(p), nil
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// TestPoisonMessageBecomesAFailedAttempt: a message whose lease can never be
// acquired keeps coming back; past MaxDeliveries it is reported as a failed
// attempt, and the retry (a new message) runs.
func TestPoisonMessageBecomesAFailedAttempt(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	api := &interceptAPI{TaskAPI: taskapi.NewClient(sys.URL, sys.Cfg.WorkerToken),
		failAcquire: func(r taskapi.Ref) bool { return r.Attempt == 1 }}
	sys.StartWorker(apptest.WorkerOptions{API: api, Config: func(c *workers.Config) {
		c.ClaimIdle, c.MaxDeliveries = 300*time.Millisecond, 2
	}})
	wf := sys.Workflow(`{"nodes":[{"id":"n","type":"noop","retry":{"max_attempts":2,"no_jitter":true}}]}`)
	run := sys.StartRun(wf, `{}`)
	got, tasks := sys.WaitRun(run, 30*time.Second)
	require.Equal(t, "completed", got.Status, "error: %s", got.Error)
	assert.Equal(t, 2, tasks["n"].Attempt)
	var lastErr struct{ Code string }
	require.NoError(t, json.Unmarshal(tasks["n"].LastError, &lastErr))
	assert.Equal(t, "max_deliveries", lastErr.Code)
}

// TestGracefulShutdownFinishesRunningTasks stops a worker while a task runs:
// the worker stops reading, lets the task finish and report, then exits.
// TestShutdownDeadlineReportsWhatItCancels: a task still running when the
// shutdown deadline passes is cancelled and reported as a retryable
// failure before the worker exits, so it is retried at once, not after
// its lease expires.
func TestShutdownDeadlineReportsWhatItCancels(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	started := make(chan struct{}, 1)
	h := workers.ExecutorFunc(func(ctx context.Context, t workers.Task) (json.RawMessage, error) {
		started <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	})
	_, stop := sys.StartWorker(apptest.WorkerOptions{Noop: h, Config: func(c *workers.Config) {
		c.ShutdownTimeout = 200 * time.Millisecond
		c.LeaseTTL = time.Minute // the lease would outlast the test: only the report can requeue it
	}})
	run := sys.StartRun(sys.Workflow(`{"nodes":[{"id":"s","type":"noop","retry":{"max_attempts":3}}]}`), `{}`)
	<-started
	stop()
	got, tasks := sys.Run(run)
	assert.Equal(t, "running", got.Status)
	assert.Equal(t, "pending", tasks["s"].State, "the cancelled attempt was reported")
	assert.Equal(t, 2, tasks["s"].Attempt)
	assert.Contains(t, string(tasks["s"].LastError), "worker_shutdown")
}

func TestGracefulShutdownFinishesRunningTasks(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	started := make(chan struct{}, 1)
	h := workers.ExecutorFunc(func(ctx context.Context, t workers.Task) (json.RawMessage, error) {
		started <- struct{}{}
		time.Sleep(300 * time.Millisecond)
		return json.RawMessage(`{"finished": true}`), nil
	})
	_, stop := sys.StartWorker(apptest.WorkerOptions{Noop: h})
	run := sys.StartRun(sys.Workflow(`{"nodes":[{"id":"s","type":"noop"}]}`), `{}`)
	<-started
	stop() // returns only after the worker has exited
	got, tasks := sys.Run(run)
	assert.Equal(t, "completed", got.Status, "the in-flight task finished and reported before exit")
	assert.Equal(t, 1, tasks["s"].Attempt)
}

// TestLeaseLostCancelsTheExecution: cancelling the run makes the next
// renewal answer "lost", which cancels the running handler's context.
func TestLeaseLostCancelsTheExecution(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	started := make(chan struct{}, 1)
	cause := make(chan error, 1)
	h := workers.ExecutorFunc(func(ctx context.Context, t workers.Task) (json.RawMessage, error) {
		started <- struct{}{}
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return nil, ctx.Err()
	})
	sys.StartWorker(apptest.WorkerOptions{Noop: h})
	run := sys.StartRun(sys.Workflow(`{"nodes":[{"id":"l","type":"noop"}]}`), `{}`)
	<-started
	_, err := sys.Coordinator().CancelRun(context.Background(), sys.Tenant, run, "stop")
	require.NoError(t, err)
	select {
	case c := <-cause:
		assert.ErrorIs(t, c, workers.ErrLeaseLost)
	case <-time.After(10 * time.Second):
		t.Fatal("the execution was not cancelled")
	}
	got, tasks := sys.Run(run)
	assert.Equal(t, "cancelled", got.Status)
	assert.Equal(t, "cancelled", tasks["l"].State)
}

// TestOneSlotReadsEveryShard: with fewer free slots than shards, a read
// must go on to the other shards before concluding there is nothing to do
// (here idling would mean waiting an hour).
func TestOneSlotReadsEveryShard(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	tn, err := tenants.Create(ctx, sys.Deps.DB, tenants.CreateParams{Name: "eight-shards", StreamShards: 8})
	require.NoError(t, err)
	sys.StartWorker(apptest.WorkerOptions{Config: func(c *workers.Config) { c.Concurrency, c.IdlePoll = 1, time.Hour }})
	var nodes []string
	for i := 0; i < 10; i++ {
		dep := ""
		if i > 0 {
			dep = fmt.Sprintf(`,"depends_on":["n%d"]`, i-1)
		}
		nodes = append(nodes, fmt.Sprintf(`{"id":"n%d","type":"noop"%s}`, i, dep))
	}
	w, _, err := sys.Coordinator().CreateWorkflow(ctx, tn.ID, "chain", "", []byte(`{"nodes":[`+strings.Join(nodes, ",")+`]}`))
	require.NoError(t, err)
	res, err := sys.Coordinator().StartRun(ctx, tn.ID, engine.StartRun{WorkflowID: w.ID})
	require.NoError(t, err)
	sys.Tenant = tn.ID
	run, _ := sys.WaitRun(res.RunID, 15*time.Second)
	assert.Equal(t, "completed", run.Status)
}

// TestAFailingLeaseCallIsRetriedNotStranded: the server cannot be reached
// for the first lease calls of a task (its database restarting); the
// worker retries and runs the task within seconds — not after ClaimIdle
// (an hour here), which is when the message would otherwise come back.
func TestAFailingLeaseCallIsRetriedNotStranded(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	var calls atomic.Int32
	api := &interceptAPI{TaskAPI: taskapi.NewClient(sys.URL, sys.Cfg.WorkerToken),
		failAcquire: func(taskapi.Ref) bool { return calls.Add(1) <= 4 }}
	sys.StartWorker(apptest.WorkerOptions{API: api, Config: func(c *workers.Config) {
		c.ClaimIdle, c.LeaseTTL = time.Hour, 10*time.Second
	}})
	run := sys.StartRun(sys.Workflow(`{"nodes":[{"id":"n","type":"noop"}]}`), `{}`)
	got, tasks := sys.WaitRun(run, 15*time.Second)
	require.Equal(t, "completed", got.Status)
	assert.Equal(t, 1, tasks["n"].Attempt, "the same attempt ran once the server answered")
	assert.GreaterOrEqual(t, calls.Load(), int32(5), "the lease call was retried")
}

// TestAPersistentlyFailingLeaseCallPutsItsMessagesBack: when the lease
// call keeps failing for a whole lease TTL, the worker gives the messages
// back to their stream at once, and another worker runs the task long
// before the first one's ClaimIdle.
func TestAPersistentlyFailingLeaseCallPutsItsMessagesBack(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	broken := &interceptAPI{TaskAPI: taskapi.NewClient(sys.URL, sys.Cfg.WorkerToken), failAcquire: func(taskapi.Ref) bool { return true }}
	_, stopBroken := sys.StartWorker(apptest.WorkerOptions{API: broken, Config: func(c *workers.Config) {
		c.ClaimIdle, c.LeaseTTL = time.Hour, time.Second
	}})
	run := sys.StartRun(sys.Workflow(`{"nodes":[{"id":"n","type":"noop"}]}`), `{}`)
	// Let the broken worker take the message and give up on it.
	apptest.Eventually(t, "the broken worker to put the message back", 15*time.Second, func() bool {
		return sys.Logs.FilterMessageSnippet("the messages go back to their streams").Len() > 0
	})
	stopBroken()
	sys.StartWorker(apptest.WorkerOptions{Config: func(c *workers.Config) { c.ClaimIdle = time.Hour }})
	got, _ := sys.WaitRun(run, 15*time.Second)
	assert.Equal(t, "completed", got.Status, "a healthy worker read the put-back message")
}
