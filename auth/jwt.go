package auth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/uuid"

	"github.com/composer-dev/composer/internal/errs"
)

// Algorithms a verifier may accept; which ones it does accept follows
// from the keys it is given.
const (
	algHS256 = "HS256"
	algRS256 = "RS256"
	algES256 = "ES256"
)

// DefaultLeeway is the clock skew tolerated on exp, nbf and iat.
const DefaultLeeway = 30 * time.Second

// maxTokenLen bounds what is parsed at all; real tokens are far smaller.
const maxTokenLen = 16 << 10

// minHMACSecret is the shortest HS256 secret accepted (RFC 7518 §3.2).
const minHMACSecret = 32

// JWTConfig configures a JWTVerifier. At least one key source is needed;
// each adds its algorithm to the accepted set, and a token signed with any
// other algorithm (none included) is rejected before its key is looked up.
type JWTConfig struct {
	// Issuer and Audience are required, and every token must carry them.
	Issuer   string
	Audience string
	// HS256Secret enables HS256 with this shared secret (development and
	// `composer token`); at least 32 bytes.
	HS256Secret []byte
	// PublicKeysPEM holds PEM blocks (PUBLIC KEY, RSA PUBLIC KEY or
	// CERTIFICATE): RSA keys enable RS256, P-256 keys ES256. They have no
	// key id and are tried for tokens whose kid matches no JWKS key.
	PublicKeysPEM []byte
	// JWKS is a JSON Web Key Set document (the identity provider's
	// jwks_uri content): RSA and P-256 EC signing keys, matched by kid.
	// Keys of other types or uses are ignored.
	JWKS []byte
	// Leeway is the tolerated clock skew; 0 means DefaultLeeway.
	Leeway time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// JWTVerifier checks user tokens: signature, algorithm, exp, nbf, iat, iss
// and aud, and the Composer claims tenant_id and role. It does not check
// membership; Authenticator.JWT does. Safe for concurrent use.
type JWTVerifier struct {
	parser *jwt.Parser
	secret []byte
	keys   []publicKey
}

type publicKey struct {
	kid string
	alg string
	key crypto.PublicKey
}

// Claims are the claims of a Composer user token.
type Claims struct {
	jwt.RegisteredClaims
	TenantID string `json:"tenant_id"`
	Role     string `json:"role"`
}

// NewJWTVerifier returns a verifier for cfg.
func NewJWTVerifier(cfg JWTConfig) (*JWTVerifier, error) {
	if cfg.Issuer == "" || cfg.Audience == "" {
		return nil, errors.New("jwt: issuer and audience are required")
	}
	v := &JWTVerifier{}
	var methods []string
	if cfg.HS256Secret != nil {
		if len(cfg.HS256Secret) < minHMACSecret {
			return nil, fmt.Errorf("jwt: the HS256 secret must be at least %d bytes", minHMACSecret)
		}
		v.secret = append([]byte(nil), cfg.HS256Secret...)
		methods = append(methods, algHS256)
	}
	if len(cfg.PublicKeysPEM) > 0 {
		keys, err := parsePEMKeys(cfg.PublicKeysPEM)
		if err != nil {
			return nil, fmt.Errorf("jwt: public keys: %w", err)
		}
		v.keys = append(v.keys, keys...)
	}
	if len(cfg.JWKS) > 0 {
		keys, err := parseJWKS(cfg.JWKS)
		if err != nil {
			return nil, fmt.Errorf("jwt: %w", err)
		}
		v.keys = append(v.keys, keys...)
	}
	seen := map[string]bool{}
	for _, k := range v.keys {
		if !seen[k.alg] {
			seen[k.alg] = true
			methods = append(methods, k.alg)
		}
	}
	if len(methods) == 0 {
		return nil, errors.New("jwt: no verification key configured")
	}
	leeway := cfg.Leeway
	if leeway == 0 {
		leeway = DefaultLeeway
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	v.parser = jwt.NewParser(
		jwt.WithValidMethods(methods),
		jwt.WithIssuer(cfg.Issuer),
		jwt.WithAudience(cfg.Audience),
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
		jwt.WithLeeway(leeway),
		jwt.WithTimeFunc(now),
	)
	return v, nil
}

// Verify checks token and returns the principal it claims to be. Every
// failure is Unauthenticated with a message that does not echo the token.
func (v *JWTVerifier) Verify(token string) (Principal, error) {
	if len(token) > maxTokenLen {
		return Principal{}, errs.E(errs.Unauthenticated, "invalid token")
	}
	var c Claims
	if _, err := v.parser.ParseWithClaims(token, &c, v.keyFor); err != nil {
		return Principal{}, errs.Wrap(errs.Unauthenticated, err, "invalid token")
	}
	tenant, err := uuid.Parse(c.TenantID)
	if err != nil || tenant == uuid.Nil {
		return Principal{}, errs.E(errs.Unauthenticated, "invalid token: no valid tenant_id claim")
	}
	if c.Subject == "" || len(c.Subject) > 255 {
		return Principal{}, errs.E(errs.Unauthenticated, "invalid token: no valid sub claim")
	}
	role := Role(c.Role)
	if !role.Valid() {
		return Principal{}, errs.E(errs.Unauthenticated, "invalid token: no valid role claim")
	}
	out := Principal{TenantID: tenant, Subject: c.Subject, Kind: KindUser, Role: role}
	if c.ExpiresAt != nil {
		exp := c.ExpiresAt.Time
		out.ExpiresAt = &exp
	}
	return out, nil
}

// keyFor returns the key(s) for a token whose algorithm the parser has
// already checked against the configured ones. Keys are chosen by
// algorithm first, so a key is only ever used with its own algorithm (no
// HS256 with an RSA public key as the secret).
func (v *JWTVerifier) keyFor(t *jwt.Token) (any, error) {
	alg := t.Method.Alg()
	if alg == algHS256 {
		if v.secret == nil {
			return nil, errors.New("HS256 is not configured")
		}
		return v.secret, nil
	}
	kid, _ := t.Header["kid"].(string)
	if kid != "" {
		for _, k := range v.keys {
			if k.kid == kid {
				if k.alg != alg {
					return nil, fmt.Errorf("key %q is not an %s key", kid, alg)
				}
				return k.key, nil
			}
		}
	}
	var set jwt.VerificationKeySet
	for _, k := range v.keys {
		if k.kid == "" && k.alg == alg {
			set.Keys = append(set.Keys, k.key)
		}
	}
	if len(set.Keys) == 0 {
		return nil, fmt.Errorf("no %s key for kid %q", alg, kid)
	}
	return set, nil
}

// jwk is the subset of RFC 7517/7518 fields read for RSA and EC keys.
type jwk struct {
	Kty string `json:"kty"`
	Kid string `json:"kid"`
	Use string `json:"use"`
	Alg string `json:"alg"`
	N   string `json:"n"`
	E   string `json:"e"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Y   string `json:"y"`
}

// parseJWKS reads the RSA (RS256) and P-256 EC (ES256) signing keys of a
// JWKS document. Keys of other types, curves, algorithms or uses are
// skipped, since identity providers publish those too; a malformed RSA or
// EC key, a duplicate kid or a set with no usable key is an error.
func parseJWKS(data []byte) ([]publicKey, error) {
	var doc struct {
		Keys []jwk `json:"keys"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("jwks: %w", err)
	}
	var out []publicKey
	kids := map[string]bool{}
	for i, k := range doc.Keys {
		if k.Use != "" && k.Use != "sig" {
			continue
		}
		var pk publicKey
		var err error
		switch {
		case k.Kty == "RSA" && (k.Alg == "" || k.Alg == algRS256):
			pk, err = rsaJWK(k)
		case k.Kty == "EC" && k.Crv == "P-256" && (k.Alg == "" || k.Alg == algES256):
			pk, err = ecJWK(k)
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("jwks key %d (kid %q): %w", i, k.Kid, err)
		}
		if k.Kid != "" && kids[k.Kid] {
			return nil, fmt.Errorf("jwks: duplicate kid %q", k.Kid)
		}
		kids[k.Kid] = true
		out = append(out, pk)
	}
	if len(out) == 0 {
		return nil, errors.New("jwks: no RSA or P-256 signing key")
	}
	return out, nil
}

func b64(s string) ([]byte, error) {
	return base64.RawURLEncoding.DecodeString(s)
}

func rsaJWK(k jwk) (publicKey, error) {
	n, err := b64(k.N)
	if err != nil || len(n) == 0 {
		return publicKey{}, errors.New("bad modulus")
	}
	e, err := b64(k.E)
	if err != nil || len(e) == 0 || len(e) > 4 {
		return publicKey{}, errors.New("bad exponent")
	}
	pub := &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(new(big.Int).SetBytes(e).Int64())}
	if err := checkRSA(pub); err != nil {
		return publicKey{}, err
	}
	return publicKey{kid: k.Kid, alg: algRS256, key: pub}, nil
}

func checkRSA(pub *rsa.PublicKey) error {
	if pub.N.BitLen() < 2048 {
		return fmt.Errorf("RSA key of %d bits: at least 2048 are required", pub.N.BitLen())
	}
	if pub.E < 3 || pub.E%2 == 0 {
		return errors.New("bad RSA exponent")
	}
	return nil
}

func ecJWK(k jwk) (publicKey, error) {
	x, errX := b64(k.X)
	y, errY := b64(k.Y)
	if errX != nil || errY != nil || len(x) != 32 || len(y) != 32 {
		return publicKey{}, errors.New("bad P-256 coordinates")
	}
	pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), append(append([]byte{4}, x...), y...))
	if err != nil {
		return publicKey{}, fmt.Errorf("bad P-256 point: %w", err)
	}
	return publicKey{kid: k.Kid, alg: algES256, key: pub}, nil
}

// parsePEMKeys reads every PEM block of data as a signing public key.
func parsePEMKeys(data []byte) ([]publicKey, error) {
	var out []publicKey
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		var key any
		var err error
		switch block.Type {
		case "PUBLIC KEY":
			key, err = x509.ParsePKIXPublicKey(block.Bytes)
		case "RSA PUBLIC KEY":
			key, err = x509.ParsePKCS1PublicKey(block.Bytes)
		case "CERTIFICATE":
			var cert *x509.Certificate
			if cert, err = x509.ParseCertificate(block.Bytes); err == nil {
				key = cert.PublicKey
			}
		default:
			return nil, fmt.Errorf("unexpected PEM block %q", block.Type)
		}
		if err != nil {
			return nil, fmt.Errorf("PEM %s: %w", block.Type, err)
		}
		switch k := key.(type) {
		case *rsa.PublicKey:
			if err := checkRSA(k); err != nil {
				return nil, err
			}
			out = append(out, publicKey{alg: algRS256, key: k})
		case *ecdsa.PublicKey:
			if k.Curve != elliptic.P256() {
				return nil, errors.New("only P-256 EC keys are supported")
			}
			out = append(out, publicKey{alg: algES256, key: k})
		default:
			return nil, fmt.Errorf("unsupported public key type %T", key)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM block found")
	}
	return out, nil
}

// MintDevToken signs an HS256 user token for development (`composer
// token`); production tokens come from the identity provider.
func MintDevToken(secret, issuer, audience, tenant, subject, role string, ttl time.Duration) (string, error) {
	if len(secret) < minHMACSecret {
		return "", fmt.Errorf("mint token: the secret must be at least %d bytes", minHMACSecret)
	}
	if issuer == "" || audience == "" || subject == "" || ttl <= 0 {
		return "", errors.New("mint token: issuer, audience, subject and a positive ttl are required")
	}
	if _, err := uuid.Parse(tenant); err != nil {
		return "", fmt.Errorf("mint token: tenant: %w", err)
	}
	if !Role(role).Valid() {
		return "", fmt.Errorf("mint token: unknown role %q", role)
	}
	now := time.Now()
	c := Claims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    issuer,
			Subject:   subject,
			Audience:  jwt.ClaimStrings{audience},
			IssuedAt:  jwt.NewNumericDate(now),
			NotBefore: jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
			ID:        uuid.NewString(),
		},
		TenantID: tenant,
		Role:     role,
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString([]byte(secret))
	if err != nil {
		return "", fmt.Errorf("mint token: %w", err)
	}
	return s, nil
}
