package webhooks_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/billing"
	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/internal/app"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/config"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/internal/ssrf"
	"github.com/composer-dev/composer/sdk/webhook"
	"github.com/composer-dev/composer/tenants"
	"github.com/composer-dev/composer/webhooks"
)

// fixture is a system whose own relay is off (no secret key), with a
// Service and Relays the test configures.
type fixture struct {
	t      *testing.T
	sys    *apptest.System
	keys   *webhooks.Keyring
	svc    webhooks.Service
	policy *ssrf.Policy
	wf     uuid.UUID
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	sys := apptest.Start(t, func(c *config.Config) { c.WebhookSecretKeys = nil })
	require.Nil(t, sys.Server.Relay)
	keys, err := webhooks.ParseKeyring([]string{app.DevWebhookKey})
	require.NoError(t, err)
	// Only 127.0.0.1 is reachable: the SSRF cases use other addresses.
	policy, err := ssrf.NewPolicy([]string{"127.0.0.1/32"})
	require.NoError(t, err)
	f := &fixture{t: t, sys: sys, keys: keys, policy: policy,
		svc: webhooks.Service{Keys: keys, Policy: policy, Dev: true}}
	f.wf = sys.Workflow(`{"nodes":[{"id":"w","type":"wait","wait":{"signal":"go"}}]}`)
	return f
}

func (f *fixture) relay(mod func(*webhooks.Relay)) *webhooks.Relay {
	r := &webhooks.Relay{DB: f.sys.Deps.DB, Keys: f.keys, Transport: f.policy.ResolvingTransport(net.DefaultResolver),
		Log: zap.NewNop(), Meter: billing.Meter{}, Schedule: []time.Duration{time.Millisecond}, Timeout: 2 * time.Second}
	if mod != nil {
		mod(r)
	}
	return r
}

func (f *fixture) tx(tenant uuid.UUID, fn func(ctx context.Context, tx *pg.Tx) error) {
	f.t.Helper()
	require.NoError(f.t, f.sys.Deps.DB.WithTenant(context.Background(), tenant, fn))
}

func (f *fixture) endpoint(tenant uuid.UUID, url string, types ...string) (webhooks.Endpoint, string) {
	f.t.Helper()
	if types == nil { // the terminal events (the fixture's runs also wait)
		types = []string{webhooks.EventRunCompleted, webhooks.EventRunFailed, webhooks.EventRunCancelled}
	}
	var e webhooks.Endpoint
	var secret string
	f.tx(tenant, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		e, secret, err = f.svc.Create(ctx, tx, webhooks.CreateParams{URL: url, EventTypes: types, CreatedBy: "test"})
		return err
	})
	return e, secret
}

// cancelledRun starts a run and cancels it: a run.cancelled event.
func (f *fixture) cancelledRun() uuid.UUID {
	f.t.Helper()
	res, err := f.sys.Coordinator().StartRun(context.Background(), f.sys.Tenant, engine.StartRun{WorkflowID: f.wf,
		Metadata: map[string]string{"customer": "c_42"}})
	require.NoError(f.t, err)
	run := res.RunID
	_, err = f.sys.Coordinator().CancelRun(context.Background(), f.sys.Tenant, run, "test")
	require.NoError(f.t, err)
	return run
}

func (f *fixture) deliveries(tenant uuid.UUID, filter webhooks.DeliveryFilter) []webhooks.Delivery {
	f.t.Helper()
	var out []webhooks.Delivery
	f.tx(tenant, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		out, _, err = f.svc.Deliveries(ctx, tx, filter, 100, nil)
		return err
	})
	return out
}

func (f *fixture) only(run uuid.UUID) webhooks.Delivery {
	f.t.Helper()
	ds := f.deliveries(f.sys.Tenant, webhooks.DeliveryFilter{RunID: &run})
	require.Len(f.t, ds, 1)
	return ds[0]
}

// pump runs relay passes until cond holds.
func (f *fixture) pump(r *webhooks.Relay, what string, cond func() bool) {
	f.t.Helper()
	apptest.Eventually(f.t, what, 20*time.Second, func() bool {
		_, err := r.Pass(context.Background())
		require.NoError(f.t, err)
		return cond()
	})
}

type received struct {
	header http.Header
	body   []byte
	at     time.Time
}

// receiver answers with status(n) for the n-th request (1-based).
type receiver struct {
	mu     sync.Mutex
	got    []received
	status func(n int) int
	srv    *httptest.Server
}

func newReceiver(t *testing.T, status func(n int) int) *receiver {
	rc := &receiver{status: status}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		rc.got = append(rc.got, received{header: r.Header.Clone(), body: body, at: time.Now()})
		n := len(rc.got)
		rc.mu.Unlock()
		w.WriteHeader(rc.status(n))
		_, _ = fmt.Fprintf(w, "answer %d", n)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) requests() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]received(nil), rc.got...)
}

// TestRetriesUntilSuccessWithTheSameID: a receiver fails three times, then
// succeeds. Exactly one success is recorded, every attempt carries the
// same webhook-id and a valid signature, and the waits grow.
func TestRetriesUntilSuccessWithTheSameID(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	rc := newReceiver(t, func(n int) int {
		if n <= 3 {
			return []int{500, 503, 429}[n-1]
		}
		return 200
	})
	_, secret := f.endpoint(f.sys.Tenant, rc.srv.URL)
	run := f.cancelledRun()
	r := f.relay(func(r *webhooks.Relay) {
		r.Schedule = []time.Duration{100 * time.Millisecond, 300 * time.Millisecond, 900 * time.Millisecond, time.Hour}
		r.Jitter = 0.1
	})
	f.pump(r, "the delivery to succeed", func() bool { return f.only(run).State == webhooks.StateSucceeded })

	d := f.only(run)
	reqs := rc.requests()
	require.Len(t, reqs, 4)
	require.Len(t, d.Attempts, 4)
	for i, a := range d.Attempts {
		require.Equal(t, i+1, a.Attempt)
		require.NotNil(t, a.StatusCode)
		require.Equal(t, []int{500, 503, 429, 200}[i], *a.StatusCode)
		require.NotNil(t, a.LatencyMs)
	}
	require.Equal(t, "HTTP 500", *d.Attempts[0].Error)
	require.Nil(t, d.Attempts[3].Error)
	require.Equal(t, "answer 4", *d.Attempts[3].ResponseBody)
	for _, q := range reqs {
		require.Equal(t, d.WebhookID(), q.header.Get("webhook-id"))
		require.NoError(t, webhook.Verify(secret, q.header, q.body))
		require.Equal(t, d.Payload, string(q.body))
	}
	gap1, gap2, gap3 := reqs[1].at.Sub(reqs[0].at), reqs[2].at.Sub(reqs[1].at), reqs[3].at.Sub(reqs[2].at)
	t.Logf("waits between attempts: %s, %s, %s", gap1, gap2, gap3)
	require.GreaterOrEqual(t, gap1, 90*time.Millisecond)
	require.Greater(t, gap2, gap1)
	require.Greater(t, gap3, gap2)

	// More passes change nothing: one success, metered once.
	for range 3 {
		_, err := r.Pass(context.Background())
		require.NoError(t, err)
	}
	require.Len(t, rc.requests(), 4)
	var metered int
	require.NoError(t, f.sys.Env.System.QueryRow(context.Background(), `SELECT count(*) FROM usage_records
		WHERE tenant_id = $1 AND meter = 'webhook_deliveries'`, f.sys.Tenant).Scan(&metered))
	require.Equal(t, 1, metered)

	var payload struct {
		Type string
		Data struct {
			RunID    uuid.UUID `json:"run_id"`
			Status   string
			Workflow string
			Error    struct{ Code string }
			Metadata map[string]string
		}
	}
	require.NoError(t, json.Unmarshal(reqs[0].body, &payload))
	require.Equal(t, map[string]string{"customer": "c_42"}, payload.Data.Metadata, "webhooks carry the run's metadata")
	require.Equal(t, "run.cancelled", payload.Type)
	require.Equal(t, run, payload.Data.RunID)
	require.Equal(t, "cancelled", payload.Data.Status)
	require.NotEmpty(t, payload.Data.Workflow)
	require.Equal(t, "cancelled", payload.Data.Error.Code)
}

// TestScheduleSpentDeadLettersAnd410Disables: a receiver that always fails
// gets the schedule's attempts, then the delivery is dead; one that
// answers 410 disables its endpoint, which pauses its deliveries until it
// is enabled again; failing for longer than DisableAfter disables too.
func TestScheduleSpentDeadLettersAnd410Disables(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	failing := newReceiver(t, func(int) int { return 500 })
	ep, _ := f.endpoint(f.sys.Tenant, failing.srv.URL)
	run := f.cancelledRun()
	r := f.relay(func(r *webhooks.Relay) { r.Schedule = []time.Duration{time.Millisecond, time.Millisecond} })
	f.pump(r, "the delivery to die", func() bool { return f.only(run).State == webhooks.StateDead })
	d := f.only(run)
	require.Len(t, d.Attempts, 3, "the first attempt and two retries")
	require.Nil(t, d.NextAttemptAt)
	require.Len(t, failing.requests(), 3)

	// Failing without a success for longer than DisableAfter disables.
	f.tx(f.sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		got, err := f.svc.Get(ctx, tx, ep.ID)
		require.NotNil(t, got.FailingSince)
		require.True(t, got.Enabled)
		return err
	})
	_, err := f.sys.Env.System.Exec(ctx, `UPDATE webhook_endpoints SET failing_since = now() - interval '2 hours'`)
	require.NoError(t, err)
	run2 := f.cancelledRun()
	r2 := f.relay(func(r *webhooks.Relay) { r.DisableAfter = time.Hour })
	f.pump(r2, "the endpoint to be disabled", func() bool {
		var enabled bool
		require.NoError(t, f.sys.Env.System.QueryRow(ctx, `SELECT enabled FROM webhook_endpoints WHERE id = $1`, ep.ID).Scan(&enabled))
		return !enabled
	})
	f.tx(f.sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		got, err := f.svc.Get(ctx, tx, ep.ID)
		require.NotNil(t, got.DisabledReason)
		require.Contains(t, *got.DisabledReason, "no successful delivery since")
		require.Contains(t, *got.DisabledReason, "HTTP 500")
		return err
	})
	d2 := f.only(run2)
	require.Equal(t, webhooks.StateFailed, d2.State)
	require.Nil(t, d2.NextAttemptAt, "paused with its endpoint")
	// A disabled endpoint gets no new deliveries.
	run3 := f.cancelledRun()
	require.Empty(t, f.deliveries(f.sys.Tenant, webhooks.DeliveryFilter{RunID: &run3}))

	// 410 Gone disables at once.
	gone := newReceiver(t, func(int) int { return 410 })
	ep2, _ := f.endpoint(f.sys.Tenant, gone.srv.URL)
	run4 := f.cancelledRun()
	f.pump(r, "410 to disable the endpoint", func() bool { return len(gone.requests()) == 1 && f.only(run4).State != webhooks.StatePending })
	f.tx(f.sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		got, err := f.svc.Get(ctx, tx, ep2.ID)
		require.False(t, got.Enabled)
		require.Contains(t, *got.DisabledReason, "410 Gone")
		return err
	})
	require.Nil(t, f.only(run4).NextAttemptAt)

	// Enabling resumes the paused delivery; the receiver is fixed now.
	gone.status = func(int) int { return 200 }
	on := true
	f.tx(f.sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		got, err := f.svc.Update(ctx, tx, ep2.ID, webhooks.UpdateParams{Enabled: &on, By: "test"})
		require.True(t, got.Enabled)
		require.Nil(t, got.DisabledReason)
		return err
	})
	f.pump(r, "the resumed delivery to succeed", func() bool { return f.only(run4).State == webhooks.StateSucceeded })
}

// blockingResolver answers every name with one address.
type blockingResolver struct{ addr netip.Addr }

func (b blockingResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return []netip.Addr{b.addr}, nil
}

// TestSSRFRefusedWithoutConnecting: deliveries to internal addresses fail
// with a clear reason, and no connection reaches them.
func TestSSRFRefusedWithoutConnecting(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()

	// A listener on 127.0.0.2 (loopback, but outside the test's allowance)
	// counts connections: none may arrive.
	trap, err := net.Listen("tcp", "127.0.0.2:0")
	require.NoError(t, err)
	t.Cleanup(func() { trap.Close() })
	var accepted atomic.Int32
	go func() {
		for {
			c, err := trap.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	trapPort := trap.Addr().(*net.TCPAddr).Port
	redirector := newReceiver(t, func(int) int { return 0 })
	redirector.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, fmt.Sprintf("http://127.0.0.2:%d/", trapPort), http.StatusTemporaryRedirect)
	})

	cases := []struct {
		name, url, reason string
		resolver          ssrf.Resolver
	}{
		{"loopback v4", fmt.Sprintf("http://127.0.0.2:%d/", trapPort), "is not reachable", nil},
		{"loopback v6", "http://[::1]:9/", "is not reachable", nil},
		{"private", "http://10.0.0.1/", "is not reachable", nil},
		{"metadata", "http://169.254.169.254/latest/meta-data/", "is not reachable", nil},
		{"unspecified", "http://0.0.0.0:9/", "is not reachable", nil},
		{"name resolving to a private address", fmt.Sprintf("http://internal.example:%d/", trapPort), "internal.example is not reachable",
			blockingResolver{netip.MustParseAddr("127.0.0.2")}},
		{"redirect to a private address", redirector.srv.URL, "redirects are not followed", nil},
	}
	// The API refuses literal blocked addresses up front; to test the relay
	// these rows are inserted as an operator would have before a policy change.
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ep, _ := f.endpoint(f.sys.Tenant, redirector.srv.URL)
			_, err := f.sys.Env.System.Exec(ctx, `UPDATE webhook_endpoints SET url = $2 WHERE id = $1`, ep.ID, tc.url)
			require.NoError(t, err)
			var d webhooks.Delivery
			f.tx(f.sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
				var err error
				d, err = f.svc.Ping(ctx, tx, ep.ID, time.Now())
				return err
			})
			resolver := tc.resolver
			if resolver == nil {
				resolver = net.DefaultResolver
			}
			r := f.relay(func(r *webhooks.Relay) { r.Transport = f.policy.ResolvingTransport(resolver) })
			f.pump(r, "the ping to be refused", func() bool {
				ds := f.deliveries(f.sys.Tenant, webhooks.DeliveryFilter{EndpointID: &ep.ID})
				return len(ds) == 1 && ds[0].State == webhooks.StateDead
			})
			got := f.deliveries(f.sys.Tenant, webhooks.DeliveryFilter{EndpointID: &ep.ID})[0]
			require.Equal(t, d.ID, got.ID)
			require.Len(t, got.Attempts, 1)
			require.NotNil(t, got.Attempts[0].Error)
			t.Logf("%s: %s", tc.url, *got.Attempts[0].Error)
			require.Contains(t, *got.Attempts[0].Error, tc.reason)
			if tc.name != "redirect to a private address" {
				require.Nil(t, got.Attempts[0].StatusCode)
				for _, detail := range []string{"loopback", "private", "link-local", "resolved"} {
					require.NotContains(t, *got.Attempts[0].Error, detail, "the tenant reads nothing of the network")
				}
			}
		})
	}
	require.Zero(t, accepted.Load(), "a refused address saw a connection")

	// The API refuses such URLs when they are entered, and in production
	// also every spelling of a local or numeric host and ports delivery
	// would refuse.
	for _, u := range []string{"http://127.0.0.2/", "http://[::1]/", "http://10.0.0.1/", "http://169.254.169.254/", "http://0.0.0.0/"} {
		f.tx(f.sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
			_, _, err := f.svc.Create(ctx, tx, webhooks.CreateParams{URL: u, EventTypes: webhooks.EventTypes, CreatedBy: "t"})
			assert.ErrorContains(t, err, "may not be called", u)
			return nil
		})
	}
	strict, err := ssrf.NewPolicy(nil)
	require.NoError(t, err)
	prod := webhooks.Service{Keys: f.svc.Keys, Policy: strict}
	for _, u := range []string{"https://LOCALHOST./", "https://localhost/", "https://api.localhost/", "https://2130706433/", "https://0x7f.1/",
		"https://127.1/", "https://0177.0.0.1/", "https://[::ffff:127.0.0.1]/", "https://hooks.example.com:22/"} {
		f.tx(f.sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
			_, _, err := prod.Create(ctx, tx, webhooks.CreateParams{URL: u, EventTypes: webhooks.EventTypes, CreatedBy: "t"})
			assert.ErrorContains(t, err, "may not be called", u)
			return nil
		})
	}
}

// TestRotationSignsWithBothSecretsDuringGrace: after a rotation each
// delivery carries two signatures, one per secret, until the grace ends.
func TestRotationSignsWithBothSecretsDuringGrace(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	rc := newReceiver(t, func(int) int { return 200 })
	ep, oldSecret := f.endpoint(f.sys.Tenant, rc.srv.URL)
	var newSecret string
	f.tx(f.sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		e, s, err := f.svc.Rotate(ctx, tx, ep.ID, time.Hour)
		require.Len(t, e.Secrets, 2)
		newSecret = s
		return err
	})
	require.NotEqual(t, oldSecret, newSecret)
	run := f.cancelledRun()
	r := f.relay(nil)
	f.pump(r, "delivery", func() bool { return f.only(run).State == webhooks.StateSucceeded })
	q := rc.requests()[0]
	require.Len(t, splitSigs(q.header), 2)
	require.NoError(t, webhook.Verify(oldSecret, q.header, q.body))
	require.NoError(t, webhook.Verify(newSecret, q.header, q.body))

	// The grace period ends: only the new secret signs.
	f.tx(f.sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE webhook_secrets SET expires_at = now() - interval '1 second' WHERE expires_at IS NOT NULL`)
		return err
	})
	run2 := f.cancelledRun()
	f.pump(r, "delivery", func() bool { return f.only(run2).State == webhooks.StateSucceeded })
	q = rc.requests()[1]
	require.Len(t, splitSigs(q.header), 1)
	require.NoError(t, webhook.Verify(newSecret, q.header, q.body))
	require.ErrorIs(t, webhook.Verify(oldSecret, q.header, q.body), webhook.ErrNoMatch)

	// Secrets are sealed at rest and unreadable to the app role.
	var n int
	require.NoError(t, f.sys.Env.System.QueryRow(ctx, `SELECT count(*) FROM webhook_secrets
		WHERE position(convert_to($1, 'UTF8') IN ciphertext) > 0`, newSecret[6:]).Scan(&n))
	require.Zero(t, n)
	err := f.sys.Deps.DB.WithTenant(ctx, f.sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		var b []byte
		return tx.QueryRow(ctx, `SELECT ciphertext FROM webhook_secrets LIMIT 1`).Scan(&b)
	})
	require.ErrorContains(t, err, "permission denied")
}

func splitSigs(h http.Header) []string {
	var out []string
	for _, s := range []byte(h.Get("webhook-signature")) {
		if s == ' ' {
			out = append(out, "")
		}
	}
	return append(out, "")
}

// TestRedeliverKeepsTheID: a succeeded delivery sent again carries the
// same webhook-id and body; it is metered once.
func TestRedeliverKeepsTheID(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	rc := newReceiver(t, func(int) int { return 200 })
	_, _ = f.endpoint(f.sys.Tenant, rc.srv.URL)
	run := f.cancelledRun()
	r := f.relay(nil)
	f.pump(r, "delivery", func() bool { return f.only(run).State == webhooks.StateSucceeded })
	d := f.only(run)
	f.tx(f.sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		got, err := f.svc.Redeliver(ctx, tx, d.ID)
		require.Equal(t, webhooks.StatePending, got.State)
		return err
	})
	f.pump(r, "redelivery", func() bool { return len(rc.requests()) == 2 && f.only(run).State == webhooks.StateSucceeded })
	q := rc.requests()
	require.Equal(t, q[0].header.Get("webhook-id"), q[1].header.Get("webhook-id"))
	require.Equal(t, q[0].body, q[1].body)
	require.Len(t, f.only(run).Attempts, 2)
}

// TestAHangingTenantDoesNotStallOthers: tenant A's endpoint holds every
// request; with four senders and one per tenant, A never has more than one
// request open, and tenant B's deliveries go through meanwhile.
func TestAHangingTenantDoesNotStallOthers(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	other, err := tenants.Create(ctx, f.sys.Deps.DB, tenants.CreateParams{Name: "b", Plan: "pro", StreamShards: 1})
	require.NoError(t, err)
	release := make(chan struct{})
	var open, peak atomic.Int32
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := open.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		open.Add(-1)
	}))
	t.Cleanup(hang.Close)
	t.Cleanup(func() { close(release) })
	epA, _ := f.endpoint(f.sys.Tenant, hang.URL)
	ok := newReceiver(t, func(int) int { return 200 })
	epB, _ := f.endpoint(other.ID, ok.srv.URL)
	for range 6 {
		f.tx(f.sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
			_, err := f.svc.Ping(ctx, tx, epA.ID, time.Now())
			return err
		})
	}
	r := f.relay(func(r *webhooks.Relay) {
		r.Batch, r.PerTenant, r.Timeout, r.Interval = 4, 1, 30*time.Second, 20*time.Millisecond
	})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); r.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	apptest.Eventually(t, "A's first request to hang", 10*time.Second, func() bool { return open.Load() == 1 })
	for i := range 3 {
		f.tx(other.ID, func(ctx context.Context, tx *pg.Tx) error {
			_, err := f.svc.Ping(ctx, tx, epB.ID, time.Now())
			return err
		})
		apptest.Eventually(t, "B's ping to arrive while A hangs", 10*time.Second, func() bool { return len(ok.requests()) == i+1 })
	}
	require.Equal(t, int32(1), peak.Load(), "A held more than its share of senders")
}

// TestRedeliverDuringAnAttemptDoesNotSendTwice: a redelivery asked for
// while an attempt is in flight keeps the attempt's claim; the attempt's
// success settles it, and nothing is sent concurrently.
func TestRedeliverDuringAnAttemptDoesNotSendTwice(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	release := make(chan struct{})
	var requests atomic.Int32
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		<-release
	}))
	t.Cleanup(slow.Close)
	_, _ = f.endpoint(f.sys.Tenant, slow.URL)
	run := f.cancelledRun()
	r := f.relay(func(r *webhooks.Relay) { r.Timeout = 30 * time.Second })
	passDone := make(chan error, 1)
	go func() { _, err := r.Pass(ctx); passDone <- err }()
	apptest.Eventually(t, "the attempt to be in flight", 10*time.Second, func() bool { return requests.Load() == 1 })
	d := f.only(run)
	f.tx(f.sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		_, err := f.svc.Redeliver(ctx, tx, d.ID)
		return err
	})
	// Another relay finds nothing due: the claim still holds.
	n, err := f.relay(nil).Pass(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	close(release)
	require.NoError(t, <-passDone)
	got := f.only(run)
	require.Equal(t, webhooks.StateSucceeded, got.State)
	require.Equal(t, int32(1), requests.Load())
	require.Len(t, got.Attempts, 1)
}

// TestWaitsAreWebhookEvents: a run that starts waiting for a signal (or an
// event) sends run.waiting, one waiting for an approval approval.requested — each with
// the node, the signal, the deadline and the run's metadata — to the
// endpoints subscribed to them, in the transition's transaction; others
// get nothing, and another tenant's endpoints never see them.
func TestWaitsAreWebhookEvents(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	waiting, _ := f.endpoint(f.sys.Tenant, "http://127.0.0.1:1/waiting", webhooks.EventRunWaiting)
	approvals, _ := f.endpoint(f.sys.Tenant, "http://127.0.0.1:1/approvals", webhooks.EventApprovalRequested)
	terminal, _ := f.endpoint(f.sys.Tenant, "http://127.0.0.1:1/terminal")
	other, err := tenants.Create(ctx, f.sys.Deps.DB, tenants.CreateParams{Name: "globex"})
	require.NoError(t, err)
	otherEnd, _ := f.endpoint(other.ID, "http://127.0.0.1:1/other", webhooks.EventRunWaiting, webhooks.EventApprovalRequested)

	wf := f.sys.Workflow(`{"nodes":[{"id":"paid","type":"wait","wait":{"signal":"payment"}},
		{"id":"ok","type":"wait","depends_on":["paid"],"wait":{"signal":"manager","approval":true,"timeout":"2h"}},
		{"id":"delivered","type":"wait","depends_on":["ok"],"wait":{"event":"parcel.delivered"}}]}`)
	res, err := f.sys.Coordinator().StartRun(ctx, f.sys.Tenant, engine.StartRun{WorkflowID: wf, Metadata: map[string]string{"order": "o-9"}})
	require.NoError(t, err)

	type data struct {
		RunID     uuid.UUID `json:"run_id"`
		Node      string
		Signal    string
		Event     string
		Status    string
		TimeoutAt *time.Time `json:"timeout_at"`
		Metadata  map[string]string
	}
	read := func(e webhooks.Endpoint) []data {
		var out []data
		for _, d := range f.deliveries(f.sys.Tenant, webhooks.DeliveryFilter{EndpointID: &e.ID}) {
			var p struct {
				Type string
				Data data
			}
			require.NoError(t, json.Unmarshal([]byte(d.Payload), &p))
			assert.Equal(t, d.EventType, p.Type)
			out = append(out, p.Data)
		}
		return out
	}
	got := read(waiting)
	require.Len(t, got, 1, "the signal wait started with the run")
	assert.Equal(t, data{RunID: res.RunID, Node: "paid", Signal: "payment", Status: "running", Metadata: map[string]string{"order": "o-9"}}, got[0])
	assert.Empty(t, read(approvals), "the approval waits for the payment")

	_, err = f.sys.Coordinator().SignalRun(ctx, f.sys.Tenant, res.RunID, engine.Signal{ID: "p1", Name: "payment", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	got = read(approvals)
	require.Len(t, got, 1)
	assert.Equal(t, "ok", got[0].Node)
	assert.Equal(t, "manager", got[0].Signal)
	require.NotNil(t, got[0].TimeoutAt)
	assert.Empty(t, read(terminal), "not a terminal event")

	// An event wait is a run.waiting too, naming its event.
	_, err = f.sys.Coordinator().SignalRun(ctx, f.sys.Tenant, res.RunID, engine.Signal{ID: "m1", Name: "manager", Payload: json.RawMessage(`{"approved": true}`)})
	require.NoError(t, err)
	got = read(waiting)
	require.Len(t, got, 2)
	assert.Contains(t, got, data{RunID: res.RunID, Node: "delivered", Event: "parcel.delivered", Status: "running", Metadata: map[string]string{"order": "o-9"}})
	assert.Empty(t, f.deliveries(other.ID, webhooks.DeliveryFilter{EndpointID: &otherEnd.ID}), "another tenant's endpoints hear nothing")
}
