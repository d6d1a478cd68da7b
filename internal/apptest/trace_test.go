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

	// The last step's span ends just after its report commits: wait for it.
	var executes []sdktrace.ReadOnlySpan
	apptest.Eventually(t, "three execution spans", 10*time.Second, func() bool {
		executes = executes[:0]
		for _, s := range rec.Ended() {
			if s.Name() == "execute noop" {
				executes = append(executes, s)
			}
		}
		return len(executes) >= 3
	})
	assert.Len(t, executes, 3, "one execution span per step")
	for _, s := range executes {
		assert.Equal(t, root.SpanContext().TraceID(), s.SpanContext().TraceID(), "step span outside the run's trace")
	}
}
