package telemetry

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"

	"github.com/felixge/httpsnoop"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/internal/obs"
)

// RequestIDHeader carries a request's id: honoured when a caller (a proxy)
// sent a well-formed one, generated otherwise, and always returned.
const RequestIDHeader = "X-Request-Id"

// Handler wraps a listener's handler: a server span per request (an
// incoming traceparent is its parent), a request id, and one access-log
// line per request with the method, the path (never the query string, which
// may hold a secret, nor any header), status, duration, bytes written,
// request id and trace id. Health probes and scrapes log at debug level and
// start no span.
func Handler(next http.Handler, log *zap.Logger) http.Handler {
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(RequestIDHeader)
		if !validRequestID(id) {
			id = newRequestID()
		}
		w.Header().Set(RequestIDHeader, id)
		ctx := obs.WithRequestID(r.Context(), id)
		m := httpsnoop.CaptureMetrics(next, w, r.WithContext(ctx))
		lvl := zap.InfoLevel
		if quiet(r) {
			lvl = zap.DebugLevel
		}
		if ce := log.Check(lvl, "http request"); ce != nil {
			ce.Write(append(obs.LogFields(ctx), zap.String("method", r.Method), zap.String("path", r.URL.Path),
				zap.Int("status", m.Code), zap.Duration("duration", m.Duration), zap.Int64("bytes", m.Written))...)
		}
	})
	return otelhttp.NewHandler(inner, "http",
		otelhttp.WithPropagators(Propagator()),
		otelhttp.WithFilter(func(r *http.Request) bool { return !quiet(r) }),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method + " " + r.URL.Path }))
}

func quiet(r *http.Request) bool {
	switch r.URL.Path {
	case "/healthz", "/readyz", "/metrics":
		return true
	}
	return false
}

// validRequestID accepts up to 128 characters of [A-Za-z0-9._:-]: enough
// for the ids proxies generate, nothing that could forge a log line.
func validRequestID(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return false
		}
	}
	return true
}

func newRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
