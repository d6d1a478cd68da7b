// Package telemetry sets up Composer's logging (zap) and OpenTelemetry tracer
// and meter providers, once per process, and holds the instrumentation every
// process shares: the HTTP middleware (server spans, request ids, the access
// log), spans for PostgreSQL and Redis calls, and the pool-health gauges.
//
// Without an OTLP endpoint the providers are real SDK providers with no
// exporter and (unless OTEL_TRACES_SAMPLER says otherwise) a sampler that
// records nothing: spans still get valid ids, so trace context travels from
// a run's start through the stream to the worker and back, nothing is sent
// anywhere, and nothing is spent recording spans nobody reads.
//
// The standard OTEL_* variables are honoured: OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES name the process, OTEL_TRACES_SAMPLER(_ARG) pick
// the sampler, OTEL_EXPORTER_OTLP_ENDPOINT (or the _TRACES_ / _METRICS_
// variants, and _HEADERS, _TIMEOUT, …) configure the OTLP/HTTP exporters,
// which read them themselves. COMPOSER_OTLP_ENDPOINT (host:port, plain
// HTTP) is kept as an alias when none of the OTEL_EXPORTER_OTLP_* endpoints
// is set.
package telemetry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// NewLogger builds the process logger: JSON lines for servers, a readable
// console format in development.
func NewLogger(dev bool, level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("log level: %w", err)
	}
	var cfg zap.Config
	if dev {
		cfg = zap.NewDevelopmentConfig()
		cfg.EncoderConfig.EncodeLevel = zapcore.CapitalColorLevelEncoder
	} else {
		cfg = zap.NewProductionConfig()
		cfg.EncoderConfig.TimeKey = "ts"
		cfg.EncoderConfig.EncodeTime = zapcore.RFC3339NanoTimeEncoder
	}
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.DisableStacktrace = !dev
	return cfg.Build()
}

// Options configures Setup.
type Options struct {
	// ServiceName names the process unless OTEL_SERVICE_NAME does.
	ServiceName string
	// OTLPEndpoint (COMPOSER_OTLP_ENDPOINT) is an OTLP/HTTP endpoint
	// (host:port, plain HTTP), used when no OTEL_EXPORTER_OTLP_* endpoint is
	// set; empty with none of them exports nothing.
	OTLPEndpoint string
}

// Setup installs the global tracer provider, meter provider and W3C
// propagators. The returned function flushes and stops them.
func Setup(ctx context.Context, o Options) (shutdown func(context.Context) error, err error) {
	// Our name over the SDK's defaults, OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES over ours.
	env, err := resource.New(ctx, resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(o.ServiceName)))
	if err == nil {
		res, err = resource.Merge(res, env)
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}
	// (The sampler is the SDK's default, which reads OTEL_TRACES_SAMPLER.)
	tpOpts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	mpOpts := []sdkmetric.Option{sdkmetric.WithResource(res)}
	te, me, err := exporters(ctx, o.OTLPEndpoint)
	if err != nil {
		return nil, err
	}
	switch {
	case te != nil:
		tpOpts = append(tpOpts, sdktrace.WithBatcher(te))
	case os.Getenv("OTEL_TRACES_SAMPLER") == "":
		// Nothing exports spans: record none (the hot path then skips the
		// store spans too), but still give every span valid ids, so trace
		// context travels with runs, steps and webhooks.
		tpOpts = append(tpOpts, sdktrace.WithSampler(sdktrace.NeverSample()))
	}
	if me != nil {
		mpOpts = append(mpOpts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(me, sdkmetric.WithInterval(15*time.Second))))
	}
	// Metrics are always readable at /metrics (Prometheus text format), with
	// no tenant ids as labels: tenant-level figures are in the API.
	// (No scope labels: every series would carry the instrumenting
	// package's name and version, doubling the exposition's size.)
	prom, err := prometheus.New(prometheus.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	mpOpts = append(mpOpts, sdkmetric.WithReader(prom), sdkmetric.WithView(dropped...))
	tp := sdktrace.NewTracerProvider(tpOpts...)
	mp := sdkmetric.NewMeterProvider(mpOpts...)
	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(mp)
	otel.SetTextMapPropagator(Propagator())
	return func(ctx context.Context) error {
		return errors.Join(tp.Shutdown(ctx), mp.Shutdown(ctx))
	}, nil
}

// Propagator is the W3C trace context and baggage propagator every process
// installs.
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// exporters builds the OTLP exporters the environment asks for: the
// standard variables first (the exporters read them when built without
// overriding options), COMPOSER_OTLP_ENDPOINT as the alias of both.
func exporters(ctx context.Context, alias string) (sdktrace.SpanExporter, sdkmetric.Exporter, error) {
	std := os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
	var te sdktrace.SpanExporter
	var me sdkmetric.Exporter
	var err error
	switch {
	case std || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "":
		te, err = otlptracehttp.New(ctx)
	case alias != "":
		te, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpoint(alias), otlptracehttp.WithInsecure())
	}
	if err != nil {
		return nil, nil, fmt.Errorf("otlp trace exporter: %w", err)
	}
	switch {
	case std || os.Getenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") != "":
		me, err = otlpmetrichttp.New(ctx)
	case alias != "":
		me, err = otlpmetrichttp.New(ctx, otlpmetrichttp.WithEndpoint(alias), otlpmetrichttp.WithInsecure())
	}
	if err != nil {
		return nil, nil, fmt.Errorf("otlp metric exporter: %w", err)
	}
	return te, me, nil
}

// dropped are instruments of libraries we do not chart: otelhttp's body
// size histograms (request duration is kept).
var dropped = []sdkmetric.View{
	sdkmetric.NewView(sdkmetric.Instrument{Name: "http.server.request.body.size"}, sdkmetric.Stream{Aggregation: sdkmetric.AggregationDrop{}}),
	sdkmetric.NewView(sdkmetric.Instrument{Name: "http.server.response.body.size"}, sdkmetric.Stream{Aggregation: sdkmetric.AggregationDrop{}}),
}

// MetricsRenderInterval is how long one rendering of /metrics serves
// scrapes: scrapers polling faster than this (or many at once) share it,
// so the process renders its metrics at most once per interval whatever
// the scrape rate. Prometheus scrapes every few seconds at most.
const MetricsRenderInterval = time.Second

// MetricsHandler serves the process's metrics in the Prometheus text
// format, rendered at most once per MetricsRenderInterval.
func MetricsHandler() http.Handler { return &cachedMetrics{next: promhttp.Handler()} }

type cachedMetrics struct {
	next        http.Handler
	mu          sync.Mutex
	at          time.Time
	body        []byte
	contentType string
	status      int
}

func (c *cachedMetrics) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	if c.at.IsZero() || time.Since(c.at) >= MetricsRenderInterval {
		// A plain request: the text format, uncompressed, whoever asked.
		rec := &recorder{header: http.Header{}, status: http.StatusOK}
		req, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, "/metrics", nil)
		c.next.ServeHTTP(rec, req)
		c.body, c.contentType, c.status, c.at = rec.body.Bytes(), rec.header.Get("Content-Type"), rec.status, time.Now()
	}
	body, ct, status := c.body, c.contentType, c.status
	c.mu.Unlock()
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// recorder captures a rendering.
type recorder struct {
	header http.Header
	body   bytes.Buffer
	status int
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }
func (r *recorder) WriteHeader(status int)      { r.status = status }
