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

// chainDef is a chain of n task steps, each adding one to its input.
func chainDef(n int) string {
	def := `{"nodes":[{"id":"s0","type":"task","task":{"handler":"inc"}}`
	for i := 1; i < n; i++ {
		def += fmt.Sprintf(`,{"id":"s%d","type":"task","task":{"handler":"inc"},"depends_on":["s%d"],"input":{"n":"nodes.s%d.output.n"},"retry":{"max_attempts":3}}`, i, i-1, i-1)
	}
	return def + `]}`
}

func incHandlers(calls *sync.Map) *workers.Handlers {
	h := &workers.Handlers{}
	h.Register("inc", func(ctx context.Context, t workers.Task) (json.RawMessage, error) {
		var in struct{ N int }
		_ = json.Unmarshal(t.Input, &in)
		if calls != nil {
			n, _ := calls.LoadOrStore(fmt.Sprintf("%s/%s/%d", t.Run, t.NodeID, t.Attempt), new(atomic.Int32))
			n.(*atomic.Int32).Add(1)
		}
		return json.RawMessage(fmt.Sprintf(`{"n":%d}`, in.N+1)), nil
	})
	return h
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
			w, _ := sys.StartWorker(apptest.WorkerOptions{Handlers: incHandlers(&calls), Config: func(c *workers.Config) { c.NoEager = !eager }})
			wf := sys.Workflow(chainDef(10))
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
// lease, after the server committed it: the worker never hears of that
// lease.
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

// TestLostEagerLeaseIsRecoveredBySweep: the answer carrying an eager lease
// is lost; the worker's retried report is ignored as a duplicate, the
// lease nobody runs expires, and the sweep gives the step a second
// attempt: the run completes with every step's output.
func TestLostEagerLeaseIsRecoveredBySweep(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	api := &lossyAPI{TaskAPI: taskapi.NewClient(sys.URL, sys.Cfg.WorkerToken)}
	sys.StartWorker(apptest.WorkerOptions{Handlers: incHandlers(nil), API: api})
	run, tasks := sys.WaitRun(sys.StartRun(sys.Workflow(chainDef(3)), `{}`), 30*time.Second)
	require.Equal(t, "completed", run.Status)
	assert.JSONEq(t, `{"s2":{"n":3}}`, string(run.Output))
	lost := api.lost.Load()
	require.NotNil(t, lost, "an eager lease was lost")
	assert.Equal(t, 2, tasks[lost.NodeID].Attempt, "the lost lease's step ran as attempt 2")
}
