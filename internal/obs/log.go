package obs

import (
	"context"

	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
)

type requestIDKey struct{}

// WithRequestID is ctx serving the request id.
func WithRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, requestIDKey{}, id)
}

// RequestID is the id of the request ctx serves ("" outside a request).
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

// LogFields are the request id and trace id of ctx, for every log line
// written while serving a request (or executing a step).
func LogFields(ctx context.Context) []zap.Field {
	f := make([]zap.Field, 0, 2)
	if id := RequestID(ctx); id != "" {
		f = append(f, zap.String("request_id", id))
	}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		f = append(f, zap.String("trace_id", sc.TraceID().String()))
	}
	return f
}
