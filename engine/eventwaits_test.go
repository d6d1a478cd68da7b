package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	sm "github.com/composer-dev/composer/engine/statemachine"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/tenants"
)

const paidWaiter = `{"nodes": [
	{"id": "paid", "type": "wait", "wait": {"event": "order.paid", "match": "event.payload.order_id == input.order_id", "timeout": "1h"}},
	{"id": "ship", "type": "noop", "depends_on": ["paid"], "input": {"amount": "nodes.paid.output.payload.amount"}}]}`

// TestAnEventResumesOnlyTheMatchingRunAmongAThousand: 1,000 runs wait for
// "order.paid", each for its own order; an event for one order resumes
// that run alone, found through the index of waits (one candidate read),
// and is listed with the run it resumed.
func TestAnEventResumesOnlyTheMatchingRunAmongAThousand(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	wf := f.workflow(paidWaiter)
	const n = 1000
	runs := make([]uuid.UUID, n)
	for i := range runs {
		runs[i] = f.start(wf, fmt.Sprintf(`{"order_id": "ord-%d"}`, i))
	}
	require.Equal(t, n, f.count(`SELECT count(*) FROM event_waits WHERE tenant_id = $1 AND name = 'order.paid'`, f.tenant))

	var waiters int
	require.NoError(t, f.db.WithTenant(context.Background(), f.tenant, func(ctx context.Context, tx *pg.Tx) error {
		rows, err := tx.Query(ctx, qEventWaiters, tx.Tenant, "order.paid", []string{"event.payload.order_id"}, []string{`"ord-537"`}, MaxEventDeliveries)
		if err != nil {
			return err
		}
		got, err := pgx.CollectRows(rows, func(pgx.CollectableRow) (struct{}, error) { return struct{}{}, nil })
		waiters = len(got)
		return err
	}))
	assert.Equal(t, 1, waiters, "the lookup reads the one run waiting for the key")

	p := f.publish("order.paid", "pay-537", `{"order_id": "ord-537", "amount": 42}`)
	require.Len(t, p.Runs, 1)
	r := p.Runs[0]
	assert.Equal(t, EventRun{WorkflowID: wf, RunID: runs[537], Outcome: EventRunResumed}, r)
	paid := f.mustTask(runs[537], "paid")
	assert.Equal(t, "completed", paid.State)
	assert.JSONEq(t, `{"id": "pay-537", "name": "order.paid", "payload": {"order_id": "ord-537", "amount": 42}}`, string(paid.Output))
	assert.Equal(t, "pending", f.mustTask(runs[537], "ship").State, "the run went on")
	assert.Equal(t, n-1, f.count(`SELECT count(*) FROM task_instances WHERE tenant_id = $1 AND node_id = 'paid' AND state = 'waiting'`, f.tenant))
	assert.Equal(t, n-1, f.count(`SELECT count(*) FROM event_waits WHERE tenant_id = $1`, f.tenant), "the resolved wait left the index")

	// Recorded with the event, and a repeat of its id resumes nothing again.
	runsOf := f.eventRunsOf(p.Key)
	assert.Equal(t, r, runsOf[wf])
	again := f.publish("order.paid", "pay-537", `{"order_id": "ord-537", "amount": 42}`)
	assert.False(t, again.Created)
	assert.Equal(t, p.Runs, again.Runs)
	// Another event for the same order finds nothing waiting any more; one
	// for no order resumes nothing.
	assert.Empty(t, f.publish("order.paid", "pay-537-b", `{"order_id": "ord-537", "amount": 1}`).Runs)
	assert.Empty(t, f.publish("order.paid", "pay-none", `{"order_id": "nobody"}`).Runs)
	assert.Empty(t, f.publish("order.paid", "pay-shape", `{"amount": 1}`).Runs, "a payload without the key matches nothing")

	var timeline int
	require.NoError(t, f.env.System.QueryRow(context.Background(),
		`SELECT count(*) FROM run_events WHERE run_id = $1 AND kind = 'event_received' AND detail->'event'->>'id' = 'pay-537'`, runs[537]).Scan(&timeline))
	assert.Equal(t, 1, timeline, "the timeline names the event")
}

func TestUnkeyedEventWaitsAreTriedAgainstTheirCondition(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	wf := f.workflow(`{"nodes": [{"id": "w", "type": "wait", "wait": {"event": "price.changed", "match": "event.payload.price < input.below"}}]}`)
	cheap, dear := f.start(wf, `{"below": 10}`), f.start(wf, `{"below": 100}`)
	p := f.publish("price.changed", "p1", `{"price": 50}`)
	require.Len(t, p.Runs, 1)
	assert.Equal(t, dear, p.Runs[0].RunID)
	assert.Equal(t, sm.RunCompleted, f.runStatus(dear))
	assert.Equal(t, sm.RunRunning, f.runStatus(cheap))
}

func TestCancelOnCancelsTheMatchingRunsOnly(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	wf := f.workflow(`{"cancel_on": [{"event": "order.cancelled", "match": "event.payload.order_id == input.order_id"}],
		"nodes": [{"id": "a", "type": "noop"}]}`)
	keep, drop := f.start(wf, `{"order_id": 1}`), f.start(wf, `{"order_id": 2}`)
	p := f.publish("order.cancelled", "c2", `{"order_id": 2}`)
	require.Len(t, p.Runs, 1)
	assert.Equal(t, EventRun{WorkflowID: wf, RunID: drop, Outcome: EventRunCancelled}, p.Runs[0])
	assert.Equal(t, sm.RunCancelled, f.runStatus(drop))
	assert.Equal(t, "cancelled", f.mustTask(drop, "a").State)
	assert.Equal(t, sm.RunRunning, f.runStatus(keep))
	assert.Zero(t, f.count(`SELECT count(*) FROM event_waits WHERE run_id = $1`, drop), "a finished run leaves the index")
	assert.Equal(t, 1, f.count(`SELECT count(*) FROM event_waits WHERE run_id = $1`, keep))

	// A run that finishes leaves it too.
	f.complete(keep, "a", `{}`)
	assert.Zero(t, f.count(`SELECT count(*) FROM event_waits WHERE tenant_id = $1`, f.tenant))
	assert.Empty(t, f.publish("order.cancelled", "c1", `{"order_id": 1}`).Runs)
	assert.Equal(t, sm.RunCompleted, f.runStatus(keep))
}

// TestAFailedPublishResumesNothing: the deliveries are part of the
// publish's one transaction; when it fails, no run moved.
func TestAFailedPublishResumesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	waiter := f.workflow(paidWaiter)
	f.workflow(triggered(`[{"event": "order.paid"}]`))
	run := f.start(waiter, `{"order_id": "x"}`)
	before := f.snapshot(run)
	var persists int
	f.c.fault = func(action int) bool {
		if action == 0 {
			persists++
		}
		return persists == 2 && action == 0 // the triggered start, after the delivery
	}
	_, err := f.c.PublishEvent(context.Background(), f.tenant, PublishEvent{ID: "e", Name: "order.paid", Payload: json.RawMessage(`{"order_id": "x"}`)})
	require.Error(t, err)
	f.c.fault = nil
	assert.Equal(t, before, f.snapshot(run), "the run is as it was")
	assert.Zero(t, f.count(`SELECT count(*) FROM events WHERE tenant_id = $1`, f.tenant))
	assert.Equal(t, 1, f.count(`SELECT count(*) FROM event_waits WHERE run_id = $1`, run))

	p := f.publish("order.paid", "e", `{"order_id": "x"}`)
	assert.Len(t, p.Runs, 2, "published again, it resumes the run and starts the triggered one")
}

// TestConcurrentPublishesResumeEachRunOnce: 8 publishers publish the same
// 50 events (one per waiting run) at once, in different orders; each run
// is resumed exactly once and every publish answers the same event.
func TestConcurrentPublishesResumeEachRunOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	wf := f.workflow(paidWaiter)
	const runs, publishers = 50, 8
	ids := make([]uuid.UUID, runs)
	for i := range ids {
		ids[i] = f.start(wf, fmt.Sprintf(`{"order_id": %d}`, i))
	}
	var wg sync.WaitGroup
	errc := make(chan error, publishers)
	for g := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range runs {
				i := (k*7 + g*13) % runs
				p, err := f.c.PublishEvent(context.Background(), f.tenant, PublishEvent{ID: fmt.Sprint("pay-", i), Name: "order.paid",
					Payload: json.RawMessage(fmt.Sprintf(`{"order_id": %d, "amount": %d}`, i, i))})
				if err == nil && (len(p.Runs) != 1 || p.Runs[0].RunID != ids[i]) {
					err = fmt.Errorf("event %d answered %+v", i, p.Runs)
				}
				if err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		require.NoError(t, err)
	}
	assert.Equal(t, runs, f.count(`SELECT count(*) FROM event_runs WHERE tenant_id = $1 AND outcome = 'resumed'`, f.tenant))
	assert.Equal(t, runs, f.count(`SELECT count(DISTINCT run_id) FROM event_runs WHERE tenant_id = $1 AND outcome = 'resumed'`, f.tenant))
	assert.Equal(t, runs, f.count(`SELECT count(*) FROM run_events WHERE tenant_id = $1 AND kind = 'event_received'`, f.tenant))
	assert.Equal(t, runs, f.count(`SELECT count(*) FROM task_instances WHERE tenant_id = $1 AND node_id = 'ship'`, f.tenant))
	for i, id := range ids {
		assert.JSONEq(t, fmt.Sprintf(`{"amount": %d}`, i), string(mustInput(t, f, id, "ship")))
	}
}

func mustInput(t *testing.T, f *fixture, run uuid.UUID, node string) json.RawMessage {
	t.Helper()
	var in json.RawMessage
	require.NoError(t, f.env.System.QueryRow(context.Background(), `SELECT input FROM task_instances WHERE run_id = $1 AND node_id = $2`, run, node).Scan(&in))
	return in
}

// TestEventWaitsStayInTheirTenant: an event published by one tenant never
// resumes another's run waiting for the same name and key.
func TestEventWaitsStayInTheirTenant(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	tb, err := tenants.Create(context.Background(), f.db, tenants.CreateParams{Name: "other"})
	require.NoError(t, err)
	g := &fixture{t: t, env: f.env, db: f.db, c: f.c, tenant: tb.ID}
	theirs := g.start(g.workflow(paidWaiter), `{"order_id": "same"}`)
	mine := f.start(f.workflow(paidWaiter), `{"order_id": "same"}`)
	p := f.publish("order.paid", "e", `{"order_id": "same"}`)
	require.Len(t, p.Runs, 1)
	assert.Equal(t, mine, p.Runs[0].RunID)
	assert.Equal(t, "waiting", g.mustTask(theirs, "paid").State)
}
