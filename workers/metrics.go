package workers

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/composer-dev/composer/internal/obs"
)

// Step outcomes, the outcome label of composer.step.duration.
const (
	outcomeCompleted = "completed"
	outcomeFailed    = "failed"
	outcomeLeaseLost = "lease_lost"
)

var (
	meter = obs.Meter("workers")

	stepDuration = obs.Seconds(meter, "composer.step.duration", "a step's execution on a platform worker, by queue and outcome (completed, failed, lease_lost)")
	queueWait    = obs.Seconds(meter, "composer.step.queue_wait", "schedule to start: from a task's publication to its stream to its execution starting, by queue and dispatch (stream; eager: handed over in the previous step's report, 0)")
	handoff      = obs.Seconds(meter, "composer.worker.handoff", "from a read batch's dispatch to its lease acquired and the step handed to its slot, by queue")

	stepBy = map[string]*obs.Labelled{
		outcomeCompleted: obs.NewLabelled("queue", attribute.String("outcome", outcomeCompleted)),
		outcomeFailed:    obs.NewLabelled("queue", attribute.String("outcome", outcomeFailed)),
		outcomeLeaseLost: obs.NewLabelled("queue", attribute.String("outcome", outcomeLeaseLost)),
	}
	waitStream = obs.NewLabelled("queue", attribute.String("dispatch", "stream"))
	waitEager  = obs.NewLabelled("queue", attribute.String("dispatch", "eager"))
	byQueue    = obs.NewLabelled("queue")
)

func recordStep(ctx context.Context, queue, outcome string, began time.Time) {
	stepDuration.Record(ctx, time.Since(began).Seconds(), stepBy[outcome].Get(queue))
}

// recordWait records a step's schedule-to-start; enqueued is zero for an
// eager lease (no stream in between).
func recordWait(ctx context.Context, queue string, enqueued time.Time) {
	if enqueued.IsZero() {
		queueWait.Record(ctx, 0, waitEager.Get(queue))
		return
	}
	queueWait.Record(ctx, max(time.Since(enqueued).Seconds(), 0), waitStream.Get(queue))
}
