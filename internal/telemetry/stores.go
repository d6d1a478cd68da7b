package telemetry

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Spans of store calls are children only: a call made while a recording
// span is in the context (a request, a step's report, a transition) gets a
// span; a background loop's polling does not start traces of its own. The
// statements are the package's own SQL constants (never arguments); Redis
// spans name the command only (never its arguments: payloads, keys).

var (
	pgSystem    = attribute.String("db.system.name", "postgresql")
	redisSystem = attribute.String("db.system.name", "redis")
)

func tracer() trace.Tracer { return otel.Tracer("github.com/composer-dev/composer/internal/telemetry") }

func recording(ctx context.Context) bool { return trace.SpanFromContext(ctx).IsRecording() }

// PgxTracer is a pgx QueryTracer and BatchTracer: a client span per
// statement and per pipelined batch.
type PgxTracer struct{}

var (
	_ pgx.QueryTracer = PgxTracer{}
	_ pgx.BatchTracer = PgxTracer{}
)

// TraceQueryStart implements pgx.QueryTracer.
func (PgxTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if !recording(ctx) {
		return ctx
	}
	ctx, _ = tracer().Start(ctx, "db "+operation(data.SQL), trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(pgSystem, attribute.String("db.query.text", statement(data.SQL))))
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (PgxTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	endSpan(ctx, data.Err)
}

// TraceBatchStart implements pgx.BatchTracer.
func (PgxTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	if !recording(ctx) {
		return ctx
	}
	n := 0
	if data.Batch != nil {
		n = data.Batch.Len()
	}
	ctx, _ = tracer().Start(ctx, "db batch", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(pgSystem, attribute.Int("db.operation.batch.size", n)))
	return ctx
}

// TraceBatchQuery implements pgx.BatchTracer: the batch's statements are
// events of its span (one span per round trip, not per statement).
func (PgxTracer) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{attribute.String("db.query.text", statement(data.SQL))}
	if data.Err != nil {
		attrs = append(attrs, attribute.String("error", data.Err.Error()))
	}
	span.AddEvent("statement", trace.WithAttributes(attrs...))
}

// TraceBatchEnd implements pgx.BatchTracer.
func (PgxTracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchEndData) {
	endSpan(ctx, data.Err)
}

func endSpan(ctx context.Context, err error) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// operation is a statement's first keyword (SELECT, INSERT, WITH, …).
func operation(sql string) string {
	sql = strings.TrimSpace(sql)
	if i := strings.IndexAny(sql, " \t\n("); i > 0 {
		sql = sql[:i]
	}
	return strings.ToUpper(sql)
}

// statement bounds a statement's text on a span.
func statement(sql string) string {
	const max = 1024
	if len(sql) > max {
		return sql[:max]
	}
	return sql
}

// RedisHook is a go-redis hook: a client span per command and per
// pipeline, named by the command alone.
type RedisHook struct{}

var _ redis.Hook = RedisHook{}

// DialHook implements redis.Hook.
func (RedisHook) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (RedisHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !recording(ctx) {
			return next(ctx, cmd)
		}
		ctx, span := tracer().Start(ctx, "redis "+cmd.Name(), trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(redisSystem))
		err := next(ctx, cmd)
		if err != nil && !errors.Is(err, redis.Nil) {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
		return err
	}
}

// ProcessPipelineHook implements redis.Hook.
func (RedisHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !recording(ctx) {
			return next(ctx, cmds)
		}
		ctx, span := tracer().Start(ctx, "redis pipeline", trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(redisSystem, attribute.Int("db.operation.batch.size", len(cmds))))
		err := next(ctx, cmds)
		if err != nil && !errors.Is(err, redis.Nil) {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
		return err
	}
}
