package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/config"
	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/sdk/client"
)

// approval is a workflow a backend drives: an approval, then a signal.
const approval = `{"nodes":[{"id":"ok","type":"wait","wait":{"signal":"approval","approval":true}},
	{"id":"go","type":"wait","depends_on":["ok"],"wait":{"signal":"go"}}]}`

// TestABackendKeyDrivesItsRuns: with a key of exactly the scopes the
// README names for a backend (runs:read and runs:write), every call the
// README lists for a backend succeeds — a mutation's answer reaches the
// caller for a run it created — and with runs:write alone every mutation
// still answers what it did. A workflows:write key creates and publishes
// workflows, an events:write key publishes events.
func TestABackendKeyDrivesItsRuns(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	author, err := client.New(sys.URL, sys.APIKey(auth.ScopeWorkflowsWrite))
	require.NoError(t, err)
	wfID, version, err := author.CreateWorkflow(ctx, "approve-then-go", json.RawMessage(approval))
	require.NoError(t, err, "workflows:write creates a workflow")
	assert.Equal(t, 1, version)
	version, err = author.PublishVersion(ctx, wfID, json.RawMessage(approval))
	require.NoError(t, err)
	assert.Equal(t, 2, version)

	backend, err := client.New(sys.URL, sys.APIKey(auth.ScopeRunsRead, auth.ScopeRunsWrite))
	require.NoError(t, err)
	run, created, err := backend.StartRun(ctx, client.Start{Workflow: "approve-then-go", Input: map[string]int{"order": 1}, IdempotencyKey: "order-1"})
	require.NoError(t, err, "a backend key starts a run and learns of it")
	assert.True(t, created)
	assert.Equal(t, wfID, run.WorkflowID)
	assert.Equal(t, "approve-then-go", run.Workflow)
	assert.Equal(t, "order-1", run.IdempotencyKey)
	assert.Equal(t, "RUNNING", run.Status)
	again, created, err := backend.StartRun(ctx, client.Start{Workflow: "approve-then-go", Input: map[string]int{"order": 1}, IdempotencyKey: "order-1"})
	require.NoError(t, err)
	assert.False(t, created)
	assert.Equal(t, run.ID, again.ID)

	read, err := backend.GetRun(ctx, run.ID)
	require.NoError(t, err, "a backend key reads its run")
	assert.Equal(t, wfID, read.WorkflowID)
	require.NotEmpty(t, read.Tasks, "with its tasks")
	assert.Equal(t, "ok", read.Tasks[0].NodeID)
	ignored, err := backend.Approve(ctx, run.ID, true, "fine")
	require.NoError(t, err)
	assert.False(t, ignored)
	ignored, err = backend.Signal(ctx, run.ID, "go", map[string]bool{"now": true}, "")
	require.NoError(t, err)
	assert.False(t, ignored)
	done, err := backend.WaitRun(ctx, run.ID)
	require.NoError(t, err)
	assert.Equal(t, "COMPLETED", done.Status)
	assert.True(t, done.Done())

	byID, _, err := backend.StartRun(ctx, client.Start{WorkflowID: wfID})
	require.NoError(t, err)
	cancelled, err := backend.CancelRun(ctx, byID.ID, "not needed")
	require.NoError(t, err)
	assert.Equal(t, "CANCELLED", cancelled.Status)

	// runs:write alone: what it wrote, never a FORBIDDEN for reading it.
	writer, err := client.New(sys.URL, sys.APIKey(auth.ScopeRunsWrite))
	require.NoError(t, err)
	w, created, err := writer.StartRun(ctx, client.Start{Workflow: "approve-then-go"})
	require.NoError(t, err)
	assert.True(t, created)
	assert.NotEmpty(t, w.ID)
	assert.NotEmpty(t, w.IdempotencyKey, "the client sent a key of its own")
	_, err = writer.Approve(ctx, w.ID, true, "")
	require.NoError(t, err)
	_, err = writer.Signal(ctx, w.ID, "go", nil, "sig-1")
	require.NoError(t, err)
	_, err = writer.CancelRun(ctx, w.ID, "")
	require.NoError(t, err)
	_, err = writer.GetRun(ctx, w.ID)
	assert.Equal(t, "FORBIDDEN", client.ErrorCode(err), "reading needs runs:read")

	publisher, err := client.New(sys.URL, sys.APIKey(auth.ScopeEventsWrite))
	require.NoError(t, err)
	_, created, err = publisher.PublishEvent(ctx, "order.placed", map[string]int{"order": 1}, "evt-1")
	require.NoError(t, err)
	assert.True(t, created)
}

// TestWaitRunWaitsForATerminalStatus: a run created while its workflow is
// paused is QUEUED; WaitRun keeps polling through QUEUED and RUNNING and
// returns only the finished run.
func TestWaitRunWaitsForATerminalStatus(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	polls := &counter{match: "runStatus"}
	c, wf := backendOf(t, sys, polls)
	_, err := c.PauseWorkflow(ctx, wf.String(), "hold")
	require.NoError(t, err)
	run, _, err := c.StartRun(ctx, client.Start{WorkflowID: wf.String()})
	require.NoError(t, err)
	require.Equal(t, "QUEUED", run.Status)
	assert.False(t, run.Done())

	waited := make(chan *client.Run, 1)
	go func() {
		r, err := c.WaitRun(ctx, run.ID)
		assert.NoError(t, err)
		waited <- r
	}()
	require.Eventually(t, func() bool { return polls.times() >= 3 }, 30*time.Second, 5*time.Millisecond, "WaitRun polls the queued run")
	notYet(t, waited)
	_, err = c.ResumeWorkflow(ctx, wf.String())
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		r, err := c.GetRun(ctx, run.ID)
		return err == nil && r.Status == "RUNNING" && len(r.Tasks) == 1 && r.Tasks[0].State == "WAITING"
	}, 30*time.Second, 10*time.Millisecond)
	seen := polls.times()
	require.Eventually(t, func() bool { return polls.times() >= seen+2 }, 30*time.Second, 5*time.Millisecond, "WaitRun polls the running run")
	notYet(t, waited)
	_, err = c.Signal(ctx, run.ID, "go", nil, "")
	require.NoError(t, err)
	r := <-waited
	assert.Equal(t, "COMPLETED", r.Status)
}

// backendOf is a backend's client (runs:read and runs:write) whose calls
// pass through transport, and a workflow waiting for the signal "go".
func backendOf(t *testing.T, sys *apptest.System, transport http.RoundTripper) (*client.Client, uuid.UUID) {
	t.Helper()
	c, err := client.New(sys.URL, sys.APIKey(auth.ScopeRunsRead, auth.ScopeRunsWrite), client.Options{HTTPClient: &http.Client{Transport: transport}})
	require.NoError(t, err)
	return c, sys.Workflow(`{"nodes":[{"id":"go","type":"wait","wait":{"signal":"go"}}]}`)
}

// notYet fails the test if WaitRun has returned.
func notYet(t *testing.T, waited <-chan *client.Run) {
	t.Helper()
	select {
	case r := <-waited:
		t.Fatalf("WaitRun returned a %s run", r.Status)
	default:
	}
}

// TestTheClientRepeatsWhatTheServerCouldNotFinish: a start whose commit's
// answer is lost (OUTCOME_UNKNOWN), and one made while the database is
// unreachable (UNAVAILABLE), are repeated by the client with the same
// idempotency key — its own, as the caller gave none: each returns its
// run, and exactly one run exists per start.
func TestTheClientRepeatsWhatTheServerCouldNotFinish(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	proxy, appURL := testenv.ProxyURL(t, env.AppURL)
	lose := proxy.LoseCommitWhen(func(sql string, _ []any) bool { return strings.Contains(sql, "INSERT INTO run_idempotency_keys") })
	sys := apptest.StartTraced(t, env, lose, func(c *config.Config) { c.DatabaseURL = appURL })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	answers := &counter{match: "startRun"}
	c, wf := backendOf(t, sys, answers)
	runsOf := func() []string {
		rows, err := env.System.Query(ctx, `SELECT id::text FROM workflow_runs WHERE tenant_id = $1 ORDER BY id`, sys.Tenant)
		require.NoError(t, err)
		var ids []string
		for rows.Next() {
			var id string
			require.NoError(t, rows.Scan(&id))
			ids = append(ids, id)
		}
		require.NoError(t, rows.Err())
		return ids
	}

	run, created, err := c.StartRun(ctx, client.Start{WorkflowID: wf.String()})
	require.NoError(t, err)
	assert.True(t, created, "the run the lost commit created was this call's")
	assert.Equal(t, 1, proxy.LostAnswers(), "the first attempt's commit answer was lost")
	assert.Equal(t, []string{"OUTCOME_UNKNOWN", ""}, answers.codes(), "answered OUTCOME_UNKNOWN, then the run")
	_, err = uuid.Parse(run.IdempotencyKey)
	assert.NoError(t, err, "the client's own key: %q", run.IdempotencyKey)
	assert.Equal(t, []string{run.ID}, runsOf(), "one run")

	// Unreachable: the database comes back once the client was told so.
	answers.reset()
	proxy.Down()
	answers.after(func(code string) {
		if code == "UNAVAILABLE" {
			proxy.Up()
		}
	})
	second, created, err := c.StartRun(ctx, client.Start{WorkflowID: wf.String()})
	require.NoError(t, err)
	assert.True(t, created)
	assert.Equal(t, "UNAVAILABLE", answers.codes()[0])
	assert.Equal(t, "", answers.codes()[len(answers.codes())-1])
	assert.ElementsMatch(t, []string{run.ID, second.ID}, runsOf(), "one more run")

	// What a repeat cannot fix is answered at once.
	answers.reset()
	_, _, err = c.StartRun(ctx, client.Start{Workflow: "no-such-workflow"})
	assert.Equal(t, "NOT_FOUND", client.ErrorCode(err))
	assert.Len(t, answers.codes(), 1, "not repeated")
}

// TestIsTemporary: nil, a cancelled call and the client's own refusals are
// not temporary; a lost connection and the retryable codes are.
func TestIsTemporary(t *testing.T) {
	t.Parallel()
	assert.False(t, client.IsTemporary(nil))
	assert.False(t, client.IsTemporary(context.Canceled))
	assert.False(t, client.IsTemporary(fmt.Errorf("call: %w", context.DeadlineExceeded)))
	assert.False(t, client.IsTemporary(errors.New("composer client: a definition is required")))
	for _, code := range []string{"UNAVAILABLE", "OUTCOME_UNKNOWN", "RATE_LIMITED", "INTERNAL"} {
		assert.True(t, client.IsTemporary(&client.Error{Code: code}), code)
	}
	for _, code := range []string{"NOT_FOUND", "FORBIDDEN", "BAD_USER_INPUT", "CONFLICT", "UNAUTHENTICATED", "QUOTA_EXCEEDED"} {
		assert.False(t, client.IsTemporary(&client.Error{Code: code}), code)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	c, err := client.New("http://"+addr, "cmp_x", client.Options{Retries: -1})
	require.NoError(t, err)
	_, err = c.GetRun(context.Background(), uuid.NewString())
	require.Error(t, err)
	assert.True(t, client.IsTemporary(err), "connection refused: %v", err)
	_, _, err = c.CreateWorkflow(context.Background(), "x", nil)
	assert.False(t, client.IsTemporary(err), "a missing definition is the caller's")
	_, err = c.Signal(context.Background(), "r", "s", func() {}, "")
	assert.False(t, client.IsTemporary(err), "a payload that cannot be encoded is the caller's")
}

// counter is a transport that records the code of each answer to the
// GraphQL operation named match ("" for data) and may act after each.
type counter struct {
	match string
	mu    sync.Mutex
	seen  []string
	then  func(code string)
}

func (c *counter) RoundTrip(r *http.Request) (*http.Response, error) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	r.Body = io.NopCloser(strings.NewReader(string(body)))
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err != nil || !strings.Contains(string(body), `"operationName":"`+c.match+`"`) {
		return resp, err
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(strings.NewReader(string(data)))
	var out struct {
		Errors []struct {
			Extensions struct{ Code string }
		}
	}
	_ = json.Unmarshal(data, &out)
	code := ""
	if len(out.Errors) > 0 {
		code = out.Errors[0].Extensions.Code
	}
	c.mu.Lock()
	c.seen = append(c.seen, code)
	then := c.then
	c.mu.Unlock()
	if then != nil {
		then(code)
	}
	return resp, nil
}

func (c *counter) times() int { return len(c.codes()) }

func (c *counter) codes() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.seen)
}

func (c *counter) reset() {
	c.mu.Lock()
	c.seen, c.then = nil, nil
	c.mu.Unlock()
}

func (c *counter) after(fn func(code string)) {
	c.mu.Lock()
	c.then = fn
	c.mu.Unlock()
}
