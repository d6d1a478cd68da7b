package workers

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/engine/taskapi"
)

type seen struct {
	method, path, rawQuery, body string
	header                       http.Header
}

// sink records requests and answers with what echo says.
func sink(t *testing.T, status int, echo func(r *http.Request) string) (*httptest.Server, func() seen) {
	var mu sync.Mutex
	var last seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		last = seen{method: r.Method, path: r.URL.EscapedPath(), rawQuery: r.URL.RawQuery, body: string(b), header: r.Header.Clone()}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, echo(r))
	}))
	t.Cleanup(srv.Close)
	return srv, func() seen { mu.Lock(); defer mu.Unlock(); return last }
}

const secretValue = "sk_live_9f8e7d6c5b4a/+ &="

func secretTask(spec *taskapi.HTTPSpec, input string) Task {
	return Task{ID: uuid.New(), Run: uuid.New(), Attempt: 1, Input: json.RawMessage(input), Config: taskapi.TaskConfig{HTTP: spec},
		Secrets: func(context.Context) (map[string]string, error) { return map[string]string{"TOKEN": secretValue}, nil }}
}

func TestTemplatedRequestCarriesInputAndSecrets(t *testing.T) {
	t.Parallel()
	srv, last := sink(t, 200, func(r *http.Request) string {
		// A receiver that echoes the credential back.
		b, _ := json.Marshal(map[string]any{"auth": r.Header.Get("Authorization"), "url": r.URL.String(), secretValue: 1})
		return string(b)
	})
	spec := &taskapi.HTTPSpec{Method: "GET",
		URLParts: []taskapi.Part{{Text: srv.URL + "/orders/42/"}, {Secret: "secrets.TOKEN", Escape: "path"}, {Text: "?fixed=1"}},
		Query:    []taskapi.Param{{Name: "order", Value: "42 & more"}, {Name: "key", Parts: []taskapi.Part{{Secret: "secrets.TOKEN", Escape: ""}}}},
		Headers:  map[string]string{"X-Order": "42"},
		SecretHeaders: map[string][]taskapi.Part{"Authorization": {{Text: "Bearer "}, {Secret: "secrets.TOKEN"}},
			"X-Len": {{Secret: "string(size(secrets.TOKEN))"}}},
		Secrets: []string{"TOKEN"}}
	out, err := loopback(t).Execute(context.Background(), secretTask(spec, `{"order_id": 42}`))
	require.NoError(t, err)
	got := last()
	assert.Equal(t, "GET", got.method)
	assert.Empty(t, got.body, "GET sends no body")
	assert.Equal(t, "/orders/42/sk_live_9f8e7d6c5b4a%2F+%20&=", got.path)
	assert.Equal(t, "fixed=1&order=42+%26+more&key=sk_live_9f8e7d6c5b4a%2F%2B+%26%3D", got.rawQuery)
	assert.Equal(t, "Bearer "+secretValue, got.header.Get("Authorization"))
	assert.Equal(t, "25", got.header.Get("X-Len"))
	assert.Equal(t, "42", got.header.Get("X-Order"))
	assert.NotContains(t, string(out), "sk_live", "an echoed secret is redacted from the output")
	assert.Contains(t, string(out), Redacted)
	assert.True(t, json.Valid(out))
}

func TestMethodsWithoutBodiesSendNone(t *testing.T) {
	t.Parallel()
	srv, last := sink(t, 200, func(*http.Request) string { return `{}` })
	for _, m := range []string{"GET", "HEAD", "DELETE", "OPTIONS"} {
		_, err := loopback(t).Execute(context.Background(), Task{ID: uuid.New(), Input: json.RawMessage(`{"a": 1}`),
			Config: taskapi.TaskConfig{HTTP: &taskapi.HTTPSpec{Method: m, URL: srv.URL + "/x", Query: []taskapi.Param{{Name: "a", Value: "1"}}}}})
		require.NoError(t, err, m)
		got := last()
		assert.Empty(t, got.body, m)
		assert.Empty(t, got.header.Get("Content-Type"), m)
		assert.Equal(t, "a=1", got.rawQuery, m)
	}
	_, err := loopback(t).Execute(context.Background(), Task{ID: uuid.New(), Input: json.RawMessage(`{"a": 1}`),
		Config: taskapi.TaskConfig{HTTP: &taskapi.HTTPSpec{Method: "POST", URL: srv.URL + "/x"}}})
	require.NoError(t, err)
	assert.JSONEq(t, `{"a": 1}`, last().body, "POST sends the input")
}

func TestSecretsNeverReachFailures(t *testing.T) {
	t.Parallel()
	srv, _ := sink(t, 401, func(r *http.Request) string { return `{"error": "bad key ` + r.Header.Get("X-Key") + `"}` })
	spec := &taskapi.HTTPSpec{Method: "POST", URLParts: []taskapi.Part{{Text: srv.URL + "/t/"}, {Secret: "secrets.TOKEN", Escape: "path"}},
		SecretHeaders: map[string][]taskapi.Part{"X-Key": {{Secret: "secrets.TOKEN"}}}, Secrets: []string{"TOKEN"}}
	_, err := loopback(t).Execute(context.Background(), secretTask(spec, `{}`))
	var f *Failure
	require.ErrorAs(t, err, &f)
	assert.Equal(t, "http_status", f.Code)
	assert.NotContains(t, f.Message, "sk_live", "the url in the message")
	assert.NotContains(t, string(f.Details), "sk_live", "the echoed body in the details")
	assert.Contains(t, f.Message, Redacted)

	// Unreachable: the dial error's message.
	spec.URLParts[0].Text = "http://127.0.0.1:1/t/"
	_, err = loopback(t).Execute(context.Background(), secretTask(spec, `{}`))
	require.ErrorAs(t, err, &f)
	assert.NotContains(t, f.Error(), "sk_live")

	// A header rendered from a secret with a line break is refused without
	// repeating it.
	task := secretTask(&taskapi.HTTPSpec{Method: "GET", URL: srv.URL, Secrets: []string{"TOKEN"},
		SecretHeaders: map[string][]taskapi.Part{"A": {{Secret: "secrets.TOKEN"}}}}, `{}`)
	task.Secrets = func(context.Context) (map[string]string, error) {
		return map[string]string{"TOKEN": "x\r\nEvil: sk_live_1"}, nil
	}
	_, err = loopback(t).Execute(context.Background(), task)
	require.ErrorAs(t, err, &f)
	assert.Equal(t, "bad_template", f.Code)
	assert.NotContains(t, f.Error(), "sk_live")
}

func TestSecretReadFailures(t *testing.T) {
	t.Parallel()
	spec := &taskapi.HTTPSpec{Method: "GET", URL: "http://127.0.0.1:1/", Secrets: []string{"GONE"}}
	cases := []struct {
		err       error
		code      string
		retryable bool
	}{
		{&taskapi.APIError{Status: 400, Code: "BAD_USER_INPUT", Message: "secrets.GONE does not exist"}, "secret_not_found", false},
		{&taskapi.APIError{Status: 404, Code: "NOT_FOUND"}, "lease_lost", true},
		{errors.New("connection refused"), "secrets_unavailable", true},
	}
	for _, c := range cases {
		task := secretTask(spec, `{}`)
		task.Secrets = func(context.Context) (map[string]string, error) { return nil, c.err }
		_, err := loopback(t).Execute(context.Background(), task)
		var f *Failure
		require.ErrorAs(t, err, &f)
		assert.Equal(t, c.code, f.Code)
		assert.Equal(t, c.retryable, f.Retryable)
	}
	task := secretTask(spec, `{}`)
	task.Secrets = nil
	_, err := loopback(t).Execute(context.Background(), task)
	require.ErrorContains(t, err, "cannot read secrets")
}

func TestRedactorKeepsJSON(t *testing.T) {
	r := newRedactor(map[string]string{"A": `p"q\r`})
	enc, _ := json.Marshal(map[string]any{"x": `before p"q\r after`, `p"q\r`: []any{json.Number("1")}})
	out := r.json(enc)
	require.True(t, json.Valid(out))
	assert.NotContains(t, string(out), `p\"q`)
	assert.Equal(t, 2, strings.Count(string(out), Redacted))
	assert.Equal(t, json.RawMessage(`{"n":1}`), r.json(json.RawMessage(`{"n":1}`)), "untouched without a secret")
}
