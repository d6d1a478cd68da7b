// Package obs holds what every instrumented package shares to record
// metrics cheaply: the bucket boundaries of latency histograms and helpers
// that create an instrument once and precompute its attribute sets. It
// imports only the OpenTelemetry API (the SDK and exporters are set up by
// internal/telemetry), so the engine, workers and webhooks can use it.
package obs

import (
	"context"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Buckets are the boundaries, in seconds, of every latency histogram: from
// a millisecond (a commit, a hand-off) to ten minutes (a slow step, a queue
// backlog).
var Buckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

// Meter is the meter of a Composer package (the global provider's; the
// global delegates to the SDK once telemetry.Setup installed it).
func Meter(pkg string) metric.Meter { return otel.Meter("github.com/composer-dev/composer/" + pkg) }

// Seconds creates a latency histogram in seconds with Buckets.
func Seconds(m metric.Meter, name, desc string) metric.Float64Histogram {
	h, _ := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
		metric.WithExplicitBucketBoundaries(Buckets...))
	return h
}

// Counter creates a counter; errors only come from invalid names, which
// tests catch.
func Counter(m metric.Meter, name, desc string) metric.Int64Counter {
	c, _ := m.Int64Counter(name, metric.WithDescription(desc))
	return c
}

// Attrs is a precomputed attribute set option: build it once per label
// value, not per event.
func Attrs(kv ...attribute.KeyValue) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(kv...))
}

// MaxLabelValues bounds the distinct values a Labelled keeps; later values
// are recorded as "other". Queue names come from tenants' definitions, so
// without a bound a tenant could grow the series without limit.
const MaxLabelValues = 64

// Labelled caches one precomputed option per label value of one key, for
// labels whose values are few but not known in advance (queues, event
// kinds). Safe for concurrent use.
type Labelled struct {
	key   string
	extra []attribute.KeyValue
	m     sync.Map
	n     atomic.Int32
	other metric.MeasurementOption
}

// NewLabelled caches options for key, each with extra appended.
func NewLabelled(key string, extra ...attribute.KeyValue) *Labelled {
	return &Labelled{key: key, extra: extra, other: Attrs(append([]attribute.KeyValue{attribute.String(key, "other")}, extra...)...)}
}

// Get is the option for value.
func (l *Labelled) Get(value string) metric.MeasurementOption {
	if o, ok := l.m.Load(value); ok {
		return o.(metric.MeasurementOption)
	}
	if l.n.Add(1) > MaxLabelValues {
		return l.other
	}
	kv := append([]attribute.KeyValue{attribute.String(l.key, value)}, l.extra...)
	o, _ := l.m.LoadOrStore(value, Attrs(kv...))
	return o.(metric.MeasurementOption)
}

// ObserveAttrs is a precomputed attribute set option for observable
// instruments, from key/value pairs.
func ObserveAttrs(kv ...string) metric.ObserveOption { return ObserveAttrsM(kv...) }

// ObserveAttrsM is ObserveAttrs usable by every kind of instrument.
func ObserveAttrsM(kv ...string) metric.MeasurementOption {
	a := make([]attribute.KeyValue, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		a = append(a, attribute.String(kv[i], kv[i+1]))
	}
	return metric.WithAttributeSet(attribute.NewSet(a...))
}

var (
	primeMu sync.Mutex
	primers []func(context.Context)
)

// OnPrime registers fn to be run by Prime: it adds zero to a counter's
// known series, so they exist (at 0) from a process's start — rate() and
// alerts over them need no "absent" special case, and a scrape shows every
// metric an operator may query.
func OnPrime(fn func(context.Context)) {
	primeMu.Lock()
	defer primeMu.Unlock()
	primers = append(primers, fn)
}

// Prime runs the registered primers; call it once the meter provider is
// installed (measurements made before are dropped).
func Prime(ctx context.Context) {
	primeMu.Lock()
	defer primeMu.Unlock()
	for _, fn := range primers {
		fn(ctx)
	}
}
