package e2e

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/tenants"
)

// TestResumeSurvivesASIGKILLedServer: a paused workflow holds 2,000 queued
// runs; it is resumed, and the real `composer server` process working the
// resume is SIGKILLed mid-job. A second process carries the job on from
// its cursor once the dead one's claim has lapsed: every queued run is
// started exactly once (one run_started each), in the order the runs were
// queued, and the job's progress ends at 2,000.
func TestResumeSurvivesASIGKILLedServer(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	ctx := context.Background()
	// No server in this process: only the processes below work the job.
	db := pg.New(env.App, env.System, false)
	tn, err := tenants.Create(ctx, db, tenants.CreateParams{Name: "acme"})
	require.NoError(t, err)
	coord := engine.NewCoordinator(db, engine.Options{})
	wf, _, err := coord.CreateWorkflow(ctx, tn.ID, "parked", "", []byte(`{"nodes":[{"id":"w","type":"wait","wait":{"signal":"go"}}]}`))
	require.NoError(t, err)
	_, err = coord.PauseWorkflow(ctx, tn.ID, wf.ID, "")
	require.NoError(t, err)
	const n = 2000
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 8 {
				_, err := coord.StartRun(ctx, tn.ID, engine.StartRun{WorkflowID: wf.ID})
				require.NoError(t, err)
			}
		}()
	}
	wg.Wait()
	_, op, err := coord.ResumeWorkflow(ctx, tn.ID, wf.ID, "tester")
	require.NoError(t, err)
	require.NotNil(t, op)
	progress := func() (status string, done int64) {
		require.NoError(t, env.System.QueryRow(ctx, `SELECT status, done FROM bulk_operations WHERE id = $1`, op.ID).Scan(&status, &done))
		return status, done
	}

	sys := &apptest.System{Cfg: apptest.Config(env)}
	bin := apptest.Binary(t)
	first := &proc{name: "server", args: []string{"server"}, env: append(sys.ProcessEnv(), "COMPOSER_HTTP_ADDR="+freeAddr(t))}
	first.start(t, bin)
	apptest.Eventually(t, "the first server to start a few batches", 60*time.Second, func() bool {
		_, done := progress()
		return done >= 400
	})
	first.kill() // SIGKILL, mid-job
	status, done := progress()
	require.Equal(t, engine.BulkRunning, status)
	require.Less(t, done, int64(n), "the job was cut short")
	t.Logf("killed after %d of %d runs started", done, n)
	// The dead process's claim lapses (30 s); the test lets it lapse now.
	_, err = env.System.Exec(ctx, `UPDATE bulk_operations SET lease_expires_at = now() WHERE id = $1 AND lease_owner IS NOT NULL`, op.ID)
	require.NoError(t, err)

	second := &proc{name: "server-2", args: []string{"server"}, env: append(sys.ProcessEnv(), "COMPOSER_HTTP_ADDR="+freeAddr(t))}
	second.start(t, bin)
	defer second.kill()
	apptest.Eventually(t, "the second server to finish the job", 120*time.Second, func() bool {
		status, _ := progress()
		return status == engine.BulkCompleted
	})
	var matched int64
	require.NoError(t, env.System.QueryRow(ctx, `SELECT matched, done FROM bulk_operations WHERE id = $1`, op.ID).Scan(&matched, &done))
	assert.EqualValues(t, n, done)
	assert.EqualValues(t, n, matched)
	rows, err := env.System.Query(ctx, `SELECT r.id, r.status, count(e.id), min(e.id) FROM workflow_runs r
		LEFT JOIN run_events e ON e.tenant_id = r.tenant_id AND e.run_id = r.id AND e.kind = 'run_started'
		WHERE r.tenant_id = $1 GROUP BY r.id, r.status ORDER BY r.id`, tn.ID)
	require.NoError(t, err)
	defer rows.Close()
	var last int64
	seen := 0
	for rows.Next() {
		var id uuid.UUID
		var st string
		var starts, ev int64
		require.NoError(t, rows.Scan(&id, &st, &starts, &ev))
		require.Equal(t, "running", st, "run %s", id)
		require.EqualValues(t, 1, starts, "run %s started %d times", id, starts)
		require.Greater(t, ev, last, "run %s started out of order", id)
		last = ev
		seen++
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, n, seen)
}
