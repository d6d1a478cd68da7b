package billing

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/internal/lifecycle"
	"github.com/composer-dev/composer/internal/pg"
)

// Exporter sends usage records to a billing endpoint. usage_records is the
// outbox: a record commits with the transition it measures, marked
// pending, and the exporter relays it. Every replica may run it: a batch
// is claimed with FOR UPDATE SKIP LOCKED and a claim lease (a claim whose
// exporter died is retried once the lease passes), so each record is sent
// at least once and, thanks to its idempotency key, counted once by an
// endpoint that honours keys.
//
// The payload is a generic JSON batch shaped like common metering APIs:
//
//	{"events": [{"idempotency_key": "<tenant>/<meter>:<fact>", "customer_id": "<tenant>",
//	  "event_name": "steps_executed", "timestamp": "…", "properties": {"quantity": 1, "unit": "step"}}]}
//
// A 2xx marks the batch sent. 408, 425, 429, 5xx and network errors retry
// with jittered exponential backoff; any other answer, or MaxAttempts
// failures, moves the records to 'dead' with the reason (they stay in
// usage_records for an operator to requeue).
type Exporter struct {
	DB     *pg.DB
	URL    string
	Token  string
	Client *http.Client
	Log    *zap.Logger
	// Batch is the most records per request (default 500).
	Batch int
	// MaxAttempts before a record is dead (default 12, about a day).
	MaxAttempts int
	// Interval is the poll when idle (default 1 s).
	Interval time.Duration
	// ClaimLease is how long a claimed batch is someone's (default 1 min).
	ClaimLease time.Duration
	// Backoff is the first retry delay, doubled per attempt up to an hour
	// (default 5 s).
	Backoff time.Duration
}

// Event is one exported usage record.
type Event struct {
	IdempotencyKey string         `json:"idempotency_key"`
	CustomerID     uuid.UUID      `json:"customer_id"`
	EventName      string         `json:"event_name"`
	Timestamp      time.Time      `json:"timestamp"`
	Properties     map[string]any `json:"properties"`
}

func (e *Exporter) defaults() {
	if e.Batch <= 0 {
		e.Batch = 500
	}
	if e.MaxAttempts <= 0 {
		e.MaxAttempts = 12
	}
	if e.Interval <= 0 {
		e.Interval = time.Second
	}
	if e.ClaimLease <= 0 {
		e.ClaimLease = time.Minute
	}
	if e.Backoff <= 0 {
		e.Backoff = 5 * time.Second
	}
	if e.Client == nil {
		e.Client = &http.Client{Timeout: 10 * time.Second}
	}
	if e.Log == nil {
		e.Log = zap.NewNop()
	}
}

// Run exports until ctx ends.
func (e *Exporter) Run(ctx context.Context) error {
	e.defaults()
	for ctx.Err() == nil {
		n, err := e.Pass(ctx)
		if err != nil && ctx.Err() == nil {
			e.Log.Warn("usage export failed", zap.Error(err))
		}
		if n == e.Batch && err == nil {
			continue // more waiting
		}
		lifecycle.Sleep(ctx, e.Interval)
	}
	return ctx.Err()
}

type claimed struct {
	tenant   uuid.UUID
	key      string
	attempts int
}

// Pass claims one batch, sends it and records the outcome. It returns how
// many records it claimed.
func (e *Exporter) Pass(ctx context.Context) (int, error) {
	e.defaults()
	var batch []claimed
	var events []Event
	err := e.DB.WithSystem(ctx, func(ctx context.Context, tx *pg.Tx) error {
		batch, events = nil, nil
		rows, err := tx.Query(ctx, qClaimExport, e.Batch, e.ClaimLease.Seconds())
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var c claimed
			var meter string
			var q int64
			var at time.Time
			if err := rows.Scan(&c.tenant, &c.key, &meter, &q, &at, &c.attempts); err != nil {
				return err
			}
			batch = append(batch, c)
			events = append(events, Event{IdempotencyKey: c.tenant.String() + "/" + c.key, CustomerID: c.tenant, EventName: meter,
				Timestamp: at.UTC(), Properties: map[string]any{"quantity": q, "unit": unitName(meter)}})
		}
		return rows.Err()
	})
	if err != nil || len(batch) == 0 {
		if err != nil {
			err = fmt.Errorf("claim usage records: %w", err)
		}
		return 0, err
	}
	retry, reason := e.send(ctx, events)
	err = e.DB.WithSystem(ctx, func(ctx context.Context, tx *pg.Tx) error {
		for _, c := range batch {
			var err error
			switch {
			case reason == "":
				_, err = tx.Exec(ctx, qExportSent, c.tenant, c.key)
			case retry && c.attempts < e.MaxAttempts:
				_, err = tx.Exec(ctx, qExportRetry, c.tenant, c.key, e.backoff(c.attempts).Seconds(), reason)
			default:
				_, err = tx.Exec(ctx, qExportDead, c.tenant, c.key, reason)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return len(batch), fmt.Errorf("record export outcome (the claim lease will retry it): %w", err)
	}
	if reason != "" {
		return len(batch), fmt.Errorf("export of %d usage records: %s", len(batch), reason)
	}
	return len(batch), nil
}

// send posts the events; reason is "" on success.
func (e *Exporter) send(ctx context.Context, events []Event) (retry bool, reason string) {
	body, err := json.Marshal(map[string]any{"events": events})
	if err != nil {
		return false, "encoding: " + err.Error()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.URL, bytes.NewReader(body))
	if err != nil {
		return false, "request: " + err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	if e.Token != "" {
		req.Header.Set("Authorization", "Bearer "+e.Token)
	}
	resp, err := e.Client.Do(req)
	if err != nil {
		return true, "network: " + err.Error()
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	switch c := resp.StatusCode; {
	case c >= 200 && c < 300:
		return false, ""
	case c == 408 || c == 425 || c == 429 || c >= 500:
		return true, fmt.Sprintf("endpoint answered %d", c)
	default:
		return false, fmt.Sprintf("endpoint refused the batch with %d", c)
	}
}

// backoff is the delay after the n-th failed attempt: Backoff doubling,
// at most an hour, with ±20% jitter.
func (e *Exporter) backoff(n int) time.Duration {
	d := e.Backoff << min(max(n-1, 0), 20)
	d = min(d, time.Hour)
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

func unitName(meter string) string {
	switch meter {
	case StepSeconds:
		return "millisecond"
	case RunsStarted:
		return "run"
	case StepsExecuted:
		return "step"
	case WebhookDeliveries:
		return "delivery"
	}
	return "unit"
}
