package app

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/composer-dev/composer/audit"
	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/engine/taskserver"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/tenants"
)

// DevJWTSecret signs user tokens under `composer dev` when none is
// configured. Never use it anywhere else.
const DevJWTSecret = "composer-dev-only-secret-do-not-use-in-production"

// DevWebhookKey seals webhook secrets under `composer dev` when
// COMPOSER_WEBHOOK_SECRET_KEY is unset (32 bytes, base64). Never use it in
// production.
const DevWebhookKey = "Y29tcG9zZXItZGV2LW9ubHktd2ViaG9vay1rZXkhISE="

// DevAuditKey keys the audit chain under `composer dev` (and in tests)
// when COMPOSER_AUDIT_KEY is unset (32 bytes, base64). It is public: a
// chain keyed with it proves nothing. Never use it in production.
const DevAuditKey = "Y29tcG9zZXItZGV2LW9ubHktYXVkaXQtY2hhaW4tayE="

// AuditKeyring builds the audit chain's keyring from COMPOSER_AUDIT_KEY.
// Without one, development mode uses DevAuditKey (with a warning) and
// anything else refuses to start: a chain keyed by nothing outside the
// database can be rewritten by whoever can write the table.
func AuditKeyring(d *Deps) (*audit.Keyring, error) {
	keys := d.Cfg.AuditKeys
	if len(keys) == 0 {
		if !d.Cfg.Dev {
			return nil, errors.New("COMPOSER_AUDIT_KEY is not set: the audit log's chain is keyed by an operator key kept " +
				"outside the database; generate one with `openssl rand -base64 32` (see docs/OPERATIONS.md, \"Audit log\")")
		}
		if d.Log != nil {
			d.Log.Warn("the audit log is keyed with the public development key: set COMPOSER_AUDIT_KEY (openssl rand -base64 32) outside development")
		}
		keys = []string{DevAuditKey}
	}
	k, err := audit.ParseKeyring(keys)
	if err != nil {
		return nil, fmt.Errorf("COMPOSER_AUDIT_KEY: %w", err)
	}
	return k, nil
}

// JWTVerifier builds the user-token verifier from the configuration, or
// returns nil when no key source is configured (then only API keys work).
func JWTVerifier(d *Deps) (*auth.JWTVerifier, error) {
	cfg := auth.JWTConfig{Issuer: d.Cfg.JWTIssuer, Audience: d.Cfg.JWTAudience}
	if d.Cfg.JWTHS256Secret != "" {
		cfg.HS256Secret = []byte(d.Cfg.JWTHS256Secret)
	}
	var err error
	if f := d.Cfg.JWTPublicKeysFile; f != "" {
		if cfg.PublicKeysPEM, err = os.ReadFile(f); err != nil {
			return nil, fmt.Errorf("COMPOSER_JWT_PUBLIC_KEYS_FILE: %w", err)
		}
	}
	if f := d.Cfg.JWKSFile; f != "" {
		if cfg.JWKS, err = os.ReadFile(f); err != nil {
			return nil, fmt.Errorf("COMPOSER_JWKS_FILE: %w", err)
		}
	}
	if cfg.HS256Secret == nil && cfg.PublicKeysPEM == nil && cfg.JWKS == nil {
		return nil, nil
	}
	v, err := auth.NewJWTVerifier(cfg)
	if err != nil {
		return nil, fmt.Errorf("JWT configuration: %w", err)
	}
	return v, nil
}

// Provisioned is a new tenant and its first owner API key (shown once).
type Provisioned struct {
	Tenant tenants.Tenant
	APIKey string
	KeyID  string
}

// ProvisionTenant creates a tenant with a first API key of admin scope:
// what `composer tenants create` prints and how `composer dev` makes its
// demo tenant.
func ProvisionTenant(ctx context.Context, d *Deps, p tenants.CreateParams, createdBy string) (Provisioned, error) {
	var out Provisioned
	t, err := tenants.Create(ctx, d.DB, p, func(ctx context.Context, tx *pg.Tx) error {
		plain, key, err := auth.Keys{}.Create(ctx, tx, "first owner key", []string{auth.ScopeAdmin}, nil, createdBy)
		out.APIKey, out.KeyID = plain, key.KeyID
		return err
	})
	if err != nil {
		return Provisioned{}, err
	}
	out.Tenant = t
	return out, nil
}

// DevToken makes subject a member of tenant with role (if needed) and mints
// an HS256 user token for it. Development only: it needs the HS256 secret.
func DevToken(ctx context.Context, d *Deps, tenant uuid.UUID, subject string, role auth.Role, ttl time.Duration) (string, error) {
	if d.Cfg.JWTHS256Secret == "" {
		return "", errs.E(errs.Invalid, "COMPOSER_JWT_HS256_SECRET is not set: development tokens need it")
	}
	if !role.Valid() {
		return "", errs.E(errs.Invalid, "unknown role %q (owner, admin, developer, viewer)", role)
	}
	err := d.DB.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		m, err := auth.Members{}.Get(ctx, tx, subject)
		switch {
		case errs.KindOf(err) == errs.NotFound:
			_, err = auth.Members{}.Add(ctx, tx, subject, role, "")
			return err
		case err != nil:
			return err
		case m.Role != role:
			_, err = auth.Members{}.ChangeRole(ctx, tx, subject, role)
			return err
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return auth.MintDevToken(d.Cfg.JWTHS256Secret, d.Cfg.JWTIssuer, d.Cfg.JWTAudience, tenant.String(), subject, string(role), ttl)
}

// WorkerAuth authenticates task API callers: platform workers by the shared
// token (compared in constant time against its hash), a tenant's own
// workers by an API key with the worker (or admin) scope, bound to that
// tenant.
//
// A tenant worker authenticates every call — a report per step — so a
// successful key authentication is remembered for workerKeyCacheTTL,
// keyed by the hash of the whole presented key (a wrong secret never
// matches): a revoked key keeps working for at most that long, well
// within a heartbeat interval, and a held poll re-checks its key fresh
// before it leases anything.
func WorkerAuth(platformToken string, authn *auth.Authenticator) taskserver.Authenticator {
	want := sha256.Sum256([]byte(platformToken))
	cache := &keyCache{m: map[[32]byte]cachedCaller{}}
	return func(r *http.Request, fresh bool) (taskserver.Caller, error) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || token == "" {
			return taskserver.Caller{}, errs.E(errs.Unauthenticated, "a worker credential is required (Authorization: Bearer <token>)")
		}
		got := sha256.Sum256([]byte(token))
		if strings.HasPrefix(token, auth.APIKeyPrefix) && authn != nil {
			if c, ok := cache.get(got); ok && !fresh {
				return c, nil
			}
			p, err := authn.APIKey(r.Context(), token)
			if err != nil {
				return taskserver.Caller{}, err
			}
			if !slices.Contains(p.Scopes, auth.ScopeWorker) && !slices.Contains(p.Scopes, auth.ScopeAdmin) {
				return taskserver.Caller{}, errs.E(errs.Forbidden, "this API key lacks the worker scope")
			}
			c := taskserver.Caller{Tenant: p.TenantID, Name: "key:" + p.Subject, KeyID: p.Subject}
			cache.put(got, c)
			return c, nil
		}
		if platformToken == "" || subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			return taskserver.Caller{}, errs.E(errs.Unauthenticated, "invalid worker credential")
		}
		return taskserver.Caller{Platform: true, Name: "platform"}, nil
	}
}

// workerKeyCacheTTL is how long a worker's key authentication is reused.
const workerKeyCacheTTL = time.Second

type keyCache struct {
	mu sync.Mutex
	m  map[[32]byte]cachedCaller
}

type cachedCaller struct {
	c       taskserver.Caller
	expires time.Time
}

func (k *keyCache) get(h [32]byte) (taskserver.Caller, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	e, ok := k.m[h]
	if !ok || time.Now().After(e.expires) {
		return taskserver.Caller{}, false
	}
	return e.c, true
}

func (k *keyCache) put(h [32]byte, c taskserver.Caller) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.m) >= 10_000 {
		clear(k.m) // bounded; a miss only costs a lookup
	}
	k.m[h] = cachedCaller{c: c, expires: time.Now().Add(workerKeyCacheTTL)}
}
