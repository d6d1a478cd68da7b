package webhooks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
)

// dueNowUnlessClaimed makes a delivery due now, unless a relay holds a live
// claim on it (then its lease stands, so nobody sends it concurrently).
const dueNowUnlessClaimed = `CASE WHEN claim IS NOT NULL AND next_attempt_at > now() THEN next_attempt_at ELSE now() END`

// Delivery states.
const (
	StatePending   = "pending"
	StateFailed    = "failed"
	StateSucceeded = "succeeded"
	StateDead      = "dead"
)

// Delivery is one event for one endpoint, with its attempts.
type Delivery struct {
	ID         uuid.UUID
	EndpointID uuid.UUID
	EventType  string
	RunID      *uuid.UUID
	// Payload is the exact body every attempt sends and signs.
	Payload string
	State   string
	// NextAttemptAt is when the relay sends it next (nil: not scheduled —
	// finished, or paused while its endpoint is disabled).
	NextAttemptAt *time.Time
	LastStatus    *int
	LastError     *string
	SucceededAt   *time.Time
	CreatedAt     time.Time
	Attempts      []Attempt
}

// WebhookID is the webhook-id header: the same on every attempt.
func (d Delivery) WebhookID() string { return MessageID(d.ID) }

// MessageID is a delivery's webhook-id.
func MessageID(id uuid.UUID) string { return "msg_" + id.String() }

// Attempt is one try at a delivery.
type Attempt struct {
	Attempt   int
	StartedAt time.Time
	LatencyMs *int
	// StatusCode is nil when no response came.
	StatusCode   *int
	Error        *string
	ResponseBody *string
}

// DeliveryFilter narrows List.
type DeliveryFilter struct {
	EndpointID *uuid.UUID
	RunID      *uuid.UUID
	State      *string
}

func scanDelivery(row pgx.Row) (Delivery, error) {
	var d Delivery
	err := row.Scan(&d.ID, &d.EndpointID, &d.EventType, &d.RunID, &d.Payload, &d.State, &d.NextAttemptAt,
		&d.LastStatus, &d.LastError, &d.SucceededAt, &d.CreatedAt)
	return d, err
}

// Deliveries lists deliveries newest first, n at most, before the id
// after (a cursor), each with its attempts; more reports a next page.
func (s Service) Deliveries(ctx context.Context, tx *pg.Tx, f DeliveryFilter, n int, after *uuid.UUID) (out []Delivery, more bool, err error) {
	if f.State != nil {
		switch *f.State {
		case StatePending, StateFailed, StateSucceeded, StateDead:
		default:
			return nil, false, errs.E(errs.Invalid, "state: unknown delivery state %q", *f.State)
		}
	}
	rows, err := tx.Query(ctx, qDeliveries, tx.Tenant, f.EndpointID, f.RunID, f.State, after, n+1)
	if err != nil {
		return nil, false, fmt.Errorf("list deliveries: %w", err)
	}
	out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Delivery, error) { return scanDelivery(r) })
	if err != nil {
		return nil, false, fmt.Errorf("list deliveries: %w", err)
	}
	if len(out) > n {
		out, more = out[:n], true
	}
	return out, more, s.attachAttempts(ctx, tx, out)
}

// attachAttempts loads the attempts of a page of deliveries in one query.
func (s Service) attachAttempts(ctx context.Context, tx *pg.Tx, ds []Delivery) error {
	if len(ds) == 0 {
		return nil
	}
	ids := make([]uuid.UUID, len(ds))
	at := make(map[uuid.UUID]int, len(ds))
	for i, d := range ds {
		ids[i], at[d.ID] = d.ID, i
	}
	rows, err := tx.Query(ctx, qAttemptsOf, tx.Tenant, ids)
	if err != nil {
		return fmt.Errorf("list attempts: %w", err)
	}
	var id uuid.UUID
	var a Attempt
	_, err = pgx.ForEachRow(rows, []any{&id, &a.Attempt, &a.StartedAt, &a.LatencyMs, &a.StatusCode, &a.Error, &a.ResponseBody}, func() error {
		ds[at[id]].Attempts = append(ds[at[id]].Attempts, a)
		return nil
	})
	if err != nil {
		return fmt.Errorf("list attempts: %w", err)
	}
	return nil
}

// Delivery returns one delivery with its attempts, or NOT_FOUND.
func (s Service) Delivery(ctx context.Context, tx *pg.Tx, id uuid.UUID) (Delivery, error) {
	d, err := scanDelivery(tx.QueryRow(ctx, qDelivery, tx.Tenant, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Delivery{}, errs.E(errs.NotFound, "webhook delivery %s not found", id)
	}
	if err != nil {
		return Delivery{}, fmt.Errorf("read delivery: %w", err)
	}
	one := []Delivery{d}
	err = s.attachAttempts(ctx, tx, one)
	return one[0], err
}

// Redeliver sends a delivery again now, whatever its state, with the same
// webhook-id and body, and a fresh retry schedule. Its endpoint must be
// enabled.
func (s Service) Redeliver(ctx context.Context, tx *pg.Tx, id uuid.UUID) (Delivery, error) {
	var enabled bool
	err := tx.QueryRow(ctx, qEndpointOfDelivery, tx.Tenant, id).Scan(&enabled)
	if errors.Is(err, pgx.ErrNoRows) {
		return Delivery{}, errs.E(errs.NotFound, "webhook delivery %s not found", id)
	}
	if err != nil {
		return Delivery{}, fmt.Errorf("read delivery: %w", err)
	}
	if !enabled {
		return Delivery{}, errs.E(errs.Conflict, "the delivery's endpoint is disabled; enable it first")
	}
	// An attempt in flight keeps its claim lease: its outcome counts (a
	// success satisfies the redelivery; a failure retries from the start
	// of the schedule).
	if _, err := tx.Exec(ctx, qRedeliver, tx.Tenant, id); err != nil {
		return Delivery{}, fmt.Errorf("redeliver: %w", err)
	}
	return s.Delivery(ctx, tx, id)
}

// MaxPingsPerHour bounds the test pings of one endpoint.
const MaxPingsPerHour = 10

// Ping queues a webhook.test delivery to one endpoint (enabled or not:
// a ping checks a fix before re-enabling).
func (s Service) Ping(ctx context.Context, tx *pg.Tx, endpoint uuid.UUID, now time.Time) (Delivery, error) {
	if err := s.lock(ctx, tx, endpoint); err != nil {
		return Delivery{}, err
	}
	var recent int
	if err := tx.QueryRow(ctx, qRecentPings, tx.Tenant, endpoint, EventTest).Scan(&recent); err != nil {
		return Delivery{}, fmt.Errorf("count pings: %w", err)
	}
	if recent >= MaxPingsPerHour {
		return Delivery{}, &errs.Error{Kind: errs.RateLimited, RetryAfter: 10 * time.Minute,
			Message: fmt.Sprintf("at most %d test pings per endpoint an hour", MaxPingsPerHour)}
	}
	id := uuid.Must(uuid.NewV7())
	body, err := json.Marshal(map[string]any{"type": EventTest, "timestamp": now.UTC().Format(time.RFC3339Nano),
		"data": map[string]any{"endpoint_id": endpoint, "message": "a test ping from Composer"}})
	if err != nil {
		return Delivery{}, err
	}
	if _, err := tx.Exec(ctx, qInsertPing, tx.Tenant, id, endpoint, EventTest, string(body)); err != nil {
		return Delivery{}, fmt.Errorf("queue ping: %w", err)
	}
	return s.Delivery(ctx, tx, id)
}
