package workers

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/engine/taskapi"
	"github.com/composer-dev/composer/internal/ssrf"
)

func loopback(t *testing.T) *HTTP {
	p, err := ssrf.NewPolicy([]string{"127.0.0.0/8", "::1/128"})
	require.NoError(t, err)
	return NewHTTP(p)
}

func httpTask(method, url string, input string) Task {
	return Task{ID: uuid.New(), Run: uuid.New(), Attempt: 3, Input: json.RawMessage(input),
		Config: taskapi.TaskConfig{HTTP: &taskapi.HTTPSpec{Method: method, URL: url}}}
}

func TestHTTPStatusMapping(t *testing.T) {
	t.Parallel()
	cases := []struct {
		status     int
		header     map[string]string
		body       string
		retryable  bool
		ok         bool
		retryAfter time.Duration
	}{
		{status: 200, body: `{"a":1}`, ok: true},
		{status: 201, body: `plain text`, ok: true},
		{status: 204, ok: true},
		{status: 400, body: `{"error":"bad"}`},
		{status: 401},
		{status: 404},
		{status: 409},
		{status: 422},
		{status: 408, retryable: true},
		{status: 429, header: map[string]string{"Retry-After": "7"}, retryable: true, retryAfter: 7 * time.Second},
		{status: 500, retryable: true},
		{status: 502, retryable: true},
		{status: 503, header: map[string]string{"Retry-After": "120"}, retryable: true, retryAfter: 2 * time.Minute},
	}
	for _, c := range cases {
		t.Run(http.StatusText(c.status), func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				for k, v := range c.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(c.status)
				_, _ = io.WriteString(w, c.body)
			}))
			defer srv.Close()
			out, err := loopback(t).Execute(context.Background(), httpTask("GET", srv.URL, `{}`))
			if c.ok {
				require.NoError(t, err)
				var o httpOutput
				require.NoError(t, json.Unmarshal(out, &o))
				assert.Equal(t, c.status, o.Status)
				return
			}
			var f *Failure
			require.ErrorAs(t, err, &f)
			assert.Equal(t, "http_status", f.Code)
			assert.Equal(t, c.retryable, f.Retryable)
			assert.Equal(t, c.retryAfter, f.RetryAfter)
			assert.Contains(t, f.Message, "answered")
		})
	}
}

func TestHTTPOutputKeepsJSONOrText(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/json" {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Set-Cookie", "secret=1")
			_, _ = io.WriteString(w, `{"n": 1}`)
			return
		}
		_, _ = io.WriteString(w, "hello")
	}))
	defer srv.Close()
	out, err := loopback(t).Execute(context.Background(), httpTask("GET", srv.URL+"/json", ``))
	require.NoError(t, err)
	assert.JSONEq(t, `{"status":200,"headers":{"Content-Type":"application/json"},"body":{"n":1}}`, string(out), "only a safe subset of headers is kept")
	out, err = loopback(t).Execute(context.Background(), httpTask("GET", srv.URL+"/text", ``))
	require.NoError(t, err)
	assert.Contains(t, string(out), `"body":"hello"`)
}

func TestHTTPSendsIdempotencyKeyAttemptAndInputBody(t *testing.T) {
	t.Parallel()
	var got *http.Request
	var body string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got, body = r, string(b)
	}))
	defer srv.Close()
	task := httpTask("POST", srv.URL, `{"amount": 5}`)
	_, err := loopback(t).Execute(context.Background(), task)
	require.NoError(t, err)
	assert.Equal(t, task.ID.String(), got.Header.Get("Idempotency-Key"))
	assert.Equal(t, "3", got.Header.Get("Composer-Attempt"))
	assert.Equal(t, "application/json", got.Header.Get("Content-Type"))
	assert.JSONEq(t, `{"amount": 5}`, body, "without a body of its own, POST sends the input")

	task = httpTask("GET", srv.URL, `{"amount": 5}`)
	task.Config.HTTP.Headers = map[string]string{"Idempotency-Key": "mine", "X-Api-Key": "k"}
	_, err = loopback(t).Execute(context.Background(), task)
	require.NoError(t, err)
	assert.Equal(t, "mine", got.Header.Get("Idempotency-Key"), "a key set in the definition wins")
	assert.Equal(t, "k", got.Header.Get("X-Api-Key"))
	assert.Empty(t, body, "GET sends no body")
}

func TestHTTPBodyCapTimeoutAndNetworkErrors(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			_, _ = io.WriteString(w, strings.Repeat("x", MaxResponseBytes+10))
		case "/slow":
			time.Sleep(500 * time.Millisecond)
		}
	}))
	defer srv.Close()
	_, err := loopback(t).Execute(context.Background(), httpTask("GET", srv.URL+"/big", ``))
	var f *Failure
	require.ErrorAs(t, err, &f)
	assert.Equal(t, "response_too_large", f.Code)
	assert.False(t, f.Retryable)

	slow := httpTask("GET", srv.URL+"/slow", ``)
	slow.Config.HTTP.TimeoutMS = 50
	_, err = loopback(t).Execute(context.Background(), slow)
	require.ErrorAs(t, err, &f)
	assert.Equal(t, "http_timeout", f.Code)
	assert.True(t, f.Retryable)

	closed := httptest.NewServer(http.NotFoundHandler())
	url := closed.URL
	closed.Close()
	_, err = loopback(t).Execute(context.Background(), httpTask("GET", url, ``))
	require.ErrorAs(t, err, &f)
	assert.Equal(t, "http_network", f.Code)
	assert.True(t, f.Retryable, "a refused connection may succeed later")
}

func TestHTTPRefusesPrivateAddressesWithoutConnecting(t *testing.T) {
	t.Parallel()
	var hits int
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits++ }))
	defer srv.Close()
	strict, err := ssrf.NewPolicy(nil)
	require.NoError(t, err)
	_, err = NewHTTP(strict).Execute(context.Background(), httpTask("GET", srv.URL, ``))
	var f *Failure
	require.ErrorAs(t, err, &f)
	assert.Equal(t, "http_unreachable", f.Code, "the same code as a name that does not resolve")
	assert.NotContains(t, f.Message, "loopback", "nothing of the network")
	assert.Zero(t, hits)
}

func TestRetryAfterParsing(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	assert.Equal(t, 30*time.Second, retryAfter("30", now))
	assert.Equal(t, time.Minute, retryAfter(now.Add(time.Minute).Format(http.TimeFormat), now))
	assert.Zero(t, retryAfter("soon", now))
	assert.Zero(t, retryAfter(now.Add(-time.Minute).Format(http.TimeFormat), now))
	assert.Equal(t, 24*time.Hour, retryAfter("999999", now), "capped")
}

func TestFailures(t *testing.T) {
	assert.Equal(t, "task_error", asFailure(errors.New("x")).Code)
	assert.True(t, asFailure(errors.New("x")).Retryable)
	assert.False(t, asFailure(Permanent("bad", "no")).Retryable)
}
