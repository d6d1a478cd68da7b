package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/tenants"
)

func triggered(triggers string) string {
	return `{"triggers": ` + triggers + `, "nodes": [{"id": "a", "type": "noop"}]}`
}

func (f *fixture) publish(name, id, payload string) Published {
	f.t.Helper()
	p, err := f.c.PublishEvent(context.Background(), f.tenant, PublishEvent{ID: id, Name: name, Payload: json.RawMessage(payload)})
	require.NoError(f.t, err)
	return p
}

func (f *fixture) eventRunsOf(key uuid.UUID) map[uuid.UUID]EventRun {
	f.t.Helper()
	var ev Event
	require.NoError(f.t, f.db.WithTenant(context.Background(), f.tenant, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		ev, err = EventByKey(ctx, tx, key)
		return err
	}))
	out := map[uuid.UUID]EventRun{}
	for _, r := range ev.Runs {
		out[r.WorkflowID] = r
	}
	return out
}

func (f *fixture) runsOfWorkflow(wf uuid.UUID) int {
	f.t.Helper()
	var n int
	require.NoError(f.t, f.env.System.QueryRow(context.Background(),
		`SELECT count(*) FROM workflow_runs WHERE tenant_id = $1 AND workflow_id = $2`, f.tenant, wf).Scan(&n))
	return n
}

func TestPublishEventDedupes(t *testing.T) {
	f := newFixture(t)
	a := f.workflow(triggered(`[{"event": "order.created"}]`))
	b := f.workflow(triggered(`[{"event": "order.*"}]`))
	f.workflow(triggered(`[{"event": "invoice.created"}]`))
	f.workflow(`{"nodes": [{"id": "a", "type": "noop"}]}`)

	first := f.publish("order.created", "evt-1", `{"n": 1}`)
	require.True(t, first.Created)
	require.Len(t, first.Runs, 2)
	for i := 0; i < 2; i++ {
		again := f.publish("order.created", "evt-1", `{ "n" : 1 }`) // the same payload, spelled otherwise
		require.False(t, again.Created)
		require.Equal(t, first.Key, again.Key)
		require.ElementsMatch(t, first.Runs, again.Runs)
	}
	require.Equal(t, 1, f.runsOfWorkflow(a))
	require.Equal(t, 1, f.runsOfWorkflow(b))
	var events int
	require.NoError(t, f.env.System.QueryRow(context.Background(), `SELECT count(*) FROM events WHERE tenant_id = $1`, f.tenant).Scan(&events))
	require.Equal(t, 1, events)

	// The run's input is the event.
	var input json.RawMessage
	require.NoError(t, f.env.System.QueryRow(context.Background(), `SELECT input FROM workflow_runs WHERE tenant_id = $1 AND id = $2`,
		f.tenant, first.Runs[0].RunID).Scan(&input))
	require.JSONEq(t, `{"event": {"id": "evt-1", "name": "order.created", "payload": {"n": 1}}}`, string(input))

	// The same id with another payload or name is a conflict, and changes nothing.
	for _, c := range []struct{ name, payload string }{{"order.created", `{"n": 2}`}, {"order.updated", `{"n": 1}`}} {
		_, err := f.c.PublishEvent(context.Background(), f.tenant, PublishEvent{ID: "evt-1", Name: c.name, Payload: json.RawMessage(c.payload)})
		require.Equal(t, errs.Conflict, errs.KindOf(err), "%v", err)
	}
	require.Equal(t, 1, f.runsOfWorkflow(a))

	// An event no trigger matches is recorded and starts nothing.
	none := f.publish("user.signed_up", "evt-2", `{}`)
	require.True(t, none.Created)
	require.Empty(t, none.Runs)
}

func TestPublishEventMatchesWildcardsAndConditions(t *testing.T) {
	f := newFixture(t)
	big := f.workflow(triggered(`[{"event": "order.created", "if": "event.payload.total > 100"}]`))
	any := f.workflow(triggered(`[{"event": "order.*"}]`))
	eu := f.workflow(triggered(`[{"event": "*.shipped.eu"}, {"event": "order.refunded", "if": "event.payload.region == 'eu'"}]`))
	started := func(p Published) []uuid.UUID {
		var out []uuid.UUID
		for _, r := range p.Runs {
			require.Equal(t, EventRunStarted, r.Outcome, "%+v", r)
			out = append(out, r.WorkflowID)
		}
		return out
	}
	require.ElementsMatch(t, []uuid.UUID{big, any}, started(f.publish("order.created", "1", `{"total": 150}`)))
	require.ElementsMatch(t, []uuid.UUID{any}, started(f.publish("order.created", "2", `{"total": 50}`)))
	require.ElementsMatch(t, []uuid.UUID{eu}, started(f.publish("parcel.shipped.eu", "3", `{}`)))
	require.Empty(t, started(f.publish("order.item.added", "4", `{}`)))
	require.ElementsMatch(t, []uuid.UUID{any, eu}, started(f.publish("order.refunded", "5", `{"region": "eu"}`)))
	require.ElementsMatch(t, []uuid.UUID{any}, started(f.publish("order.refunded", "6", `{"region": "us"}`)))

	// A condition that fails on the payload is recorded as a refusal.
	p := f.publish("order.created", "7", `{}`)
	runs := map[uuid.UUID]EventRun{}
	for _, r := range p.Runs {
		runs[r.WorkflowID] = r
	}
	require.Equal(t, EventRunStarted, runs[any].Outcome)
	require.Equal(t, EventRunRefused, runs[big].Outcome)
	require.Equal(t, string(errs.Invalid), runs[big].ErrorCode)
	require.Contains(t, runs[big].ErrorMessage, "triggers[0].if")

	// Only the latest version's triggers count.
	_, err := f.c.PublishVersion(context.Background(), f.tenant, any, []byte(triggered(`[{"event": "invoice.*"}]`)))
	require.NoError(t, err)
	require.Empty(t, started(f.publish("order.created", "8", `{"total": 1}`)))
	require.ElementsMatch(t, []uuid.UUID{any}, started(f.publish("invoice.paid", "9", `{}`)))
}

func TestPublishEventRecordsRefusedStarts(t *testing.T) {
	f := newFixture(t)
	// Admission: the tenant may have one run.
	f.c = NewCoordinator(f.db, Options{Admit: func(ctx context.Context, tx *pg.Tx) error {
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM workflow_runs WHERE tenant_id = $1`, tx.Tenant).Scan(&n); err != nil {
			return err
		}
		if n >= 1 {
			return errs.E(errs.QuotaExceeded, "the tenant may have one run")
		}
		return nil
	}})
	a := f.workflow(triggered(`[{"event": "go"}]`))
	b := f.workflow(triggered(`[{"event": "go"}]`))
	p := f.publish("go", "e1", `{}`)
	require.Len(t, p.Runs, 2)
	runs := f.eventRunsOf(p.Key)
	require.Equal(t, EventRunStarted, runs[a].Outcome) // (workflow ids are v7: a sorts first)
	require.NotEqual(t, uuid.Nil, runs[a].RunID)
	require.Equal(t, EventRunRefused, runs[b].Outcome)
	require.Equal(t, uuid.Nil, runs[b].RunID)
	require.Equal(t, string(errs.QuotaExceeded), runs[b].ErrorCode)
	require.Equal(t, "the tenant may have one run", runs[b].ErrorMessage)
	require.Equal(t, 0, f.runsOfWorkflow(b))
	// Publishing it again starts nothing and answers the same.
	again := f.publish("go", "e1", `{}`)
	require.False(t, again.Created)
	require.Equal(t, 1, f.runsOfWorkflow(a))
}

func TestPublishEventValidates(t *testing.T) {
	f := newFixture(t)
	for _, c := range []struct {
		req   PublishEvent
		field string
	}{
		{PublishEvent{Name: "a"}, "id"},
		{PublishEvent{ID: string(make([]byte, 256)), Name: "a"}, "id"},
		{PublishEvent{ID: "1", Name: ""}, "name"},
		{PublishEvent{ID: "1", Name: "order.*"}, "name"},
		{PublishEvent{ID: "1", Name: "a", Payload: json.RawMessage(`[1]`)}, "payload"},
		{PublishEvent{ID: "1", Name: "a", Payload: json.RawMessage(`{"x": "` + string(make([]byte, MaxEventPayloadBytes)) + `"}`)}, "payload"},
	} {
		_, err := f.c.PublishEvent(context.Background(), f.tenant, c.req)
		var e *errs.Error
		require.ErrorAs(t, err, &e)
		require.Equal(t, errs.Invalid, e.Kind)
		require.Equal(t, c.field, e.Fields[0].Field)
	}
}

func TestPublishEventStaysInItsTenant(t *testing.T) {
	f := newFixture(t)
	a := f.workflow(triggered(`[{"event": "order.created"}]`))
	tb, err := tenants.Create(context.Background(), f.db, tenants.CreateParams{Name: "other"})
	require.NoError(t, err)
	g := &fixture{t: t, env: f.env, db: f.db, c: f.c, tenant: tb.ID}
	gb := g.workflow(triggered(`[{"event": "order.*"}]`))

	pb := g.publish("order.created", "same-id", `{}`)
	require.Len(t, pb.Runs, 1)
	require.Equal(t, gb, pb.Runs[0].WorkflowID)
	require.Equal(t, 0, f.runsOfWorkflow(a))

	// The same publisher id in the other tenant is another event.
	pa := f.publish("order.created", "same-id", `{"other": true}`)
	require.True(t, pa.Created)
	require.Len(t, pa.Runs, 1)
	require.Equal(t, a, pa.Runs[0].WorkflowID)

	// One tenant's event is not found by another.
	err = g.db.WithTenant(context.Background(), g.tenant, func(ctx context.Context, tx *pg.Tx) error {
		_, err := EventByKey(ctx, tx, pa.Key)
		return err
	})
	require.Equal(t, errs.NotFound, errs.KindOf(err))
	err = g.db.WithTenant(context.Background(), g.tenant, func(ctx context.Context, tx *pg.Tx) error {
		evs, err := ListEvents(ctx, tx, "", uuid.Nil, 10)
		require.Len(t, evs, 1)
		require.Equal(t, pb.Key, evs[0].Key)
		return err
	})
	require.NoError(t, err)
}

func TestListEvents(t *testing.T) {
	f := newFixture(t)
	wf := f.workflow(triggered(`[{"event": "a"}]`))
	for i := 0; i < 5; i++ {
		f.publish([]string{"a", "b"}[i%2], fmt.Sprint(i), `{}`)
	}
	var page []Event
	require.NoError(t, f.db.WithTenant(context.Background(), f.tenant, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		page, err = ListEvents(ctx, tx, "", uuid.Nil, 2)
		return err
	}))
	require.Len(t, page, 3) // one more than asked: there is a next page
	require.Equal(t, "4", page[0].ID)
	require.Equal(t, wf, page[0].Runs[0].WorkflowID)
	require.Empty(t, page[1].Runs)
	require.NoError(t, f.db.WithTenant(context.Background(), f.tenant, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		page, err = ListEvents(ctx, tx, "a", page[1].Key, 10)
		return err
	}))
	require.Len(t, page, 2)
	require.Equal(t, "2", page[0].ID)
	require.Equal(t, "0", page[1].ID)
}

// TestPublishEventConcurrently: many publishers of overlapping ids start
// exactly one run per (event, workflow).
func TestPublishEventConcurrently(t *testing.T) {
	f := newFixture(t)
	a := f.workflow(triggered(`[{"event": "order.*"}]`))
	b := f.workflow(triggered(`[{"event": "order.created"}]`))
	const publishers, events = 16, 20
	var wg sync.WaitGroup
	keys := make([]map[string]uuid.UUID, publishers)
	errc := make(chan error, publishers)
	for g := 0; g < publishers; g++ {
		keys[g] = map[string]uuid.UUID{}
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < events; i++ {
				id := fmt.Sprintf("evt-%d", (i+g)%events)
				p, err := f.c.PublishEvent(context.Background(), f.tenant, PublishEvent{ID: id, Name: "order.created", Payload: json.RawMessage(`{"id": "` + id + `"}`)})
				if err != nil {
					errc <- err
					return
				}
				if len(p.Runs) != 2 {
					errc <- fmt.Errorf("%s: %d runs", id, len(p.Runs))
					return
				}
				keys[g][id] = p.Key
			}
		}(g)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		require.NoError(t, err)
	}
	for g := 1; g < publishers; g++ {
		require.Equal(t, keys[0], keys[g])
	}
	require.Equal(t, events, f.runsOfWorkflow(a))
	require.Equal(t, events, f.runsOfWorkflow(b))
	var pairs int
	require.NoError(t, f.env.System.QueryRow(context.Background(),
		`SELECT count(DISTINCT (event, workflow_id)) FROM event_runs WHERE tenant_id = $1 AND outcome = 'started'`, f.tenant).Scan(&pairs))
	require.Equal(t, 2*events, pairs)
}
