package billing_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/billing"
	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/sdk/worker"
	"github.com/composer-dev/composer/tenants"
)

type row struct {
	tenant uuid.UUID
	key    string
	meter  string
	q      int64
	at     time.Time
}

func seed(t *testing.T, env *testenv.Env, rows ...row) {
	for _, r := range rows {
		_, err := env.System.Exec(context.Background(), `INSERT INTO usage_records (tenant_id, key, meter, quantity, recorded_at) VALUES ($1, $2, $3, $4, $5)`,
			r.tenant, r.key, r.meter, r.q, r.at)
		require.NoError(t, err)
	}
}

// totals reads a key → quantity map.
func totals(t *testing.T, pool pg.Querier, sql string, args ...any) map[string]int64 {
	rows, err := pool.Query(context.Background(), sql, args...)
	require.NoError(t, err)
	out := map[string]int64{}
	for rows.Next() {
		var k string
		var q int64
		require.NoError(t, rows.Scan(&k, &q))
		out[k] = q
	}
	return out
}

func hourly(t *testing.T, env *testenv.Env) map[string]int64 {
	return totals(t, env.System, `SELECT tenant_id::text || '/' || meter || '/' || to_char(hour AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24'), quantity FROM usage_hourly`)
}

func daily(t *testing.T, env *testenv.Env) map[string]int64 {
	return totals(t, env.System, `SELECT tenant_id::text || '/' || meter || '/' || day::text, quantity FROM usage_daily`)
}

// TestRollupIsIdempotentAndSafeOnManyReplicas: usage over three hours and
// two days for two tenants; passes run repeatedly and eight at once give
// exactly the sums, and a row that commits late, within the lateness
// window, is counted by the next pass.
func TestRollupIsIdempotentAndSafeOnManyReplicas(t *testing.T) {
	t.Parallel()
	env := testenv.NewPG(t)
	ctx := context.Background()
	// Buckets are UTC hours whatever the session time zone: run every pass
	// in a zone half an hour off UTC.
	_, err := env.Owner(t).Exec(ctx, `ALTER DATABASE `+env.DBName+` SET timezone = 'Asia/Kolkata'`)
	require.NoError(t, err)
	env.System.Reset()
	var tz string
	require.NoError(t, env.System.QueryRow(ctx, `SHOW timezone`).Scan(&tz))
	require.Equal(t, "Asia/Kolkata", tz)
	db := pg.New(env.App, env.System, false)
	a, err := tenants.Create(ctx, db, tenants.CreateParams{Name: "a"})
	require.NoError(t, err)
	b, err := tenants.Create(ctx, db, tenants.CreateParams{Name: "b"})
	require.NoError(t, err)
	now := time.Now().UTC()
	h0 := now.Truncate(time.Hour)
	yesterday := h0.Add(-25 * time.Hour)
	seed(t, env,
		row{a.ID, "runs_started:1", billing.RunsStarted, 1, h0.Add(time.Minute)},
		row{a.ID, "runs_started:2", billing.RunsStarted, 1, h0.Add(2 * time.Minute)},
		row{a.ID, "step_seconds:1", billing.StepSeconds, 1500, h0.Add(-30 * time.Minute)},
		row{a.ID, "step_seconds:2", billing.StepSeconds, 2500, h0.Add(-20 * time.Minute)},
		row{a.ID, "runs_started:0", billing.RunsStarted, 1, yesterday},
		row{b.ID, "runs_started:9", billing.RunsStarted, 1, h0.Add(time.Minute)},
	)
	r := &billing.Rollup{DB: db, Log: zap.NewNop()}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 3 {
				_, err := r.Pass(ctx)
				assert.NoError(t, err)
			}
		}()
	}
	wg.Wait()
	hr := func(tn uuid.UUID, m string, h time.Time) string {
		return tn.String() + "/" + m + "/" + h.Format("2006-01-02T15")
	}
	want := map[string]int64{
		hr(a.ID, billing.RunsStarted, h0):                 2,
		hr(a.ID, billing.StepSeconds, h0.Add(-time.Hour)): 4000,
		hr(a.ID, billing.RunsStarted, yesterday):          1,
		hr(b.ID, billing.RunsStarted, h0):                 1,
	}
	assert.Equal(t, want, hourly(t, env))
	days := map[string]int64{}
	for k, v := range want {
		days[k[:len(k)-3]] += v // tenant/meter/YYYY-MM-DD
	}
	assert.Equal(t, days, daily(t, env))

	// A row that shows up late, timestamped a few minutes back: the next
	// pass recomputes that hour.
	seed(t, env, row{a.ID, "runs_started:late", billing.RunsStarted, 1, now.Add(-5 * time.Minute)})
	_, err = r.Pass(ctx)
	require.NoError(t, err)
	late := now.Add(-5 * time.Minute).Truncate(time.Hour)
	assert.Equal(t, want[hr(a.ID, billing.RunsStarted, late)]+1, hourly(t, env)[hr(a.ID, billing.RunsStarted, late)])
	before := hourly(t, env)
	_, err = r.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, before, hourly(t, env), "a repeated pass changes nothing")
}

// TestRetentionKeepsWhatWasNotExported: raw rows past retention go when
// their export is settled (sent, or export off); rows still to be sent
// and dead-lettered ones stay.
func TestRetentionKeepsWhatWasNotExported(t *testing.T) {
	t.Parallel()
	env := testenv.NewPG(t)
	db := pg.New(env.App, env.System, false)
	ctx := context.Background()
	a, err := tenants.Create(ctx, db, tenants.CreateParams{Name: "a"})
	require.NoError(t, err)
	old := time.Now().Add(-48 * time.Hour)
	for _, state := range []string{"none", "sent", "pending", "dead"} {
		_, err := env.System.Exec(ctx, `INSERT INTO usage_records (tenant_id, key, meter, quantity, recorded_at, export_state)
			VALUES ($1, $2, 'runs_started', 1, $3, $2)`, a.ID, state, old)
		require.NoError(t, err)
	}
	r := &billing.Rollup{DB: db, Log: zap.NewNop(), Retention: time.Hour}
	_, err = r.Pass(ctx) // rolls them up: nothing is deleted before that
	require.NoError(t, err)
	st, err := r.Pass(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(2), st.Deleted)
	rows, err := env.System.Query(ctx, `SELECT key FROM usage_records ORDER BY key`)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	assert.Equal(t, []string{"dead", "pending"}, left)
	assert.Equal(t, int64(4), hourly(t, env)[a.ID.String()+"/runs_started/"+old.UTC().Format("2006-01-02T15")], "totals keep them")
}

// TestMetersAreWrittenWithTheTransitionAndOnlyOnce: a run's start and its
// steps are metered in their transactions; a duplicated report and a
// refused start add nothing.
func TestMetersAreWrittenWithTheTransitionAndOnlyOnce(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	sys.StartSDKWorker(func(w *worker.Worker) {
		w.HandleRaw("work", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			time.Sleep(20 * time.Millisecond) // the work being measured
			return json.RawMessage(`{}`), nil
		})
	}, apptest.SDKWorkerOptions{})
	wf := sys.Workflow(`{"nodes":[{"id":"a","type":"task","task":{"handler":"work"}},{"id":"b","type":"task","task":{"handler":"work"},"depends_on":["a"]}]}`)
	run := sys.StartRun(wf, `{}`)
	got, tasks := sys.WaitRun(run, 30*time.Second)
	require.Equal(t, "completed", got.Status)
	count := func() map[string]int64 {
		return totals(t, sys.Deps.DB.System(), `SELECT meter, count(*) FROM usage_records WHERE tenant_id = $1 GROUP BY meter`, sys.Tenant)
	}
	assert.Equal(t, map[string]int64{billing.RunsStarted: 1, billing.StepsExecuted: 2, billing.StepSeconds: 2}, count())
	var ms int64
	require.NoError(t, sys.Deps.DB.System().QueryRow(ctx, `SELECT quantity FROM usage_records WHERE tenant_id = $1 AND key = $2`,
		sys.Tenant, "step_seconds:"+tasks["a"].ID.String()+":1").Scan(&ms))
	assert.GreaterOrEqual(t, ms, int64(20), "the attempt's execution time (the handler sleeps 20 ms)")

	// The worker's report again: fenced, and nothing more is metered.
	ack, err := sys.Coordinator().CompleteTask(ctx, sys.Tenant, engine.Report{RunID: run, TaskID: tasks["a"].ID, NodeID: "a", Attempt: 1,
		LeaseOwner: "someone", Output: json.RawMessage(`{}`)})
	require.NoError(t, err)
	assert.True(t, ack.Ignored)
	// A start refused by validation writes no meter either.
	_, err = sys.Coordinator().StartRun(ctx, sys.Tenant, engine.StartRun{WorkflowID: wf, Input: json.RawMessage(`[1]`)})
	require.Error(t, err)
	assert.Equal(t, map[string]int64{billing.RunsStarted: 1, billing.StepsExecuted: 2, billing.StepSeconds: 2}, count())
}

// TestCapsRefuseNewRunsUntilThePlanChanges: on a plan with a hard cap of
// 2 runs a month, the third start is QUOTA_EXCEEDED and writes nothing;
// the runs already started finish; a plan change admits starts again. A
// spend cap does the same with money.
func TestCapsRefuseNewRunsUntilThePlanChanges(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	owner := sys.Env.Owner(t)
	_, err := owner.Exec(ctx, `INSERT INTO plans (name, limits, base_fee_cents) VALUES ('capped', '{"max_running_tasks": 10}', 0), ('metered', '{}', 0);
		INSERT INTO plan_prices (plan, meter, included, unit_price_micros, hard_cap) VALUES
		  ('capped', 'runs_started', 2, 0, 2), ('metered', 'runs_started', 0, 1000000, NULL)`)
	require.NoError(t, err)
	require.NoError(t, tenants.Update(ctx, sys.Deps.DB, sys.Tenant, tenants.UpdateParams{Plan: "capped"}))
	tok := sys.Token(sys.Tenant, "owner@x", auth.RoleOwner)
	wf := sys.Workflow(`{"nodes":[{"id":"w","type":"wait","wait":{"signal":"go"}}]}`)
	start := func() apptest.GQLResponse {
		return sys.GraphQL(tok, `mutation($w: ID!) { startRun(input: {workflowId: $w}) { run { id } } }`, map[string]any{"w": wf.String()})
	}
	rollup := &billing.Rollup{DB: sys.Deps.DB, Log: zap.NewNop()}
	var first struct {
		StartRun struct{ Run struct{ ID string } }
	}
	start().Decode(t, &first)
	require.Empty(t, start().Errors)
	_, err = rollup.Pass(ctx)
	require.NoError(t, err)

	runs := func() (n int) {
		require.NoError(t, sys.Deps.DB.System().QueryRow(ctx, `SELECT count(*) FROM workflow_runs WHERE tenant_id = $1`, sys.Tenant).Scan(&n))
		return n
	}
	res := start()
	assert.Equal(t, []string{"QUOTA_EXCEEDED"}, res.Codes(), "the cap of 2 runs is reached")
	assert.Contains(t, res.Errors[0].Message, "cap of 2 runs_started")
	assert.Equal(t, 2, runs(), "nothing written for the refused start")

	// A run already started still finishes.
	_, err = sys.Coordinator().SignalRun(ctx, sys.Tenant, uuid.MustParse(first.StartRun.Run.ID), engine.Signal{Name: "go"})
	require.NoError(t, err)
	got, _ := sys.WaitRun(uuid.MustParse(first.StartRun.Run.ID), 10*time.Second)
	assert.Equal(t, "completed", got.Status)

	var inv struct {
		InvoicePreview struct {
			Plan        string
			CapsReached []string
			LineItems   []struct {
				Meter      string
				Quantity   int64
				HardCap    *int64
				CapReached bool
			}
		}
	}
	sys.GraphQL(tok, `{ invoicePreview { plan capsReached lineItems { meter quantity hardCap capReached } } }`, nil).Decode(t, &inv)
	assert.Equal(t, "capped", inv.InvoicePreview.Plan)
	assert.Equal(t, []string{billing.RunsStarted}, inv.InvoicePreview.CapsReached)

	// A plan change admits starts again.
	require.NoError(t, tenants.Update(ctx, sys.Deps.DB, sys.Tenant, tenants.UpdateParams{Plan: "metered", Limits: &tenants.Limits{SpendCapCents: 250}}))
	require.Empty(t, start().Errors, "admitted on the new plan")
	_, err = rollup.Pass(ctx)
	require.NoError(t, err)
	// 3 runs at $1 each this month: $3.00 reaches the $2.50 spend cap.
	res = start()
	assert.Equal(t, []string{"QUOTA_EXCEEDED"}, res.Codes(), "the spend cap is reached")
	assert.Contains(t, res.Errors[0].Message, "spend cap of 2.50 USD")
	assert.Equal(t, 3, runs())
}

// TestExportDeliversEachRecordOnceAndRetries: the billing endpoint fails
// twice, then accepts; every record arrives with its idempotency key, the
// retries back off, and a refused batch goes dead with its reason.
func TestExportDeliversEachRecordOnceAndRetries(t *testing.T) {
	t.Parallel()
	env := testenv.NewPG(t)
	db := pg.New(env.App, env.System, false)
	ctx := context.Background()
	tn, err := tenants.Create(ctx, db, tenants.CreateParams{Name: "a"})
	require.NoError(t, err)
	m := billing.Meter{Export: true}
	for i := range 7 {
		require.NoError(t, db.WithTenant(ctx, tn.ID, func(ctx context.Context, tx *pg.Tx) error {
			return m.Record(ctx, tx, tn.ID, billing.RunsStarted, uuid.NewString(), int64(i+1))
		}))
	}
	var calls atomic.Int32
	var mu sync.Mutex
	seen := map[string]int{}
	var auths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		var body struct{ Events []billing.Event }
		b, _ := io.ReadAll(r.Body)
		require.NoError(t, json.Unmarshal(b, &body))
		mu.Lock()
		auths = append(auths, r.Header.Get("Authorization"))
		if n > 2 {
			for _, e := range body.Events {
				seen[e.IdempotencyKey]++
				assert.Equal(t, tn.ID, e.CustomerID)
				assert.Equal(t, billing.RunsStarted, e.EventName)
			}
		}
		mu.Unlock()
		if n <= 2 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	}))
	defer srv.Close()
	ex := &billing.Exporter{DB: db, URL: srv.URL, Token: "tok", Batch: 10, Backoff: 300 * time.Millisecond, ClaimLease: time.Minute}
	deadline := time.Now().Add(20 * time.Second)
	var delays []time.Duration
	for {
		before := calls.Load()
		_, _ = ex.Pass(ctx)
		var pending int
		var wait time.Duration
		require.NoError(t, env.System.QueryRow(ctx, `SELECT count(*), coalesce(max(export_next_at) - now(), '0')
			FROM usage_records WHERE export_state = 'pending'`).Scan(&pending, &wait))
		if pending == 0 {
			break
		}
		if calls.Load() > before && calls.Load() <= 2 {
			delays = append(delays, wait) // after the n-th failure
		}
		require.True(t, time.Now().Before(deadline), "export did not finish")
		time.Sleep(10 * time.Millisecond) // the backoff runs on the database clock: poll it
	}
	mu.Lock()
	assert.Len(t, seen, 7, "every record")
	for k, n := range seen {
		assert.Equal(t, 1, n, "accepted once: %s", k)
	}
	assert.Equal(t, "Bearer tok", auths[0])
	mu.Unlock()
	var sent int
	require.NoError(t, env.System.QueryRow(ctx, `SELECT count(*) FROM usage_records WHERE export_state = 'sent'`).Scan(&sent))
	assert.Equal(t, 7, sent)
	if assert.Len(t, delays, 2) {
		assert.Greater(t, delays[1], delays[0], "the backoff grows")
	}

	// A refused batch is dead at once, with the reason.
	require.NoError(t, db.WithTenant(ctx, tn.ID, func(ctx context.Context, tx *pg.Tx) error {
		return m.Record(ctx, tx, tn.ID, billing.RunsStarted, "refused", 1)
	}))
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusBadRequest) }))
	defer bad.Close()
	ex.URL = bad.URL
	_, err = ex.Pass(ctx)
	require.Error(t, err)
	var state, reason string
	require.NoError(t, env.System.QueryRow(ctx, `SELECT export_state, export_error FROM usage_records WHERE key = 'runs_started:refused'`).Scan(&state, &reason))
	assert.Equal(t, "dead", state)
	assert.Contains(t, reason, "400")
}

// TestUsageAndInvoiceInGraphQL: a tenant reads its meters for a period and
// its invoice preview; a key without billing:read cannot; a bad period is
// a clear error.
func TestUsageAndInvoiceInGraphQL(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t) // plan pro
	ctx := context.Background()
	now := time.Now().UTC()
	seed(t, sys.Env,
		row{sys.Tenant, "runs_started:x", billing.RunsStarted, 50_100, now.Add(-time.Minute)},
		row{sys.Tenant, "step_seconds:x", billing.StepSeconds, 1_000_000_500, now.Add(-time.Minute)},
		row{sys.Tenant, "runs_started:old", billing.RunsStarted, 7, now.AddDate(0, -1, 0)},
	)
	// Rows are seeded in the past, which live usage never is: the server's
	// own rollup may already have moved past them, so start over.
	_, err := sys.Env.System.Exec(ctx, `UPDATE usage_rollup_state SET through = '2000-01-01'`)
	require.NoError(t, err)
	_, err = (&billing.Rollup{DB: sys.Deps.DB, Log: zap.NewNop()}).Pass(ctx)
	require.NoError(t, err)
	viewer := sys.Token(sys.Tenant, "viewer@x", auth.RoleViewer)
	var got struct {
		Tenant struct {
			Usage struct {
				Period string
				Meters []struct {
					Meter    string
					Quantity int64
					Unit     string
				}
			}
		}
		InvoicePreview struct {
			Currency     string
			BaseFeeCents int64
			TotalCents   int64
			LineItems    []struct {
				Meter       string
				Billable    int64
				AmountCents int64
			}
		}
	}
	sys.GraphQL(viewer, `{ tenant { usage { period meters { meter quantity unit } } }
		invoicePreview { currency baseFeeCents totalCents lineItems { meter billable amountCents } } }`, nil).Decode(t, &got)
	assert.Equal(t, billing.PeriodOf(now).String(), got.Tenant.Usage.Period)
	q := map[string]int64{}
	for _, m := range got.Tenant.Usage.Meters {
		q[m.Meter] = m.Quantity
	}
	assert.Equal(t, map[string]int64{billing.RunsStarted: 50_100, billing.StepsExecuted: 0, billing.StepSeconds: 1_000_001, billing.WebhookDeliveries: 0}, q,
		"this month only; step seconds rounded up")
	// pro: 4,900 base; 100 runs over 50,000 × 200 µ$ = 2 c; 1 s over 1,000,000 × 10 µ$ = 0 c.
	assert.Equal(t, "USD", got.InvoicePreview.Currency)
	assert.Equal(t, int64(4902), got.InvoicePreview.TotalCents)

	var last struct {
		Tenant struct {
			Usage struct{ Meters []struct{ Quantity int64 } }
		}
	}
	sys.GraphQL(viewer, `query($p: String) { tenant { usage(period: $p) { meters { quantity } } } }`,
		map[string]any{"p": billing.PeriodOf(now.AddDate(0, -1, 0)).String()}).Decode(t, &last)
	assert.Equal(t, int64(7), last.Tenant.Usage.Meters[0].Quantity, "last month's runs")

	res := sys.GraphQL(viewer, `{ tenant { usage(period: "2026-13") { queuedTasks } } }`, nil)
	assert.Equal(t, []string{"BAD_USER_INPUT"}, res.Codes())

	// A key scoped to runs only reads the queue, not the meters.
	var key struct{ CreateApiKey struct{ Secret string } }
	owner := sys.Token(sys.Tenant, "owner@x", auth.RoleOwner)
	sys.GraphQL(owner, `mutation { createApiKey(input: {name: "ci", scopes: ["runs:read"]}) { secret } }`, nil).Decode(t, &key)
	res = sys.GraphQL(key.CreateApiKey.Secret, `{ tenant { usage { queuedTasks meters { quantity } } } }`, nil)
	assert.Equal(t, []string{"FORBIDDEN"}, res.Codes())
	res = sys.GraphQL(key.CreateApiKey.Secret, `{ invoicePreview { totalCents } }`, nil)
	assert.Equal(t, []string{"FORBIDDEN"}, res.Codes())
}

// TestEveryPlanPricesEveryMeter: the meter names the code writes are the
// ones the plans price — a meter renamed on one side only would bill
// nothing.
func TestEveryPlanPricesEveryMeter(t *testing.T) {
	t.Parallel()
	env := testenv.NewPG(t)
	for _, plan := range []string{"free", "pro", "enterprise"} {
		rows, err := env.System.Query(context.Background(), `SELECT meter FROM plan_prices WHERE plan = $1 ORDER BY meter`, plan)
		require.NoError(t, err)
		var priced []string
		for rows.Next() {
			var m string
			require.NoError(t, rows.Scan(&m))
			priced = append(priced, m)
		}
		require.NoError(t, rows.Err())
		assert.ElementsMatch(t, billing.Meters, priced, "plan %s", plan)
	}
}
