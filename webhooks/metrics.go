package webhooks

import (
	"go.opentelemetry.io/otel/metric"

	"github.com/composer-dev/composer/internal/obs"
)

var (
	deliveryDuration = obs.Seconds(obs.Meter("webhooks"), "composer.webhook.delivery.duration",
		"a webhook delivery attempt's request, by outcome (success: 2xx; http_error: another status; no_response: refused, unreachable or timed out)")
	outcomeSuccess    = obs.ObserveAttrsM("outcome", "success")
	outcomeHTTPError  = obs.ObserveAttrsM("outcome", "http_error")
	outcomeNoResponse = obs.ObserveAttrsM("outcome", "no_response")
)

func deliveryOutcome(o outcome) metric.MeasurementOption {
	switch {
	case o.ok:
		return outcomeSuccess
	case o.status != nil:
		return outcomeHTTPError
	default:
		return outcomeNoResponse
	}
}
