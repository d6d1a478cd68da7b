package engine

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	sm "github.com/composer-dev/composer/engine/statemachine"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/tenants"
)

// fixture is one test's database, coordinator and tenant.
type fixture struct {
	t      testing.TB
	env    *testenv.Env
	db     *pg.DB
	c      *Coordinator
	tenant uuid.UUID
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	env := testenv.NewPG(t)
	db := pg.New(env.App, env.System, false)
	tn, err := tenants.Create(context.Background(), db, tenants.CreateParams{Name: "acme"})
	require.NoError(t, err)
	return &fixture{t: t, env: env, db: db, c: NewCoordinator(db, Options{}), tenant: tn.ID}
}

// newQuotaFixture is a fixture whose tenant may run limit tasks at once,
// enforced by a real Redis semaphore.
func newQuotaFixture(t *testing.T, limit int) (*fixture, *tenants.Slots) {
	t.Helper()
	env := testenv.New(t)
	db := pg.New(env.App, env.System, false)
	tn, err := tenants.Create(context.Background(), db, tenants.CreateParams{Name: "acme"})
	require.NoError(t, err)
	require.NoError(t, tenants.Update(context.Background(), db, tn.ID, tenants.UpdateParams{Limits: &tenants.Limits{MaxRunningTasks: limit}}))
	slots := tenants.NewSlots(env.Redis, env.Namespace, nil)
	return &fixture{t: t, env: env, db: db, c: NewCoordinator(db, Options{Slots: slots}), tenant: tn.ID}, slots
}

func (f *fixture) workflow(def string) uuid.UUID {
	f.t.Helper()
	w, _, err := f.c.CreateWorkflow(context.Background(), f.tenant, "wf-"+uuid.NewString()[:8], "", []byte(def))
	require.NoError(f.t, err)
	return w.ID
}

func (f *fixture) start(wf uuid.UUID, input string) uuid.UUID {
	f.t.Helper()
	res, err := f.c.StartRun(context.Background(), f.tenant, StartRun{WorkflowID: wf, Input: json.RawMessage(input)})
	require.NoError(f.t, err)
	require.True(f.t, res.Created)
	return res.RunID
}

type taskRow struct {
	ID      uuid.UUID
	State   string
	Attempt int
	Output  json.RawMessage
}

// task reads a node's task, or returns ok=false when it has none.
func (f *fixture) task(run uuid.UUID, node string) (taskRow, bool) {
	f.t.Helper()
	var r taskRow
	err := f.env.System.QueryRow(context.Background(), `SELECT id, state, attempt, output FROM task_instances WHERE run_id = $1 AND node_id = $2`,
		run, node).Scan(&r.ID, &r.State, &r.Attempt, &r.Output)
	if err == pgx.ErrNoRows {
		return r, false
	}
	require.NoError(f.t, err)
	return r, true
}

func (f *fixture) mustTask(run uuid.UUID, node string) taskRow {
	f.t.Helper()
	r, ok := f.task(run, node)
	require.True(f.t, ok, "node %s has no task", node)
	return r
}

func (f *fixture) complete(run uuid.UUID, node, output string) Ack {
	f.t.Helper()
	tk := f.mustTask(run, node)
	ack, err := f.c.CompleteTask(context.Background(), f.tenant, Report{RunID: run, TaskID: tk.ID, NodeID: node, Attempt: tk.Attempt, Output: json.RawMessage(output)})
	require.NoError(f.t, err)
	return ack
}

func (f *fixture) runStatus(run uuid.UUID) sm.RunStatus {
	f.t.Helper()
	var s string
	require.NoError(f.t, f.env.System.QueryRow(context.Background(), `SELECT status FROM workflow_runs WHERE id = $1`, run).Scan(&s))
	return sm.RunStatus(s)
}

func (f *fixture) count(query string, args ...any) int {
	f.t.Helper()
	var n int
	require.NoError(f.t, f.env.System.QueryRow(context.Background(), query, args...).Scan(&n))
	return n
}

// snapshot captures every row of a run, to compare before and after.
func (f *fixture) snapshot(run uuid.UUID) string {
	f.t.Helper()
	var s string
	owner := f.env.Owner(f.t)
	tx, err := owner.Begin(context.Background())
	require.NoError(f.t, err)
	defer tx.Rollback(context.Background()) //nolint:errcheck
	_, err = tx.Exec(context.Background(), "SELECT set_config('app.tenant_id', $1, true)", f.tenant.String())
	require.NoError(f.t, err)
	require.NoError(f.t, tx.QueryRow(context.Background(), `SELECT concat_ws(' | ',
		(SELECT row_to_json(r)::text FROM workflow_runs r WHERE id = $1),
		(SELECT json_agg(t ORDER BY node_id)::text FROM task_instances t WHERE run_id = $1),
		(SELECT json_agg(o ORDER BY id)::text FROM outbox o WHERE run_id = $1),
		(SELECT json_agg(e ORDER BY id)::text FROM run_events e WHERE run_id = $1),
		(SELECT json_agg(m ORDER BY id)::text FROM timers m WHERE run_id = $1))`, run).Scan(&s))
	return s
}

func eventually(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

const forkJoinDef = `{"nodes":[
	{"id":"a","type":"noop"},
	{"id":"b","type":"noop","depends_on":["a"]},
	{"id":"c","type":"noop","depends_on":["a"]},
	{"id":"join","type":"noop","depends_on":["b","c"],"input":{"b":"nodes.b.output","c":"nodes.c.output"}}]}`

func tenantsParams(name string) tenants.CreateParams { return tenants.CreateParams{Name: name} }
