package auth_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/errs"
)

// tamper replaces a token's payload, keeping its header and signature.
func tamper(t *testing.T, token string, c auth.Claims) string {
	t.Helper()
	forged := sign(t, jwt.SigningMethodHS256, []byte(hsSecret), "", c)
	parts, forgedParts := strings.Split(token, "."), strings.Split(forged, ".")
	return parts[0] + "." + forgedParts[1] + "." + parts[2]
}

func noneToken(t *testing.T, c auth.Claims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(jwt.SigningMethodNone, c).SignedString(jwt.UnsafeAllowNoneSignatureType)
	require.NoError(t, err)
	return s
}

// TestJWTVerifierRejectsAttacks verifies without a database: every forged,
// stale or misdirected token is Unauthenticated, and nothing panics.
func TestJWTVerifierRejectsAttacks(t *testing.T) {
	t.Parallel()
	rsa1 := rsaKey1()
	pubPEM := publicPEM(t, &rsa1.PublicKey)
	v, err := auth.NewJWTVerifier(auth.JWTConfig{Issuer: issuer, Audience: audience, PublicKeysPEM: pubPEM})
	require.NoError(t, err)
	tenant := uuid.New()
	valid := claims(tenant, "alice", auth.RoleViewer)
	with := func(edit func(c *auth.Claims)) auth.Claims {
		c := claims(tenant, "alice", auth.RoleViewer)
		edit(&c)
		return c
	}
	rs := func(c auth.Claims) string { return sign(t, jwt.SigningMethodRS256, rsa1, "", c) }

	// The control: the same verifier accepts the genuine token.
	p, err := v.Verify(rs(valid))
	require.NoError(t, err)
	require.NotNil(t, p.ExpiresAt, "the token's exp is kept")
	p.ExpiresAt = nil
	assert.Equal(t, auth.Principal{TenantID: tenant, Subject: "alice", Kind: auth.KindUser, Role: auth.RoleViewer}, p)

	cases := map[string]string{
		"alg none":                             noneToken(t, valid),
		"alg none with empty signature added":  strings.TrimSuffix(noneToken(t, valid), ".") + ".",
		"HS256 signed with the RSA public key": sign(t, jwt.SigningMethodHS256, pubPEM, "", valid),
		"HS256 with a guessed secret":          sign(t, jwt.SigningMethodHS256, []byte(hsSecret), "", valid),
		"RS256 by another key":                 sign(t, jwt.SigningMethodRS256, rsaKey2(), "", valid),
		"RS384 (not configured)":               sign(t, jwt.SigningMethodRS384, rsa1, "", valid),
		"expired":                              rs(with(func(c *auth.Claims) { c.ExpiresAt = jwt.NewNumericDate(time.Now().Add(-time.Minute)) })),
		"no expiry":                            rs(with(func(c *auth.Claims) { c.ExpiresAt = nil })),
		"not yet valid":                        rs(with(func(c *auth.Claims) { c.NotBefore = jwt.NewNumericDate(time.Now().Add(time.Minute)) })),
		"issued in the future":                 rs(with(func(c *auth.Claims) { c.IssuedAt = jwt.NewNumericDate(time.Now().Add(time.Minute)) })),
		"wrong issuer":                         rs(with(func(c *auth.Claims) { c.Issuer = "https://evil.example.test/" })),
		"no issuer":                            rs(with(func(c *auth.Claims) { c.Issuer = "" })),
		"wrong audience":                       rs(with(func(c *auth.Claims) { c.Audience = jwt.ClaimStrings{"another-api"} })),
		"no audience":                          rs(with(func(c *auth.Claims) { c.Audience = nil })),
		"tampered role":                        tamper(t, rs(valid), with(func(c *auth.Claims) { c.Role = "owner" })),
		"tampered tenant":                      tamper(t, rs(valid), with(func(c *auth.Claims) { c.TenantID = uuid.NewString() })),
		"no tenant":                            rs(with(func(c *auth.Claims) { c.TenantID = "" })),
		"nil tenant":                           rs(with(func(c *auth.Claims) { c.TenantID = uuid.Nil.String() })),
		"unknown role":                         rs(with(func(c *auth.Claims) { c.Role = "superuser" })),
		"no subject":                           rs(with(func(c *auth.Claims) { c.Subject = "" })),
		"two segments":                         strings.Join(strings.Split(rs(valid), ".")[:2], "."),
		"garbage":                              "not a token",
		"bad base64 header":                    "%%%." + strings.SplitN(rs(valid), ".", 2)[1],
		"oversized":                            rs(valid) + strings.Repeat("A", 20<<10),
		"header is JSON null":                  base64.RawURLEncoding.EncodeToString([]byte("null")) + ".e30.sig",
	}
	for name, token := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var err error
			assert.NotPanics(t, func() { _, err = v.Verify(token) })
			require.Error(t, err)
			assert.Equal(t, errs.Unauthenticated, errs.KindOf(err), "%v", err)
			assert.NotContains(t, err.Error(), token, "errors never echo the token")
		})
	}
}

func TestJWKSSelectsKeyByKid(t *testing.T) {
	t.Parallel()
	r1, r2, e1 := rsaKey1(), rsaKey2(), ecKey1()
	doc := jwks(t,
		rsaJWK("r1", &r1.PublicKey),
		rsaJWK("r2", &r2.PublicKey),
		ecJWK(t, "e1", &e1.PublicKey),
		map[string]string{"kty": "oct", "kid": "s1", "k": "c2VjcmV0"},             // symmetric: skipped
		map[string]string{"kty": "OKP", "kid": "o1", "crv": "Ed25519", "x": "AA"}, // unsupported: skipped
		func() map[string]string { k := rsaJWK("enc1", &r1.PublicKey); k["use"] = "enc"; return k }(),
	)
	v, err := auth.NewJWTVerifier(auth.JWTConfig{Issuer: issuer, Audience: audience, JWKS: doc})
	require.NoError(t, err)
	c := claims(uuid.New(), "alice", auth.RoleDeveloper)

	cases := []struct {
		name   string
		method jwt.SigningMethod
		key    any
		kid    string
		ok     bool
	}{
		{"RS256 first key", jwt.SigningMethodRS256, r1, "r1", true},
		{"RS256 second key", jwt.SigningMethodRS256, r2, "r2", true},
		{"ES256 key", jwt.SigningMethodES256, e1, "e1", true},
		{"kid of another key", jwt.SigningMethodRS256, r1, "r2", false},
		{"unknown kid", jwt.SigningMethodRS256, r1, "r9", false},
		{"no kid", jwt.SigningMethodRS256, r1, "", false},
		{"RSA kid with ES256", jwt.SigningMethodES256, e1, "r1", false},
		{"EC kid with RS256", jwt.SigningMethodRS256, r1, "e1", false},
		{"encryption key", jwt.SigningMethodRS256, r1, "enc1", false},
		{"symmetric JWK as HS256 secret", jwt.SigningMethodHS256, []byte("secret"), "s1", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, err := v.Verify(sign(t, tc.method, tc.key, tc.kid, c))
			if tc.ok {
				require.NoError(t, err)
				assert.Equal(t, "alice", p.Subject)
				assert.Equal(t, auth.RoleDeveloper, p.Role)
				return
			}
			assert.Equal(t, errs.Unauthenticated, errs.KindOf(err), "%v", err)
		})
	}
}

func TestES256WithPEMKey(t *testing.T) {
	t.Parallel()
	e1 := ecKey1()
	v, err := auth.NewJWTVerifier(auth.JWTConfig{Issuer: issuer, Audience: audience, PublicKeysPEM: publicPEM(t, &e1.PublicKey)})
	require.NoError(t, err)
	tenant := uuid.New()
	p, err := v.Verify(sign(t, jwt.SigningMethodES256, e1, "any-kid", claims(tenant, "bob", auth.RoleAdmin)))
	require.NoError(t, err)
	p.ExpiresAt = nil
	assert.Equal(t, auth.Principal{TenantID: tenant, Subject: "bob", Kind: auth.KindUser, Role: auth.RoleAdmin}, p)

	other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	_, err = v.Verify(sign(t, jwt.SigningMethodES256, other, "", claims(tenant, "bob", auth.RoleAdmin)))
	assert.Equal(t, errs.Unauthenticated, errs.KindOf(err))
}

func TestNewJWTVerifierRejectsBadConfig(t *testing.T) {
	t.Parallel()
	r1 := rsaKey1()
	small, err := rsaKeyOfBits(1024)
	require.NoError(t, err)
	badPoint := ecJWK(t, "e1", &ecKey1().PublicKey)
	badPoint["y"] = badPoint["x"]
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	require.NoError(t, err)
	cases := map[string]auth.JWTConfig{
		"no issuer":            {Audience: audience, HS256Secret: []byte(hsSecret)},
		"no audience":          {Issuer: issuer, HS256Secret: []byte(hsSecret)},
		"no key":               {Issuer: issuer, Audience: audience},
		"short HS256 secret":   {Issuer: issuer, Audience: audience, HS256Secret: []byte("short")},
		"JWKS not JSON":        {Issuer: issuer, Audience: audience, JWKS: []byte("<html>")},
		"JWKS of no use":       {Issuer: issuer, Audience: audience, JWKS: []byte(`{"keys":[{"kty":"oct","k":"AA"}]}`)},
		"JWKS small RSA key":   {Issuer: issuer, Audience: audience, JWKS: jwks(t, rsaJWK("r", &small.PublicKey))},
		"JWKS point off curve": {Issuer: issuer, Audience: audience, JWKS: jwks(t, badPoint)},
		"JWKS duplicate kid":   {Issuer: issuer, Audience: audience, JWKS: jwks(t, rsaJWK("r", &r1.PublicKey), rsaJWK("r", &rsaKey2().PublicKey))},
		"JWKS bad modulus":     {Issuer: issuer, Audience: audience, JWKS: []byte(`{"keys":[{"kty":"RSA","kid":"r","n":"!!","e":"AQAB"}]}`)},
		"PEM garbage":          {Issuer: issuer, Audience: audience, PublicKeysPEM: []byte("not pem")},
		"PEM P-384 key":        {Issuer: issuer, Audience: audience, PublicKeysPEM: publicPEM(t, &p384.PublicKey)},
		"PEM private key":      {Issuer: issuer, Audience: audience, PublicKeysPEM: []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")},
	}
	for name, cfg := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := auth.NewJWTVerifier(cfg)
			assert.Error(t, err)
		})
	}
}

func TestMintDevTokenVerifies(t *testing.T) {
	t.Parallel()
	v, err := auth.NewJWTVerifier(auth.JWTConfig{Issuer: issuer, Audience: audience, HS256Secret: []byte(hsSecret)})
	require.NoError(t, err)
	tenant := uuid.New()
	token, err := auth.MintDevToken(hsSecret, issuer, audience, tenant.String(), "dev@example.test", "developer", time.Hour)
	require.NoError(t, err)
	p, err := v.Verify(token)
	require.NoError(t, err)
	require.NotNil(t, p.ExpiresAt)
	assert.WithinDuration(t, time.Now().Add(time.Hour), *p.ExpiresAt, time.Minute)
	p.ExpiresAt = nil
	assert.Equal(t, auth.Principal{TenantID: tenant, Subject: "dev@example.test", Kind: auth.KindUser, Role: auth.RoleDeveloper}, p)

	_, err = auth.MintDevToken(hsSecret, issuer, audience, tenant.String(), "x", "root", time.Hour)
	assert.Error(t, err, "unknown role")
	_, err = auth.MintDevToken("short", issuer, audience, tenant.String(), "x", "viewer", time.Hour)
	assert.Error(t, err, "short secret")
	_, err = auth.MintDevToken(hsSecret, issuer, audience, "not-a-uuid", "x", "viewer", time.Hour)
	assert.Error(t, err, "bad tenant")

	// A verifier with a different secret rejects it.
	other, err := auth.NewJWTVerifier(auth.JWTConfig{Issuer: issuer, Audience: audience, HS256Secret: []byte(strings.Repeat("x", 32))})
	require.NoError(t, err)
	_, err = other.Verify(token)
	assert.Equal(t, errs.Unauthenticated, errs.KindOf(err))
}
