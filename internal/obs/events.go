package obs

import (
	"context"

	"go.opentelemetry.io/otel/metric"
)

// Reasons a run start (or an event's starts) is refused at admission.
const (
	RefusedStartRate   = "start_rate"   // the tenant's starts-per-second limit
	RefusedQueuedTasks = "queued_tasks" // the tenant's queued-task quota
	RefusedUsageCap    = "usage_cap"    // a hard cap of the plan or the spend cap
)

var (
	refusals   = Counter(Meter("internal/obs"), "composer.admission.refusals", "run starts refused at admission, by reason (start_rate, queued_tasks, usage_cap)")
	refusalOpt = map[string]metric.MeasurementOption{}
)

func init() {
	for _, r := range []string{RefusedStartRate, RefusedQueuedTasks, RefusedUsageCap} {
		refusalOpt[r] = ObserveAttrsM("reason", r)
	}
	OnPrime(func(ctx context.Context) {
		for _, o := range refusalOpt {
			refusals.Add(ctx, 0, o)
		}
		for _, o := range deadOpt {
			deadLetters.Add(ctx, 0, o)
		}
	})
}

// Refused counts a refusal for one of the reasons above.
func Refused(ctx context.Context, reason string) {
	if o, ok := refusalOpt[reason]; ok {
		refusals.Add(ctx, 1, o)
	}
}

// Kinds of dead letters: things set aside for good after failing too often.
const (
	DeadOutboxRow       = "outbox_row"       // an outbox row that could not be published
	DeadWebhookDelivery = "webhook_delivery" // a delivery whose retry schedule is spent
	DeadStreamMessage   = "stream_message"   // an undecodable stream message
	DeadMaxDeliveries   = "max_deliveries"   // a message delivered too often, failed as an attempt
)

var (
	deadLetters = Counter(Meter("internal/obs"), "composer.dead_letters", "items set aside for good, by kind (outbox_row, webhook_delivery, stream_message, max_deliveries)")
	deadOpt     = map[string]metric.MeasurementOption{}
)

func init() {
	for _, k := range []string{DeadOutboxRow, DeadWebhookDelivery, DeadStreamMessage, DeadMaxDeliveries} {
		deadOpt[k] = ObserveAttrsM("kind", k)
	}
}

// DeadLettered counts n dead letters of one of the kinds above.
func DeadLettered(ctx context.Context, kind string, n int) {
	if o, ok := deadOpt[kind]; ok && n > 0 {
		deadLetters.Add(ctx, int64(n), o)
	}
}
