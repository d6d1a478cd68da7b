package webhooks

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/internal/ssrf"
	"github.com/composer-dev/composer/sdk/webhook"
	"github.com/composer-dev/composer/tenants"
)

// Event types an endpoint subscribes to.
const (
	EventRunCompleted = "run.completed"
	EventRunFailed    = "run.failed"
	EventRunCancelled = "run.cancelled"
	// EventRunWaiting: a run started waiting for a signal at a wait node.
	EventRunWaiting = "run.waiting"
	// EventApprovalRequested: a run started waiting for an approval.
	EventApprovalRequested = "approval.requested"
	// EventTest is a ping sent on request (sendWebhookTestPing); endpoints
	// do not subscribe to it.
	EventTest = "webhook.test"
)

// EventTypes lists the subscribable event types.
var EventTypes = []string{EventRunCompleted, EventRunFailed, EventRunCancelled, EventRunWaiting, EventApprovalRequested}

// Limits of the endpoint API.
const (
	// MaxEndpoints is the most endpoints a tenant may have when its plan
	// says nothing (plans set max_webhook_endpoints).
	MaxEndpoints = 20
	// MaxGrace bounds a rotation's grace period.
	MaxGrace = 7 * 24 * time.Hour
	// DefaultGrace is a rotation's grace period when none is given.
	DefaultGrace = 24 * time.Hour
)

// Endpoint is a tenant's webhook endpoint. Its secrets are never part of
// it: a secret is returned once, by Create or Rotate.
type Endpoint struct {
	ID             uuid.UUID
	URL            string
	Description    string
	EventTypes     []string
	Enabled        bool
	DisabledReason *string
	DisabledAt     *time.Time
	FailingSince   *time.Time
	LastSuccessAt  *time.Time
	CreatedBy      string
	CreatedAt      time.Time
	UpdatedAt      time.Time
	// Secrets are the signing secrets' metadata: the current one and any
	// rotated-out one still in its grace period.
	Secrets []SecretInfo
}

// SecretInfo describes a signing secret without revealing it.
type SecretInfo struct {
	ID        uuid.UUID
	CreatedAt time.Time
	// ExpiresAt is nil for the current secret.
	ExpiresAt *time.Time
}

// Service manages endpoints in tenant transactions.
type Service struct {
	// Keys seals secrets; without it endpoints cannot be created.
	Keys *Keyring
	// Policy refuses endpoint URLs whose host is an address it blocks.
	Policy *ssrf.Policy
	// Dev allows plain-http URLs.
	Dev bool
}

// CreateParams are a new endpoint's settings.
type CreateParams struct {
	URL         string
	Description string
	EventTypes  []string
	CreatedBy   string
}

// UpdateParams change an endpoint; nil fields stay as they are.
type UpdateParams struct {
	URL         *string
	Description *string
	EventTypes  []string
	// Enabled re-enables (resuming paused deliveries) or disables it.
	Enabled *bool
	// By names who changes it (recorded as the disable reason).
	By string
}

func (s Service) checkURL(raw string) (string, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" || len(raw) > 2048 {
		return "", errs.E(errs.Invalid, "url: must be 1 to 2048 characters")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", errs.E(errs.Invalid, "url: not a URL")
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && s.Dev:
	case u.Scheme == "http":
		return "", errs.E(errs.Invalid, "url: must use https (plain http is allowed only in development)")
	default:
		return "", errs.E(errs.Invalid, "url: scheme must be https")
	}
	if u.Host == "" || u.Hostname() == "" {
		return "", errs.E(errs.Invalid, "url: has no host")
	}
	if u.User != nil {
		return "", errs.E(errs.Invalid, "url: must not carry credentials; verify the webhook-signature header instead")
	}
	if u.Fragment != "" {
		return "", errs.E(errs.Invalid, "url: must not have a fragment")
	}
	// Refuse now what delivery would refuse every time: local names, IP
	// literals of any spelling the policy blocks, ports it does not allow.
	if s.Policy != nil && !s.Dev {
		if err := s.Policy.CheckHostName(u.Hostname()); err != nil {
			return "", errs.E(errs.Invalid, "url: %s may not be called: webhooks may only call public addresses", u.Hostname())
		}
		port, err := strconv.Atoi(u.Port())
		if err != nil {
			port = 443
			if u.Scheme == "http" {
				port = 80
			}
		}
		ip, literal := netip.ParseAddr(strings.Trim(u.Hostname(), "[]"))
		if (literal == nil && s.Policy.CheckAddr(ip, port) != nil) || (literal != nil && !s.Policy.PortAllowed(port)) {
			return "", errs.E(errs.Invalid, "url: port %d may not be called (allowed: 80, 443 and the server's COMPOSER_ALLOWED_PORTS)", port)
		}
	}
	if ip, err := netip.ParseAddr(u.Hostname()); err == nil && s.Policy != nil {
		if err := s.Policy.Check(ip); err != nil {
			return "", errs.E(errs.Invalid, "url: %s may not be called: webhooks may only call public addresses", ip)
		}
	}
	return u.String(), nil
}

func checkEventTypes(types []string) ([]string, error) {
	if len(types) == 0 {
		return nil, errs.E(errs.Invalid, "eventTypes: subscribe to at least one of %s", strings.Join(EventTypes, ", "))
	}
	out := make([]string, 0, len(types))
	for _, t := range types {
		if !slices.Contains(EventTypes, t) {
			return nil, errs.E(errs.Invalid, "eventTypes: unknown event type %q (known: %s)", t, strings.Join(EventTypes, ", "))
		}
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return out, nil
}

func checkDescription(d string) error {
	if len(d) > 500 {
		return errs.E(errs.Invalid, "description: at most 500 characters")
	}
	return nil
}

// Create adds an endpoint with a fresh signing secret, returned once.
func (s Service) Create(ctx context.Context, tx *pg.Tx, p CreateParams) (Endpoint, string, error) {
	if s.Keys == nil {
		return Endpoint{}, "", errs.Wrap(errs.Unavailable, ErrNoKeyring, "webhooks are not configured on this server")
	}
	u, err := s.checkURL(p.URL)
	if err != nil {
		return Endpoint{}, "", err
	}
	types, err := checkEventTypes(p.EventTypes)
	if err != nil {
		return Endpoint{}, "", err
	}
	if err := checkDescription(p.Description); err != nil {
		return Endpoint{}, "", err
	}
	// Serialise creates per tenant so the endpoint limit holds (the count
	// is a later statement, so its snapshot sees creates that held the lock).
	if _, err := tx.Exec(ctx, qLockTenantEndpoints, tx.Tenant); err != nil {
		return Endpoint{}, "", fmt.Errorf("lock endpoints: %w", err)
	}
	var n int
	if err := tx.QueryRow(ctx, qCountEndpoints, tx.Tenant).Scan(&n); err != nil {
		return Endpoint{}, "", fmt.Errorf("count endpoints: %w", err)
	}
	l, err := tenants.EffectiveLimits(ctx, tx)
	if err != nil {
		return Endpoint{}, "", err
	}
	if max := cmpOr(l.MaxWebhookEndpoints, MaxEndpoints); n >= max {
		return Endpoint{}, "", errs.E(errs.QuotaExceeded, "a tenant may have at most %d webhook endpoints on its plan", max)
	}
	id := uuid.Must(uuid.NewV7())
	if _, err := tx.Exec(ctx, qInsertEndpoint, tx.Tenant, id, u, p.Description, types, p.CreatedBy); err != nil {
		return Endpoint{}, "", fmt.Errorf("insert endpoint: %w", err)
	}
	secret, err := s.addSecret(ctx, tx, id)
	if err != nil {
		return Endpoint{}, "", err
	}
	e, err := s.Get(ctx, tx, id)
	return e, secret, err
}

func (s Service) addSecret(ctx context.Context, tx *pg.Tx, endpoint uuid.UUID) (string, error) {
	secret, key := webhook.NewSecret()
	sid := uuid.Must(uuid.NewV7())
	if _, err := tx.Exec(ctx, qInsertSecret,
		tx.Tenant, endpoint, sid, s.Keys.Seal(key, tx.Tenant, endpoint, sid)); err != nil {
		return "", fmt.Errorf("insert secret: %w", err)
	}
	return secret, nil
}

// Rotate gives the endpoint a new secret, returned once. The old one keeps
// signing alongside it for grace (0: DefaultGrace; at most MaxGrace), so
// receivers can switch without missing a delivery.
func (s Service) Rotate(ctx context.Context, tx *pg.Tx, id uuid.UUID, grace time.Duration) (Endpoint, string, error) {
	if s.Keys == nil {
		return Endpoint{}, "", errs.Wrap(errs.Unavailable, ErrNoKeyring, "webhooks are not configured on this server")
	}
	if grace < 0 || grace > MaxGrace {
		return Endpoint{}, "", errs.E(errs.Invalid, "graceSeconds: must be between 0 and %d", int(MaxGrace.Seconds()))
	}
	if grace == 0 {
		grace = DefaultGrace
	}
	if err := s.lock(ctx, tx, id); err != nil {
		return Endpoint{}, "", err
	}
	// At most two secrets live: drop every rotated-out one (a rotation
	// during another's grace period ends that grace), end the current
	// one's life after grace, add a new one.
	if _, err := tx.Exec(ctx, qDropExpiredSecrets,
		tx.Tenant, id); err != nil {
		return Endpoint{}, "", fmt.Errorf("drop expired secrets: %w", err)
	}
	if _, err := tx.Exec(ctx, qExpireSecrets, tx.Tenant, id, grace.Seconds()); err != nil {
		return Endpoint{}, "", fmt.Errorf("expire secret: %w", err)
	}
	secret, err := s.addSecret(ctx, tx, id)
	if err != nil {
		return Endpoint{}, "", err
	}
	e, err := s.Get(ctx, tx, id)
	return e, secret, err
}

// lock takes the endpoint's row lock, or answers NOT_FOUND.
func (s Service) lock(ctx context.Context, tx *pg.Tx, id uuid.UUID) error {
	var one int
	err := tx.QueryRow(ctx, qLockEndpoint, tx.Tenant, id).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return errs.E(errs.NotFound, "webhook endpoint %s not found", id)
	}
	if err != nil {
		return fmt.Errorf("lock endpoint: %w", err)
	}
	return nil
}

// Update changes an endpoint. Disabling pauses its pending deliveries;
// enabling clears the disable reason and resumes them.
func (s Service) Update(ctx context.Context, tx *pg.Tx, id uuid.UUID, p UpdateParams) (Endpoint, error) {
	var u *string
	if p.URL != nil {
		v, err := s.checkURL(*p.URL)
		if err != nil {
			return Endpoint{}, err
		}
		u = &v
	}
	var types []string
	if p.EventTypes != nil {
		var err error
		if types, err = checkEventTypes(p.EventTypes); err != nil {
			return Endpoint{}, err
		}
	}
	if p.Description != nil {
		if err := checkDescription(*p.Description); err != nil {
			return Endpoint{}, err
		}
	}
	if err := s.lock(ctx, tx, id); err != nil {
		return Endpoint{}, err
	}
	if _, err := tx.Exec(ctx, qUpdateEndpoint,
		tx.Tenant, id, u, p.Description, types); err != nil {
		return Endpoint{}, fmt.Errorf("update endpoint: %w", err)
	}
	if p.Enabled != nil {
		if err := SetEnabled(ctx, tx, tx.Tenant, id, *p.Enabled, "disabled by "+p.By); err != nil {
			return Endpoint{}, err
		}
	}
	return s.Get(ctx, tx, id)
}

// SetEnabled enables an endpoint (clearing why it was disabled, and
// resuming its paused deliveries) or disables it with a reason (pausing
// them; an attempt in flight finishes, and its outcome pauses it; test
// pings are not paused). Disabling a disabled endpoint keeps the first
// reason.
func SetEnabled(ctx context.Context, tx *pg.Tx, tenant, id uuid.UUID, enabled bool, reason string) error {
	if enabled {
		if _, err := tx.Exec(ctx, qEnableEndpoint, tenant, id); err != nil {
			return fmt.Errorf("enable endpoint: %w", err)
		}
		if _, err := tx.Exec(ctx, qResumeDeliveries, tenant, id); err != nil {
			return fmt.Errorf("resume deliveries: %w", err)
		}
		return nil
	}
	if len(reason) > 1000 {
		reason = reason[:1000]
	}
	if _, err := tx.Exec(ctx, qDisableEndpoint, tenant, id, reason); err != nil {
		return fmt.Errorf("disable endpoint: %w", err)
	}
	if _, err := tx.Exec(ctx, qPauseDeliveries, tenant, id); err != nil {
		return fmt.Errorf("pause deliveries: %w", err)
	}
	return nil
}

// Delete removes an endpoint with its secrets and delivery history.
func (s Service) Delete(ctx context.Context, tx *pg.Tx, id uuid.UUID) error {
	tag, err := tx.Exec(ctx, qDeleteEndpoint, tx.Tenant, id)
	if err != nil {
		return fmt.Errorf("delete endpoint: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return errs.E(errs.NotFound, "webhook endpoint %s not found", id)
	}
	return nil
}

func scanEndpoint(row pgx.Row) (Endpoint, error) {
	var e Endpoint
	var ids []uuid.UUID
	var created []time.Time
	var expires []*time.Time
	err := row.Scan(&e.ID, &e.URL, &e.Description, &e.EventTypes, &e.Enabled, &e.DisabledReason, &e.DisabledAt,
		&e.FailingSince, &e.LastSuccessAt, &e.CreatedBy, &e.CreatedAt, &e.UpdatedAt, &ids, &created, &expires)
	for i := range ids {
		e.Secrets = append(e.Secrets, SecretInfo{ID: ids[i], CreatedAt: created[i], ExpiresAt: expires[i]})
	}
	return e, err
}

// Get returns one endpoint, or NOT_FOUND.
func (s Service) Get(ctx context.Context, tx *pg.Tx, id uuid.UUID) (Endpoint, error) {
	e, err := scanEndpoint(tx.QueryRow(ctx, qGetEndpoint, tx.Tenant, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Endpoint{}, errs.E(errs.NotFound, "webhook endpoint %s not found", id)
	}
	if err != nil {
		return Endpoint{}, fmt.Errorf("read endpoint: %w", err)
	}
	return e, nil
}

// List returns the tenant's endpoints, oldest first.
func (s Service) List(ctx context.Context, tx *pg.Tx) ([]Endpoint, error) {
	rows, err := tx.Query(ctx, qListEndpoints, tx.Tenant)
	if err != nil {
		return nil, fmt.Errorf("list endpoints: %w", err)
	}
	defer rows.Close()
	var out []Endpoint
	for rows.Next() {
		e, err := scanEndpoint(rows)
		if err != nil {
			return nil, fmt.Errorf("list endpoints: %w", err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

func cmpOr(v, d int) int {
	if v <= 0 {
		return d
	}
	return v
}
