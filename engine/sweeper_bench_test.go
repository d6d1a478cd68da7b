package engine

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkSweepExpiredLeases measures how fast the sweep turns expired
// leases into their next attempt: per iteration, 200 runs whose only
// task's lease has expired, swept until none is left running; reported as
// expired leases applied per second.
func BenchmarkSweepExpiredLeases(b *testing.B) {
	const n = 200
	f := newFixture(b)
	sw := NewSweeper(f.c, f.db, SweeperConfig{}, nil)
	ctx := context.Background()
	var took time.Duration
	for range b.N {
		b.StopTimer()
		expiredLeases(b, f, n)
		b.StartTimer()
		t0 := time.Now()
		for f.count(`SELECT count(*) FROM task_instances WHERE state = 'running'`) > 0 {
			_, err := sw.SweepOnce(ctx)
			require.NoError(b, err)
		}
		took += time.Since(t0)
	}
	b.ReportMetric(float64(n*b.N)/took.Seconds(), "leases/s")
}

// expiredLeases starts n one-task runs, leases each task and lets every
// lease expire.
func expiredLeases(tb testing.TB, f *fixture, n int) {
	ctx := context.Background()
	wf := f.workflow(`{"nodes":[{"id":"a","type":"noop","retry":{"max_attempts":5}}]}`)
	var reqs []LeaseRequest
	for range n {
		run := f.start(wf, `{}`)
		task, ok := f.task(run, "a")
		require.True(tb, ok)
		reqs = append(reqs, LeaseRequest{RunID: run, TaskID: task.ID, Attempt: 1})
	}
	for i := 0; i < len(reqs); i += 100 {
		_, _, err := f.c.AcquireLeases(ctx, f.tenant, Holder{Worker: "bench-worker"}, time.Minute, reqs[i:min(i+100, len(reqs))])
		require.NoError(tb, err)
	}
	_, err := f.env.System.Exec(ctx, `UPDATE task_instances SET lease_expires_at = now() - interval '1 second' WHERE tenant_id = $1 AND state = 'running'`, f.tenant)
	require.NoError(tb, err)
}
