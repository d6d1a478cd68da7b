package graph_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/graph"
	"github.com/composer-dev/composer/internal/app"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/testenv"
)

// closed waits for the server to close the socket and returns its close
// code and when it came.
func (c *wsClient) closed(timeout time.Duration) (websocket.StatusCode, time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		var m wsMsg
		err := wsjson.Read(ctx, c.conn, &m)
		if err == nil {
			if m.Type == "ping" {
				_ = wsjson.Write(ctx, c.conn, wsMsg{Type: "pong"})
			}
			continue
		}
		return websocket.CloseStatus(err), time.Now()
	}
}

// TestLiveConnectionClosesWhenItsKeyIsRevoked: a subscription opened with
// an API key streams until the key is revoked, then the server closes the
// socket with 4401 within seconds.
func TestLiveConnectionClosesWhenItsKeyIsRevoked(t *testing.T) {
	t.Parallel()
	sys, a, _ := twoTenants(t)
	var key struct {
		CreateApiKey struct {
			Secret string
			ApiKey struct{ ID string }
		}
	}
	sys.GraphQL(a.owner, `mutation { createApiKey(input: {name: "dash", scopes: ["runs:read"]}) { secret apiKey { id } } }`, nil).Decode(t, &key)
	c := dialWS(t, sys, key.CreateApiKey.Secret)
	c.subscribe("1", `subscription { runsChanged { event run { id input } } }`, nil)
	res := sys.GraphQL(a.owner, `mutation($id: ID!) { revokeApiKey(id: $id) { revokedAt } }`, map[string]any{"id": key.CreateApiKey.ApiKey.ID})
	require.Empty(t, res.Errors)
	revoked := time.Now()
	code, at := c.closed(20 * time.Second)
	assert.Equal(t, websocket.StatusCode(graph.CloseUnauthorized), code, "closed with the unauthorized code")
	assert.Less(t, at.Sub(revoked), 8*time.Second, "within seconds of the revocation")
}

// TestLiveConnectionClosesAtTokenExpiry: a socket opened with a user token
// is closed when the token expires, not at the next reconnect.
func TestLiveConnectionClosesAtTokenExpiry(t *testing.T) {
	t.Parallel()
	sys, a, _ := twoTenants(t)
	tok, err := app.DevToken(context.Background(), sys.Deps, a.id, "brief@"+a.id.String(), auth.RoleViewer, 3*time.Second)
	require.NoError(t, err)
	opened := time.Now()
	c := dialWS(t, sys, tok)
	c.subscribe("1", `subscription { runsChanged { event } }`, nil)
	code, at := c.closed(20 * time.Second)
	assert.Equal(t, websocket.StatusCode(graph.CloseUnauthorized), code)
	assert.Less(t, at.Sub(opened), 5*time.Second, "at the token's expiry (3 s)")
}

// TestLiveConnectionClosesWhenItsMemberIsRemoved: a removed member's open
// socket is closed too.
func TestLiveConnectionClosesWhenItsMemberIsRemoved(t *testing.T) {
	t.Parallel()
	sys, a, _ := twoTenants(t)
	c := dialWS(t, sys, a.viewer)
	c.subscribe("1", `subscription { runsChanged { event } }`, nil)
	res := sys.GraphQL(a.owner, `mutation($s: String!) { removeMember(subject: $s) }`, map[string]any{"s": "viewer@" + a.id.String()})
	require.Empty(t, res.Errors)
	code, _ := c.closed(20 * time.Second)
	assert.Equal(t, websocket.StatusCode(graph.CloseUnauthorized), code)
}

// TestLiveSubscriptionsAreCapped: one connection may hold 25
// subscriptions; of 26 asked for at once exactly one is QUOTA_EXCEEDED.
func TestLiveSubscriptionsAreCapped(t *testing.T) {
	t.Parallel()
	sys, a, _ := twoTenants(t)
	c := dialWS(t, sys, a.viewer)
	for i := range graph.DefaultSubscriptionsPerConnection + 1 {
		c.subscribe(fmt.Sprint(i), `subscription { runsChanged { event } }`, nil)
	}
	m := c.next(10 * time.Second)
	require.NotEmpty(t, m.Type, "no answer to the subscription over the cap")
	assert.Contains(t, []string{"error", "next"}, m.Type, "%s", m.Payload)
	assert.Contains(t, string(m.Payload), "QUOTA_EXCEEDED")
	assert.Contains(t, string(m.Payload), "per connection")
	for {
		m := c.next(time.Second)
		if m.Type == "" {
			break
		}
		assert.NotContains(t, string(m.Payload), "QUOTA_EXCEEDED", "only one subscription was over the cap")
	}
}

// queryCounter counts the statements that read a run's tasks.
type queryCounter struct{ taskReads atomic.Int64 }

func (q *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "FROM task_instances WHERE tenant_id = $1 AND run_id = ANY") {
		q.taskReads.Add(1)
	}
	return ctx
}

func (q *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestLiveReadsEachChangeOnceAndShowsTheTasksAsTheyAreNow: twenty sockets
// follow one run; each change is read once for all of them (not once per
// subscriber), and every update shows the tasks as they are after it —
// the last, all of them completed.
func TestLiveReadsEachChangeOnceAndShowsTheTasksAsTheyAreNow(t *testing.T) {
	t.Parallel()
	counter := &queryCounter{}
	sys := apptest.StartTraced(t, testenv.New(t), counter)
	sys.StartWorker(apptest.WorkerOptions{})
	owner := sys.Token(sys.Tenant, "owner@x", auth.RoleOwner)
	var created struct {
		CreateWorkflow struct{ Workflow struct{ ID string } }
	}
	sys.GraphQL(owner, `mutation { createWorkflow(input: {name: "steps", definition: {nodes: [
		{id: "ok", type: "wait", wait: {signal: "go"}}, {id: "x", type: "noop", depends_on: ["ok"]}, {id: "y", type: "noop", depends_on: ["x"]}]}}) { workflow { id } } }`,
		nil).Decode(t, &created)
	var started struct {
		StartRun struct{ Run struct{ ID string } }
	}
	sys.GraphQL(owner, `mutation($w: ID!) { startRun(input: {workflowId: $w}) { run { id } } }`, map[string]any{"w": created.CreateWorkflow.Workflow.ID}).Decode(t, &started)
	id := started.StartRun.Run.ID

	const subscribers = 20
	var clients []*wsClient
	for range subscribers {
		c := dialWS(t, sys, owner)
		c.subscribe("1", `subscription($id: ID!) { runUpdated(id: $id) { status tasks { nodeId state } } }`, map[string]any{"id": id})
		require.Equal(t, "next", c.next(10*time.Second).Type)
		clients = append(clients, c)
	}
	before := counter.taskReads.Load()
	res := sys.GraphQL(owner, `mutation($id: ID!) { signalRun(id: $id, name: "go") { ignored } }`, map[string]any{"id": id})
	require.Empty(t, res.Errors)
	for _, c := range clients {
		var last wsMsg
		for {
			m := c.next(15 * time.Second)
			require.NotEmpty(t, m.Type, "a subscription stalled")
			if m.Type == "complete" {
				break
			}
			last = m
		}
		var p struct {
			Data struct {
				RunUpdated struct {
					Status string
					Tasks  []struct{ NodeID, State string }
				}
			}
		}
		require.NoError(t, json.Unmarshal(last.Payload, &p))
		assert.Equal(t, "COMPLETED", p.Data.RunUpdated.Status)
		require.Len(t, p.Data.RunUpdated.Tasks, 3, "the last update shows every task")
		for _, tk := range p.Data.RunUpdated.Tasks {
			assert.Equal(t, "COMPLETED", tk.State, "node %s as it is now", tk.NodeID)
		}
	}
	// Three transitions (signal, x, y) — each read once, or twice when a
	// change came in during the read: not once per subscriber.
	reads := counter.taskReads.Load() - before
	t.Logf("%d task reads for %d subscribers of 3 changes", reads, subscribers)
	assert.LessOrEqual(t, reads, int64(6))
}

// following opens n runsChanged subscriptions on c and returns once the
// server has registered each of them: start makes a change, and every one
// must see it.
func following(t *testing.T, c *wsClient, prefix string, n int) map[string]bool {
	t.Helper()
	before := c.sys.Server.Live.Subscriptions()
	ids := asking(c, prefix, n)
	// (A frame is handled on the server's own time: a change made before
	// the subscription exists would never reach it.)
	require.Eventually(t, func() bool { return c.sys.Server.Live.Subscriptions() >= before+n }, 20*time.Second, 5*time.Millisecond,
		"the server registers the subscriptions")
	return ids
}

// asking opens n runsChanged subscriptions on c without waiting for them.
func asking(c *wsClient, prefix string, n int) map[string]bool {
	ids := map[string]bool{}
	for i := range n {
		id := fmt.Sprintf("%s-%d", prefix, i)
		ids[id] = false
		c.subscribe(id, `subscription { runsChanged { event } }`, nil)
	}
	return ids
}

// awaitAll reads c until each subscription in ids has had an update.
func awaitAll(t *testing.T, c *wsClient, ids map[string]bool) {
	t.Helper()
	seen := 0
	for seen < len(ids) {
		m := c.next(20 * time.Second)
		require.NotEmpty(t, m.Type, "%d of %d subscriptions saw the change", seen, len(ids))
		require.NotContains(t, string(m.Payload), "QUOTA_EXCEEDED", "a subscription under every cap was refused")
		if done, ok := ids[m.ID]; ok && !done && m.Type == "next" {
			ids[m.ID] = true
			seen++
		}
	}
}

// refusal subscribes once more on c and returns the error it is answered.
func refusal(t *testing.T, c *wsClient, id string) string {
	t.Helper()
	c.subscribe(id, `subscription { runsChanged { event } }`, nil)
	for {
		m := c.next(10 * time.Second)
		require.NotEmpty(t, m.Type, "no answer to the subscription over the cap")
		if m.ID == id && (m.Type == "error" || m.Type == "next") {
			return string(m.Payload)
		}
	}
}

// TestLiveSubscriptionsAreCappedPerPrincipalAndPerTenant: one principal
// may hold 100 subscriptions on a replica, across any number of sockets;
// a tenant 500. The one past each cap is QUOTA_EXCEEDED naming the cap,
// other principals and other tenants keep subscribing, and a closed
// socket gives its subscriptions back.
func TestLiveSubscriptionsAreCappedPerPrincipalAndPerTenant(t *testing.T) {
	t.Parallel()
	sys, a, b := twoTenants(t)
	perConn := graph.DefaultSubscriptionsPerConnection
	conns := graph.DefaultSubscriptionsPerPrincipal / perConn
	principals := graph.DefaultSubscriptionsPerTenant / graph.DefaultSubscriptionsPerPrincipal

	type sock struct {
		c   *wsClient
		ids map[string]bool
	}
	var socks []sock
	for p := range principals {
		tok := sys.Token(a.id, fmt.Sprintf("watcher-%d@example.com", p), auth.RoleViewer)
		for i := range conns {
			c := dialWS(t, sys, tok)
			socks = append(socks, sock{c, following(t, c, fmt.Sprintf("p%d-c%d", p, i), perConn)})
		}
		if p == 0 {
			// The first principal is full: one more socket of its own is
			// refused, whatever connection it comes on.
			startIn(t, sys, a)
			for _, s := range socks {
				awaitAll(t, s.c, s.ids)
			}
			extra := dialWS(t, sys, tok)
			msg := refusal(t, extra, "over")
			assert.Contains(t, msg, "QUOTA_EXCEEDED")
			assert.Contains(t, msg, "per principal")
		}
	}
	startIn(t, sys, a)
	for _, s := range socks {
		for id := range s.ids {
			s.ids[id] = false
		}
		awaitAll(t, s.c, s.ids)
	}

	// The tenant is full: a new principal of it is refused...
	lateToken := sys.Token(a.id, "late@example.com", auth.RoleViewer)
	late := dialWS(t, sys, lateToken)
	msg := refusal(t, late, "over")
	assert.Contains(t, msg, "QUOTA_EXCEEDED")
	assert.Contains(t, msg, "live subscriptions on this server")

	// ...while another tenant is not affected.
	other := dialWS(t, sys, b.viewer)
	ids := following(t, other, "b", 1)
	startIn(t, sys, b)
	awaitAll(t, other, ids)

	// Closing a socket gives its subscriptions back to the tenant: the
	// principal refused above may now subscribe.
	require.NoError(t, socks[0].c.conn.Close(websocket.StatusNormalClosure, ""))
	require.Eventually(t, func() bool {
		c := dialWS(t, sys, lateToken)
		defer func() { _ = c.conn.CloseNow() }()
		asking(c, "again", 1) // (refused until the closed socket's are given back)
		startIn(t, sys, a)
		for {
			m := c.next(10 * time.Second)
			switch {
			case m.Type == "":
				return false
			case strings.Contains(string(m.Payload), "QUOTA_EXCEEDED"):
				return false
			case m.ID == "again-0" && m.Type == "next":
				return true
			}
		}
	}, 20*time.Second, 200*time.Millisecond, "a closed socket's subscriptions were not given back")
}

// startIn starts a run of w's workflow: a change every follower sees.
func startIn(t *testing.T, sys *apptest.System, w tenantWorld) {
	t.Helper()
	var out struct {
		StartRun struct{ Run struct{ ID string } }
	}
	sys.GraphQL(w.owner, `mutation($w: ID!) { startRun(input: {workflowId: $w}) { run { id } } }`, map[string]any{"w": w.workflow}).Decode(t, &out)
	require.NotEmpty(t, out.StartRun.Run.ID)
}
