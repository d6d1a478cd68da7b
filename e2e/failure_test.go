package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/engine/dag"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/config"
	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/sdk/worker"
)

func errCode(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var e struct {
		Code    string          `json:"code"`
		Details json.RawMessage `json:"details"`
	}
	require.NoError(t, json.Unmarshal(raw, &e), "error document %s", raw)
	if e.Code == "node_failed" && len(e.Details) > 0 {
		return errCode(t, e.Details)
	}
	return e.Code
}

func TestRetriesBackOffUntilSuccess(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	var mu sync.Mutex
	var starts []time.Time
	sys.StartSDKWorker(func(w *worker.Worker) {
		w.HandleRaw("flaky", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			mu.Lock()
			starts = append(starts, time.Now())
			mu.Unlock()
			if tk, _ := worker.TaskFrom(ctx); tk.Attempt < 3 {
				return nil, worker.Errorf("upstream_down", true, "attempt %d failed", tk.Attempt)
			}
			return json.RawMessage(`{"ok": true}`), nil
		})
	}, apptest.SDKWorkerOptions{})
	wf := sys.Workflow(`{"nodes":[{"id":"f","type":"task","task":{"handler":"flaky"},
		"retry":{"max_attempts":5,"backoff":"300ms","max_backoff":"10s","no_jitter":true}}]}`)
	run, tasks := sys.WaitRun(sys.StartRun(wf, `{}`), 20*time.Second)
	require.Equal(t, "completed", run.Status)
	assert.Equal(t, 3, tasks["f"].Attempt)
	require.Len(t, starts, 3)
	assert.GreaterOrEqual(t, starts[1].Sub(starts[0]), 300*time.Millisecond, "first retry waits its backoff")
	assert.GreaterOrEqual(t, starts[2].Sub(starts[1]), 600*time.Millisecond, "the backoff doubles")
}

func TestNonRetryableFailureFailsAtOnce(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	var calls atomic.Int32
	sys.StartSDKWorker(func(w *worker.Worker) {
		w.HandleRaw("bad", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			calls.Add(1)
			return nil, worker.Errorf("invalid_card", false, "the card was declined")
		})
	}, apptest.SDKWorkerOptions{})
	wf := sys.Workflow(`{"nodes":[{"id":"pay","type":"task","task":{"handler":"bad"},"retry":{"max_attempts":5}},
		{"id":"after","type":"noop","depends_on":["pay"]}]}`)
	run, tasks := sys.WaitRun(sys.StartRun(wf, `{}`), 20*time.Second)
	require.Equal(t, "failed", run.Status)
	assert.Equal(t, "invalid_card", errCode(t, run.Error))
	assert.EqualValues(t, 1, calls.Load())
	assert.Equal(t, "failed", tasks["pay"].State)
	_, created := tasks["after"]
	assert.False(t, created, "nothing runs after a failure")
}

func TestExecutionTimeoutIsAFailedAttempt(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	sys.StartSDKWorker(func(w *worker.Worker) {
		w.HandleRaw("hang", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		})
	}, apptest.SDKWorkerOptions{})
	wf := sys.Workflow(`{"nodes":[{"id":"h","type":"task","task":{"handler":"hang"},"timeout":"200ms","retry":{"max_attempts":2,"backoff":"10ms"}}]}`)
	run, tasks := sys.WaitRun(sys.StartRun(wf, `{}`), 20*time.Second)
	require.Equal(t, "failed", run.Status)
	assert.Equal(t, "execution_timeout", errCode(t, run.Error))
	assert.Equal(t, 2, tasks["h"].Attempt, "each timed-out attempt was retried until none was left")
}

func TestScheduleToStartTimeout(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	sys.StartWorker(apptest.WorkerOptions{}) // serves "default" only
	wf := sys.Workflow(`{"nodes":[{"id":"n","type":"noop","queue":"nobody-serves-this","schedule_to_start_timeout":"300ms",
		"retry":{"max_attempts":2,"backoff":"10ms"}}]}`)
	start := time.Now()
	run, tasks := sys.WaitRun(sys.StartRun(wf, `{}`), 20*time.Second)
	require.Equal(t, "failed", run.Status)
	assert.Equal(t, "schedule_to_start_timeout", errCode(t, run.Error))
	assert.Equal(t, 2, tasks["n"].Attempt)
	assert.GreaterOrEqual(t, time.Since(start), 600*time.Millisecond)
}

func TestRunTimeoutCancelsWhatIsLeft(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	sys.StartWorker(apptest.WorkerOptions{})
	// The timeout leaves the quick step time to finish even on a loaded machine.
	wf := sys.Workflow(`{"timeout":"3s","nodes":[{"id":"quick","type":"noop"},{"id":"nap","type":"sleep","sleep":{"duration":"1h"}}]}`)
	run, tasks := sys.WaitRun(sys.StartRun(wf, `{}`), 20*time.Second)
	require.Equal(t, "failed", run.Status)
	assert.Equal(t, "run_timeout", errCode(t, run.Error))
	assert.Equal(t, "cancelled", tasks["nap"].State)
	assert.Equal(t, "completed", tasks["quick"].State, "finished work is kept")
}

func TestSleepAndApprovalResume(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	sys.StartWorker(apptest.WorkerOptions{})
	wf := sys.Workflow(`{"nodes":[
		{"id":"nap","type":"sleep","sleep":{"duration":"1s"}},
		{"id":"ok","type":"wait","depends_on":["nap"],"wait":{"signal":"approval","approval":true,"timeout":"1h"}},
		{"id":"ship","type":"noop","depends_on":["ok"],"input":{"by":"nodes.ok.output.by"}}]}`)
	id := sys.StartRun(wf, `{}`)
	// The approval may come before the wait is reached: it is kept for it,
	// with its sender, who is the approver whatever the payload says.
	grace := engine.WithActor(context.Background(), dag.Principal{Kind: dag.PrincipalUser, ID: "grace", Role: "admin"})
	ack, err := sys.Coordinator().SignalRun(grace, sys.Tenant, id, engine.Signal{ID: "approval-1", Name: "approval",
		Payload: json.RawMessage(`{"approved": true, "by": "mallory"}`)})
	require.NoError(t, err)
	assert.False(t, ack.Ignored)
	run, tasks := sys.WaitRun(id, 20*time.Second)
	require.Equal(t, "completed", run.Status)
	// On the database clock, which set the timer: from the sleep's creation
	// (the start's transaction) to the commit of the timer firing.
	require.NotNil(t, tasks["nap"].FinishedAt)
	assert.GreaterOrEqual(t, tasks["nap"].FinishedAt.Sub(tasks["nap"].CreatedAt), time.Second, "the sleep lasted its duration")
	assert.JSONEq(t, `{"by": "grace"}`, string(tasks["ship"].Input))
}

func TestWaitTimesOut(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	wf := sys.Workflow(`{"nodes":[{"id":"w","type":"wait","wait":{"signal":"go","timeout":"300ms"}}]}`)
	run, _ := sys.WaitRun(sys.StartRun(wf, `{}`), 20*time.Second)
	require.Equal(t, "failed", run.Status)
	assert.Equal(t, "wait_timeout", errCode(t, run.Error))
}

// TestRedisFlushedStillFinishes: messages in flight are lost when Redis
// restarts without persistence; the lost-dispatch sweep re-dispatches them
// and the workers re-create their consumer groups.
func TestRedisFlushedStillFinishes(t *testing.T) {
	t.Parallel()
	env := testenv.WithPrivateRedis(t)
	sys := apptest.StartWith(t, env, func(c *config.Config) { c.LostDispatchAge = time.Second })
	wf := sys.Workflow(`{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"noop","depends_on":["a"]},{"id":"c","type":"noop","depends_on":["b"]}]}`)
	var runs []uuid.UUID
	for i := 0; i < 20; i++ {
		runs = append(runs, sys.StartRun(wf, `{}`))
	}
	ctx := context.Background()
	apptest.Eventually(t, "the first steps to be published", 10*time.Second, func() bool {
		var n int
		require.NoError(t, sys.Deps.DB.System().QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n))
		return n == 0
	})
	require.NoError(t, env.Redis.FlushAll(ctx).Err(), "every message and consumer group is gone")
	sys.StartWorker(apptest.WorkerOptions{})
	for _, id := range runs {
		run, _ := sys.WaitRun(id, 30*time.Second)
		assert.Equal(t, "completed", run.Status)
	}
	var redispatched int
	require.NoError(t, sys.Deps.DB.System().QueryRow(ctx, `SELECT count(*) FROM run_events WHERE kind = 'redispatched'`).Scan(&redispatched))
	assert.GreaterOrEqual(t, redispatched, 20, "the sweep re-dispatched the lost first steps")
}

func TestRerunFromFailedNodesKeepsFinishedWork(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	var prepared, flaky atomic.Int32
	sys.StartSDKWorker(func(w *worker.Worker) {
		w.HandleRaw("prepare", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			prepared.Add(1)
			return json.RawMessage(`{"prepared": true}`), nil
		})
		w.HandleRaw("flaky", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			if flaky.Add(1) == 1 {
				return nil, worker.Errorf("broken", false, "first time unlucky")
			}
			return json.RawMessage(`{"fixed": true}`), nil
		})
	}, apptest.SDKWorkerOptions{})
	sys.StartWorker(apptest.WorkerOptions{}) // the noop node
	wf := sys.Workflow(`{"nodes":[{"id":"p","type":"task","task":{"handler":"prepare"}},
		{"id":"f","type":"task","depends_on":["p"],"task":{"handler":"flaky"}},
		{"id":"z","type":"noop","depends_on":["f"],"input":{"p":"nodes.p.output"}}]}`)
	id := sys.StartRun(wf, `{"order": 7}`)
	run, before := sys.WaitRun(id, 20*time.Second)
	require.Equal(t, "failed", run.Status)

	ack, err := sys.Coordinator().RerunRun(context.Background(), sys.Tenant, id)
	require.NoError(t, err)
	require.False(t, ack.Ignored, ack.Reason)
	run, after := sys.WaitRun(id, 20*time.Second)
	require.Equal(t, "completed", run.Status)
	assert.EqualValues(t, 1, prepared.Load(), "the finished node was not run again")
	assert.Equal(t, before["p"].ID, after["p"].ID)
	assert.NotEqual(t, before["f"].ID, after["f"].ID, "the failed node got a new task")
	assert.JSONEq(t, `{"p": {"prepared": true}}`, string(after["z"].Input))

	again, err := sys.Coordinator().RerunAsNew(context.Background(), sys.Tenant, id)
	require.NoError(t, err)
	run, _ = sys.WaitRun(again.RunID, 20*time.Second)
	assert.Equal(t, "completed", run.Status)
	assert.JSONEq(t, `{"order": 7}`, string(run.Input))
	require.NotNil(t, run.RerunOf)
	assert.Equal(t, id, *run.RerunOf)
}

// TestTimersSurviveTheProcessThatScheduledThem starts a run with a 2 s
// sleep and an approval wait in a `composer dev` process, SIGKILLs that
// process, and lets a fresh server finish the run.
func TestTimersSurviveTheProcessThatScheduledThem(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	base, cmd := startDev(t, env)
	post := func(path, body string) map[string]any {
		resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		var out map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		require.Equal(t, 200, resp.StatusCode, "%s: %v", path, out)
		return out
	}
	post("/v1/dev/workflows", `{"name":"timers","definition":{"nodes":[
		{"id":"nap","type":"sleep","sleep":{"duration":"2s"}},
		{"id":"ok","type":"wait","wait":{"signal":"approval","approval":true}},
		{"id":"done","type":"noop","depends_on":["nap","ok"]}]}}`)
	started := time.Now()
	id := uuid.MustParse(post("/v1/dev/runs", `{"workflow":"timers"}`)["run_id"].(string))

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()

	sys := apptest.StartWith(t, env)
	sys.StartWorker(apptest.WorkerOptions{})
	var demo uuid.UUID
	require.NoError(t, sys.Deps.DB.System().QueryRow(context.Background(), `SELECT id FROM tenants WHERE name = 'demo'`).Scan(&demo))
	ack, err := sys.Coordinator().SignalRun(context.Background(), demo, id, engine.Signal{Name: "approval", Payload: json.RawMessage(`{"approved": true}`)})
	require.NoError(t, err)
	require.False(t, ack.Ignored, ack.Reason)
	sys.Tenant = demo
	run, tasks := sys.WaitRun(id, 30*time.Second)
	require.Equal(t, "completed", run.Status)
	require.NotNil(t, tasks["nap"].FinishedAt)
	assert.GreaterOrEqual(t, tasks["nap"].FinishedAt.Sub(started), 2*time.Second-50*time.Millisecond, "the sleep kept its duration")
}

// TestHTTPStepErrorsRevealNothingOfTheNetwork: an HTTP step to a blocked
// address, to a name that does not resolve, or on a port that is not
// allowed fails with the same reason a tenant cannot learn the network
// from: no resolved address, no resolver, no "no such host".
func TestHTTPStepErrorsRevealNothingOfTheNetwork(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t, func(c *config.Config) { c.AllowPrivateNetworks = nil })
	sys.StartWorker(apptest.WorkerOptions{})
	reasons := map[string]string{}
	for name, url := range map[string]string{
		"private":  "http://10.0.0.1/x",
		"metadata": "http://169.254.169.254/latest/meta-data/",
		"no such":  "http://no-such-host.invalid/x",
		"loopback": "http://127.0.0.1:5432/",
		"bad port": "http://1.1.1.1:22/",
	} {
		wf := sys.Workflow(fmt.Sprintf(`{"nodes":[{"id":"h","type":"http","http":{"method":"GET","url":%q},"retry":{"max_attempts":1}}]}`, url))
		run, tasks := sys.WaitRun(sys.StartRun(wf, `{}`), 20*time.Second)
		require.Equal(t, "failed", run.Status, name)
		msg := string(tasks["h"].LastError)
		for _, detail := range []string{"ssrf", "private", "link-local", "loopback", "no such host", "127.0.0.53", "resolved", "lookup"} {
			assert.NotContains(t, msg, detail, "%s: %s", name, msg)
		}
		assert.Contains(t, msg, "is not reachable", name)
		assert.Equal(t, "http_unreachable", errCode(t, tasks["h"].LastError), "%s: one code for every reason", name)
		reasons[name] = msg
	}
	t.Logf("%v", reasons)
}
