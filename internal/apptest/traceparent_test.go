package apptest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/telemetry"
)

// TestAGraphQLStartsTraceparentSpansTheRun starts a run through GraphQL
// with a caller's traceparent and follows that one trace through the whole
// run: the HTTP request's server span (a child of the caller's span), the
// start's transition transaction, the worker's executions, each report's
// transition, the next step (a descendant of the previous step's report),
// and the run.completed webhook, whose request carries the trace's
// traceparent header.
func TestAGraphQLStartsTraceparentSpansTheRun(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(telemetry.Propagator())
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	hooks := make(chan http.Header, 4)
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hooks <- r.Header.Clone()
	}))
	t.Cleanup(sink.Close)

	sys := apptest.Start(t)
	sys.StartWorker(apptest.WorkerOptions{})
	owner := sys.Token(sys.Tenant, "owner@traces", auth.RoleOwner)
	res := sys.GraphQL(owner, `mutation($u: String!) { createWebhookEndpoint(input: {url: $u, eventTypes: ["run.completed"]}) { secret } }`,
		map[string]any{"u": sink.URL + "/hook"})
	require.Empty(t, res.Errors)
	wf := sys.Workflow(`{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"noop","depends_on":["a"]}]}`)

	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	body, err := json.Marshal(map[string]any{"query": `mutation($w: ID!) { startRun(input: {workflowId: $w}) { run { id } } }`,
		"variables": map[string]any{"w": wf.String()}})
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, sys.URL+"/graphql", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+owner)
	req.Header.Set("traceparent", "00-"+traceID+"-"+parentID+"-01")
	req.Header.Set("X-Request-Id", "trace-test-1")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var started struct {
		Data struct {
			StartRun struct{ Run struct{ ID string } }
		}
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&started))
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "trace-test-1", resp.Header.Get("X-Request-Id"), "a well-formed request id is honoured and returned")
	require.NotEmpty(t, started.Data.StartRun.Run.ID)

	var hook http.Header
	select {
	case hook = <-hooks:
	case <-time.After(30 * time.Second):
		t.Fatal("no run.completed webhook")
	}
	assert.Contains(t, hook.Get("traceparent"), traceID, "the webhook request carries the run's trace")

	// Every span of the run is in the caller's trace; find them by name.
	byName := map[string][]sdktrace.ReadOnlySpan{}
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	apptest.Eventually(t, "the run's spans", 10*time.Second, func() bool {
		clear(byName)
		clear(byID)
		for _, s := range rec.Ended() {
			if s.SpanContext().TraceID().String() != traceID {
				continue
			}
			byName[s.Name()] = append(byName[s.Name()], s)
			byID[s.SpanContext().SpanID()] = s
		}
		return len(byName["execute noop"]) == 2 && len(byName["transition node_completed"]) == 2 && len(byName["webhook run.completed"]) == 1
	})
	gql := byName["POST /graphql"]
	require.Len(t, gql, 1, "one server span for the request")
	assert.Equal(t, parentID, gql[0].Parent().SpanID().String(), "the server span is a child of the caller's span")
	require.Len(t, byName["transition run_started"], 1)
	assert.True(t, descends(byID, byName["transition run_started"][0], gql[0]), "the start's transaction is in the request")

	// Step b runs after a's report committed: b's execution descends from
	// a's execution through a's report transition.
	var a, b sdktrace.ReadOnlySpan
	for _, s := range byName["execute noop"] {
		for _, kv := range s.Attributes() {
			if kv.Key == "composer.node_id" && kv.Value.AsString() == "a" {
				a = s
			} else if kv.Key == "composer.node_id" {
				b = s
			}
		}
	}
	require.NotNil(t, a)
	require.NotNil(t, b)
	assert.True(t, descends(byID, a, gql[0]), "step a's execution is in the request's trace, below it")
	assert.True(t, descends(byID, b, a), "step b's execution descends from step a's")
	var report sdktrace.ReadOnlySpan
	for _, s := range byName["transition node_completed"] {
		if descends(byID, s, a) && descends(byID, b, s) {
			report = s
		}
	}
	assert.NotNil(t, report, "a's report transition is between a's execution and b's")
	assert.NotEmpty(t, byName["db batch"], "the transactions' statements are spans too")
}

// descends reports whether s is below ancestor in spans' parent links.
func descends(spans map[trace.SpanID]sdktrace.ReadOnlySpan, s, ancestor sdktrace.ReadOnlySpan) bool {
	for p := s.Parent().SpanID(); p.IsValid(); {
		if p == ancestor.SpanContext().SpanID() {
			return true
		}
		next, ok := spans[p]
		if !ok {
			return false
		}
		p = next.Parent().SpanID()
	}
	return false
}
