package workers_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/engine/taskapi"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/workers"
)

// chainDef is a chain of n steps on queue, each adding one to its input
// (incExec runs them), each allowed attempts attempts.
func chainDef(n int, queue string, attempts int) string {
	def := fmt.Sprintf(`{"nodes":[{"id":"s0","type":"noop","queue":%q,"retry":{"max_attempts":%d}}`, queue, attempts)
	for i := 1; i < n; i++ {
		def += fmt.Sprintf(`,{"id":"s%d","type":"noop","queue":%q,"retry":{"max_attempts":%d},"depends_on":["s%d"],"input":{"n":"nodes.s%d.output.n"}}`,
			i, queue, attempts, i-1, i-1)
	}
	return def + `]}`
}

// longWindow lets a slot keep a chain for the whole test.
func longWindow(c *workers.Config) { c.EagerWindow = time.Hour }

// incExec runs the steps of these tests (noop nodes): it adds one to the
// input's n, after 10 ms when the input says slow, counting executions
// per run, node and attempt in calls.
func incExec(calls *sync.Map) workers.Executor {
	return workers.ExecutorFunc(func(ctx context.Context, t workers.Task) (json.RawMessage, error) {
		var in struct {
			N    int
			Slow bool
		}
		_ = json.Unmarshal(t.Input, &in)
		if calls != nil {
			n, _ := calls.LoadOrStore(fmt.Sprintf("%s/%s/%d", t.Run, t.NodeID, t.Attempt), new(atomic.Int32))
			n.(*atomic.Int32).Add(1)
		}
		if in.Slow {
			time.Sleep(10 * time.Millisecond)
		}
		return json.RawMessage(fmt.Sprintf(`{"n":%d}`, in.N+1)), nil
	})
}

// TestChainStepsGoEagerlyToTheReportingWorker: with one tenant on the
// worker, every step after a chain's first comes back with the previous
// step's report, each executes once, and the outputs flow through; with
// eager dispatch off, every step comes through the stream, and the result
// is the same.
func TestChainStepsGoEagerlyToTheReportingWorker(t *testing.T) {
	t.Parallel()
	for _, eager := range []bool{true, false} {
		t.Run(fmt.Sprintf("eager=%v", eager), func(t *testing.T) {
			t.Parallel()
			sys := apptest.Start(t)
			var calls sync.Map
			w, _ := sys.StartWorker(apptest.WorkerOptions{Noop: incExec(&calls), Config: func(c *workers.Config) {
				longWindow(c)
				c.NoEager = !eager
			}})
			wf := sys.Workflow(chainDef(10, "default", 1))
			var runs []uuid.UUID
			for range 8 {
				runs = append(runs, sys.StartRun(wf, `{}`))
			}
			for _, id := range runs {
				run, _ := sys.WaitRun(id, 30*time.Second)
				require.Equal(t, "completed", run.Status)
				assert.JSONEq(t, `{"s9":{"n":10}}`, string(run.Output))
			}
			n := 0
			calls.Range(func(k, v any) bool {
				n++
				assert.EqualValues(t, 1, v.(*atomic.Int32).Load(), "%s executed once", k)
				return true
			})
			assert.Equal(t, 80, n, "every step ran, each on its first attempt")
			if eager {
				assert.EqualValues(t, 8*9, w.EagerStarts(), "every step after the first came with a report")
			} else {
				assert.Zero(t, w.EagerStarts())
			}
		})
	}
}

// lossyAPI loses the answer of the first completion that carried an eager
// lease, after the server committed it.
type lossyAPI struct {
	workers.TaskAPI
	lost atomic.Pointer[taskapi.Lease]
}

func (a *lossyAPI) Complete(ctx context.Context, r taskapi.CompleteRequest) (taskapi.ReportResponse, error) {
	res, err := a.TaskAPI.Complete(ctx, r)
	if err == nil && res.Next != nil && a.lost.CompareAndSwap(nil, res.Next) {
		return taskapi.ReportResponse{}, errors.New("connection reset")
	}
	return res, err
}

// TestLostEagerAnswerIsRecoveredByTheRepeatedReport: the answer carrying
// an eager lease is lost; the worker repeats its report, which is ignored
// as a duplicate but hands back the same lease, so the step runs at once
// on its first attempt — the only one its node allows.
func TestLostEagerAnswerIsRecoveredByTheRepeatedReport(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	api := &lossyAPI{TaskAPI: taskapi.NewClient(sys.URL, sys.Cfg.WorkerToken)}
	var calls sync.Map
	w, _ := sys.StartWorker(apptest.WorkerOptions{Noop: incExec(&calls), API: api, Config: longWindow})
	run, tasks := sys.WaitRun(sys.StartRun(sys.Workflow(chainDef(3, "default", 1)), `{}`), 30*time.Second)
	require.Equal(t, "completed", run.Status)
	assert.JSONEq(t, `{"s2":{"n":3}}`, string(run.Output))
	lost := api.lost.Load()
	require.NotNil(t, lost, "an eager answer was lost")
	assert.Equal(t, 1, tasks[lost.NodeID].Attempt, "the step ran on its first attempt")
	calls.Range(func(k, v any) bool {
		assert.EqualValues(t, 1, v.(*atomic.Int32).Load(), "%s executed once", k)
		return true
	})
	assert.EqualValues(t, 2, w.EagerStarts())
}

// oldServerAPI refuses eager offers as a server that predates them does:
// 400, UNKNOWN_FIELD, naming the field.
type oldServerAPI struct {
	workers.TaskAPI
	offers atomic.Int32
}

func (a *oldServerAPI) Complete(ctx context.Context, r taskapi.CompleteRequest) (taskapi.ReportResponse, error) {
	if r.Eager != nil {
		a.offers.Add(1)
		return taskapi.ReportResponse{}, &taskapi.APIError{Status: 400, Code: taskapi.CodeUnknownField, Field: "eager", Message: `the server does not know the field "eager"`}
	}
	return a.TaskAPI.Complete(ctx, r)
}

// TestWorkerFallsBackWhenTheServerRefusesOffers: against a server that
// predates eager dispatch, the report refused for its offer is sent again
// without it and nothing is lost; the worker stops offering.
func TestWorkerFallsBackWhenTheServerRefusesOffers(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	api := &oldServerAPI{TaskAPI: taskapi.NewClient(sys.URL, sys.Cfg.WorkerToken)}
	w, _ := sys.StartWorker(apptest.WorkerOptions{Noop: incExec(nil), API: api, Config: longWindow})
	wf := sys.Workflow(chainDef(5, "default", 1))
	for range 3 {
		run, _ := sys.WaitRun(sys.StartRun(wf, `{}`), 30*time.Second)
		require.Equal(t, "completed", run.Status)
		assert.JSONEq(t, `{"s4":{"n":5}}`, string(run.Output))
	}
	assert.EqualValues(t, 1, api.offers.Load(), "one refused offer, then none for a while")
	assert.Zero(t, w.EagerStarts())
}

// TestOtherBadRequestsDoNotTurnOffersOff: a 400 for anything but the offer
// itself is the report's own problem: the worker does not resend it, nor
// stop offering.
func TestOtherBadRequestsDoNotTurnOffersOff(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	api := &badOutputAPI{TaskAPI: taskapi.NewClient(sys.URL, sys.Cfg.WorkerToken)}
	w, _ := sys.StartWorker(apptest.WorkerOptions{Noop: incExec(nil), API: api, Config: longWindow})
	run, _ := sys.WaitRun(sys.StartRun(sys.Workflow(chainDef(4, "default", 3)), `{}`), 30*time.Second)
	require.Equal(t, "completed", run.Status)
	assert.EqualValues(t, 1, api.calls.Load()-api.passed.Load(), "the refused report was not resent")
	assert.EqualValues(t, 3, w.EagerStarts(), "offers went on after the refusal: s1-s3 came with reports")
}

// badOutputAPI refuses the first report (s0's) as malformed for a reason
// of its own; s0 then runs again when its lease expires (a new attempt
// through the stream), so the chain still completes.
type badOutputAPI struct {
	workers.TaskAPI
	calls, passed atomic.Int32
}

func (a *badOutputAPI) Complete(ctx context.Context, r taskapi.CompleteRequest) (taskapi.ReportResponse, error) {
	if a.calls.Add(1) == 1 {
		return taskapi.ReportResponse{}, &taskapi.APIError{Status: 400, Code: "INVALID", Message: `output is not valid JSON (not an unknown field "eager")`}
	}
	a.passed.Add(1)
	return a.TaskAPI.Complete(ctx, r)
}

// TestEagerChainDoesNotStarveAnotherQueue: a one-slot worker serving two
// queues runs a long chain of short steps on one; a run on the other
// queue is served while the chain is still going, not after it.
func TestEagerChainDoesNotStarveAnotherQueue(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	sys.StartWorker(apptest.WorkerOptions{Noop: incExec(nil), Config: func(c *workers.Config) {
		c.Queues, c.Concurrency = []string{"default", "other"}, 1
	}})
	def := `{"nodes":[{"id":"s0","type":"noop","input":{"slow":"true"}}`
	for i := 1; i < 200; i++ {
		def += fmt.Sprintf(`,{"id":"s%d","type":"noop","input":{"slow":"true"},"depends_on":["s%d"]}`, i, i-1)
	}
	chain := sys.StartRun(sys.Workflow(def+`]}`), `{}`)
	apptest.Eventually(t, "the chain to be under way", 20*time.Second, func() bool {
		_, tasks := sys.Run(chain)
		return len(tasks) >= 5
	})
	other := sys.StartRun(sys.Workflow(chainDef(1, "other", 1)), `{}`)
	run, _ := sys.WaitRun(other, 30*time.Second)
	require.Equal(t, "completed", run.Status)
	got, tasks := sys.Run(chain)
	assert.Equal(t, "running", got.Status, "the other queue's run did not wait for the chain (%d of 200 steps done)", len(tasks))
}
