package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/engine/taskapi"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/config"
	"github.com/composer-dev/composer/internal/testenv"
)

// TestStoreFaultsAnswerHonestly drives a server whose app-role pool
// reaches PostgreSQL through a proxy the test breaks, and checks what each
// fault answers on GraphQL and on the task API:
//   - every backend of the app role is terminated between two requests:
//     the next request meets dead pooled connections and succeeds, on
//     GraphQL (the key lookup and the start) and on the task API;
//   - the database goes away under a start in flight (waiting on a lock):
//     UNAVAILABLE with retryAfterSeconds; the task API answers 503 with
//     Retry-After; GraphQL's authentication 503 too;
//   - a start's COMMIT is carried out and its answer lost: OUTCOME_UNKNOWN
//     with its message; the same start again (same idempotency key) finds
//     the run, and exactly one exists.
//
// Nothing answers INTERNAL, and nothing is logged as a failure.
func TestStoreFaultsAnswerHonestly(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	ctx := context.Background()
	proxy, appURL := testenv.ProxyURL(t, env.AppURL)
	lose := proxy.LoseCommitWhen(func(sql string, args []any) bool {
		return strings.Contains(sql, "INSERT INTO run_idempotency_keys") && slices.Contains(args, any("unknown-1"))
	})
	sys := apptest.StartTraced(t, env, lose, func(c *config.Config) { c.DatabaseURL = appURL })
	wf := sys.Workflow(`{"nodes":[{"id":"t","type":"task","task":{"handler":"nobody"}}]}`)
	key := sys.APIKey(auth.ScopeRunsRead, auth.ScopeRunsWrite)
	type started struct {
		StartRun struct {
			Created bool
			Run     struct{ ID string }
		}
	}
	start := func(idem string) apptest.GQLResponse {
		return sys.GraphQL(key, `mutation($w: ID!, $k: String) { startRun(input: {workflowId: $w, idempotencyKey: $k}) { created run { id } } }`,
			map[string]any{"w": wf.String(), "k": idem})
	}
	report := func() *http.Response {
		body, _ := json.Marshal(taskapi.CompleteRequest{Ref: taskapi.Ref{Tenant: sys.Tenant, Run: uuid.New(), Task: uuid.New(), Attempt: 1},
			NodeID: "t", WorkerID: "w-1"})
		req, err := http.NewRequest(http.MethodPost, sys.URL+taskapi.PathComplete, bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+sys.Cfg.WorkerToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		return resp
	}
	codeOf := func(resp *http.Response) string {
		defer resp.Body.Close()
		var e taskapi.ErrorResponse
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
		return e.Error.Code
	}

	// Between requests.
	require.Empty(t, start("before").Errors)
	require.Positive(t, testenv.TerminateBackends(t, env.AppURL, "%"), "the server's pool had connections")
	var after started
	start("after").Decode(t, &after)
	assert.True(t, after.StartRun.Created)
	require.Positive(t, testenv.TerminateBackends(t, env.AppURL, "%"))
	resp := report()
	require.Equal(t, http.StatusOK, resp.StatusCode, "a report for a run that does not exist is acknowledged")
	resp.Body.Close()

	// In flight: another transaction holds the key the start claims, and
	// the database goes away while the start waits for it.
	holder, err := pgx.Connect(ctx, env.AppURL)
	require.NoError(t, err)
	defer holder.Close(ctx)
	tx, err := holder.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SELECT set_config('app.tenant_id', $1, true)", sys.Tenant.String())
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO run_idempotency_keys (tenant_id, key, run_id, request_hash) VALUES ($1, 'inflight-1', $2, '\x00')`,
		sys.Tenant, uuid.New())
	require.NoError(t, err)
	went := testenv.When(t, env.AppURL, "usename = 'composer_app' AND wait_event_type = 'Lock'", func(*pgx.Conn) { proxy.Down() })
	inflight := start("inflight-1")
	<-went
	require.NoError(t, tx.Rollback(ctx))
	require.Len(t, inflight.Errors, 1, "%s", inflight.Data)
	assert.Equal(t, "UNAVAILABLE", inflight.Errors[0].Code(), inflight.Errors[0].Message)
	assert.EqualValues(t, 1, inflight.Errors[0].Extensions["retryAfterSeconds"])
	assert.Contains(t, inflight.Errors[0].Message, "retry")
	// While it is down: the task API, and GraphQL's authentication.
	resp = report()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	assert.Equal(t, "UNAVAILABLE", codeOf(resp))
	down := start("down-1")
	assert.Equal(t, http.StatusServiceUnavailable, down.Status)
	assert.Equal(t, []string{"UNAVAILABLE"}, down.Codes())
	proxy.Up()

	// The commit's answer lost.
	unknown := start("unknown-1")
	require.Len(t, unknown.Errors, 1, "%s", unknown.Data)
	assert.Equal(t, "OUTCOME_UNKNOWN", unknown.Errors[0].Code())
	assert.Equal(t, "outcome unknown: retry with the same idempotency key", unknown.Errors[0].Message)
	assert.EqualValues(t, 1, unknown.Errors[0].Extensions["retryAfterSeconds"])
	assert.Equal(t, 1, proxy.LostAnswers())
	var again started
	start("unknown-1").Decode(t, &again)
	assert.False(t, again.StartRun.Created, "the first start had committed")
	var keys, runs int
	require.NoError(t, env.System.QueryRow(ctx, `SELECT count(*) FROM run_idempotency_keys WHERE tenant_id = $1 AND key = 'unknown-1'`, sys.Tenant).Scan(&keys))
	require.NoError(t, env.System.QueryRow(ctx, `SELECT count(*) FROM workflow_runs WHERE tenant_id = $1`, sys.Tenant).Scan(&runs))
	assert.Equal(t, 1, keys)
	assert.Equal(t, 3, runs, "before, after and unknown-1: the start in flight and the refused one wrote nothing")

	assert.Zero(t, sys.Logs.FilterMessage("graphql resolver failed").Len(), "nothing answered INTERNAL")
	assert.Zero(t, sys.Logs.FilterMessage("task API request failed").Len(), "nothing answered 500")
	assert.Positive(t, sys.Logs.FilterMessage("graphql resolver met a store fault").Len(), "the faults were logged as such")
}
