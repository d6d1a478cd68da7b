package telemetry

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/composer-dev/composer/internal/obs"
)

func TestNewLoggerRejectsUnknownLevels(t *testing.T) {
	_, err := NewLogger(false, "loud")
	assert.Error(t, err)
	l, err := NewLogger(true, "debug")
	require.NoError(t, err)
	assert.True(t, l.Core().Enabled(-1))
}

// Without an exporter, spans must still carry valid ids so trace context
// can travel through the task streams.
func TestSetupGivesValidSpanContextsWithoutExporters(t *testing.T) {
	shutdown, err := Setup(context.Background(), Options{ServiceName: "test"})
	require.NoError(t, err)
	defer shutdown(context.Background()) //nolint:errcheck

	ctx, span := otel.Tracer("t").Start(context.Background(), "op")
	defer span.End()
	assert.True(t, span.SpanContext().IsValid())
	assert.False(t, span.IsRecording(), "nothing exports: nothing is recorded")
	carrier := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, carrier)
	assert.NotEmpty(t, carrier["traceparent"])
}

// Scrapes within MetricsRenderInterval share one rendering: a counter
// added to in between shows at the next interval, not before.
func TestMetricsAreRenderedAtMostOncePerInterval(t *testing.T) {
	shutdown, err := Setup(context.Background(), Options{ServiceName: "test"})
	require.NoError(t, err)
	defer shutdown(context.Background()) //nolint:errcheck
	c, err := otel.Meter("t").Int64Counter("composer.test.cached")
	require.NoError(t, err)
	c.Add(context.Background(), 1)
	h := MetricsHandler()
	scrape := func() string {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		require.Equal(t, 200, rec.Code)
		assert.Contains(t, rec.Header().Get("Content-Type"), "text/plain")
		return rec.Body.String()
	}
	first := scrape()
	assert.Contains(t, first, "composer_test_cached_total 1")
	assert.NotContains(t, first, "otel_scope_name", "no scope labels")
	c.Add(context.Background(), 1)
	assert.Equal(t, first, scrape(), "the same rendering within the interval")
	assert.Eventually(t, func() bool { return strings.Contains(scrape(), "composer_test_cached_total 2") },
		3*MetricsRenderInterval, 50*time.Millisecond)
}

// The standard variables name the service; a request id is honoured when
// well-formed and replaced otherwise.
func TestOTELServiceNameAndRequestIDs(t *testing.T) {
	t.Setenv("OTEL_SERVICE_NAME", "from-env")
	t.Setenv("OTEL_TRACES_SAMPLER", "always_on") // (recorded spans, to read their resource)
	assert.True(t, validRequestID("abc-123_x.y:z"))
	assert.False(t, validRequestID("a b"))
	assert.False(t, validRequestID(strings.Repeat("a", 129)))
	assert.False(t, validRequestID("x\ninjected"))

	shutdown, err := Setup(context.Background(), Options{ServiceName: "composer-test"})
	require.NoError(t, err)
	defer shutdown(context.Background()) //nolint:errcheck
	_, span := otel.Tracer("t").Start(context.Background(), "op")
	span.End()
	ro, ok := span.(sdktrace.ReadOnlySpan)
	require.True(t, ok)
	name, _ := ro.Resource().Set().Value(semconv.ServiceNameKey)
	assert.Equal(t, "from-env", name.AsString(), "OTEL_SERVICE_NAME wins over the default name")

	core, logs := observer.New(zap.InfoLevel)
	var seen, traceID string
	h := Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = obs.RequestID(r.Context())
		traceID = trace.SpanContextFromContext(r.Context()).TraceID().String()
		w.WriteHeader(http.StatusTeapot)
	}), zap.New(core))
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/x?token=secret", nil)
	req.Header.Set(RequestIDHeader, "bad id!")
	h.ServeHTTP(rec, req)
	assert.Equal(t, http.StatusTeapot, rec.Code)
	assert.Len(t, seen, 24, "a malformed id is replaced")
	assert.Equal(t, seen, rec.Header().Get(RequestIDHeader))
	require.Equal(t, 1, logs.Len(), "one access-log line")
	f := logs.All()[0].ContextMap()
	assert.Equal(t, "/x", f["path"], "never the query string")
	assert.EqualValues(t, http.StatusTeapot, f["status"])
	assert.Equal(t, seen, f["request_id"])
	assert.Equal(t, traceID, f["trace_id"], "the request's span")
	assert.NotContains(t, fmt.Sprint(f), "secret")
}
