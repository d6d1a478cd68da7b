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
