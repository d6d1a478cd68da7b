package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	sm "github.com/composer-dev/composer/engine/statemachine"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/tenants"
)

const pendingDef = `{"metadata":{"customer":"input.customer"},"nodes":[{"id":"a","type":"noop"}]}`

// startMany starts n runs of wf from 8 goroutines.
func (f *fixture) startMany(wf uuid.UUID, n int, input func(i int) string) []uuid.UUID {
	f.t.Helper()
	ids := make([]uuid.UUID, n)
	var wg sync.WaitGroup
	var failed atomic.Value
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				res, err := f.c.StartRun(context.Background(), f.tenant, StartRun{WorkflowID: wf, Input: json.RawMessage(input(i))})
				if err != nil {
					failed.Store(err)
					return
				}
				ids[i] = res.RunID
			}
		}()
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		f.t.Fatal(err)
	}
	return ids
}

// drain works bulk operations with the given runners, concurrently, until
// job op is finished.
func (f *fixture) drain(op uuid.UUID, runners ...*BulkRunner) BulkOperation {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for _, r := range runners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if _, err := r.Step(ctx); err != nil && ctx.Err() == nil {
					f.t.Errorf("step: %v", err)
					return
				}
				if f.bulk(op).Status != BulkRunning {
					return
				}
				time.Sleep(time.Millisecond)
			}
		}()
	}
	wg.Wait()
	got := f.bulk(op)
	require.NotEqual(f.t, BulkRunning, got.Status, "the job did not finish")
	return got
}

func (f *fixture) bulk(op uuid.UUID) BulkOperation {
	f.t.Helper()
	var got BulkOperation
	require.NoError(f.t, f.db.WithTenant(context.Background(), f.tenant, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		got, err = GetBulkOperation(ctx, tx, op)
		return err
	}))
	return got
}

func (f *fixture) runner(owner string) *BulkRunner {
	return &BulkRunner{DB: f.db, Coord: f.c, Owner: owner, Retry: 50 * time.Millisecond}
}

// TestBulkCancelOfTenThousandRunsCancelsEachOnce: 10,000 running runs of
// one workflow (and runs of another, and of the same customer metadata in
// another workflow, that the filter leaves alone) are cancelled by one job
// worked by two runners racing: every run is cancelled exactly once, the
// progress reaches 10,000 and was reported batch by batch; creating the
// job again with its key answers the same job; working it again from the
// start (a retry after a crash that lost its progress) changes nothing.
func TestBulkCancelOfTenThousandRunsCancelsEachOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 runs")
	}
	f := newFixture(t)
	ctx := context.Background()
	wf := f.workflow(pendingDef)
	other := f.workflow(pendingDef)
	const n = 10_000
	started := time.Now()
	f.startMany(wf, n, func(i int) string { return fmt.Sprintf(`{"customer":"c%d"}`, i%2) })
	others := f.startMany(other, 50, func(int) string { return `{"customer":"c0"}` })
	t.Logf("started %d runs in %s", n+50, time.Since(started))

	req := BulkRequest{Action: BulkCancel, Filter: RunFilter{WorkflowID: &wf, Statuses: []string{"running"}}, Reason: "bulk test", IdempotencyKey: "cancel-all"}
	op, created, err := f.c.CreateBulkOperation(ctx, f.tenant, req)
	require.NoError(t, err)
	require.True(t, created)
	again, created, err := f.c.CreateBulkOperation(ctx, f.tenant, req)
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, op.ID, again.ID)
	other2 := req
	other2.Reason = "another"
	_, _, err = f.c.CreateBulkOperation(ctx, f.tenant, other2)
	require.Equal(t, errs.Conflict, errs.KindOf(err))

	var reports atomic.Int64
	var last atomic.Int64
	progress := func(tenant, id uuid.UUID, status string) {
		require.Equal(t, f.tenant, tenant)
		reports.Add(1)
		last.Store(f.bulk(id).Matched)
	}
	a, b := f.runner("a"), f.runner("b")
	a.OnProgress, b.OnProgress = progress, progress
	started = time.Now()
	got := f.drain(op.ID, a, b)
	elapsed := time.Since(started)
	t.Logf("cancelled %d runs in %s (%.0f runs/s), %d progress reports", got.Done, elapsed, float64(got.Done)/elapsed.Seconds(), reports.Load())
	require.Equal(t, BulkCompleted, got.Status)
	require.EqualValues(t, n, got.Matched)
	require.EqualValues(t, n, got.Done)
	require.Zero(t, got.Failed)
	require.Zero(t, got.Skipped)
	require.GreaterOrEqual(t, reports.Load(), int64(n/BulkBatch))
	require.EqualValues(t, n, last.Load())

	require.Equal(t, n, f.count(`SELECT count(*) FROM workflow_runs WHERE tenant_id = $1 AND workflow_id = $2 AND status = 'cancelled'`, f.tenant, wf))
	require.Equal(t, 0, f.count(`SELECT count(*) FROM (SELECT run_id FROM run_events WHERE tenant_id = $1 AND kind = $2
		GROUP BY run_id HAVING count(*) <> 1) x`, f.tenant, sm.KindCancelRequested))
	require.Equal(t, n, f.count(`SELECT count(*) FROM run_events e JOIN workflow_runs r ON r.tenant_id = e.tenant_id AND r.id = e.run_id
		WHERE e.tenant_id = $1 AND r.workflow_id = $2 AND e.kind = $3`, f.tenant, wf, sm.KindCancelRequested))
	require.Equal(t, n, f.count(`SELECT count(*) FROM bulk_operation_runs WHERE operation_id = $1`, op.ID))
	for _, r := range others {
		require.Equal(t, sm.RunRunning, f.runStatus(r))
	}

	// The job worked again from scratch (a retry that lost its progress)
	// changes no run a second time (none matches any more), and counts
	// from its marks what it did.
	_, err = f.env.System.Exec(ctx, `UPDATE bulk_operations SET status = 'running', cursor_run = NULL, matched = 0, done = 0, finished_at = NULL WHERE id = $1`, op.ID)
	require.NoError(t, err)
	events := f.count(`SELECT count(*) FROM run_events WHERE tenant_id = $1`, f.tenant)
	got = f.drain(op.ID, f.runner("c"))
	require.EqualValues(t, n, got.Done)
	require.Equal(t, events, f.count(`SELECT count(*) FROM run_events WHERE tenant_id = $1`, f.tenant))
}

// failAll fails the running task of each run (no retry left).
func (f *fixture) failAll(runs []uuid.UUID) {
	f.t.Helper()
	for _, r := range runs {
		tk := f.mustTask(r, "a")
		_, err := f.c.FailTask(context.Background(), f.tenant, Report{RunID: r, TaskID: tk.ID, NodeID: "a", Attempt: tk.Attempt,
			Error: sm.Error{Code: "boom", Message: "boom"}})
		require.NoError(f.t, err)
		require.Equal(f.t, sm.RunFailed, f.runStatus(r))
	}
}

// TestBulkRerunChangesEachRunOnce: a rerun job over failed runs selected by
// metadata reruns each once; the runs fail again, and the job worked again
// (a retry) does not rerun them a second time; a run the filter leaves out
// stays failed.
func TestBulkRerunChangesEachRunOnce(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	wf := f.workflow(pendingDef)
	runs := f.startMany(wf, 30, func(i int) string { return fmt.Sprintf(`{"customer":"c%d"}`, i%3) })
	f.failAll(runs)
	op, _, err := f.c.CreateBulkOperation(ctx, f.tenant, BulkRequest{Action: BulkRerun, Filter: RunFilter{Metadata: map[string]string{"customer": "c1"}}})
	require.NoError(t, err)
	r := f.runner("a")
	r.Batch = 4
	got := f.drain(op.ID, r, f.runner("b"))
	require.EqualValues(t, 10, got.Done)
	require.EqualValues(t, 10, got.Matched)
	var again []uuid.UUID
	for i, id := range runs {
		if i%3 == 1 {
			require.Equal(t, sm.RunRunning, f.runStatus(id))
			again = append(again, id)
		} else {
			require.Equal(t, sm.RunFailed, f.runStatus(id))
		}
	}
	f.failAll(again)
	_, err = f.env.System.Exec(ctx, `UPDATE bulk_operations SET status = 'running', cursor_run = NULL, finished_at = NULL WHERE id = $1`, op.ID)
	require.NoError(t, err)
	f.drain(op.ID, f.runner("c"))
	for _, id := range again {
		require.Equal(t, sm.RunFailed, f.runStatus(id))
		require.Equal(t, 1, f.count(`SELECT count(*) FROM run_events WHERE run_id = $1 AND kind = $2`, id, sm.KindRerunRequested))
	}
}

// TestBulkOperationsAreValidatedAndBounded: bad filters and actions are
// BAD_USER_INPUT; a tenant's running jobs are bounded; another tenant sees
// none of them.
func TestBulkOperationsAreValidatedAndBounded(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for _, req := range []BulkRequest{
		{Action: "delete"},
		{Action: BulkCancel, Filter: RunFilter{Statuses: []string{"completed"}}},
		{Action: BulkRerun, Filter: RunFilter{Statuses: []string{"bogus"}}},
		{Action: BulkCancel, Filter: RunFilter{Metadata: map[string]string{"a": "1", "b": "2", "c": "3", "d": "4", "e": "5"}}},
		{Action: BulkCancel, Reason: string(make([]byte, 1001))},
	} {
		_, _, err := f.c.CreateBulkOperation(ctx, f.tenant, req)
		require.Equal(t, errs.Invalid, errs.KindOf(err), "%+v", req)
	}
	var first BulkOperation
	for i := 0; i < MaxActiveBulkOperations; i++ {
		op, _, err := f.c.CreateBulkOperation(ctx, f.tenant, BulkRequest{Action: BulkCancel})
		require.NoError(t, err)
		if i == 0 {
			first = op
		}
	}
	_, _, err := f.c.CreateBulkOperation(ctx, f.tenant, BulkRequest{Action: BulkCancel})
	require.Equal(t, errs.QuotaExceeded, errs.KindOf(err))
	// A cancelled job frees its place.
	_, err = f.c.CancelBulkOperation(ctx, f.tenant, first.ID)
	require.NoError(t, err)
	_, _, err = f.c.CreateBulkOperation(ctx, f.tenant, BulkRequest{Action: BulkCancel})
	require.NoError(t, err)

	tn, err := tenants.Create(ctx, f.db, tenants.CreateParams{Name: "other"})
	require.NoError(t, err)
	other := tn.ID
	require.NoError(t, f.db.WithTenant(ctx, other, func(ctx context.Context, tx *pg.Tx) error {
		_, err := GetBulkOperation(ctx, tx, first.ID)
		require.Equal(t, errs.NotFound, errs.KindOf(err))
		list, _, err := ListBulkOperations(ctx, tx, 100, nil)
		require.NoError(t, err)
		require.Empty(t, list)
		return nil
	}))
	_, err = f.c.CancelBulkOperation(ctx, other, first.ID)
	require.Equal(t, errs.NotFound, errs.KindOf(err))
}

// TestZombieBatchChangesNothingTwice: two runners work the same batch at
// once (one's lease ran out while it was still working): each run is
// rerun once, and only the lease holder's progress is recorded.
func TestZombieBatchChangesNothingTwice(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	wf := f.workflow(pendingDef)
	runs := f.startMany(wf, 40, func(int) string { return `{"customer":"c"}` })
	f.failAll(runs)
	op, _, err := f.c.CreateBulkOperation(ctx, f.tenant, BulkRequest{Action: BulkRerun})
	require.NoError(t, err)
	_, err = f.env.System.Exec(ctx, `UPDATE bulk_operations SET lease_owner = 'a', lease_expires_at = now() + interval '1 minute' WHERE id = $1`, op.ID)
	require.NoError(t, err)
	a, b := f.runner("a"), f.runner("b")
	var wg sync.WaitGroup
	for _, r := range []*BulkRunner{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.init()
			require.NoError(t, r.batch(ctx, f.tenant, op.ID))
		}()
	}
	wg.Wait()
	got := f.bulk(op.ID)
	require.Equal(t, BulkCompleted, got.Status)
	require.EqualValues(t, 40, got.Done, "%+v", got)
	require.EqualValues(t, 40, got.Matched)
	for _, id := range runs {
		require.Equal(t, 1, f.count(`SELECT count(*) FROM run_events WHERE run_id = $1 AND kind = $2`, id, sm.KindRerunRequested))
	}
}
