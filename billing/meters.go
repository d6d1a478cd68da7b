package billing

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/composer-dev/composer/engine"
	sm "github.com/composer-dev/composer/engine/statemachine"
)

// The meters.
const (
	// RunsStarted counts runs started (key: the run).
	RunsStarted = "runs_started"
	// StepsExecuted counts attempts that ran on a worker and reported a
	// result, success or failure (key: the task and attempt). Attempts
	// lost with their worker are not billed: the sweeper, not the tenant's
	// step, ended them.
	StepsExecuted = "steps_executed"
	// StepSeconds measures those attempts' execution time, from the lease
	// grant to the result's commit on the database clock, recorded in
	// milliseconds and billed in whole seconds per period.
	StepSeconds = "step_seconds"
	// WebhookDeliveries counts webhook deliveries that succeeded (key: the
	// delivery).
	WebhookDeliveries = "webhook_deliveries"
)

// Meters lists every meter, in invoice order.
var Meters = []string{RunsStarted, StepsExecuted, StepSeconds, WebhookDeliveries}

// Unit is how a meter's recorded quantity relates to its billed unit: a
// billed unit is Unit recorded units (step_seconds are recorded in ms).
func Unit(meter string) int64 {
	if meter == StepSeconds {
		return 1000
	}
	return 1
}

// BilledUnit names the unit a meter is billed in.
func BilledUnit(meter string) string {
	switch meter {
	case RunsStarted:
		return "run"
	case StepsExecuted:
		return "step"
	case StepSeconds:
		return "second"
	case WebhookDeliveries:
		return "delivery"
	}
	return "unit"
}

// Execer runs one statement (a pgx.Tx, a pg.Tx, a pool).
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Meter records usage inside the caller's transaction; used by code that
// meters facts of its own (webhook deliveries). A fact already recorded
// under key is not counted again.
type Meter struct {
	// Export marks new records for export to the billing endpoint.
	Export bool
}

func (m Meter) state() string {
	if m.Export {
		return "pending"
	}
	return "none"
}

// Record writes one usage record in ex's transaction.
func (m Meter) Record(ctx context.Context, ex Execer, tenant uuid.UUID, meter, key string, quantity int64) error {
	if _, err := ex.Exec(ctx, insertUsage, tenant, meter+":"+key, meter, quantity, m.state()); err != nil {
		return fmt.Errorf("record usage: %w", err)
	}
	return nil
}

// Hook meters transitions: a started run, and each attempt a worker
// reports on. It queues its rows into the transition's own transaction.
func (m Meter) Hook(t *engine.TxTransition, q engine.Queuer) {
	state := m.state()
	if t.Event == sm.KindRunStarted {
		q.Queue(insertUsage, t.Tenant, RunsStarted+":"+t.RunID.String(), RunsStarted, int64(1), state)
	}
	if r := t.Report; r != nil {
		id := fmt.Sprintf("%s:%d", r.Task, r.Attempt)
		ms := max(t.Now.Sub(r.StartedAt).Milliseconds(), 0)
		q.Queue(insertAttempt, t.Tenant, StepsExecuted+":"+id, StepSeconds+":"+id, state, ms, StepsExecuted, StepSeconds)
	}
}

// Ensure Hook has the engine's hook type.
var _ engine.TxHook = Meter{}.Hook
