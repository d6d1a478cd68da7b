package secrets_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/testenv"
)

func randomValue(prefix string) string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// TestASecretLeavesNoTraceInARun runs a workflow whose HTTP steps carry a
// secret in the url path, the query and a header, against a receiver that
// echoes it back in a success and in a failure, then greps for the value
// (and the one it replaced) in every text, json and bytea column of every
// table of the database (the sealed column excepted: ciphertext), every
// log line the system wrote and every GraphQL answer of the run's life.
// It is found only where it was sent: at the receiver (and in no Redis key).
func TestASecretLeavesNoTraceInARun(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	owner := sys.Token(sys.Tenant, "owner@example.com", auth.RoleOwner)
	old, current := randomValue("sv1"), randomValue("sv2")
	orderID := randomValue("ord")

	var mu sync.Mutex
	var received []string
	var webhooks int
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		received = append(received, r.Method+" "+r.URL.String()+" "+r.Header.Get("Authorization")+" "+string(body))
		if r.URL.Path == "/hook" {
			webhooks++
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.HasPrefix(r.URL.Path, "/orders/"):
			// Echo the credential: the output must not keep it.
			_ = json.NewEncoder(w).Encode(map[string]any{"you_sent": r.Header.Get("Authorization"), "url": r.URL.String(), "cursor": "c-1"})
		case strings.HasPrefix(r.URL.Path, "/reject/"):
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = fmt.Fprintf(w, `{"error": "key %s is revoked", "path": %q}`, r.Header.Get("X-Key"), r.URL.Path)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	t.Cleanup(sink.Close)
	sys.StartWorker(apptest.WorkerOptions{})

	var answers []string
	gql := func(query string, vars map[string]any) apptest.GQLResponse {
		t.Helper()
		res := sys.GraphQL(owner, query, vars)
		b, _ := json.Marshal(res)
		answers = append(answers, string(b))
		return res
	}
	require.Empty(t, gql(`mutation($v: String!) { createSecret(name: "API_TOKEN", value: $v) { name version } }`, map[string]any{"v": old}).Errors)
	require.Empty(t, gql(`mutation($v: String!) { updateSecret(name: "API_TOKEN", value: $v) { name version versions { version } } }`,
		map[string]any{"v": current}).Errors)
	require.Empty(t, gql(`mutation($u: String!) { createWebhookEndpoint(input: {url: $u, eventTypes: ["run.failed"]}) { endpoint { id } } }`,
		map[string]any{"u": sink.URL + "/hook"}).Errors)

	def := fmt.Sprintf(`{"nodes": [
	  {"id": "fetch", "type": "http", "retry": {"max_attempts": 1}, "http": {"method": "GET",
	    "url": "%[1]s/orders/{{ input.order_id }}/{{ secrets.API_TOKEN }}",
	    "query": {"key": "{{ secrets.API_TOKEN }}", "order": "{{ input.order_id }}"},
	    "headers": {"Authorization": "Bearer {{ secrets.API_TOKEN }}"}}},
	  {"id": "reject", "type": "http", "depends_on": ["fetch"], "retry": {"max_attempts": 1}, "http": {"method": "POST",
	    "url": "%[1]s/reject/{{ nodes.fetch.output.body.cursor }}/{{ secrets.API_TOKEN }}",
	    "headers": {"X-Key": "{{ secrets.API_TOKEN }}"}},
	   "input": {"order": "input.order_id", "seen": "nodes.fetch.output.body"}}
	]}`, sink.URL)
	var wf struct {
		CreateWorkflow struct{ Workflow struct{ ID string } }
	}
	res := gql(`mutation($d: JSON!) { createWorkflow(input: {name: "uses-a-secret", definition: $d}) { workflow { id } } }`,
		map[string]any{"d": json.RawMessage(def)})
	res.Decode(t, &wf)
	var started struct {
		StartRun struct{ Run struct{ ID string } }
	}
	res = gql(`mutation($w: ID!, $i: JSON!) { startRun(input: {workflowId: $w, input: $i}) { run { id } } }`,
		map[string]any{"w": wf.CreateWorkflow.Workflow.ID, "i": map[string]any{"order_id": orderID}})
	res.Decode(t, &started)

	var run struct {
		Run struct {
			Status string
			Tasks  []struct {
				NodeID    string
				State     string
				Output    json.RawMessage
				LastError json.RawMessage
			}
		}
	}
	apptest.Eventually(t, "the run to fail at reject", 20*time.Second, func() bool {
		res := sys.GraphQL(owner, `query($id: ID!) { run(id: $id) { status } }`, map[string]any{"id": started.StartRun.Run.ID})
		return !strings.Contains(string(res.Data), "RUNNING")
	})
	res = gql(`query($id: ID!) { run(id: $id) { status input output error metadata tasks { nodeId state input output lastError skipReason }
		timeline { kind nodeId detail } workflow { versions { definition } } } }`, map[string]any{"id": started.StartRun.Run.ID})
	res.Decode(t, &run)
	require.Equal(t, "FAILED", run.Run.Status)
	require.Len(t, run.Run.Tasks, 2)
	assert.Equal(t, "COMPLETED", run.Run.Tasks[0].State)
	assert.Contains(t, string(run.Run.Tasks[0].Output), `"cursor":"c-1"`)
	assert.Contains(t, string(run.Run.Tasks[0].Output), "Bearer [secret]", "the echoed credential is redacted")
	assert.Contains(t, string(run.Run.Tasks[1].LastError), "[secret]")
	apptest.Eventually(t, "the run.failed webhook", 20*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return webhooks > 0 })
	gql(`{ secrets { name version versions { version createdBy } } secretAudit { action secretName version principal }
		webhookDeliveries { edges { node { id payload attempts { responseBody error } } } } }`, nil)

	// The receiver got the current value in the path, the query and the header.
	mu.Lock()
	got := strings.Join(received, "\n")
	mu.Unlock()
	assert.Contains(t, got, "/orders/"+orderID+"/"+current+"?key="+current+"&order="+orderID+" Bearer "+current)
	assert.Contains(t, got, "/reject/c-1/"+current)
	assert.NotContains(t, got, old, "steps use the latest version")

	for _, v := range []string{old, current} {
		for _, a := range answers {
			assert.NotContains(t, a, v, "a GraphQL answer holds the secret")
		}
		for _, e := range sys.Logs.All() {
			line, _ := json.Marshal(map[string]any{"msg": e.Message, "fields": e.ContextMap()})
			assert.NotContains(t, string(line), v, "a log line holds the secret: %s", line)
		}
	}
	for _, v := range []string{old, current} {
		assert.Empty(t, grepRedis(t, sys, v), "Redis keys holding the secret")
	}
	found := grepDatabase(t, sys, []string{old, current, orderID})
	assert.Empty(t, found[old], "columns holding the replaced value")
	assert.Empty(t, found[current], "columns holding the value")
	assert.Contains(t, strings.Join(found[orderID], " "), "workflow_runs_", "the grep finds what is there (the run's input, in its partition)")
}

// grepRedis lists the test's Redis keys whose value holds needle
// (streams carry references, never data; this checks it).
func grepRedis(t *testing.T, sys *apptest.System, needle string) []string {
	ctx := context.Background()
	keys, err := testenv.Keys(ctx, sys.Env.Redis, sys.Env.Namespace+"*")
	require.NoError(t, err)
	require.NotEmpty(t, keys)
	rdb := sys.Env.Redis
	var out []string
	for _, k := range keys {
		var content string
		switch typ, _ := rdb.Type(ctx, k).Result(); typ {
		case "string":
			content, _ = rdb.Get(ctx, k).Result()
		case "hash":
			content = fmt.Sprint(rdb.HGetAll(ctx, k).Val())
		case "stream":
			content = fmt.Sprint(rdb.XRange(ctx, k, "-", "+").Val())
		case "zset":
			content = fmt.Sprint(rdb.ZRange(ctx, k, 0, -1).Val())
		case "set":
			content = fmt.Sprint(rdb.SMembers(ctx, k).Val())
		case "list":
			content = fmt.Sprint(rdb.LRange(ctx, k, 0, -1).Val())
		}
		if strings.Contains(content, needle) || strings.Contains(k, needle) {
			out = append(out, k)
		}
	}
	return out
}

// grepDatabase lists, per needle, the table.column of every row that
// holds it, over every text, varchar, json, jsonb, text[] and bytea column
// of every table (partitions included), as the owner in the tenant's scope
// (and unscoped tables whole). secret_versions.sealed is left out: it is
// ciphertext, checked by TestSealedValuesAreNeitherReadableByTheAppNorVisibleToOtherTenants.
func grepDatabase(t *testing.T, sys *apptest.System, needles []string) map[string][]string {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, sys.Env.OwnerURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `SELECT set_config('app.tenant_id', $1, false)`, sys.Tenant.String())
	require.NoError(t, err)
	rows, err := conn.Query(ctx, `SELECT c.oid::regclass::text, a.attname, format_type(a.atttypid, NULL)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_attribute a ON a.attrelid = c.oid
		WHERE n.nspname = 'public' AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
		  AND format_type(a.atttypid, NULL) IN ('text', 'character varying', 'json', 'jsonb', 'text[]', 'bytea')
		ORDER BY 1, 2`)
	require.NoError(t, err)
	type col struct{ table, name, typ string }
	var cols []col
	for rows.Next() {
		var c col
		require.NoError(t, rows.Scan(&c.table, &c.name, &c.typ))
		cols = append(cols, c)
	}
	require.NoError(t, rows.Err())
	require.Greater(t, len(cols), 50, "every table's columns")
	found := map[string][]string{}
	for _, c := range cols {
		if c.table == "secret_versions" && c.name == "sealed" {
			continue
		}
		expr := fmt.Sprintf("%q::text", c.name)
		if c.typ == "bytea" {
			expr = fmt.Sprintf("encode(%q, 'escape')", c.name)
		}
		for _, n := range needles {
			var hits int
			require.NoError(t, conn.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE strpos(%s, $1) > 0`, c.table, expr), n).Scan(&hits),
				"%s.%s", c.table, c.name)
			if hits > 0 {
				found[n] = append(found[n], c.table+"."+c.name)
			}
		}
	}
	return found
}
