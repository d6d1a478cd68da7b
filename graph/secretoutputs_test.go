package graph_test

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/apptest"
)

func reversed(s string) string {
	r := []rune(s)
	for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
		r[i], r[j] = r[j], r[i]
	}
	return string(r)
}

// TestSecretDerivedValuesAreOnlyForThoseWhoMayReadThem: a receiver echoes
// the secret a step sent it hex-encoded, reversed and in base64 — forms
// no redaction of the exact value catches — in a success (the step's
// output, the next step's input, the run's output, a child run's input and
// tasks) and in a failure (the step's error, the run's error, the
// timeline). A viewer and a runs:read key read none of it through any
// field, and are told why; an owner, an admin, a developer and a key with
// secrets:outputs read it all. Values that do not come from the secret
// (the step before it) stay readable to everyone.
func TestSecretDerivedValuesAreOnlyForThoseWhoMayReadThem(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	owner := sys.Token(sys.Tenant, "owner", auth.RoleOwner)
	secret := fmt.Sprintf("tok-%d-xyzzy", time.Now().UnixNano())
	forms := map[string]string{"hex": hex.EncodeToString([]byte(secret)), "reversed": reversed(secret),
		"base64": base64.StdEncoding.EncodeToString([]byte(secret))}
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		echo := map[string]string{"hex": hex.EncodeToString([]byte(got)), "reversed": reversed(got),
			"base64": base64.StdEncoding.EncodeToString([]byte(got))}
		w.Header().Set("Content-Type", "application/json")
		if strings.HasPrefix(r.URL.Path, "/reject") {
			w.WriteHeader(http.StatusBadRequest)
		}
		_ = json.NewEncoder(w).Encode(echo)
	}))
	t.Cleanup(sink.Close)
	sys.StartWorker(apptest.WorkerOptions{})
	require.Empty(t, sys.GraphQL(owner, `mutation($v: String!) { createSecret(name: "TOKEN", value: $v) { name } }`,
		map[string]any{"v": secret}).Errors)
	create := func(name, def string) string {
		var out struct {
			CreateWorkflow struct{ Workflow struct{ ID string } }
		}
		sys.GraphQL(owner, `mutation($n: String!, $d: JSON!) { createWorkflow(input: {name: $n, definition: $d}) { workflow { id } } }`,
			map[string]any{"n": name, "d": json.RawMessage(def)}).Decode(t, &out)
		return out.CreateWorkflow.Workflow.ID
	}
	create("kid", `{"nodes":[{"id":"k","type":"noop"}]}`)
	call := func(path string) string {
		return fmt.Sprintf(`"type":"http","retry":{"max_attempts":1},"http":{"method":"GET","url":"%s%s","headers":{"Authorization":"Bearer {{ secrets.TOKEN }}"}}`, sink.URL, path)
	}
	echo := create("echo", `{"output":{"echo":"nodes.call.output.body","before":"nodes.before.output"},"nodes":[
		{"id":"before","type":"noop","input":{"marker":"input.marker"}},
		{"id":"call","depends_on":["before"],`+call("/echo")+`},
		{"id":"next","type":"noop","depends_on":["call"],"input":{"echo":"nodes.call.output.body"}},
		{"id":"kid","type":"workflow","depends_on":["call"],"workflow":{"name":"kid"},"input":{"echo":"nodes.call.output.body"}}]}`)
	reject := create("reject", `{"nodes":[{"id":"call",`+call("/reject")+`}]}`)
	start := func(wf string) string {
		var out struct {
			StartRun struct{ Run struct{ ID string } }
		}
		sys.GraphQL(owner, `mutation($w: ID!) { startRun(input: {workflowId: $w, input: {marker: "plain-marker"}}) { run { id } } }`,
			map[string]any{"w": wf}).Decode(t, &out)
		return out.StartRun.Run.ID
	}
	runs := []string{start(echo), start(reject)}
	for _, id := range runs {
		apptest.Eventually(t, "the run to finish", 20*time.Second, func() bool {
			res := sys.GraphQL(owner, `query($id: ID!) { run(id: $id) { status } }`, map[string]any{"id": id})
			return !strings.Contains(string(res.Data), "RUNNING")
		})
	}
	var kid struct {
		Run struct{ Tasks []struct{ ChildRunID string } }
	}
	sys.GraphQL(owner, `query($id: ID!) { run(id: $id) { tasks { childRunId } } }`, map[string]any{"id": runs[0]}).Decode(t, &kid)
	for _, tk := range kid.Run.Tasks {
		if tk.ChildRunID != "" {
			runs = append(runs, tk.ChildRunID)
		}
	}
	require.Len(t, runs, 3, "the child run")
	apptest.Eventually(t, "the child to finish", 20*time.Second, func() bool {
		res := sys.GraphQL(owner, `query($id: ID!) { run(id: $id) { status } }`, map[string]any{"id": runs[2]})
		return strings.Contains(string(res.Data), "COMPLETED")
	})

	const fields = `id status input output error metadata concurrencyKey secretDerived
		tasks { nodeId state input output lastError secretDerived } timeline(first: 500) { kind nodeId detail }`
	read := func(cred string) string {
		t.Helper()
		var all []string
		for _, id := range runs {
			res := sys.GraphQL(cred, `query($id: ID!) { run(id: $id) { `+fields+` } }`, map[string]any{"id": id})
			require.Empty(t, res.Errors)
			all = append(all, string(res.Data))
		}
		res := sys.GraphQL(cred, `{ runs(first: 5) { edges { node { id status input output error metadata secretDerived tasks { nodeId input output lastError } } } } }`, nil)
		require.Empty(t, res.Errors)
		return strings.Join(append(all, string(res.Data)), "\n")
	}

	var readers, hidden []string
	readers = []string{owner, sys.Token(sys.Tenant, "admin", auth.RoleAdmin), sys.Token(sys.Tenant, "dev", auth.RoleDeveloper),
		sys.APIKey(auth.ScopeRunsRead, auth.ScopeSecretOutputs)}
	hidden = []string{sys.Token(sys.Tenant, "viewer", auth.RoleViewer), sys.APIKey(auth.ScopeRunsRead)}
	for i, cred := range readers {
		got := read(cred)
		for form, v := range forms {
			assert.Contains(t, got, v, "reader %d reads the %s echo", i, form)
		}
		assert.NotContains(t, got, "hidden")
	}
	for i, cred := range hidden {
		got := read(cred)
		for form, v := range forms {
			assert.NotContains(t, got, v, "hidden reader %d reads the %s echo", i, form)
		}
		assert.Contains(t, got, "plain-marker", "what does not come from the secret stays readable")
		assert.Contains(t, got, "reading it needs the secrets:outputs permission", "and the reader is told why")
	}

	// The flags say what is hidden: the step and what follows it, the
	// run's output and error; the step before it is not.
	var flags struct {
		Run struct {
			SecretDerived bool
			Output        json.RawMessage
			Tasks         []struct {
				NodeID        string
				SecretDerived bool
				Output        json.RawMessage
			}
		}
	}
	sys.GraphQL(hidden[0], `query($id: ID!) { run(id: $id) { secretDerived output tasks { nodeId secretDerived output } } }`,
		map[string]any{"id": runs[0]}).Decode(t, &flags)
	assert.True(t, flags.Run.SecretDerived)
	assert.JSONEq(t, `{"hidden":"derived from a secret: reading it needs the secrets:outputs permission"}`, string(flags.Run.Output))
	derived := map[string]bool{}
	for _, tk := range flags.Run.Tasks {
		derived[tk.NodeID] = tk.SecretDerived
	}
	assert.Equal(t, map[string]bool{"before": false, "call": true, "next": true, "kid": true}, derived)
	var child struct {
		Run struct {
			SecretDerived bool
			Input         json.RawMessage
		}
	}
	sys.GraphQL(hidden[0], `query($id: ID!) { run(id: $id) { secretDerived input } }`, map[string]any{"id": runs[2]}).Decode(t, &child)
	assert.True(t, child.Run.SecretDerived, "a child run whose input came from the secret")
	assert.Contains(t, string(child.Run.Input), "hidden")
	var failed struct {
		Run struct {
			Error json.RawMessage
			Tasks []struct{ LastError json.RawMessage }
		}
	}
	sys.GraphQL(hidden[0], `query($id: ID!) { run(id: $id) { error tasks { lastError } } }`, map[string]any{"id": runs[1]}).Decode(t, &failed)
	assert.Contains(t, string(failed.Run.Tasks[0].LastError), `"code":"http_status"`, "a hidden error keeps its code")
	assert.Contains(t, string(failed.Run.Error), `"code":"node_failed"`)
}
