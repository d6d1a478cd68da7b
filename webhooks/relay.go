package webhooks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/billing"
	"github.com/composer-dev/composer/internal/config"
	"github.com/composer-dev/composer/internal/obs"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/internal/ssrf"
	"github.com/composer-dev/composer/sdk/webhook"
)

// DefaultSchedule is the wait before each retry after the first attempt
// (the Standard Webhooks reference schedule): the last retry is about 27.5
// hours after the event; after it the delivery is dead.
var DefaultSchedule = []time.Duration{5 * time.Second, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour,
	5 * time.Hour, 10 * time.Hour, 10 * time.Hour}

// Relay sends due deliveries. Every replica may run one: a batch is
// claimed with FOR UPDATE SKIP LOCKED, stamped with a claim token and
// pushed one claim lease into the future, then sent outside any
// transaction. A relay that dies mid-delivery leaves the row to fall due
// again when the lease ends (same webhook-id, same body); the claim token
// fences a late outcome of a claim that was taken over.
type Relay struct {
	DB   *pg.DB
	Keys *Keyring
	// Transport sends the requests; it must be SSRF-safe
	// (ssrf.Policy.ResolvingTransport).
	Transport http.RoundTripper
	Log       *zap.Logger
	// Meter records webhook_deliveries for each delivery that succeeds.
	Meter billing.Meter
	// Schedule is the wait before each retry (default DefaultSchedule),
	// each varied by ±Jitter (default 0.2) of itself.
	Schedule []time.Duration
	Jitter   float64
	// Timeout bounds one attempt (default 10 s).
	Timeout time.Duration
	// DisableAfter disables an endpoint that has failed without a success
	// for this long (default 5 days).
	DisableAfter time.Duration
	// Interval is the poll when idle (default 1 s); Wake cuts it short.
	Interval time.Duration
	// ClaimLease is how long a claimed delivery is this relay's (default
	// three times Timeout; it must exceed Timeout).
	ClaimLease time.Duration
	// Batch is the most deliveries in flight at once (default 32).
	Batch int
	// PerTenant is the most of them for one tenant (default Batch/4).
	PerTenant int
	// Retention is how long finished deliveries and their attempts are
	// kept (default 30 days).
	Retention time.Duration

	once   sync.Once
	wake   chan struct{}
	client *http.Client
}

func (r *Relay) init() {
	r.once.Do(func() {
		if r.Schedule == nil {
			r.Schedule = DefaultSchedule
		}
		if r.Jitter == 0 {
			r.Jitter = 0.2
		}
		if r.Timeout == 0 {
			r.Timeout = config.DefaultWebhookTimeout
		}
		if r.DisableAfter == 0 {
			r.DisableAfter = config.DefaultWebhookDisableAfter
		}
		if r.Interval == 0 {
			r.Interval = time.Second
		}
		if r.ClaimLease <= r.Timeout {
			r.ClaimLease = 3 * r.Timeout
		}
		if r.Batch == 0 {
			r.Batch = 32
		}
		if r.PerTenant <= 0 {
			r.PerTenant = max(1, r.Batch/4)
		}
		if r.Retention == 0 {
			r.Retention = 30 * 24 * time.Hour
		}
		if r.Log == nil {
			r.Log = zap.NewNop()
		}
		r.wake = make(chan struct{}, 1)
		r.client = &http.Client{
			Transport: r.Transport,
			Timeout:   r.Timeout,
			// Redirects are not followed: the endpoint is the URL the tenant
			// registered, and a redirect could aim anywhere.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	})
}

// Wake makes the relay look for due deliveries now (called in-process
// after a run ends; other replicas find them on their next poll).
func (r *Relay) Wake() {
	r.init()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run relays until ctx ends. Up to Batch deliveries are in flight at
// once, at most a quarter of them (PerTenant) for one tenant, so a tenant
// whose endpoint hangs cannot take every sender; a freed sender claims
// again at once.
func (r *Relay) Run(ctx context.Context) error {
	r.init()
	poll := time.NewTicker(r.Interval)
	defer poll.Stop()
	var (
		mu       sync.Mutex
		inFlight = map[uuid.UUID]int{}
		total    int
		wg       sync.WaitGroup
	)
	defer wg.Wait()
	lastRetention := time.Time{}
	for {
		mu.Lock()
		free := r.Batch - total
		flight := make(map[uuid.UUID]int, len(inFlight))
		for t, n := range inFlight {
			flight[t] = n
		}
		mu.Unlock()
		var claimedN int
		if free > 0 {
			batch, err := r.claim(ctx, free, flight)
			if err != nil && ctx.Err() == nil {
				r.Log.Warn("webhook relay claim failed", zap.Error(err))
			}
			claimedN = len(batch)
			mu.Lock()
			for _, c := range batch {
				inFlight[c.tenant]++
				total++
			}
			mu.Unlock()
			for _, c := range batch {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := r.deliver(ctx, c); err != nil && ctx.Err() == nil {
						r.Log.Warn("webhook outcome not recorded", zap.Error(err))
					}
					mu.Lock()
					if inFlight[c.tenant]--; inFlight[c.tenant] == 0 {
						delete(inFlight, c.tenant)
					}
					total--
					mu.Unlock()
					r.Wake() // a sender is free
				}()
			}
		}
		if time.Since(lastRetention) > time.Hour {
			lastRetention = time.Now()
			if err := r.applyRetention(ctx); err != nil && ctx.Err() == nil {
				r.Log.Warn("webhook retention failed", zap.Error(err))
			}
		}
		if free > 0 && claimedN == free {
			continue // more may be due
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-r.wake:
		case <-poll.C:
		}
	}
}

// claimed is one delivery this relay is sending.
type claimed struct {
	tenant, id, endpoint uuid.UUID
	eventType            string
	payload              string
	attempt              int
	claim                uuid.UUID
	url                  string
	keys                 [][]byte
	// traceparent is the run's (its start's trace): the delivery is a span
	// of that trace, and the endpoint receives it as a traceparent header.
	traceparent string
}

// outcome is how an attempt went.
type outcome struct {
	status    *int
	latencyMs int
	elapsed   time.Duration
	err       string
	body      *string
	ok, gone  bool
}

// Pass claims one batch, sends it and records the outcomes; it returns how
// many deliveries it claimed. (Run does the same continuously.)
func (r *Relay) Pass(ctx context.Context) (int, error) {
	r.init()
	batch, err := r.claim(ctx, r.Batch, nil)
	if err != nil || len(batch) == 0 {
		return 0, err
	}
	var wg sync.WaitGroup
	errc := make(chan error, len(batch))
	for _, c := range batch {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.deliver(ctx, c); err != nil {
				errc <- err
			}
		}()
	}
	wg.Wait()
	close(errc)
	var errsAll []error
	for err := range errc {
		errsAll = append(errsAll, err)
	}
	return len(batch), errors.Join(errsAll...)
}

// deliver sends one claimed delivery and records the outcome.
func (r *Relay) deliver(ctx context.Context, c claimed) error {
	var o outcome
	if c.keys == nil {
		o = outcome{err: "no signing secret could be opened; rotate the endpoint's secret"}
	} else {
		o = r.send(ctx, c)
	}
	if ctx.Err() != nil {
		return nil // shutting down: the claim lease hands it to another relay
	}
	if c.keys != nil {
		deliveryDuration.Record(ctx, o.elapsed.Seconds(), deliveryOutcome(o))
	}
	return r.record(context.WithoutCancel(ctx), c, o)
}

// claim claims up to n due deliveries, for each tenant no more than
// PerTenant less what it has in flight (inFlight).
func (r *Relay) claim(ctx context.Context, n int, inFlight map[uuid.UUID]int) ([]claimed, error) {
	flightTenants, flightCounts := make([]uuid.UUID, 0, len(inFlight)), make([]int32, 0, len(inFlight))
	for t, c := range inFlight {
		flightTenants, flightCounts = append(flightTenants, t), append(flightCounts, int32(c))
	}
	var out []claimed
	err := r.DB.WithSystem(ctx, func(ctx context.Context, tx *pg.Tx) error {
		out = out[:0]
		// Candidates are ranked per tenant without locks (window functions
		// and FOR UPDATE do not mix), then locked with SKIP LOCKED.
		rows, err := tx.Query(ctx, qClaimDeliveries,
			n, r.ClaimLease.Seconds(), r.PerTenant, flightTenants, flightCounts)
		if err != nil {
			return fmt.Errorf("claim deliveries: %w", err)
		}
		for rows.Next() {
			var c claimed
			if err := rows.Scan(&c.tenant, &c.id, &c.endpoint, &c.eventType, &c.payload, &c.attempt, &c.claim, &c.url, &c.traceparent); err != nil {
				rows.Close()
				return fmt.Errorf("claim deliveries: %w", err)
			}
			out = append(out, c)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("claim deliveries: %w", err)
		}
		if len(out) == 0 {
			return nil
		}
		tenantIDs, ids, attempts := make([]uuid.UUID, len(out)), make([]uuid.UUID, len(out)), make([]int, len(out))
		endpoints := make([]uuid.UUID, len(out))
		for i, c := range out {
			tenantIDs[i], ids[i], attempts[i], endpoints[i] = c.tenant, c.id, c.attempt, c.endpoint
		}
		// The attempt is logged as lost until its outcome replaces that.
		if _, err := tx.Exec(ctx, qInsertAttempt, tenantIDs, ids, attempts); err != nil {
			return fmt.Errorf("log attempts: %w", err)
		}
		// Secrets valid now, the current (newest) first.
		rows, err = tx.Query(ctx, qSecretsOf, tenantIDs, endpoints)
		if err != nil {
			return fmt.Errorf("read secrets: %w", err)
		}
		keys := map[[2]uuid.UUID][][]byte{}
		var t, e, sid uuid.UUID
		var sealed []byte
		for rows.Next() {
			if err := rows.Scan(&t, &e, &sid, &sealed); err != nil {
				rows.Close()
				return fmt.Errorf("read secrets: %w", err)
			}
			k := [2]uuid.UUID{t, e}
			key, err := r.Keys.Open(sealed, t, e, sid)
			if err != nil {
				r.Log.Error("webhook secret does not open", zap.Stringer("tenant", t), zap.Stringer("endpoint", e), zap.Error(err))
				continue
			}
			keys[k] = append(keys[k], key)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("read secrets: %w", err)
		}
		for i := range out {
			out[i].keys = keys[[2]uuid.UUID{out[i].tenant, out[i].endpoint}]
		}
		return nil
	})
	return out, err
}

const maxResponseBody = 2 << 10

func (r *Relay) send(ctx context.Context, c claimed) outcome {
	body := []byte(c.payload)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return outcome{err: "invalid endpoint URL: " + err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "Composer-Webhooks/1")
	webhook.Headers(req.Header, MessageID(c.id), time.Now(), body, c.keys...)
	if c.traceparent != "" {
		pctx := otel.GetTextMapPropagator().Extract(ctx, propagation.MapCarrier{"traceparent": c.traceparent})
		_, span := otel.Tracer("github.com/composer-dev/composer/webhooks").Start(pctx, "webhook "+c.eventType,
			trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attribute.String("composer.delivery_id", c.id.String())))
		defer span.End()
		otel.GetTextMapPropagator().Inject(trace.ContextWithSpan(ctx, span), propagation.HeaderCarrier(req.Header))
	}
	start := time.Now()
	resp, err := r.client.Do(req)
	o := outcome{latencyMs: int(time.Since(start).Milliseconds()), elapsed: time.Since(start)}
	if err != nil {
		o.err = r.describe(req.URL.Hostname(), err)
		return o
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxResponseBody))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // reuse the connection
	text := strings.ReplaceAll(strings.ToValidUTF8(string(b), "\uFFFD"), "\x00", "")
	code := resp.StatusCode
	o.status, o.body = &code, &text
	switch {
	case code >= 200 && code < 300:
		o.ok = true
	case code == http.StatusGone:
		o.gone, o.err = true, "410 Gone: the endpoint asked to stop receiving webhooks"
	case code >= 300 && code < 400:
		o.err = fmt.Sprintf("HTTP %d: redirects are not followed (Location: %s)", code, truncate(resp.Header.Get("Location"), 300))
	default:
		o.err = fmt.Sprintf("HTTP %d", code)
	}
	return o
}

// describe says why a request got no response, for the tenant: what is
// wrong, but nothing of our network (resolved internal addresses, DNS
// servers), which goes to the log instead.
func (r *Relay) describe(host string, err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var ne interface{ Timeout() bool }
	if reason, ok := ssrf.Describe(host, err); ok {
		r.Log.Info("webhook could not reach its endpoint", zap.String("host", host), zap.Error(err))
		return reason
	}
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Sprintf("no response within %s", r.Timeout)
	}
	return truncate(err.Error(), 500)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// delay is the wait before retry number step (1-based), with jitter; ok is
// false once the schedule is spent.
func (r *Relay) delay(step int) (time.Duration, bool) {
	if step > len(r.Schedule) {
		return 0, false
	}
	d := r.Schedule[step-1]
	j := 1 + r.Jitter*(2*rand.Float64()-1)
	return time.Duration(float64(d) * j), true
}

func (r *Relay) record(ctx context.Context, c claimed, o outcome) error {
	test := c.eventType == EventTest
	dead := false
	err := r.DB.WithSystem(ctx, func(ctx context.Context, tx *pg.Tx) error {
		dead = false
		var errText *string
		if o.err != "" {
			errText = &o.err
		}
		if _, err := tx.Exec(ctx, qRecordAttempt,
			c.tenant, c.id, c.attempt, o.latencyMs, o.status, errText, o.body); err != nil {
			return fmt.Errorf("record attempt: %w", err)
		}
		// The schedule position is the row's, read under the claim: a
		// redelivery requested while this attempt was in flight reset it.
		var step int
		err := tx.QueryRow(ctx, qRetryStep,
			c.tenant, c.id, c.claim).Scan(&step)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // the claim was taken over (its holder records), or the endpoint was deleted
		}
		if err != nil {
			return fmt.Errorf("record delivery: %w", err)
		}
		var state string
		var wait time.Duration
		switch {
		case o.ok:
			state = StateSucceeded
		case test:
			state = StateDead // a ping is one attempt
		default:
			var more bool
			if wait, more = r.delay(step + 1); more {
				state = StateFailed
			} else {
				state = StateDead
			}
		}
		dead = state == StateDead && !test
		tag, err := tx.Exec(ctx, qSettleDelivery,
			c.tenant, c.id, c.claim, state, wait.Seconds(), o.status, errText)
		if err != nil {
			return fmt.Errorf("record delivery: %w", err)
		}
		if tag.RowsAffected() == 0 || test {
			return nil // pings do not touch endpoint health
		}
		if o.ok {
			if _, err := tx.Exec(ctx, qEndpointSucceeded, c.tenant, c.endpoint); err != nil {
				return fmt.Errorf("endpoint health: %w", err)
			}
			return r.Meter.Record(ctx, tx, c.tenant, billing.WebhookDeliveries, c.id.String(), 1)
		}
		var enabled, tooLong bool
		var since time.Time
		if err := tx.QueryRow(ctx, qEndpointFailing,
			c.tenant, c.endpoint, r.DisableAfter.Seconds()).Scan(&enabled, &since, &tooLong); err != nil {
			return fmt.Errorf("endpoint health: %w", err)
		}
		switch {
		case !enabled:
		case o.gone:
			return SetEnabled(ctx, tx, c.tenant, c.endpoint, false,
				fmt.Sprintf("the endpoint answered 410 Gone at %s", time.Now().UTC().Format(time.RFC3339)))
		case tooLong:
			return SetEnabled(ctx, tx, c.tenant, c.endpoint, false,
				fmt.Sprintf("no successful delivery since %s (last: %s)", since.UTC().Format(time.RFC3339), truncate(o.err, 500)))
		}
		return nil
	})
	if err == nil && dead {
		obs.DeadLettered(ctx, obs.DeadWebhookDelivery, 1)
	}
	return err
}

func (r *Relay) applyRetention(ctx context.Context) error {
	for range 100 {
		var n int64
		err := r.DB.WithSystem(ctx, func(ctx context.Context, tx *pg.Tx) error {
			tag, err := tx.Exec(ctx, qDeliveryRetention, r.Retention.Seconds())
			n = tag.RowsAffected()
			return err
		})
		if err != nil || n < 10000 {
			return err
		}
	}
	return nil
}
