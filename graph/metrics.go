package graph

import (
	"context"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"go.opentelemetry.io/otel/metric"

	"github.com/composer-dev/composer/internal/obs"
)

var (
	requestDuration = obs.Seconds(obs.Meter("graph"), "composer.graphql.request.duration",
		"a GraphQL request over HTTP POST, from its arrival to its response, by operation type (query, mutation; invalid: refused before an operation was chosen)")
	opAttrs = map[string]metric.MeasurementOption{
		"query": obs.ObserveAttrsM("operation", "query"), "mutation": obs.ObserveAttrsM("operation", "mutation"),
		"subscription": obs.ObserveAttrsM("operation", "subscription"), "invalid": obs.ObserveAttrsM("operation", "invalid"),
	}
)

type opTypeKey struct{}

// opType is where the operation interceptor leaves the request's
// operation type for the request's histogram.
type opType struct{ name string }

// withOpType gives a request a slot for its operation type.
func withOpType(ctx context.Context) (context.Context, *opType) {
	o := &opType{name: "invalid"}
	return context.WithValue(ctx, opTypeKey{}, o), o
}

// observeRequest records a POST request's duration once it is answered.
func observeRequest(ctx context.Context, o *opType, began time.Time) {
	a, ok := opAttrs[o.name]
	if !ok {
		a = opAttrs["invalid"]
	}
	requestDuration.Record(ctx, time.Since(began).Seconds(), a)
}

// operationType is the extension that names a request's operation type.
type operationType struct{}

var _ interface {
	graphql.HandlerExtension
	graphql.OperationInterceptor
} = operationType{}

func (operationType) ExtensionName() string                   { return "OperationType" }
func (operationType) Validate(graphql.ExecutableSchema) error { return nil }

func (operationType) InterceptOperation(ctx context.Context, next graphql.OperationHandler) graphql.ResponseHandler {
	if o, ok := ctx.Value(opTypeKey{}).(*opType); ok {
		if oc := graphql.GetOperationContext(ctx); oc != nil && oc.Operation != nil {
			o.name = string(oc.Operation.Operation)
		}
	}
	return next(ctx)
}
