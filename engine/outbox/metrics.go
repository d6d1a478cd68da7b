package outbox

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
)

var freshDropped metric.Int64Counter

func init() {
	m := otel.Meter("github.com/composer-dev/composer/engine/outbox")
	freshDropped, _ = m.Int64Counter("composer.outbox.fresh_deferred",
		metric.WithDescription("dispatches left to the polling path because the fast path's queue was full (Redis slow or down)"))
}
