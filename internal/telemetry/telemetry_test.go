package telemetry

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
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
	carrier := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, carrier)
	assert.NotEmpty(t, carrier["traceparent"])
}
