package dag

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSecretDerivedNodesAreTheSecretReadersAndWhatFollowsThem(t *testing.T) {
	wf := MustParse(`{"nodes": [
	  {"id": "before", "type": "noop"},
	  {"id": "call", "type": "http", "depends_on": ["before"], "http": {"method": "GET", "url": "https://api.example.com/",
	    "headers": {"Authorization": "Bearer {{ secrets.TOKEN }}"}}},
	  {"id": "plain", "type": "http", "depends_on": ["before"], "http": {"method": "GET", "url": "https://api.example.com/{{ input.id }}"}},
	  {"id": "next", "type": "task", "depends_on": ["call"], "task": {"handler": "h"}},
	  {"id": "later", "type": "noop", "depends_on": ["next", "plain"]},
	  {"id": "fan", "type": "map", "depends_on": ["before"], "map": {"items": "input.list", "step": {"type": "http", "http": {"method": "GET",
	    "url": "https://api.example.com/{{ item }}", "headers": {"X-Api-Key": "{{ secrets.KEY }}"}}}}},
	  {"id": "side", "type": "noop", "depends_on": ["plain"]}
	]}`)
	for id, want := range map[string]bool{"before": false, "call": true, "plain": false, "next": true, "later": true, "fan": true,
		"fan[3]": true, "side": false, "nope": false, "plain[1]": false} {
		assert.Equal(t, want, wf.SecretDerived(id), id)
	}
	assert.True(t, wf.ReadsSecrets())
	assert.False(t, MustParse(`{"nodes": [{"id": "a", "type": "noop"}]}`).ReadsSecrets())
}

func TestCredentialNames(t *testing.T) {
	for _, name := range []string{"Authorization", "proxy-authorization", "Cookie", "X-Api-Key", "x-goog-api-key", "X-Auth-Token", "access_token",
		"Ocp-Apim-Subscription-Key", "X-Client-Secret", "password", "X-Session-Id", "X-Hub-Signature-256", "key", "sig", "AWS-Access-Key-Id"} {
		assert.True(t, CredentialName(name), name)
	}
	for _, name := range []string{"Accept", "Content-Type", "Idempotency-Key", "X-Request-Id", "User-Agent", "limit", "cursor", "keyword"} {
		assert.False(t, CredentialName(name), name)
	}
}

func TestLiteralCredentialsAreRefusedWhenPublished(t *testing.T) {
	step := func(http string) string {
		return `{"nodes": [{"id": "call", "type": "http", "http": {"method": "GET", ` + http + `}}]}`
	}
	for def, want := range map[string][]string{
		step(`"url": "https://a.example/", "headers": {"Authorization": "Bearer sk_live_123"}`):          {"http.headers.Authorization"},
		step(`"url": "https://a.example/", "headers": {"X-Api-Key": "{{ 'sk_live_' + '123' }}"}`):        {"http.headers.X-Api-Key"},
		step(`"url": "https://a.example/", "query": {"api_key": "sk_live_123", "limit": "10"}`):          {"http.query.api_key"},
		step(`"url": "https://a.example/v1?limit=5&access_token=abc&q={{ input.q }}"`):                   {"http.url"},
		step(`"url": "https://a.example/", "headers": {"Cookie": "s=1", "Authorization": "Basic eDp5"}`): {"http.headers.Authorization", "http.headers.Cookie"},
		`{"nodes": [{"id": "fan", "type": "map", "map": {"items": "input.list", "step": {"type": "http", "http": {"method": "GET",
		  "url": "https://a.example/{{ item }}", "headers": {"X-Auth-Token": "t0k3n"}}}}}]}`: {"map.step.http.headers.X-Auth-Token"},
		// Taken from a secret, from the run, or blank: nothing is stored.
		step(`"url": "https://a.example/", "headers": {"Authorization": "Bearer {{ secrets.TOKEN }}", "Accept": "application/json"}`): nil,
		`{"nodes": [{"id": "login", "type": "noop"}, {"id": "call", "type": "http", "depends_on": ["login"], "http": {"method": "GET",
		  "url": "https://a.example/", "headers": {"Authorization": "Bearer {{ nodes.login.output.token }}"}}}]}`: nil,
		step(`"url": "https://a.example/", "headers": {"Authorization": "Bearer {{ input.token }}", "Idempotency-Key": "fixed"}`): nil,
		step(`"url": "https://a.example/v1?access_token={{ secrets.T }}&key=", "query": {"token": ""}`):                           nil,
	} {
		_, err := ParseForPublish([]byte(def))
		if want == nil {
			assert.NoError(t, err, def)
			continue
		}
		var ve *ValidationError
		require.True(t, errors.As(err, &ve), "%s: %v", def, err)
		var fields []string
		for _, p := range ve.Problems {
			fields = append(fields, p.Field)
		}
		assert.Equal(t, want, fields, def)
		assert.Contains(t, ve.Problems[0].Message, "{{ secrets.NAME }}", def)
	}
	// A stored version that holds one still parses (its runs go on), and says what it holds.
	stored := step(`"url": "https://a.example/?sig=abc", "headers": {"Authorization": "Bearer sk_live_123"}`)
	wf, err := Parse([]byte(stored))
	require.NoError(t, err)
	assert.Equal(t, []string{"call http.headers.Authorization", "call http.url"}, wf.LiteralCredentials())
}
