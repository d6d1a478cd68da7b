package apptest_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/internal/apptest"
)

// TestOneTraceSpansTheRun starts a run inside a span and checks that every
// step's execution span, on the worker, belongs to that same trace: the
// trace context travels through the outbox, the stream message and the
// task API.
func TestOneTraceSpansTheRun(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	sys := apptest.Start(t)
	sys.StartWorker(apptest.WorkerOptions{})
	wf := sys.Workflow(`{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"noop","depends_on":["a"]},{"id":"c","type":"noop","depends_on":["b"]}]}`)

	ctx, root := otel.Tracer("test").Start(context.Background(), "start run")
	res, err := sys.Coordinator().StartRun(ctx, sys.Tenant, engine.StartRun{WorkflowID: wf, Input: json.RawMessage(`{}`)})
	require.NoError(t, err)
	root.End()
	run, _ := sys.WaitRun(res.RunID, 20*time.Second)
	require.Equal(t, "completed", run.Status)

	var executes int
	for _, s := range rec.Ended() {
		if s.Name() == "execute noop" {
			executes++
			assert.Equal(t, root.SpanContext().TraceID(), s.SpanContext().TraceID(), "step span outside the run's trace")
		}
	}
	assert.Equal(t, 3, executes, "one execution span per step, all in the run's trace")
}
