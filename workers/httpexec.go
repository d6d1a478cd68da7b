package workers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/composer-dev/composer/engine/dag"
	"github.com/composer-dev/composer/engine/taskapi"
	"github.com/composer-dev/composer/internal/ssrf"
)

// MaxResponseBytes caps an HTTP step's response body.
const MaxResponseBytes = 1 << 20

// DefaultHTTPTimeout bounds an HTTP step without a timeout of its own.
const DefaultHTTPTimeout = 30 * time.Second

// keptHeaders are the response headers an HTTP step's output keeps.
var keptHeaders = []string{"Content-Type", "Location", "ETag", "Last-Modified", "Retry-After", "X-Request-Id"}

// HTTP runs http nodes. Every request goes through the SSRF-safe client,
// carries the task id as Idempotency-Key (stable across every attempt and
// redelivery, so receivers that honour it apply the effect once) and the
// attempt number.
type HTTP struct {
	client *http.Client
	// Log hears what a failure's tenant-facing reason leaves out (resolved
	// addresses, resolvers); nil logs nothing.
	Log *zap.Logger
}

// NewHTTP returns the http executor using policy for every connection.
func NewHTTP(policy *ssrf.Policy) *HTTP {
	return &HTTP{client: policy.Client(0)}
}

type httpOutput struct {
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    any               `json:"body"`
}

// Execute performs the request. 2xx completes; 4xx fails for good except
// 408 and 429; 5xx and network errors are retryable; Retry-After is passed
// on to the retry policy. A request that reads secrets gets their current
// values for this attempt's lease, and every value it rendered from them
// is redacted from the output and the failure.
func (h *HTTP) Execute(ctx context.Context, t Task) (json.RawMessage, error) {
	spec := t.Config.HTTP
	if spec == nil {
		return nil, Permanent("bad_config", "http node without a request")
	}
	var values map[string]string
	if len(spec.Secrets) > 0 {
		if t.Secrets == nil {
			return nil, Permanent("secrets_unavailable", "this worker cannot read secrets")
		}
		v, err := t.Secrets(ctx)
		if err != nil {
			return nil, secretsFailure(err)
		}
		values = v
	}
	red := newRedactor(values)
	out, err := h.execute(ctx, t, spec, values, red)
	if err != nil {
		return nil, red.failure(err)
	}
	return red.json(out), nil
}

// secretsFailure is a failed read of the task's secrets.
func secretsFailure(err error) *Failure {
	var apiErr *taskapi.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.Code {
		case "BAD_USER_INPUT":
			return Permanent("secret_not_found", "%s", apiErr.Message)
		case "NOT_FOUND":
			return Retryable("lease_lost", "the task's lease ended before its secrets were read")
		}
	}
	return Retryable("secrets_unavailable", "the task's secrets could not be read")
}

func (h *HTTP) execute(ctx context.Context, t Task, spec *taskapi.HTTPSpec, values map[string]string, red *redactor) (json.RawMessage, error) {
	timeout := DefaultHTTPTimeout
	if spec.TimeoutMS > 0 {
		timeout = time.Duration(spec.TimeoutMS) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	target, err := requestURL(spec, values, red)
	if err != nil {
		return nil, err
	}
	var body io.Reader
	hasBody := false
	switch {
	case len(spec.Body) > 0:
		body, hasBody = bytes.NewReader(spec.Body), true
	case spec.Method == http.MethodPost || spec.Method == http.MethodPut || spec.Method == http.MethodPatch:
		in := t.Input
		if len(in) == 0 {
			in = json.RawMessage(`{}`)
		}
		body, hasBody = bytes.NewReader(in), true
	}
	req, err := http.NewRequestWithContext(ctx, spec.Method, "http://placeholder/", body)
	if err != nil {
		return nil, Permanent("bad_request", "cannot build the request")
	}
	req.URL, req.Host = target, ""
	for k, v := range spec.Headers {
		req.Header.Set(k, v)
	}
	for k, parts := range spec.SecretHeaders {
		v, err := renderParts(parts, values, red)
		if err != nil {
			return nil, Permanent("bad_template", "http.headers.%s: %v", k, err)
		}
		if strings.ContainsAny(v, "\r\n\x00") {
			return nil, Permanent("bad_template", "http.headers.%s: the value rendered from secrets holds a line break or NUL", k)
		}
		req.Header.Set(k, v)
	}
	if hasBody && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if req.Header.Get("Idempotency-Key") == "" {
		req.Header.Set("Idempotency-Key", t.ID.String())
	}
	req.Header.Set("Composer-Attempt", strconv.Itoa(t.Attempt))
	req.Header.Set("Composer-Run-Id", t.Run.String())
	req.Header.Set("User-Agent", "Composer/1")

	resp, err := h.client.Do(req)
	if err != nil {
		return nil, h.requestFailure(ctx, req.URL.Hostname(), err, red)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponseBytes+1))
	if err != nil {
		return nil, Retryable("http_read", "reading the response: %v", err)
	}
	if len(data) > MaxResponseBytes {
		return nil, Permanent("response_too_large", "the response body exceeds %d bytes", MaxResponseBytes)
	}
	out := httpOutput{Status: resp.StatusCode, Headers: map[string]string{}, Body: decodeBody(resp.Header.Get("Content-Type"), data)}
	for _, k := range keptHeaders {
		if v := resp.Header.Get(k); v != "" {
			out.Headers[k] = v
		}
	}
	if resp.StatusCode/100 == 2 {
		b, err := json.Marshal(out)
		if err != nil {
			return nil, Permanent("bad_response", "cannot record the response: %v", err)
		}
		return b, nil
	}
	details, _ := json.Marshal(httpOutput{Status: out.Status, Headers: out.Headers, Body: truncate(data, 1024)})
	f := &Failure{Code: "http_status", Message: fmt.Sprintf("%s %s answered %s", spec.Method, redactURL(target), resp.Status), Details: details}
	switch {
	case resp.StatusCode == http.StatusRequestTimeout || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		f.Retryable = true
		f.RetryAfter = retryAfter(resp.Header.Get("Retry-After"), time.Now())
	}
	return nil, f
}

// requestURL is the request's URL: the rendered one (or its parts over
// secrets), with the query parameters added. Errors never repeat it.
func requestURL(spec *taskapi.HTTPSpec, values map[string]string, red *redactor) (*url.URL, error) {
	raw := spec.URL
	if spec.URLParts != nil {
		var err error
		if raw, err = renderParts(spec.URLParts, values, red); err != nil {
			return nil, Permanent("bad_template", "http.url: %v", err)
		}
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		return nil, Permanent("bad_request", "the rendered url is not an absolute http or https URL without credentials")
	}
	if len(spec.Query) == 0 {
		return u, nil
	}
	q := make([]string, 0, len(spec.Query)+1)
	if u.RawQuery != "" {
		q = append(q, u.RawQuery)
	}
	for _, p := range spec.Query {
		v := p.Value
		if p.Parts != nil {
			if v, err = renderParts(p.Parts, values, red); err != nil {
				return nil, Permanent("bad_template", "http.query.%s: %v", p.Name, err)
			}
		}
		q = append(q, url.QueryEscape(p.Name)+"="+url.QueryEscape(v))
	}
	u.RawQuery = strings.Join(q, "&")
	return u, nil
}

// renderParts writes parts over secrets; every value an expression
// rendered is added to the redactor before it is used.
func renderParts(parts []taskapi.Part, values map[string]string, red *redactor) (string, error) {
	var b strings.Builder
	for _, p := range parts {
		if p.Secret == "" {
			b.WriteString(p.Text)
			continue
		}
		v, err := dag.EvalSecretPart(dag.Part{Secret: p.Secret, Escape: p.Escape}, values)
		if err != nil {
			return "", err
		}
		red.add(v)
		b.WriteString(v)
	}
	return b.String(), nil
}

// requestFailure is what the tenant reads of a request that got no
// response: never our network's details (a resolved internal address,
// the resolver, whether a name exists), which go to the log.
func (h *HTTP) requestFailure(ctx context.Context, host string, err error, red *redactor) *Failure {
	inner := unwrapURLError(err)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return Retryable("http_timeout", "the request timed out")
	}
	reason, known := ssrf.Describe(host, inner)
	if known && h.Log != nil {
		h.Log.Info("http step could not reach its host", zap.String("host", host), zap.String("error", red.text(inner.Error())))
	}
	switch {
	case ssrf.Unreachable(inner):
		// A refused address and a name that does not resolve get the same
		// code, and both may be retried (a resolver can fail for a moment):
		// otherwise the attempts a run spends would tell them apart.
		return Retryable("http_unreachable", "%s", reason)
	case known:
		return Retryable("http_network", "%s", reason)
	}
	return Retryable("http_network", "%v", inner)
}

func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// decodeBody keeps a JSON body as JSON and anything else as text.
func decodeBody(contentType string, data []byte) any {
	if len(data) == 0 {
		return nil
	}
	if strings.Contains(contentType, "json") || json.Valid(data) {
		var v any
		if json.Unmarshal(data, &v) == nil {
			return json.RawMessage(data)
		}
	}
	return string(bytes.ToValidUTF8(data, []byte("\uFFFD")))
}

func truncate(data []byte, n int) string {
	if len(data) > n {
		data = data[:n]
	}
	return string(bytes.ToValidUTF8(data, []byte("\uFFFD")))
}

// retryAfter parses a Retry-After header: seconds or an HTTP date.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && s >= 0 {
		return min(time.Duration(s)*time.Second, 24*time.Hour)
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return min(t.Sub(now), 24*time.Hour)
	}
	return 0
}

// redactURL drops the query string, which may hold secrets, from messages.
func redactURL(u *url.URL) string {
	c := *u
	c.RawQuery, c.User, c.Fragment = "", nil, ""
	return c.String()
}
