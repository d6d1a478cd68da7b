package auth_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/tenants"
)

const (
	issuer   = "https://id.example.test/"
	audience = "composer-api"
	hsSecret = "development-secret-of-at-least-32-bytes!"
)

// Keys are generated once per test binary: RSA generation is slow under -race.
var (
	rsaKey1 = sync.OnceValue(func() *rsa.PrivateKey { return mustRSA() })
	rsaKey2 = sync.OnceValue(func() *rsa.PrivateKey { return mustRSA() })
	ecKey1  = sync.OnceValue(func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			panic(err)
		}
		return k
	})
)

func mustRSA() *rsa.PrivateKey {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	return k
}

func publicPEM(t *testing.T, pub any) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

func b64u(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func rsaJWK(kid string, k *rsa.PublicKey) map[string]string {
	return map[string]string{"kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256",
		"n": b64u(k.N.Bytes()), "e": b64u([]byte{1, 0, 1})}
}

func ecJWK(t *testing.T, kid string, k *ecdsa.PublicKey) map[string]string {
	t.Helper()
	raw, err := k.Bytes() // 0x04 || X || Y
	require.NoError(t, err)
	return map[string]string{"kty": "EC", "kid": kid, "crv": "P-256", "x": b64u(raw[1:33]), "y": b64u(raw[33:])}
}

func jwks(t *testing.T, keys ...map[string]string) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"keys": keys})
	require.NoError(t, err)
	return b
}

// claims returns valid claims for a member token.
func claims(tenant uuid.UUID, subject string, role auth.Role) auth.Claims {
	now := time.Now()
	return auth.Claims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    issuer,
			Subject:   subject,
			Audience:  jwt.ClaimStrings{audience},
			IssuedAt:  jwt.NewNumericDate(now),
			NotBefore: jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(time.Hour)),
		},
		TenantID: tenant.String(),
		Role:     string(role),
	}
}

func sign(t *testing.T, method jwt.SigningMethod, key any, kid string, c auth.Claims) string {
	t.Helper()
	tok := jwt.NewWithClaims(method, c)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	require.NoError(t, err)
	return s
}

// fixture is a migrated database with two tenants.
type fixture struct {
	env  *testenv.Env
	db   *pg.DB
	a, b uuid.UUID
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	env := testenv.NewPG(t)
	db := pg.New(env.App, env.System, false)
	f := &fixture{env: env, db: db}
	f.a = f.tenant(t, "a")
	f.b = f.tenant(t, "b")
	return f
}

func (f *fixture) tenant(t *testing.T, name string) uuid.UUID {
	t.Helper()
	tn, err := tenants.Create(context.Background(), f.db, tenants.CreateParams{Name: name})
	require.NoError(t, err)
	return tn.ID
}

// in runs fn in a transaction of tenant and requires it to succeed.
func (f *fixture) in(t *testing.T, tenant uuid.UUID, fn func(ctx context.Context, tx *pg.Tx) error) {
	t.Helper()
	require.NoError(t, f.db.WithTenant(context.Background(), tenant, fn))
}

func (f *fixture) member(t *testing.T, tenant uuid.UUID, subject string, role auth.Role) {
	t.Helper()
	f.in(t, tenant, func(ctx context.Context, tx *pg.Tx) error {
		_, err := auth.Members{}.Add(ctx, tx, subject, role, "")
		return err
	})
}

func (f *fixture) key(t *testing.T, tenant uuid.UUID, scopes []string, expiresAt *time.Time) (string, auth.Key) {
	t.Helper()
	var plaintext string
	var key auth.Key
	f.in(t, tenant, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		plaintext, key, err = auth.Keys{}.Create(ctx, tx, "ci", scopes, expiresAt, "user-1")
		return err
	})
	return plaintext, key
}

func rsaKeyOfBits(bits int) (*rsa.PrivateKey, error) { return rsa.GenerateKey(rand.Reader, bits) }
