package dag

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const templated = `{"nodes": [
  {"id": "first", "type": "noop"},
  {"id": "get", "type": "http", "depends_on": ["first"], "http": {
    "method": "GET",
    "url": "https://api.example.com/orders/{{ input.order_id }}/items?token={{ secrets.TOKEN }}&q={{ input.q }}",
    "query": {"cursor": "{{ nodes.first.output.cursor }}", "limit": "{{ input.limit }}", "gone": "{{ input.missing_or_null }}", "static": "x y"},
    "headers": {"Authorization": "Bearer {{ secrets.TOKEN }}", "X-Basic": "{{ base64.encode(bytes(secrets.USER + ':' + secrets[\"PASS\"])) }}",
                "X-Order": "order {{ input.order_id }}", "Accept": "application/json"}}}
]}`

func TestTemplatesRenderInputNodesAndKeepSecrets(t *testing.T) {
	w, err := Parse([]byte(templated))
	require.NoError(t, err)
	n := w.Node("get")
	assert.True(t, n.Templated())
	assert.Equal(t, []string{"PASS", "TOKEN", "USER"}, n.SecretNames())
	r, err := n.EvalRequest(Scope{Input: json.RawMessage(`{"order_id": "a/b c", "q": "x&y=1", "limit": 50, "missing_or_null": null}`),
		Nodes: map[string]NodeResult{"first": {Status: "completed", Output: json.RawMessage(`{"cursor": "c?1"}`)}}})
	require.NoError(t, err)
	// Input lands escaped for its place: one path segment, one query value.
	assert.Equal(t, []Part{{Text: "https://api.example.com/orders/a%2Fb%20c/items?token="}, {Secret: "secrets.TOKEN", Escape: EscapeQuery},
		{Text: "&q=x%26y%3D1"}}, r.URL.Parts)
	assert.Equal(t, []Param{{Name: "cursor", Value: Value{Text: "c?1"}}, {Name: "limit", Value: Value{Text: "50"}},
		{Name: "static", Value: Value{Text: "x y"}}}, r.Query, "a null value leaves its parameter out; query values are escaped when sent")
	assert.Equal(t, Value{Parts: []Part{{Text: "Bearer "}, {Secret: "secrets.TOKEN"}}}, r.Headers["Authorization"])
	assert.Equal(t, Value{Text: "order a/b c"}, r.Headers["X-Order"])
	assert.Equal(t, Value{Text: "application/json"}, r.Headers["Accept"])
	assert.Equal(t, []string{"PASS", "TOKEN", "USER"}, r.Secrets)

	// The executor's half: expressions over secrets alone.
	v, err := EvalSecretPart(r.Headers["X-Basic"].Parts[0], map[string]string{"USER": "u", "PASS": "p"})
	require.NoError(t, err)
	assert.Equal(t, "dTpw", v)
	v, err = EvalSecretPart(Part{Secret: "secrets.TOKEN", Escape: EscapeQuery}, map[string]string{"TOKEN": "a b&c"})
	require.NoError(t, err)
	assert.Equal(t, "a+b%26c", v)
	_, err = EvalSecretPart(Part{Secret: "secrets.TOKEN"}, map[string]string{"OTHER": "sekrit-value"})
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "sekrit-value")
}

func TestInputCannotLeaveItsPathSegment(t *testing.T) {
	n := MustParse(`{"nodes": [{"id": "a", "type": "http", "http": {"url": "https://x.example/v1/users/{{ input.id }}/orders?x={{ input.id }}"}}]}`).Node("a")
	for in, want := range map[string]string{
		"..":            "https://x.example/v1/users/%2E%2E/orders?x=..",
		".":             "https://x.example/v1/users/%2E/orders?x=.",
		"../../admin":   "https://x.example/v1/users/..%2F..%2Fadmin/orders?x=..%2F..%2Fadmin",
		"1?admin=true#": "https://x.example/v1/users/1%3Fadmin=true%23/orders?x=1%3Fadmin%3Dtrue%23",
		"a.json":        "https://x.example/v1/users/a.json/orders?x=a.json",
	} {
		b, _ := json.Marshal(map[string]string{"id": in})
		r, err := n.EvalRequest(Scope{Input: b})
		require.NoError(t, err)
		assert.Equal(t, want, r.URL.Text, in)
	}
}

func TestUntemplatedRequestsStayAsWritten(t *testing.T) {
	w := MustParse(`{"nodes": [{"id": "a", "type": "http", "http": {"method": "DELETE", "url": "https://x.example/a?b=1",
		"query": {"c": "2"}, "headers": {"K": "v"}}}]}`)
	n := w.Node("a")
	assert.False(t, n.Templated(), "literal text only: every task sends the same request")
	r, err := n.EvalRequest(Scope{})
	require.NoError(t, err)
	assert.Equal(t, "https://x.example/a?b=1", r.URL.Text)
	assert.Equal(t, []Param{{Name: "c", Value: Value{Text: "2"}}}, r.Query)
	assert.Empty(t, r.Secrets)
}

func TestTemplateErrorsNameTheField(t *testing.T) {
	w := MustParse(`{"nodes": [{"id": "a", "type": "http", "http": {"url": "https://x.example/{{ input.o }}",
		"headers": {"H": "{{ input.h }}"}, "query": {"q": "{{ input.q }}"}}}]}`)
	_, err := w.Node("a").EvalRequest(Scope{Input: json.RawMessage(`{"o": [1], "h": "x", "q": 1}`)})
	require.ErrorContains(t, err, "http.url: {{ input.o }}: evaluated to list")
	_, err = w.Node("a").EvalRequest(Scope{Input: json.RawMessage(`{"o": 1, "h": "a\nb", "q": 1}`)})
	require.ErrorContains(t, err, "http.headers.H: the value holds a line break")
	_, err = w.Node("a").EvalRequest(Scope{Input: json.RawMessage(`{"o": 1, "h": "x"}`)})
	require.ErrorContains(t, err, "http.query.q:")
}

func TestBadTemplatesAreProblemsNamingNodeAndField(t *testing.T) {
	cases := []struct {
		http  string
		field string
		msg   string
	}{
		{`"url": "https://{{ input.host }}/x"`, "http.url", "only in its path and query"},
		{`"url": "https://x.example:{{ input.port }}/x"`, "http.url", "absolute http or https URL"},
		{`"url": "https://x.example/{{ input.a "`, "http.url", `"{{" without "}}"`},
		{`"url": "https://x.example/ }}"`, "http.url", `"}}" without "{{"`},
		{`"url": "https://x.example/{{ }}"`, "http.url", "expression is empty"},
		{`"url": "https://x.example/{{ input.a + }}"`, "http.url", "does not compile"},
		{`"url": "https://x.example/", "headers": {"A": "{{ secrets.T + input.x }}"}`, "http.headers.A", "may read nothing else"},
		{`"url": "https://x.example/", "headers": {"A": "{{ secrets[input.name] }}"}`, "http.headers.A", "may read nothing else"},
		{`"url": "https://x.example/", "headers": {"A": "{{ string(secrets) }}"}`, "http.headers.A", ""},
		{`"url": "https://x.example/", "headers": {"A": "{{ secrets.size() > 0 ? 'a' : 'b' }}"}`, "http.headers.A", "other than by name"},
		{`"url": "https://x.example/", "query": {"q": "{{ nodes.nope.output }}"}`, "http.query.q", "does not exist"},
		{`"url": "https://x.example/", "query": {"": "x"}`, "http.query", "invalid parameter name"},
		{`"url": "https://x.example/", "query": {"q": "{{ secrets.T }}"}, "headers": {"B": "{{ secrets['not a name'] }}"}`, "http.headers.B", "a secret name is"},
	}
	for _, c := range cases {
		_, err := Parse([]byte(`{"nodes": [{"id": "n", "type": "http", "http": {` + c.http + `}}]}`))
		var ve *ValidationError
		require.True(t, errors.As(err, &ve), "%s: %v", c.http, err)
		require.Len(t, ve.Problems, 1, c.http)
		p := ve.Problems[0]
		assert.Equal(t, "n", p.Node, c.http)
		assert.Equal(t, c.field, p.Field, c.http)
		assert.Contains(t, p.Message, c.msg, c.http)
	}
}

func TestSecretNames(t *testing.T) {
	for _, ok := range []string{"A", "_x", "STRIPE_KEY_2", "a234567890123456789012345678901234567890123456789012345678901234"} {
		assert.True(t, ValidSecretName(ok), ok)
	}
	for _, bad := range []string{"", "1A", "a-b", "a.b", "a b", "a2345678901234567890123456789012345678901234567890123456789012345"} {
		assert.False(t, ValidSecretName(bad), bad)
	}
}
