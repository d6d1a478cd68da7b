package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/tenants"
	"github.com/composer-dev/composer/workers"
)

// TestConcurrencyKeyOfOneAcrossWorkers: 500 runs of 50 keys, limit 1 per
// key, four workers: at no sampled instant do two runs (or, for a step's
// key, two tasks) of one key run (sampling the database, as the quota test
// does), no worker ever executes two steps of one key at once, every run
// completes, and each key's runs execute in the order they were started
// (FIFO per key) — for a workflow's key and for a step's.
func TestConcurrencyKeyOfOneAcrossWorkers(t *testing.T) {
	t.Parallel()
	t.Run("workflow", func(t *testing.T) {
		t.Parallel()
		concurrencyAcrossWorkers(t, `{"concurrency": {"key": "input.key", "limit": 1}, "nodes": [{"id": "w", "type": "noop"}]}`,
			`SELECT coalesce(max(c), 0) FROM (SELECT count(*) AS c FROM workflow_runs WHERE tenant_id = $1 AND status = 'running' GROUP BY concurrency_key) k`)
	})
	t.Run("step", func(t *testing.T) {
		t.Parallel()
		concurrencyAcrossWorkers(t, `{"nodes": [{"id": "w", "type": "noop", "concurrency": {"key": "input.key", "limit": 1}}]}`,
			`SELECT coalesce(max(c), 0) FROM (SELECT count(*) AS c FROM task_instances WHERE tenant_id = $1 AND state = 'running'
				AND lease_expires_at > now() GROUP BY concurrency_key) k`)
	})
}

func concurrencyAcrossWorkers(t *testing.T, def, sample string) {
	sys := apptest.Start(t)
	setLimits(t, sys, sys.Tenant, tenants.Limits{StartsPerSecond: 100_000, StartBurst: 100_000, MaxQueuedTasks: 100_000, MaxRunningTasks: 64})
	wf := sys.Workflow(def)
	const runs, keys = 500, 50
	ids := make([]uuid.UUID, 0, runs)
	for i := range runs {
		ids = append(ids, sys.StartRun(wf, fmt.Sprintf(`{"key": "k%d", "seq": %d}`, i%keys, i)))
	}

	var mu sync.Mutex
	inFlight := map[string]int{}
	order := map[string][]int{}
	var doubled atomic.Int32
	stop := make(chan struct{})
	var samples, maxPerKey int
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			var n int
			require.NoError(t, sys.Deps.DB.System().QueryRow(context.Background(), sample, sys.Tenant).Scan(&n))
			samples++
			maxPerKey = max(maxPerKey, n)
			time.Sleep(2 * time.Millisecond)
		}
	}()
	for range 4 {
		sys.StartWorker(apptest.WorkerOptions{Noop: workers.ExecutorFunc(func(_ context.Context, task workers.Task) (json.RawMessage, error) {
			var in struct {
				Key string
				Seq int
			}
			_ = json.Unmarshal(task.Input, &in)
			mu.Lock()
			inFlight[in.Key]++
			if inFlight[in.Key] > 1 {
				doubled.Add(1)
			}
			order[in.Key] = append(order[in.Key], in.Seq)
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
			mu.Lock()
			inFlight[in.Key]--
			mu.Unlock()
			return json.RawMessage(`{}`), nil
		})})
	}
	for _, id := range ids {
		run, _ := sys.WaitRun(id, 120*time.Second)
		require.Equal(t, "completed", run.Status)
	}
	close(stop)
	wg.Wait()
	t.Logf("%d database samples; at most %d running for one key", samples, maxPerKey)
	assert.LessOrEqual(t, maxPerKey, 1, "never two of one key running in the database")
	assert.Zero(t, doubled.Load(), "never two steps of one key executing at once")
	for k, seqs := range order {
		require.Len(t, seqs, runs/keys, "key %s", k)
		for i := 1; i < len(seqs); i++ {
			assert.Less(t, seqs[i-1], seqs[i], "key %s ran in start order: %v", k, seqs)
		}
	}
}
