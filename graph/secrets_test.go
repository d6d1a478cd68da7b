package graph_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
)

// TestSecretsOverGraphQL: owners, admins and secrets:manage keys manage
// secrets; developers, viewers and keys of any other scope are FORBIDDEN;
// nothing answers a value, not even an error about it.
func TestSecretsOverGraphQL(t *testing.T) {
	t.Parallel()
	sys, a, _ := twoTenants(t)
	admin := sys.Token(a.id, "admin@a", auth.RoleAdmin)
	manager := sys.APIKey(auth.ScopeSecretsManage)
	allScopesButOne := sys.APIKey(auth.ScopeRunsRead, auth.ScopeRunsWrite, auth.ScopeWorkflowsRead, auth.ScopeWorkflowsWrite,
		auth.ScopeKeysManage, auth.ScopeMembersManage, auth.ScopeWebhooksManage, auth.ScopeBillingRead, auth.ScopeEventsWrite)
	const value = "sk_test_51Hxyz-never-shown"

	ops := map[string]string{
		"createSecret": `mutation { createSecret(name: "STRIPE", value: "` + value + `") { name version } }`,
		"updateSecret": `mutation { updateSecret(name: "STRIPE", value: "` + value + `2") { version } }`,
		"deleteSecret": `mutation { deleteSecret(name: "STRIPE") }`,
		"secrets":      `{ secrets { name } }`,
		"secret":       `{ secret(name: "STRIPE") { name } }`,
		"secretAudit":  `{ secretAudit { id } }`,
	}
	for _, who := range []struct{ name, cred string }{{"a developer", a.developer}, {"a viewer", a.viewer}, {"a key without secrets:manage", allScopesButOne}} {
		for op, q := range ops {
			res := sys.GraphQL(who.cred, q, nil)
			assert.Equal(t, []string{"FORBIDDEN"}, res.Codes(), "%s may not %s", who.name, op)
		}
	}
	res := sys.GraphQL(a.owner, ops["createSecret"], nil)
	require.Empty(t, res.Errors)
	assert.JSONEq(t, `{"createSecret": {"name": "STRIPE", "version": 1}}`, string(res.Data))
	res = sys.GraphQL(admin, ops["updateSecret"], nil)
	require.Empty(t, res.Errors)
	assert.JSONEq(t, `{"updateSecret": {"version": 2}}`, string(res.Data))
	res = sys.GraphQL(manager, `mutation($v: String!) { updateSecret(name: "STRIPE", value: $v) { name version versions { version createdBy }
		createdBy createdAt updatedAt } }`, map[string]any{"v": value + "3"})
	require.Empty(t, res.Errors)
	assert.Contains(t, string(res.Data), `"version":3`)
	assert.Contains(t, string(res.Data), `"createdBy":"user:owner@`+a.id.String()+`"`)
	res = sys.GraphQL(a.owner, ops["createSecret"], nil)
	assert.Equal(t, []string{"CONFLICT"}, res.Codes())
	res = sys.GraphQL(a.owner, `{ secret(name: "NOPE") { name } }`, nil)
	assert.Equal(t, []string{"NOT_FOUND"}, res.Codes())

	// Bounds answer BAD_USER_INPUT naming the field, without the value.
	long := strings.Repeat("v", 16<<10+1)
	for _, c := range []struct{ name, value, field string }{{"9LIVES", "x", "name"}, {"OK", long, "value"}, {"OK", "", "value"}} {
		res := sys.GraphQL(a.owner, `mutation($n: SecretName!, $v: String!) { createSecret(name: $n, value: $v) { name } }`,
			map[string]any{"n": c.name, "v": c.value})
		require.Equal(t, []string{"BAD_USER_INPUT"}, res.Codes(), c.field)
		assert.Contains(t, res.Errors[0].Message, c.field)
		if c.value != "" {
			assert.NotContains(t, res.Errors[0].Message, "vvvv")
		}
	}

	var audit struct {
		SecretAudit []struct {
			Action, SecretName, Principal string
			Version                       int
		}
	}
	sys.GraphQL(a.owner, `{ secretAudit(name: "STRIPE") { action secretName principal version } }`, nil).Decode(t, &audit)
	require.Len(t, audit.SecretAudit, 3)
	assert.Equal(t, "UPDATE", audit.SecretAudit[0].Action)
	assert.True(t, strings.HasPrefix(audit.SecretAudit[0].Principal, "api_key:"), audit.SecretAudit[0].Principal)
	assert.Equal(t, "user:admin@a", audit.SecretAudit[1].Principal)
	assert.Equal(t, "CREATE", audit.SecretAudit[2].Action)

	res = sys.GraphQL(manager, ops["deleteSecret"], nil)
	require.Empty(t, res.Errors)
	assert.JSONEq(t, `{"deleteSecret": "STRIPE"}`, string(res.Data))
	res = sys.GraphQL(a.owner, `{ secrets { name } secretAudit(first: 1) { action version } }`, nil)
	require.Empty(t, res.Errors)
	assert.Contains(t, string(res.Data), `"secretAudit":[{"action":"DELETE","version":3}]`)

	// No type of the schema can carry a secret's value back.
	schema, err := os.ReadFile("secrets.graphqls")
	require.NoError(t, err)
	typ := string(schema)[strings.Index(string(schema), "type Secret {"):]
	typ = typ[:strings.Index(typ, "}")]
	assert.NotContains(t, typ, "value")
}
