package auth

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/obs"
	"github.com/composer-dev/composer/internal/pg"
)

// Authenticator turns a request's credentials into a Principal. Its fields
// are set once before use; then it is safe for concurrent use.
type Authenticator struct {
	// DB reaches PostgreSQL; only its App pool (composer_app) is used.
	DB *pg.DB
	// JWT verifies user tokens; nil rejects every JWT.
	JWT *JWTVerifier
	// Now is the clock API key expiry is checked against; nil is time.Now.
	Now func() time.Time
	// Logger records failures with their reason (never a credential); nil
	// logs nothing.
	Logger *zap.Logger
}

// touchEvery is how often a key's last_used_at is written at most.
const touchEvery = time.Minute

func (a *Authenticator) now() time.Time {
	if a.Now == nil {
		return time.Now()
	}
	return a.Now()
}

func (a *Authenticator) log() *zap.Logger {
	if a.Logger == nil {
		return zap.NewNop()
	}
	return a.Logger
}

// Authenticate resolves an Authorization header value ("Bearer <token>")
// to a principal. Tokens starting with "cmp_" are API keys, anything else
// a JWT. Failures are Unauthenticated, or Unavailable when the database
// cannot answer; their messages never contain the credential.
func (a *Authenticator) Authenticate(ctx context.Context, header string) (Principal, error) {
	token, err := bearerToken(header)
	if err != nil {
		a.failed(ctx, "header", err)
		return Principal{}, err
	}
	if strings.HasPrefix(token, APIKeyPrefix) {
		return a.APIKey(ctx, token)
	}
	return a.Token(ctx, token)
}

func bearerToken(header string) (string, error) {
	if header == "" {
		return "", errs.E(errs.Unauthenticated, "missing credentials: send Authorization: Bearer <token>")
	}
	scheme, token, ok := strings.Cut(header, " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return "", errs.E(errs.Unauthenticated, "unsupported authorization scheme: use Bearer")
	}
	if !ok || token == "" || strings.ContainsFunc(token, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return "", errs.E(errs.Unauthenticated, "malformed Authorization header")
	}
	return token, nil
}

// APIKey authenticates a raw API key. The checksum is verified before any
// database access; the secret's hash is compared in constant time; revoked
// and expired keys fail; a successful use is recorded at most once a minute.
func (a *Authenticator) APIKey(ctx context.Context, raw string) (Principal, error) {
	keyID, secret, err := ParseAPIKey(raw)
	if err != nil {
		a.failed(ctx, "api_key", err)
		return Principal{}, err
	}
	if a.DB == nil {
		return Principal{}, errs.E(errs.Unavailable, "authentication is unavailable")
	}
	rec, err := scanKeyRecord(a.DB.Unscoped().QueryRow(ctx, qKeyLookup, keyID))
	if err != nil {
		if errs.KindOf(err) != errs.Unauthenticated {
			err = errs.Wrap(errs.Unavailable, err, "authentication is unavailable")
		}
		a.failed(ctx, "api_key", err, zap.String("key_id", keyID))
		return Principal{}, err
	}
	var reason string
	now := a.now()
	switch {
	case subtle.ConstantTimeCompare(rec.hash, hashSecret(keyID, secret)) != 1:
		reason = "wrong secret"
	case rec.revokedAt != nil:
		reason = "revoked"
	case rec.expiresAt != nil && !now.Before(*rec.expiresAt):
		reason = "expired"
	}
	if reason != "" {
		err := errs.Wrap(errs.Unauthenticated, errors.New(reason), "invalid API key")
		a.failed(ctx, "api_key", err, zap.String("key_id", keyID), zap.Stringer("tenant_id", rec.tenant))
		return Principal{}, err
	}
	if rec.lastUsedAt == nil || now.Sub(*rec.lastUsedAt) >= touchEvery {
		// The function re-checks the minute on the database clock, so
		// concurrent requests write once; a failed stamp does not fail
		// the request it records.
		if _, err := a.DB.Unscoped().Exec(ctx, qKeyTouch, rec.tenant, keyID); err != nil {
			a.log().Warn("record api key use", append(obs.LogFields(ctx), zap.String("key_id", keyID), zap.Stringer("tenant_id", rec.tenant), zap.Error(err))...)
		}
	}
	p := Principal{TenantID: rec.tenant, Subject: keyID, Kind: KindAPIKey, Scopes: rec.scopes, ExpiresAt: rec.expiresAt}
	a.succeeded(ctx, p)
	return p, nil
}

// Token authenticates a user JWT: the verifier checks the token, then the
// subject must be a member of the claimed tenant with exactly the claimed
// role, read as composer_app in that tenant's scope. A token minted before
// a demotion or removal therefore stops working at once.
func (a *Authenticator) Token(ctx context.Context, token string) (Principal, error) {
	if a.JWT == nil {
		err := errs.Wrap(errs.Unauthenticated, errors.New("no JWT verifier configured"), "invalid token")
		a.failed(ctx, "jwt", err)
		return Principal{}, err
	}
	p, err := a.JWT.Verify(token)
	if err != nil {
		a.failed(ctx, "jwt", err)
		return Principal{}, err
	}
	if a.DB == nil {
		return Principal{}, errs.E(errs.Unavailable, "authentication is unavailable")
	}
	err = a.DB.WithTenant(ctx, p.TenantID, func(ctx context.Context, tx *pg.Tx) error {
		m, err := Members{}.Get(ctx, tx, p.Subject)
		if errs.KindOf(err) == errs.NotFound {
			return errs.E(errs.Unauthenticated, "not a member of this tenant")
		}
		if err != nil {
			return errs.Wrap(errs.Unavailable, err, "authentication is unavailable")
		}
		if m.Role != p.Role {
			return errs.E(errs.Unauthenticated, "the token's role is no longer current; sign in again")
		}
		return nil
	})
	if err != nil {
		if k := errs.KindOf(err); k != errs.Unauthenticated && k != errs.Unavailable {
			err = errs.Wrap(errs.Unavailable, err, "authentication is unavailable")
		}
		a.failed(ctx, "jwt", err, zap.Stringer("tenant_id", p.TenantID), zap.String("subject", p.Subject))
		return Principal{}, err
	}
	a.succeeded(ctx, p)
	return p, nil
}

// failed logs a failure with its reason; only the database being
// unavailable is worth a warning, bad credentials are routine.
func (a *Authenticator) failed(ctx context.Context, method string, err error, fields ...zap.Field) {
	level := zap.InfoLevel
	if errs.KindOf(err) != errs.Unauthenticated {
		level = zap.WarnLevel
	}
	if ce := a.log().Check(level, "authentication failed"); ce != nil {
		ce.Write(append(append(fields, obs.LogFields(ctx)...), zap.String("method", method), zap.String("reason", err.Error()))...)
	}
}

func (a *Authenticator) succeeded(ctx context.Context, p Principal) {
	if ce := a.log().Check(zap.DebugLevel, "authenticated"); ce != nil {
		ce.Write(append(obs.LogFields(ctx), zap.Stringer("tenant_id", p.TenantID), zap.String("subject", p.Subject), zap.String("kind", string(p.Kind)))...)
	}
}

// Middleware authenticates every request from its Authorization header and
// puts the principal in the request context (FromContext). A request that
// fails gets 401 with a JSON error body and WWW-Authenticate: Bearer and
// never reaches next; there is no anonymous or default tenant.
func (a *Authenticator) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var p Principal
		var err error
		if len(r.Header.Values("Authorization")) > 1 {
			err = errs.E(errs.Unauthenticated, "malformed Authorization header")
			a.failed(r.Context(), "header", err)
		} else {
			p, err = a.Authenticate(r.Context(), r.Header.Get("Authorization"))
		}
		if err != nil {
			writeError(w, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(WithPrincipal(r.Context(), p)))
	})
}

// errorBody is the JSON error shape the APIs share.
type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, err error) {
	kind := errs.KindOf(err)
	status := http.StatusInternalServerError
	switch kind {
	case errs.Unauthenticated:
		status = http.StatusUnauthorized
		w.Header().Set("WWW-Authenticate", "Bearer")
	case errs.Unavailable:
		status = http.StatusServiceUnavailable
	}
	var body errorBody
	body.Error.Code, body.Error.Message = string(kind), errs.PublicMessage(err)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}
