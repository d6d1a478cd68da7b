package engine

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/composer-dev/composer/internal/pg"
)

// RegisterGauges reports fleet-wide figures as observable gauges, read
// when metrics are collected: tasks waiting and running, runs running, and
// how many tenants are at their running-task quota. None carries a tenant
// id (unbounded label cardinality); per-tenant figures are in the API.
func RegisterGauges(db *pg.DB) error {
	m := otel.Meter("github.com/composer-dev/composer/engine")
	queued, err := m.Int64ObservableGauge("composer.tasks.queued", metric.WithDescription("tasks waiting for a worker"))
	if err != nil {
		return err
	}
	running, err := m.Int64ObservableGauge("composer.tasks.running", metric.WithDescription("tasks leased by a worker"))
	if err != nil {
		return err
	}
	runs, err := m.Int64ObservableGauge("composer.runs.running", metric.WithDescription("runs not yet finished"))
	if err != nil {
		return err
	}
	atQuota, err := m.Int64ObservableGauge("composer.tenants.at_quota", metric.WithDescription("tenants whose running tasks reach their quota"))
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		var q, r, rr, aq int64
		err := db.System().QueryRow(ctx, qFleetGauges).Scan(&q, &r, &rr, &aq)
		if err != nil {
			return fmt.Errorf("fleet gauges: %w", err)
		}
		o.ObserveInt64(queued, q)
		o.ObserveInt64(running, r)
		o.ObserveInt64(runs, rr)
		o.ObserveInt64(atQuota, aq)
		return nil
	}, queued, running, runs, atQuota)
	return err
}

var transitions, finished, eagerDispatches metric.Int64Counter

func init() {
	m := otel.Meter("github.com/composer-dev/composer/engine")
	transitions, _ = m.Int64Counter("composer.transitions", metric.WithDescription("committed transitions, by event kind"))
	finished, _ = m.Int64Counter("composer.runs.finished", metric.WithDescription("runs that reached a terminal state, by status"))
	eagerDispatches, _ = m.Int64Counter("composer.tasks.eager_dispatched", metric.WithDescription("tasks leased to the worker that reported the previous step, in that report's transaction"))
}

func countTransition(ctx context.Context, event, status string, terminal bool) {
	transitions.Add(ctx, 1, metric.WithAttributes(attribute.String("event", event)))
	if terminal {
		finished.Add(ctx, 1, metric.WithAttributes(attribute.String("status", status)))
	}
}
