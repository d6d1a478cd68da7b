package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/internal/app"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/config"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/sdk/webhook"
	"github.com/composer-dev/composer/tenants"
	"github.com/composer-dev/composer/webhooks"
)

// hookSink records what a webhook receiver got.
type hookSink struct {
	mu   sync.Mutex
	reqs []*http.Request
	body [][]byte
	srv  *httptest.Server
	// handle, when set, runs before the 200 answer (n is 1-based).
	handle func(n int, r *http.Request)
}

func newHookSink(t *testing.T) *hookSink {
	s := &hookSink{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.reqs, s.body = append(s.reqs, r), append(s.body, b)
		n, h := len(s.reqs), s.handle
		s.mu.Unlock()
		if h != nil {
			h(n, r)
		}
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *hookSink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.reqs)
}

func (s *hookSink) get(i int) (http.Header, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reqs[i].Header, s.body[i]
}

// TestWebhooksThroughTheAPI: two endpoints of one tenant get exactly one
// delivery each when its run completes, signed with their own secrets;
// another tenant's endpoint gets nothing and sees none of it; the API
// manages endpoints, lists deliveries with attempts, pings, and refuses
// bad input and roles without webhooks:manage.
func TestWebhooksThroughTheAPI(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	other, err := tenants.Create(ctx, sys.Deps.DB, tenants.CreateParams{Name: "other", Plan: "pro", StreamShards: 1})
	require.NoError(t, err)
	owner, otherOwner := sys.Token(sys.Tenant, "owner@a", auth.RoleOwner), sys.Token(other.ID, "owner@b", auth.RoleOwner)
	viewer := sys.Token(sys.Tenant, "viewer@a", auth.RoleViewer)

	a1, a2, b1 := newHookSink(t), newHookSink(t), newHookSink(t)
	type created struct {
		CreateWebhookEndpoint struct {
			Secret   string
			Endpoint struct {
				ID         string
				EventTypes []string
				Secrets    []struct{ ID string }
			}
		}
	}
	create := func(tok, url string, types ...string) (string, string) {
		var c created
		sys.GraphQL(tok, `mutation($u: String!, $e: [String!]!) { createWebhookEndpoint(input: {url: $u, eventTypes: $e, description: "test"}) {
			secret endpoint { id eventTypes secrets { id } } } }`, map[string]any{"u": url, "e": types}).Decode(t, &c)
		require.True(t, strings.HasPrefix(c.CreateWebhookEndpoint.Secret, "whsec_"))
		require.Len(t, c.CreateWebhookEndpoint.Endpoint.Secrets, 1)
		return c.CreateWebhookEndpoint.Endpoint.ID, c.CreateWebhookEndpoint.Secret
	}
	ep1, s1 := create(owner, a1.srv.URL, "run.completed", "run.failed")
	_, s2 := create(owner, a2.srv.URL, "run.completed")
	_, _ = create(otherOwner, b1.srv.URL, "run.completed", "run.failed", "run.cancelled")
	// Not subscribed to run.completed: gets nothing.
	a3 := newHookSink(t)
	_, _ = create(owner, a3.srv.URL, "run.cancelled")

	// Bad input names the problem and writes nothing; viewers may not.
	for _, tc := range []struct{ url, types, want string }{
		{"ftp://example.com/", `["run.completed"]`, "scheme must be https"},
		{"https://example.com/", `["run.finished"]`, `unknown event type "run.finished"`},
		{"https://example.com/", `[]`, "subscribe to at least one"},
		{"https://user:pw@example.com/", `["run.completed"]`, "must not carry credentials"},
		{"http://10.1.2.3/", `["run.completed"]`, "may not be called"},
	} {
		res := sys.GraphQL(owner, `mutation { createWebhookEndpoint(input: {url: "`+tc.url+`", eventTypes: `+tc.types+`}) { secret } }`, nil)
		require.Equal(t, []string{"BAD_USER_INPUT"}, res.Codes(), tc.url)
		require.Contains(t, res.Errors[0].Message, tc.want)
	}
	res := sys.GraphQL(viewer, `{ webhookEndpoints { id } }`, nil)
	require.Equal(t, []string{"FORBIDDEN"}, res.Codes())
	var list struct {
		WebhookEndpoints []map[string]any
	}
	sys.GraphQL(owner, `{ webhookEndpoints { id url enabled secrets { id expiresAt } } }`, nil).Decode(t, &list)
	require.Len(t, list.WebhookEndpoints, 3)
	raw, _ := json.Marshal(list)
	require.NotContains(t, string(raw), "whsec_", "a secret is shown once")

	wf := sys.Workflow(`{"nodes":[{"id":"w","type":"wait","wait":{"signal":"go"}}]}`)
	run := sys.StartRun(wf, `{}`)
	_, err = sys.Coordinator().SignalRun(ctx, sys.Tenant, run, engine.Signal{Name: "go", Payload: json.RawMessage(`{"ok":true}`)})
	require.NoError(t, err)
	got, _ := sys.WaitRun(run, 10*time.Second)
	require.Equal(t, "completed", got.Status)

	apptest.Eventually(t, "both endpoints to be called", 15*time.Second, func() bool { return a1.count() == 1 && a2.count() == 1 })
	h1, body1 := a1.get(0)
	h2, body2 := a2.get(0)
	require.NoError(t, webhook.Verify(s1, h1, body1))
	require.NoError(t, webhook.Verify(s2, h2, body2))
	require.ErrorIs(t, webhook.Verify(s1, h2, body2), webhook.ErrNoMatch, "each endpoint has its own secret")
	require.NotEqual(t, h1.Get("webhook-id"), h2.Get("webhook-id"))
	var payload struct {
		Type string
		Data struct {
			RunID  string `json:"run_id"`
			Status string
			Output json.RawMessage
		}
	}
	require.NoError(t, json.Unmarshal(body1, &payload))
	require.Equal(t, "run.completed", payload.Type)
	require.Equal(t, run.String(), payload.Data.RunID)
	require.JSONEq(t, `{"w":{"ok":true}}`, string(payload.Data.Output))

	type deliveries struct {
		WebhookDeliveries struct {
			Edges []struct {
				Node struct {
					WebhookID string
					State     string
					RunID     *string
					Attempts  []struct {
						StatusCode *int
						LatencyMs  *int
					}
				}
			}
		}
	}
	var mine deliveries
	apptest.Eventually(t, "both deliveries to be recorded", 10*time.Second, func() bool {
		sys.GraphQL(owner, `query($r: ID) { webhookDeliveries(runId: $r) { edges { node { webhookId state runId attempts { statusCode latencyMs } } } } }`,
			map[string]any{"r": run.String()}).Decode(t, &mine)
		n := 0
		for _, e := range mine.WebhookDeliveries.Edges {
			if e.Node.State == "SUCCEEDED" {
				n++
			}
		}
		return n == 2
	})
	require.Len(t, mine.WebhookDeliveries.Edges, 2, "exactly one delivery per subscribed endpoint")
	for _, e := range mine.WebhookDeliveries.Edges {
		require.Len(t, e.Node.Attempts, 1)
		require.Equal(t, 200, *e.Node.Attempts[0].StatusCode)
	}
	var theirs deliveries
	sys.GraphQL(otherOwner, `{ webhookDeliveries { edges { node { webhookId } } } }`, nil).Decode(t, &theirs)
	require.Empty(t, theirs.WebhookDeliveries.Edges)
	require.Zero(t, b1.count(), "another tenant's endpoint received the run")
	require.Zero(t, a3.count(), "an endpoint not subscribed to run.completed received it")
	// Another tenant cannot touch this tenant's endpoint: it does not exist for it.
	res = sys.GraphQL(otherOwner, `mutation($id: ID!) { sendWebhookTestPing(endpointId: $id) { id } }`, map[string]any{"id": ep1})
	require.Equal(t, []string{"NOT_FOUND"}, res.Codes())

	// A test ping, a rotation, then disabling and deleting.
	var ping struct {
		SendWebhookTestPing struct{ ID, EventType string }
	}
	sys.GraphQL(owner, `mutation($id: ID!) { sendWebhookTestPing(endpointId: $id) { id eventType } }`, map[string]any{"id": ep1}).Decode(t, &ping)
	require.Equal(t, "webhook.test", ping.SendWebhookTestPing.EventType)
	apptest.Eventually(t, "the ping", 10*time.Second, func() bool { return a1.count() == 2 })
	h, b := a1.get(1)
	require.NoError(t, webhook.Verify(s1, h, b))
	var rot struct {
		RotateWebhookSecret struct {
			Secret   string
			Endpoint struct{ Secrets []struct{ ExpiresAt *string } }
		}
	}
	sys.GraphQL(owner, `mutation($id: ID!) { rotateWebhookSecret(id: $id, graceSeconds: 600) { secret endpoint { secrets { expiresAt } } } }`,
		map[string]any{"id": ep1}).Decode(t, &rot)
	require.Len(t, rot.RotateWebhookSecret.Endpoint.Secrets, 2)
	sys.GraphQL(owner, `mutation($id: ID!) { sendWebhookTestPing(endpointId: $id) { id } }`, map[string]any{"id": ep1}).Decode(t, &ping)
	apptest.Eventually(t, "the second ping", 10*time.Second, func() bool { return a1.count() == 3 })
	h, b = a1.get(2)
	require.NoError(t, webhook.Verify(s1, h, b), "the old secret during the grace period")
	require.NoError(t, webhook.Verify(rot.RotateWebhookSecret.Secret, h, b))

	var dis struct {
		DisableWebhookEndpoint struct {
			Enabled        bool
			DisabledReason string
		}
	}
	sys.GraphQL(owner, `mutation($id: ID!) { disableWebhookEndpoint(id: $id) { enabled disabledReason } }`, map[string]any{"id": ep1}).Decode(t, &dis)
	require.False(t, dis.DisableWebhookEndpoint.Enabled)
	require.Equal(t, "disabled by owner@a", dis.DisableWebhookEndpoint.DisabledReason)
	var del struct{ DeleteWebhookEndpoint string }
	sys.GraphQL(owner, `mutation($id: ID!) { deleteWebhookEndpoint(id: $id) }`, map[string]any{"id": ep1}).Decode(t, &del)
	require.Equal(t, ep1, del.DeleteWebhookEndpoint)
	res = sys.GraphQL(owner, `mutation($id: ID!) { deleteWebhookEndpoint(id: $id) }`, map[string]any{"id": ep1})
	require.Equal(t, []string{"NOT_FOUND"}, res.Codes())
}

// TestWebhookRelayKilledMidDelivery: the only relay is a real `composer
// server` process, SIGKILLed while the receiver holds its request. A second
// process delivers it once the claim lease ends, with the same webhook-id
// and body; the lost attempt stays in the log.
func TestWebhookRelayKilledMidDelivery(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	// The in-process system has no relay (no secret key); it starts the run.
	sys := apptest.StartWith(t, env, func(c *config.Config) { c.WebhookSecretKeys = nil })
	ctx := context.Background()
	keys, err := webhooks.ParseKeyring([]string{app.DevWebhookKey})
	require.NoError(t, err)
	svc := webhooks.Service{Keys: keys, Dev: true}

	sink := newHookSink(t)
	inFlight := make(chan struct{})
	sink.handle = func(n int, r *http.Request) {
		if n == 1 {
			close(inFlight)
			<-r.Context().Done() // hold the request until the relay dies
		}
	}
	var secret string
	require.NoError(t, sys.Deps.DB.WithTenant(ctx, sys.Tenant, func(ctx context.Context, tx *pg.Tx) error {
		_, secret, err = svc.Create(ctx, tx, webhooks.CreateParams{URL: sink.srv.URL, EventTypes: []string{webhooks.EventRunCompleted, webhooks.EventRunFailed, webhooks.EventRunCancelled}, CreatedBy: "t"})
		return err
	}))

	bin := apptest.Binary(t)
	procEnv := append(sys.ProcessEnv(), "COMPOSER_WEBHOOK_SECRET_KEY="+app.DevWebhookKey, "COMPOSER_WEBHOOK_TIMEOUT=2s")
	relayA := &proc{name: "server-a", args: []string{"server"}, env: append(append([]string{}, procEnv...), "COMPOSER_HTTP_ADDR="+freeAddr(t))}
	relayA.start(t, bin)
	defer relayA.kill()

	wf := sys.Workflow(`{"nodes":[{"id":"w","type":"wait","wait":{"signal":"go"}}]}`)
	run := sys.StartRun(wf, `{}`)
	_, err = sys.Coordinator().CancelRun(ctx, sys.Tenant, run, "test")
	require.NoError(t, err)

	select {
	case <-inFlight:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay process never sent the delivery")
	}
	relayA.kill()
	var state string
	var attempts int
	require.NoError(t, env.System.QueryRow(ctx, `SELECT state, attempts FROM webhook_deliveries WHERE run_id = $1`, run).Scan(&state, &attempts))
	require.Equal(t, "pending", state)
	require.Equal(t, 1, attempts)

	relayB := &proc{name: "server-b", args: []string{"server"}, env: append(append([]string{}, procEnv...), "COMPOSER_HTTP_ADDR="+freeAddr(t))}
	relayB.start(t, bin)
	defer relayB.kill()
	apptest.Eventually(t, "the second relay to deliver", 30*time.Second, func() bool {
		require.NoError(t, env.System.QueryRow(ctx, `SELECT state, attempts FROM webhook_deliveries WHERE run_id = $1`, run).Scan(&state, &attempts))
		return state == "succeeded"
	})
	require.Equal(t, 2, attempts)
	require.Equal(t, 2, sink.count())
	h1, b1 := sink.get(0)
	h2, b2 := sink.get(1)
	require.Equal(t, h1.Get("webhook-id"), h2.Get("webhook-id"))
	require.Equal(t, b1, b2)
	require.NoError(t, webhook.Verify(secret, h2, b2))

	rows, err := env.System.Query(ctx, `SELECT a.attempt, a.status_code, coalesce(a.error, '') FROM webhook_attempts a
		JOIN webhook_deliveries d ON d.tenant_id = a.tenant_id AND d.id = a.delivery_id WHERE d.run_id = $1 ORDER BY a.attempt`, run)
	require.NoError(t, err)
	type att struct {
		n      int
		status *int
		err    string
	}
	var log []att
	for rows.Next() {
		var a att
		require.NoError(t, rows.Scan(&a.n, &a.status, &a.err))
		log = append(log, a)
	}
	require.Len(t, log, 2)
	require.Nil(t, log[0].status)
	require.Contains(t, log[0].err, "relay stopped")
	require.Equal(t, 200, *log[1].status)
	var metered int
	require.NoError(t, env.System.QueryRow(ctx, `SELECT count(*) FROM usage_records WHERE meter = 'webhook_deliveries'`).Scan(&metered))
	require.Equal(t, 1, metered)
}
