package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash/crc32"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/tenants"
)

// API key format: "cmp_" + key id (12 base62) + "_" + secret (40 base62) +
// checksum (6 base62, the CRC32 of everything before it). The key id is
// public (it names the key in listings and logs); the secret carries 238
// bits from crypto/rand and is stored only as a hash.
const (
	APIKeyPrefix    = "cmp_"
	keyIDLen        = 12
	secretLen       = 40
	checksumLen     = 6
	apiKeyLen       = len(APIKeyPrefix) + keyIDLen + 1 + secretLen + checksumLen
	base62          = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	secretHashLabel = "composer api key v1"
)

// APIKeyPattern matches Composer API keys in text, for secret scanners and
// log scrubbers; a match whose checksum verifies (ParseAPIKey) is almost
// certainly a real key.
var APIKeyPattern = regexp.MustCompile(`\bcmp_[0-9A-Za-z]{12}_[0-9A-Za-z]{46}\b`)

// errMalformedKey is the single answer to anything that is not a
// well-formed key, so the caller learns nothing about which part was wrong.
var errMalformedKey = errs.E(errs.Unauthenticated, "invalid API key")

// NewAPIKey returns a new random key, its key id and its secret.
func NewAPIKey() (plaintext, keyID, secret string, err error) {
	if keyID, err = randomBase62(keyIDLen); err != nil {
		return "", "", "", err
	}
	if secret, err = randomBase62(secretLen); err != nil {
		return "", "", "", err
	}
	return formatAPIKey(keyID, secret), keyID, secret, nil
}

// ParseAPIKey splits a key into its key id and secret after checking its
// shape and checksum, so typos and random strings are rejected without a
// database round trip.
func ParseAPIKey(s string) (keyID, secret string, err error) {
	if len(s) != apiKeyLen || !strings.HasPrefix(s, APIKeyPrefix) || s[len(APIKeyPrefix)+keyIDLen] != '_' {
		return "", "", errMalformedKey
	}
	body := s[len(APIKeyPrefix):]
	keyID, rest := body[:keyIDLen], body[keyIDLen+1:]
	if !isBase62(keyID) || !isBase62(rest) {
		return "", "", errMalformedKey
	}
	secret, sum := rest[:secretLen], rest[secretLen:]
	if sum != checksum(s[:len(s)-checksumLen]) {
		return "", "", errMalformedKey
	}
	return keyID, secret, nil
}

func formatAPIKey(keyID, secret string) string {
	s := APIKeyPrefix + keyID + "_" + secret
	return s + checksum(s)
}

// checksum is the CRC32 of s as 6 base62 digits (62^6 > 2^32).
func checksum(s string) string {
	n := crc32.ChecksumIEEE([]byte(s))
	var b [checksumLen]byte
	for i := checksumLen - 1; i >= 0; i-- {
		b[i] = base62[n%62]
		n /= 62
	}
	return string(b[:])
}

func isBase62(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z') {
			return false
		}
	}
	return true
}

// randomBase62 draws n uniform base62 digits, rejecting bytes >= 248 so
// the modulo is unbiased.
func randomBase62(n int) (string, error) {
	out := make([]byte, 0, n)
	buf := make([]byte, n+n/4)
	for len(out) < n {
		if _, err := rand.Read(buf); err != nil {
			return "", fmt.Errorf("random key: %w", err)
		}
		for _, c := range buf {
			if c < 248 && len(out) < n {
				out = append(out, base62[c%62])
			}
		}
	}
	return string(out), nil
}

// hashSecret is what the database stores. A plain SHA-256 suffices: the
// secret has 238 random bits, so there is nothing to brute-force; binding
// the key id makes a hash useless for any other key.
func hashSecret(keyID, secret string) []byte {
	h := sha256.New()
	h.Write([]byte(secretHashLabel))
	h.Write([]byte{0})
	h.Write([]byte(keyID))
	h.Write([]byte{0})
	h.Write([]byte(secret))
	return h.Sum(nil)
}

// Scopes an API key may hold.
const (
	ScopeRunsRead       = "runs:read"
	ScopeRunsWrite      = "runs:write"
	ScopeWorkflowsRead  = "workflows:read"
	ScopeWorkflowsWrite = "workflows:write"
	ScopeKeysManage     = "keys:manage"
	ScopeMembersManage  = "members:manage"
	ScopeWebhooksManage = "webhooks:manage"
	ScopeBillingRead    = "billing:read"
	ScopeWorker         = "worker"
	ScopeEventsWrite    = "events:write"
	// ScopeSecretsManage creates, updates, deletes and lists secrets
	// (never their values).
	ScopeSecretsManage = "secrets:manage"
	// ScopeSecretOutputs reads what steps that use secrets produced
	// (ActionSecretOutputsRead).
	ScopeSecretOutputs = "secrets:outputs"
	// ScopeAdmin grants every action.
	ScopeAdmin = "admin"
)

// AllScopes returns every scope, in a stable order.
func AllScopes() []string {
	return []string{ScopeRunsRead, ScopeRunsWrite, ScopeWorkflowsRead, ScopeWorkflowsWrite, ScopeKeysManage,
		ScopeMembersManage, ScopeWebhooksManage, ScopeBillingRead, ScopeWorker, ScopeEventsWrite, ScopeSecretsManage, ScopeSecretOutputs, ScopeAdmin}
}

// normalizeScopes rejects unknown scopes and returns the rest sorted and
// deduplicated.
func normalizeScopes(scopes []string) ([]string, error) {
	if len(scopes) == 0 {
		return nil, errs.E(errs.Invalid, "an API key needs at least one scope")
	}
	known := AllScopes()
	out := make([]string, 0, len(scopes))
	for _, s := range scopes {
		if !slices.Contains(known, s) {
			return nil, errs.E(errs.Invalid, "unknown scope %q (known: %s)", s, strings.Join(known, ", "))
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// Key is an API key as listed: everything but its secret.
type Key struct {
	ID         uuid.UUID
	KeyID      string
	Name       string
	Scopes     []string
	CreatedBy  string
	CreatedAt  time.Time
	ExpiresAt  *time.Time
	RevokedAt  *time.Time
	LastUsedAt *time.Time
}

// Keys manages a tenant's API keys inside its transaction. The zero value
// is ready to use.
type Keys struct {
	// Logger records creations and revocations (never a secret); nil logs nothing.
	Logger *zap.Logger
	// Now is the clock that expiry times are checked against; nil is time.Now.
	Now func() time.Time
}

func (k Keys) log() *zap.Logger {
	if k.Logger == nil {
		return zap.NewNop()
	}
	return k.Logger
}

func (k Keys) now() time.Time {
	if k.Now == nil {
		return time.Now()
	}
	return k.Now()
}

// Create adds a key to the transaction's tenant and returns its plaintext,
// which is never stored or shown again.
func (k Keys) Create(ctx context.Context, tx *pg.Tx, name string, scopes []string, expiresAt *time.Time, createdBy string) (string, Key, error) {
	name = strings.TrimSpace(name)
	if name == "" || len(name) > 200 || strings.IndexFunc(name, unicode.IsControl) >= 0 {
		return "", Key{}, errs.E(errs.Invalid, "key name must be 1-200 printable characters")
	}
	if createdBy == "" || len(createdBy) > 255 {
		return "", Key{}, errs.E(errs.Invalid, "key creator must be 1-255 characters")
	}
	scopes, err := normalizeScopes(scopes)
	if err != nil {
		return "", Key{}, err
	}
	if expiresAt != nil && !expiresAt.After(k.now()) {
		return "", Key{}, errs.E(errs.Invalid, "expiry must be in the future")
	}
	// Serialise a tenant's creates so the live-key bound holds.
	if _, err := tx.Exec(ctx, qKeyCreateLock, tx.Tenant); err != nil {
		return "", Key{}, fmt.Errorf("create api key: %w", err)
	}
	l, err := tenants.EffectiveLimits(ctx, tx)
	if err != nil {
		return "", Key{}, err
	}
	var live int
	if err := tx.QueryRow(ctx, qKeyCountLive, tx.Tenant).Scan(&live); err != nil {
		return "", Key{}, fmt.Errorf("create api key: %w", err)
	}
	if l.MaxAPIKeys > 0 && live >= l.MaxAPIKeys {
		return "", Key{}, errs.E(errs.QuotaExceeded, "the tenant has %d live API keys, the most its plan allows; revoke one first", live)
	}
	plaintext, keyID, secret, err := NewAPIKey()
	if err != nil {
		return "", Key{}, err
	}
	key := Key{ID: uuid.Must(uuid.NewV7()), KeyID: keyID, Name: name, Scopes: scopes, CreatedBy: createdBy, ExpiresAt: expiresAt}
	err = tx.QueryRow(ctx, qKeyInsert, tx.Tenant, key.ID, keyID, name, scopes, hashSecret(keyID, secret), createdBy, expiresAt).
		Scan(&key.CreatedAt)
	if err != nil {
		return "", Key{}, fmt.Errorf("create api key: %w", err)
	}
	k.log().Info("api key created", zap.Stringer("tenant_id", tx.Tenant), zap.String("key_id", keyID),
		zap.String("name", name), zap.Strings("scopes", scopes), zap.String("created_by", createdBy))
	return plaintext, key, nil
}

// List returns up to limit of the tenant's keys, oldest first (ids are
// UUIDv7), after the key of id after (nil: from the first), revoked ones
// included.
func (k Keys) List(ctx context.Context, tx *pg.Tx, limit int, after *uuid.UUID) ([]Key, error) {
	rows, err := tx.Query(ctx, qKeyList, tx.Tenant, limit, after)
	if err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Key, error) { return scanKey(r) })
	if err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	return keys, nil
}

// Get returns one of the tenant's keys (NotFound when it has none of that
// id).
func (k Keys) Get(ctx context.Context, tx *pg.Tx, id uuid.UUID) (Key, error) {
	key, err := scanKey(tx.QueryRow(ctx, qKeyGet, tx.Tenant, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Key{}, errs.E(errs.NotFound, "API key %s not found", id)
	}
	if err != nil {
		return Key{}, fmt.Errorf("get api key %s: %w", id, err)
	}
	return key, nil
}

func scanKey(r pgx.Row) (Key, error) {
	var key Key
	err := r.Scan(&key.ID, &key.KeyID, &key.Name, &key.Scopes, &key.CreatedBy, &key.CreatedAt,
		&key.ExpiresAt, &key.RevokedAt, &key.LastUsedAt)
	return key, err
}

// Revoke revokes a key of the tenant; the next request with it fails.
// Revoking a revoked key changes nothing.
func (k Keys) Revoke(ctx context.Context, tx *pg.Tx, id uuid.UUID) error {
	tag, err := tx.Exec(ctx, qKeyRevoke, tx.Tenant, id)
	if err != nil {
		return fmt.Errorf("revoke api key %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return errs.E(errs.NotFound, "API key %s not found", id)
	}
	k.log().Info("api key revoked", zap.Stringer("tenant_id", tx.Tenant), zap.Stringer("api_key_id", id))
	return nil
}

// keyRecord is what the lookup function returns for a key id.
type keyRecord struct {
	tenant     uuid.UUID
	id         uuid.UUID
	hash       []byte
	scopes     []string
	expiresAt  *time.Time
	revokedAt  *time.Time
	lastUsedAt *time.Time
}

func scanKeyRecord(row pgx.Row) (keyRecord, error) {
	var r keyRecord
	err := row.Scan(&r.tenant, &r.id, &r.hash, &r.scopes, &r.expiresAt, &r.revokedAt, &r.lastUsedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, errs.Wrap(errs.Unauthenticated, errors.New("unknown key id"), "invalid API key")
	}
	return r, err
}
