// Package telemetry sets up Composer's logging (zap) and OpenTelemetry tracer
// and meter providers, once per process.
//
// Without an OTLP endpoint the providers are real SDK providers with no
// exporter: spans still get valid ids, so trace context travels from a run's
// start through the stream to the worker and back, and nothing is sent
// anywhere.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
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
	ServiceName string
	// OTLPEndpoint is an OTLP/HTTP endpoint (host:port); empty exports nothing.
	OTLPEndpoint string
}

// Setup installs the global tracer provider, meter provider and W3C
// propagators. The returned function flushes and stops them.
func Setup(ctx context.Context, o Options) (shutdown func(context.Context) error, err error) {
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(o.ServiceName)))
	if err != nil {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}
	tpOpts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	mpOpts := []sdkmetric.Option{sdkmetric.WithResource(res)}
	if o.OTLPEndpoint != "" {
		te, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpoint(o.OTLPEndpoint), otlptracehttp.WithInsecure())
		if err != nil {
			return nil, fmt.Errorf("otlp trace exporter: %w", err)
		}
		me, err := otlpmetrichttp.New(ctx, otlpmetrichttp.WithEndpoint(o.OTLPEndpoint), otlpmetrichttp.WithInsecure())
		if err != nil {
			return nil, fmt.Errorf("otlp metric exporter: %w", err)
		}
		tpOpts = append(tpOpts, sdktrace.WithBatcher(te))
		mpOpts = append(mpOpts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(me, sdkmetric.WithInterval(15*time.Second))))
	}
	// Metrics are always readable at /metrics (Prometheus text format), with
	// no tenant ids as labels: tenant-level figures are in the API.
	prom, err := prometheus.New()
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	mpOpts = append(mpOpts, sdkmetric.WithReader(prom))
	tp := sdktrace.NewTracerProvider(tpOpts...)
	mp := sdkmetric.NewMeterProvider(mpOpts...)
	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(mp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return func(ctx context.Context) error {
		return errors.Join(tp.Shutdown(ctx), mp.Shutdown(ctx))
	}, nil
}

// MetricsHandler serves the process's metrics in the Prometheus format.
func MetricsHandler() http.Handler { return promhttp.Handler() }
