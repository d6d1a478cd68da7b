package app_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/app"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/tenants"
)

func postEvent(t *testing.T, sys *apptest.System, key string, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, sys.URL+app.PathEvents, strings.NewReader(body))
	require.NoError(t, err)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, out
}

func errorCode(out map[string]any) string {
	e, _ := out["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

// TestEventsEndpoint: POST /v1/events with and without the events:write
// scope, its stable error codes, its body bound, dedupe.
func TestEventsEndpoint(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	wf := sys.Workflow(`{"triggers": [{"event": "user.*"}], "nodes": [{"id": "a", "type": "noop"}]}`)
	writer := sys.APIKey(auth.ScopeEventsWrite)
	body := `{"id": "u-1", "name": "user.signed_up", "payload": {"email": "a@example.com"}}`

	status, out := postEvent(t, sys, "", body)
	assert.Equal(t, http.StatusUnauthorized, status)
	assert.Equal(t, "UNAUTHENTICATED", errorCode(out))
	status, out = postEvent(t, sys, "cmp_nope", body)
	assert.Equal(t, http.StatusUnauthorized, status, "%v", out)
	for _, scope := range []string{auth.ScopeRunsWrite, auth.ScopeRunsRead} {
		status, out = postEvent(t, sys, sys.APIKey(scope), body)
		assert.Equal(t, http.StatusForbidden, status, scope)
		assert.Equal(t, "FORBIDDEN", errorCode(out), scope)
	}

	status, out = postEvent(t, sys, writer, body)
	require.Equal(t, http.StatusOK, status, "%v", out)
	assert.Equal(t, true, out["created"])
	ev := out["event"].(map[string]any)
	assert.Equal(t, "u-1", ev["event_id"])
	runs := ev["runs"].([]any)
	require.Len(t, runs, 1)
	run := runs[0].(map[string]any)
	assert.Equal(t, wf.String(), run["workflow_id"])
	assert.Equal(t, "started", run["outcome"])
	assert.NotEmpty(t, run["run_id"])

	status, again := postEvent(t, sys, writer, body)
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, false, again["created"])
	assert.Equal(t, ev, again["event"])
	status, out = postEvent(t, sys, sys.APIKey(auth.ScopeAdmin), body)
	assert.Equal(t, http.StatusOK, status, "admin grants events:write")
	// A publish that changes runs is in the audit log, ok in its
	// transaction; refusals with their code; one that only started runs,
	// or repeated, is not recorded.
	waiting := sys.StartRun(sys.Workflow(`{"nodes": [{"id": "v", "type": "wait", "wait": {"event": "account.verified"}}]}`), `{}`)
	vstatus, vout := postEvent(t, sys, writer, `{"id": "v-1", "name": "account.verified"}`)
	require.Equal(t, http.StatusOK, vstatus, "%v", vout)
	var log struct {
		AuditLog struct {
			Edges []struct {
				Node struct{ PrincipalKind, TargetID, Outcome string }
			}
		}
	}
	owner := sys.Token(sys.Tenant, "owner@x", auth.RoleOwner)
	sys.GraphQL(owner, `{ auditLog(filter: {action: "publishEvent"}) { edges { node { principalKind targetId outcome } } } }`, nil).Decode(t, &log)
	var outcomes []string
	for _, e := range log.AuditLog.Edges {
		assert.Equal(t, "API_KEY", e.Node.PrincipalKind)
		outcomes = append(outcomes, e.Node.Outcome+" "+e.Node.TargetID)
	}
	assert.Equal(t, []string{"ok v-1", "FORBIDDEN ", "FORBIDDEN "}, outcomes)
	resumed, _ := sys.Run(waiting)
	assert.Equal(t, "completed", resumed.Status)
	assert.Equal(t, false, out["created"])

	for _, c := range []struct {
		body   string
		status int
		code   string
		field  string
	}{
		{`{"id": "u-1", "name": "user.signed_up", "payload": {"email": "b@example.com"}}`, http.StatusConflict, "CONFLICT", ""},
		{`{"id": "u-2", "name": "user.*"}`, http.StatusBadRequest, "BAD_USER_INPUT", "name"},
		{`{"name": "user.x"}`, http.StatusBadRequest, "BAD_USER_INPUT", "id"},
		{`{"id": "u-2", "name": "user.x", "payload": [1]}`, http.StatusBadRequest, "BAD_USER_INPUT", "payload"},
		{`{"id": "u-2", "name": "user.x", "data": {}}`, http.StatusBadRequest, "UNKNOWN_FIELD", "data"},
		{`not json`, http.StatusBadRequest, "BAD_USER_INPUT", ""},
		{`{"id": "u-2", "name": "user.x", "payload": {"x": "` + strings.Repeat("a", 300<<10) + `"}}`, http.StatusRequestEntityTooLarge, "BAD_USER_INPUT", ""},
	} {
		status, out := postEvent(t, sys, writer, c.body)
		label := c.body[:min(len(c.body), 60)]
		assert.Equal(t, c.status, status, label)
		assert.Equal(t, c.code, errorCode(out), label)
		if c.field != "" {
			assert.Equal(t, c.field, out["error"].(map[string]any)["field"], label)
		}
	}
	var n int
	require.NoError(t, sys.Env.System.QueryRow(t.Context(), `SELECT count(*) FROM workflow_runs WHERE tenant_id = $1 AND workflow_id = $2`,
		sys.Tenant, wf).Scan(&n))
	assert.Equal(t, 1, n)
}

// TestEventsEndpointConcurrently: clients publishing overlapping ids over
// HTTP start one run per event.
func TestEventsEndpointConcurrently(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	wf := sys.Workflow(`{"triggers": [{"event": "tick"}], "nodes": [{"id": "a", "type": "noop"}]}`)
	key := sys.APIKey(auth.ScopeEventsWrite)
	const clients, events = 8, 10
	var wg sync.WaitGroup
	statuses := make(chan int, clients*events)
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			for i := 0; i < events; i++ {
				b, _ := json.Marshal(map[string]any{"id": fmt.Sprint((i + c) % events), "name": "tick"})
				req, _ := http.NewRequest(http.MethodPost, sys.URL+app.PathEvents, bytes.NewReader(b))
				req.Header.Set("Authorization", "Bearer "+key)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					statuses <- 0
					continue
				}
				resp.Body.Close()
				statuses <- resp.StatusCode
			}
		}(c)
	}
	wg.Wait()
	close(statuses)
	for s := range statuses {
		require.Equal(t, http.StatusOK, s)
	}
	var n int
	require.NoError(t, sys.Env.System.QueryRow(t.Context(), `SELECT count(*) FROM workflow_runs WHERE tenant_id = $1 AND workflow_id = $2`,
		sys.Tenant, wf).Scan(&n))
	assert.Equal(t, events, n)
}

// TestEventStartsAreAdmitted: the server's own admission applies to each
// run an event starts, counting the runs the same publish started before
// it; the refused one is recorded with its code and the event with the
// rest commits.
func TestEventStartsAreAdmitted(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	require.NoError(t, tenants.Update(t.Context(), sys.Deps.DB, sys.Tenant, tenants.UpdateParams{Limits: &tenants.Limits{MaxQueuedTasks: 1}}))
	def := `{"triggers": [{"event": "job"}], "nodes": [{"id": "t", "type": "task", "task": {"handler": "work"}}]}`
	first, second := sys.Workflow(def), sys.Workflow(def)
	status, out := postEvent(t, sys, sys.APIKey(auth.ScopeEventsWrite), `{"id": "j-1", "name": "job"}`)
	require.Equal(t, http.StatusOK, status, "%v", out)
	runs := map[string]map[string]any{}
	for _, r := range out["event"].(map[string]any)["runs"].([]any) {
		m := r.(map[string]any)
		runs[m["workflow_id"].(string)] = m
	}
	require.Len(t, runs, 2)
	assert.Equal(t, "started", runs[first.String()]["outcome"]) // (workflow ids are v7: first sorts first)
	assert.Equal(t, "refused", runs[second.String()]["outcome"])
	assert.Nil(t, runs[second.String()]["run_id"])
	assert.Equal(t, "QUOTA_EXCEEDED", runs[second.String()]["error"].(map[string]any)["code"])
	var n int
	require.NoError(t, sys.Env.System.QueryRow(t.Context(), `SELECT count(*) FROM workflow_runs WHERE tenant_id = $1`, sys.Tenant).Scan(&n))
	assert.Equal(t, 1, n)
}
