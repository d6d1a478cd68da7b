package secrets

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/composer-dev/composer/engine/dag"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/webhooks"
)

// Bounds of the store.
const (
	// MaxSecrets is the most secrets a tenant may hold.
	MaxSecrets = 100
	// MaxValueBytes bounds a value.
	MaxValueBytes = 16 << 10
	// KeptVersions is how many versions of a secret are kept (the current
	// one and those before it); older ones are deleted with their sealed
	// values when a new one is set.
	KeptVersions = 10
	// MaxAuditPage bounds a page of the audit log.
	MaxAuditPage = 100
)

// Audit actions.
const (
	ActionCreate = "create"
	ActionUpdate = "update"
	ActionDelete = "delete"
)

// Secret describes a secret without its value.
type Secret struct {
	ID        uuid.UUID
	Name      string
	Version   int
	CreatedBy string
	CreatedAt time.Time
	UpdatedAt time.Time
	// Versions are the kept versions, newest first.
	Versions []Version
}

// Version is one kept version of a secret, without its value.
type Version struct {
	Version   int
	CreatedBy string
	CreatedAt time.Time
}

// AuditEntry is one change of a secret.
type AuditEntry struct {
	ID         uuid.UUID
	At         time.Time
	Principal  string
	Action     string
	SecretName string
	Version    int
}

// Service manages secrets in tenant transactions.
type Service struct {
	// Keys seals values; without it secrets cannot be set or read.
	Keys *webhooks.Keyring
}

func (s Service) keys() error {
	if s.Keys == nil {
		return errs.Wrap(errs.Unavailable, webhooks.ErrNoKeyring, "secrets are not configured on this server (COMPOSER_WEBHOOK_SECRET_KEY)")
	}
	return nil
}

func invalid(field, format string, args ...any) error {
	e := errs.E(errs.Invalid, "%s: "+format, append([]any{field}, args...)...)
	e.Fields = []errs.Field{{Field: field, Message: e.Message}}
	return e
}

// checkName refuses a name steps could not reference as secrets.NAME.
func checkName(name string) error {
	if !dag.ValidSecretName(name) {
		return invalid("name", "must be 1-64 letters, digits and _, not starting with a digit")
	}
	return nil
}

// checkValue refuses a value out of bounds. The message never repeats the
// value.
func checkValue(v string) error {
	switch {
	case v == "":
		return invalid("value", "must not be empty")
	case len(v) > MaxValueBytes:
		return invalid("value", "is %d bytes; at most %d", len(v), MaxValueBytes)
	case !utf8.ValidString(v):
		return invalid("value", "must be UTF-8 text")
	}
	for _, r := range v {
		if r == 0 {
			return invalid("value", "must not contain NUL")
		}
	}
	return nil
}

// checkSet refuses a set this server cannot seal, or of a bad name or
// value.
func (s Service) checkSet(name, value string) error {
	if err := s.keys(); err != nil {
		return err
	}
	if err := checkName(name); err != nil {
		return err
	}
	return checkValue(value)
}

// Create adds a secret at version 1. A name already taken is CONFLICT.
func (s Service) Create(ctx context.Context, tx *pg.Tx, name, value, by string) (Secret, error) {
	if err := s.checkSet(name, value); err != nil {
		return Secret{}, err
	}
	// Serialise creates per tenant so the count holds (the count is a
	// later statement, so its snapshot sees creates that held the lock).
	if _, err := tx.Exec(ctx, qLockTenantSecrets, tx.Tenant); err != nil {
		return Secret{}, fmt.Errorf("lock secrets: %w", err)
	}
	var n int
	if err := tx.QueryRow(ctx, qCountSecrets, tx.Tenant).Scan(&n); err != nil {
		return Secret{}, fmt.Errorf("count secrets: %w", err)
	}
	if n >= MaxSecrets {
		return Secret{}, errs.E(errs.QuotaExceeded, "a tenant may have at most %d secrets", MaxSecrets)
	}
	id := uuid.Must(uuid.NewV7())
	tag, err := tx.Exec(ctx, qInsertSecret, tx.Tenant, id, name, by)
	if err != nil {
		return Secret{}, fmt.Errorf("insert secret: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return Secret{}, errs.E(errs.Conflict, "a secret named %s exists; updateSecret sets a new version", name)
	}
	if err := s.addVersion(ctx, tx, id, 1, value, by); err != nil {
		return Secret{}, err
	}
	if err := audit(ctx, tx, by, ActionCreate, name, 1); err != nil {
		return Secret{}, err
	}
	return Get(ctx, tx, name)
}

// Update sets a new version of an existing secret (NOT_FOUND otherwise);
// steps executing from then on read it.
func (s Service) Update(ctx context.Context, tx *pg.Tx, name, value, by string) (Secret, error) {
	if err := s.checkSet(name, value); err != nil {
		return Secret{}, err
	}
	var id uuid.UUID
	var cur int
	err := tx.QueryRow(ctx, qLockSecret, tx.Tenant, name).Scan(&id, &cur)
	if errors.Is(err, pgx.ErrNoRows) {
		return Secret{}, notFound(name)
	}
	if err != nil {
		return Secret{}, fmt.Errorf("lock secret: %w", err)
	}
	next := cur + 1
	if err := s.addVersion(ctx, tx, id, next, value, by); err != nil {
		return Secret{}, err
	}
	if _, err := tx.Exec(ctx, qBumpSecret, tx.Tenant, id, next); err != nil {
		return Secret{}, fmt.Errorf("set current version: %w", err)
	}
	if _, err := tx.Exec(ctx, qPruneVersions, tx.Tenant, id, next-KeptVersions); err != nil {
		return Secret{}, fmt.Errorf("prune versions: %w", err)
	}
	if err := audit(ctx, tx, by, ActionUpdate, name, next); err != nil {
		return Secret{}, err
	}
	return Get(ctx, tx, name)
}

func (s Service) addVersion(ctx context.Context, tx *pg.Tx, secret uuid.UUID, version int, value, by string) error {
	vid := uuid.Must(uuid.NewV7())
	sealed := s.Keys.Seal([]byte(value), tx.Tenant, secret, vid)
	if _, err := tx.Exec(ctx, qInsertValue, tx.Tenant, secret, version, vid, sealed, by); err != nil {
		return fmt.Errorf("insert secret version: %w", err)
	}
	return nil
}

// Delete removes a secret with every version. Steps that reference it
// fail from then on.
func Delete(ctx context.Context, tx *pg.Tx, name, by string) error {
	if err := checkName(name); err != nil {
		return err
	}
	var last int
	err := tx.QueryRow(ctx, qDeleteSecret, tx.Tenant, name).Scan(&last)
	if errors.Is(err, pgx.ErrNoRows) {
		return notFound(name)
	}
	if err != nil {
		return fmt.Errorf("delete secret: %w", err)
	}
	return audit(ctx, tx, by, ActionDelete, name, last)
}

func audit(ctx context.Context, tx *pg.Tx, by, action, name string, version int) error {
	if _, err := tx.Exec(ctx, qInsertAudit, tx.Tenant, uuid.Must(uuid.NewV7()), by, action, name, version); err != nil {
		return fmt.Errorf("audit secret change: %w", err)
	}
	return nil
}

func notFound(name string) error { return errs.E(errs.NotFound, "secret %s not found", name) }

func scanSecret(row pgx.Row) (Secret, error) {
	var s Secret
	var versions []int32
	var by []string
	var at []time.Time
	if err := row.Scan(&s.ID, &s.Name, &s.Version, &s.CreatedBy, &s.CreatedAt, &s.UpdatedAt, &versions, &by, &at); err != nil {
		return Secret{}, err
	}
	for i := range versions {
		s.Versions = append(s.Versions, Version{Version: int(versions[i]), CreatedBy: by[i], CreatedAt: at[i]})
	}
	return s, nil
}

// Get describes one secret, or NOT_FOUND.
func Get(ctx context.Context, tx *pg.Tx, name string) (Secret, error) {
	if !dag.ValidSecretName(name) {
		return Secret{}, notFound(name)
	}
	s, err := scanSecret(tx.QueryRow(ctx, qGetSecret, tx.Tenant, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return Secret{}, notFound(name)
	}
	if err != nil {
		return Secret{}, fmt.Errorf("read secret: %w", err)
	}
	return s, nil
}

// List describes the tenant's secrets (at most MaxSecrets), by name.
func List(ctx context.Context, tx *pg.Tx) ([]Secret, error) {
	rows, err := tx.Query(ctx, qListSecrets, tx.Tenant)
	if err != nil {
		return nil, fmt.Errorf("list secrets: %w", err)
	}
	defer rows.Close()
	var out []Secret
	for rows.Next() {
		s, err := scanSecret(rows)
		if err != nil {
			return nil, fmt.Errorf("list secrets: %w", err)
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// Audit lists changes, newest first: of one secret when name is not
// empty, older than before when it is not nil; first is at most
// MaxAuditPage.
func Audit(ctx context.Context, tx *pg.Tx, name string, first int, before *uuid.UUID) ([]AuditEntry, error) {
	if first < 1 || first > MaxAuditPage {
		return nil, invalid("first", "must be between 1 and %d", MaxAuditPage)
	}
	var n *string
	if name != "" {
		n = &name
	}
	rows, err := tx.Query(ctx, qAudit, tx.Tenant, n, before, first)
	if err != nil {
		return nil, fmt.Errorf("read secret audit: %w", err)
	}
	defer rows.Close()
	var out []AuditEntry
	for rows.Next() {
		var e AuditEntry
		if err := rows.Scan(&e.ID, &e.At, &e.Principal, &e.Action, &e.SecretName, &e.Version); err != nil {
			return nil, fmt.Errorf("read secret audit: %w", err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}
