package engine

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/tenants"
)

var noopOffer = &EagerOffer{Queue: "default", NodeTypes: []string{"noop"}, TTL: 30 * time.Second}

func (f *fixture) completeAs(run uuid.UUID, tk taskRow, node, owner string, offer *EagerOffer) (Ack, error) {
	return f.c.CompleteTask(context.Background(), f.tenant, Report{RunID: run, TaskID: tk.ID, NodeID: node, Attempt: tk.Attempt,
		LeaseOwner: owner, Output: json.RawMessage(`{"n":1}`), Eager: offer})
}

// TestEagerOfferLeasesTheNextTaskInTheReportsTransaction: a completion
// carrying an offer gets the run's next task back already leased to the
// reporting worker — written running with its lease, with no outbox row —
// and that lease behaves like any other: nobody else acquires it, its
// owner renews it, and its result applies.
func TestEagerOfferLeasesTheNextTaskInTheReportsTransaction(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	wf := f.workflow(`{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"noop","depends_on":["a"],"input":{"from_a":"nodes.a.output.n"}}]}`)
	run := f.start(wf, `{}`)
	a := f.lease(run, "a", "w1", 30*time.Second)

	ack, err := f.completeAs(run, a, "a", "w1", noopOffer)
	require.NoError(t, err)
	require.NotNil(t, ack.Next, "the next task came with the answer")
	b := f.mustTask(run, "b")
	n := ack.Next
	assert.Equal(t, b.ID, n.TaskID)
	assert.Equal(t, run, n.RunID)
	assert.Equal(t, 1, n.Attempt)
	assert.True(t, n.Acquired)
	assert.Equal(t, "b", n.NodeID)
	assert.Equal(t, "noop", n.NodeType)
	assert.Equal(t, "default", n.Queue)
	assert.JSONEq(t, `{"from_a":1}`, string(n.Input), "the input mapping ran")
	var stored []byte
	require.NoError(t, f.env.System.QueryRow(context.Background(), `SELECT input FROM task_instances WHERE id = $1`, b.ID).Scan(&stored))
	assert.Equal(t, string(stored), string(n.Input), "byte for byte what an acquired lease carries")
	assert.Equal(t, wf, n.WorkflowID)

	var state, owner string
	var live bool
	var started *time.Time
	require.NoError(t, f.env.System.QueryRow(context.Background(), `SELECT state, lease_owner, lease_expires_at > now() + interval '25 seconds', started_at
		FROM task_instances WHERE id = $1`, b.ID).Scan(&state, &owner, &live, &started))
	assert.Equal(t, "running", state)
	assert.Equal(t, "w1", owner)
	assert.True(t, live, "leased for the offered TTL")
	assert.NotNil(t, started)
	assert.Zero(t, f.count(`SELECT count(*) FROM outbox WHERE task_id = $1`, b.ID), "nothing to publish")

	ls, _, err := f.c.AcquireLeases(context.Background(), f.tenant, Holder{Worker: "w2"}, 30*time.Second, []LeaseRequest{{RunID: run, TaskID: b.ID, Attempt: 1}})
	require.NoError(t, err)
	assert.False(t, ls[0].Acquired, "another worker cannot take it")
	rens, err := f.c.RenewLeases(context.Background(), f.tenant, Holder{Worker: "w1"}, 30*time.Second, []LeaseRequest{{RunID: run, TaskID: b.ID, Attempt: 1}})
	require.NoError(t, err)
	assert.True(t, rens[0].Held, "its owner renews it")

	ack, err = f.completeAs(run, b, "b", "w1", noopOffer)
	require.NoError(t, err)
	assert.Nil(t, ack.Next, "the run is over: nothing next")
	assert.Equal(t, "completed", string(f.runStatus(run)))
}

// TestEagerOfferTakesOnlyWhatTheWorkerRuns: the offer names a queue (the
// reported task's: the slot it frees) and node types; a next task
// elsewhere, of another type, or not run by workers goes through the
// outbox as usual, and a fan-out hands the worker one task only (the one
// slot it offered).
func TestEagerOfferTakesOnlyWhatTheWorkerRuns(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	cases := []struct {
		name, def string
		offer     *EagerOffer
	}{
		{"other queue", `{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"noop","queue":"gpu","depends_on":["a"]}]}`, noopOffer},
		{"other type", `{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"http","http":{"method":"GET","url":"http://127.0.0.1:9/"},"depends_on":["a"]}]}`, noopOffer},
		{"no offer", `{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"noop","depends_on":["a"]}]}`, nil},
		{"offered queue is not the reported task's", `{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"noop","queue":"gpu","depends_on":["a"]}]}`,
			&EagerOffer{Queue: "gpu", NodeTypes: []string{"noop"}, TTL: 30 * time.Second}},
		{"not a worker node", `{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"sleep","sleep":{"duration":"1h"},"depends_on":["a"]}]}`, noopOffer},
		{"a task node to a worker without handlers", `{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"task","task":{"handler":"charge"},"depends_on":["a"]}]}`,
			&EagerOffer{Queue: "default", NodeTypes: []string{"noop", "task"}, TTL: 30 * time.Second}},
		{"a task node to a worker without its handler", `{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"task","task":{"handler":"charge"},"depends_on":["a"]}]}`,
			&EagerOffer{Queue: "default", NodeTypes: []string{"noop", "task"}, Handlers: []string{"email"}, TTL: 30 * time.Second}},
	}
	for _, tc := range cases {
		run := f.start(f.workflow(tc.def), `{}`)
		a := f.lease(run, "a", "w1", 30*time.Second)
		ack, err := f.completeAs(run, a, "a", "w1", tc.offer)
		require.NoError(t, err, tc.name)
		assert.Nil(t, ack.Next, tc.name)
		b := f.mustTask(run, "b")
		assert.NotEqual(t, "running", b.State, tc.name)
	}

	// A worker that has the handler gets the task.
	run := f.start(f.workflow(`{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"task","task":{"handler":"charge"},"depends_on":["a"]}]}`), `{}`)
	a := f.lease(run, "a", "w1", 30*time.Second)
	ack, err := f.completeAs(run, a, "a", "w1", &EagerOffer{Queue: "default", NodeTypes: []string{"noop", "task"}, Handlers: []string{"charge"}, TTL: 30 * time.Second})
	require.NoError(t, err)
	require.NotNil(t, ack.Next, "the handler's worker takes its task")
	assert.Equal(t, "b", ack.Next.NodeID)

	run = f.start(f.workflow(`{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"noop","depends_on":["a"]},{"id":"c","type":"noop","depends_on":["a"]},{"id":"d","type":"noop","depends_on":["a"]}]}`), `{}`)
	a = f.lease(run, "a", "w1", 30*time.Second)
	ack, err = f.completeAs(run, a, "a", "w1", noopOffer)
	require.NoError(t, err)
	require.NotNil(t, ack.Next)
	assert.Equal(t, 1, f.count(`SELECT count(*) FROM task_instances WHERE run_id = $1 AND state = 'running'`, run), "one task for the one slot")
	assert.Equal(t, 2, f.count(`SELECT count(*) FROM task_instances WHERE run_id = $1 AND state = 'pending'`, run))
	assert.Equal(t, 2, f.count(`SELECT count(*) FROM outbox WHERE run_id = $1 AND node_id <> 'a'`, run), "the others are published")
	assert.Zero(t, f.count(`SELECT count(*) FROM outbox WHERE task_id = $1`, ack.Next.TaskID))
}

// TestEagerOfferOnARepeatedStaleOrBadReport: a malformed offer is
// rejected before anything is written; a repeated completion is ignored
// and hands back the lease its first answer carried (nothing new); a
// stale one gets nothing.
func TestEagerOfferOnARepeatedStaleOrBadReport(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	wf := f.workflow(`{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"noop","depends_on":["a"]}]}`)
	run := f.start(wf, `{}`)
	a := f.lease(run, "a", "w1", 30*time.Second)

	before := f.snapshot(run)
	for _, bad := range []*EagerOffer{
		{Queue: "default", NodeTypes: []string{"noop"}},                          // no TTL
		{Queue: "default", TTL: time.Minute},                                     // no node types
		{NodeTypes: []string{"noop"}, TTL: time.Minute},                          // no queue
		{Queue: "default", NodeTypes: []string{"noop"}, TTL: 11 * time.Minute},   // too long
		{Queue: "default", NodeTypes: make([]string, 65), TTL: 30 * time.Second}, // too many
	} {
		_, err := f.completeAs(run, a, "a", "w1", bad)
		require.Error(t, err)
		assert.Equal(t, errs.Invalid, errs.KindOf(err), "%+v", bad)
	}
	_, err := f.completeAs(run, a, "a", "", noopOffer)
	assert.Equal(t, errs.Invalid, errs.KindOf(err), "an offer without a lease owner")
	assert.Equal(t, before, f.snapshot(run), "rejected offers wrote nothing")

	ack, err := f.completeAs(run, a, "a", "w1", noopOffer)
	require.NoError(t, err)
	require.NotNil(t, ack.Next)
	first := ack.Next
	tasks := f.count(`SELECT count(*) FROM task_instances WHERE run_id = $1`, run)

	// The first answer was lost: the repeated report is ignored, and gets
	// the same lease back (extended), not a second one.
	ack, err = f.completeAs(run, a, "a", "w1", noopOffer)
	require.NoError(t, err)
	assert.True(t, ack.Ignored, "a duplicate report is ignored")
	require.NotNil(t, ack.Next, "but hands back the lease its first answer carried")
	assert.Equal(t, first.TaskID, ack.Next.TaskID)
	assert.Equal(t, 1, ack.Next.Attempt)
	assert.Equal(t, first.Input, ack.Next.Input)
	assert.False(t, ack.Next.ExpiresAt.Before(first.ExpiresAt))
	assert.Equal(t, tasks, f.count(`SELECT count(*) FROM task_instances WHERE run_id = $1`, run), "nothing new was created")
	assert.Zero(t, f.count(`SELECT count(*) FROM outbox WHERE task_id = $1`, first.TaskID))

	// Without an offer, or from another worker, a repeat gets nothing.
	ack, err = f.completeAs(run, a, "a", "w1", nil)
	require.NoError(t, err)
	assert.True(t, ack.Ignored)
	assert.Nil(t, ack.Next)
	ack, err = f.completeAs(run, a, "a", "w2", noopOffer)
	require.NoError(t, err)
	assert.True(t, ack.Ignored)
	assert.Nil(t, ack.Next)

	// A report from a worker that does not hold the lease gets nothing.
	b := f.mustTask(run, "b")
	ack, err = f.completeAs(run, b, "b", "w2", noopOffer)
	require.NoError(t, err)
	assert.True(t, ack.Ignored)
	assert.Nil(t, ack.Next)
}

// TestEagerLeaseTheWorkerNeverHeardOfIsSwept: the answer carrying the
// eager lease is lost and the worker never asks again (it died): the
// lease expires and the sweep gives the task a new attempt through the
// outbox, like any lease whose worker vanished.
func TestEagerLeaseTheWorkerNeverHeardOfIsSwept(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	wf := f.workflow(`{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"noop","depends_on":["a"],"retry":{"max_attempts":3}}]}`)
	run := f.start(wf, `{}`)
	a := f.lease(run, "a", "w1", 30*time.Second)
	ack, err := f.completeAs(run, a, "a", "w1", &EagerOffer{Queue: "default", NodeTypes: []string{"noop"}, TTL: time.Second})
	require.NoError(t, err)
	require.NotNil(t, ack.Next)

	s := NewSweeper(f.c, f.db, SweeperConfig{}, nil)
	eventually(t, "the eager lease to expire and be swept", 10*time.Second, func() bool {
		st, err := s.SweepOnce(context.Background())
		require.NoError(t, err)
		return st.Expired == 1
	})
	b := f.mustTask(run, "b")
	assert.Equal(t, "pending", b.State)
	assert.Equal(t, 2, b.Attempt)
	assert.Equal(t, 1, f.count(`SELECT count(*) FROM outbox WHERE task_id = $1 AND attempt = 2`, b.ID))

	// The lost attempt's late result is fenced out.
	ack, err = f.c.CompleteTask(context.Background(), f.tenant, Report{RunID: run, TaskID: b.ID, NodeID: "b", Attempt: 1, LeaseOwner: "w1"})
	require.NoError(t, err)
	assert.True(t, ack.Ignored)
}

// TestEagerLeaseTakesOverTheEndedAttemptsPermit: with a running-task
// quota, the permit of the reported attempt becomes the eager lease's (the
// tenant holds as many permits as live leases, one), and the next task is
// not admitted past the limit by another worker meanwhile.
func TestEagerLeaseTakesOverTheEndedAttemptsPermit(t *testing.T) {
	t.Parallel()
	f, slots := newQuotaFixture(t, 1)

	wf := f.workflow(`{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"noop","depends_on":["a"]}]}`)
	run, other := f.start(wf, `{}`), f.start(wf, `{}`)
	a := f.lease(run, "a", "w1", 30*time.Second)
	oa := f.mustTask(other, "a")
	ls, q, err := f.c.AcquireLeases(context.Background(), f.tenant, Holder{Worker: "w2"}, 30*time.Second, []LeaseRequest{{RunID: other, TaskID: oa.ID, Attempt: 1}})
	require.NoError(t, err)
	require.False(t, ls[0].Acquired, "the quota of 1 is taken")
	assert.True(t, q.Full())

	ack, err := f.completeAs(run, a, "a", "w1", noopOffer)
	require.NoError(t, err)
	require.NotNil(t, ack.Next)
	members, err := f.env.Redis.ZRange(context.Background(), f.env.Namespace+":{"+f.tenant.String()+"}:running", 0, -1).Result()
	require.NoError(t, err)
	assert.Equal(t, []string{tenants.SlotMember(ack.Next.TaskID, 1, "w1")}, members, "one permit, now the eager lease's")

	ls, _, err = f.c.AcquireLeases(context.Background(), f.tenant, Holder{Worker: "w2"}, 30*time.Second, []LeaseRequest{{RunID: other, TaskID: oa.ID, Attempt: 1}})
	require.NoError(t, err)
	assert.False(t, ls[0].Acquired, "still full while the eager lease runs")

	b := f.mustTask(run, "b")
	ack, err = f.completeAs(run, b, "b", "w1", nil)
	require.NoError(t, err)
	assert.Nil(t, ack.Next)
	eventually(t, "the last permit to be given back", 5*time.Second, func() bool {
		n, err := slots.Held(context.Background(), f.tenant)
		return err == nil && n == 0
	})
}
