// Package webhook signs and verifies Composer's webhook callbacks, which
// follow the Standard Webhooks specification: every request carries
// webhook-id (the same on every retry: deduplicate on it),
// webhook-timestamp and webhook-signature ("v1,<base64 HMAC-SHA256 of
// id.timestamp.body>", several while a rotated secret is in its grace
// period).
//
// A receiver checks a request with Verify. The package depends on the
// standard library only, so a receiver links nothing of the server.
package webhook

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// SecretPrefix starts every signing secret: "whsec_" then the key, base64.
const SecretPrefix = "whsec_"

// secretBytes is the length of a generated key (the spec allows 24–64).
const secretBytes = 32

// DefaultTolerance is how far a webhook-timestamp may be from the
// receiver's clock before Verify refuses it (replay protection).
const DefaultTolerance = 5 * time.Minute

// Errors returned by Verify; wrap-checked with errors.Is.
var (
	ErrMissingHeaders   = errors.New("webhook: missing webhook-id, webhook-timestamp or webhook-signature header")
	ErrInvalidTimestamp = errors.New("webhook: webhook-timestamp is not a unix time")
	ErrTimestampSkew    = errors.New("webhook: webhook-timestamp is outside the tolerance")
	ErrNoMatch          = errors.New("webhook: no signature matches")
	ErrInvalidSecret    = errors.New("webhook: invalid secret")
)

// NewSecret returns a fresh signing secret ("whsec_…") and its key bytes.
func NewSecret() (string, []byte) {
	key := make([]byte, secretBytes)
	if _, err := rand.Read(key); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return SecretPrefix + base64.StdEncoding.EncodeToString(key), key
}

// ParseSecret returns the key bytes of a "whsec_…" secret (the prefix is
// optional).
func ParseSecret(secret string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, SecretPrefix))
	if err != nil || len(key) < 16 {
		return nil, ErrInvalidSecret
	}
	return key, nil
}

// signature is the base64 HMAC-SHA256 of "id.timestamp.body" under key.
func signature(key []byte, id string, ts int64, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write([]byte(strconv.FormatInt(ts, 10)))
	m.Write([]byte{'.'})
	m.Write(body)
	return base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// Sign returns the webhook-signature header value for a message: one
// "v1,<signature>" per key, space-separated (several while a rotated-out
// secret is in its grace period).
func Sign(id string, ts time.Time, body []byte, keys ...[]byte) string {
	sigs := make([]string, len(keys))
	for i, k := range keys {
		sigs[i] = "v1," + signature(k, id, ts.Unix(), body)
	}
	return strings.Join(sigs, " ")
}

// Headers sets the Standard Webhooks headers of a message on h.
func Headers(h http.Header, id string, ts time.Time, body []byte, keys ...[]byte) {
	h.Set("webhook-id", id)
	h.Set("webhook-timestamp", strconv.FormatInt(ts.Unix(), 10))
	h.Set("webhook-signature", Sign(id, ts, body, keys...))
}

// Verify checks a received webhook against the endpoint's secret: the
// headers must be present, the timestamp within DefaultTolerance of now,
// and one of the v1 signatures must match the body. Pass the body exactly
// as received, before any JSON parsing.
//
//	body, _ := io.ReadAll(r.Body)
//	if err := webhook.Verify(os.Getenv("COMPOSER_WEBHOOK_SECRET"), r.Header, body); err != nil {
//		http.Error(w, "bad signature", http.StatusUnauthorized)
//		return
//	}
func Verify(secret string, h http.Header, body []byte) error {
	return Verifier{Secrets: []string{secret}}.Verify(h, body)
}

// Verifier checks webhooks with options: several secrets (a receiver
// mid-rotation), a tolerance and a clock.
type Verifier struct {
	Secrets []string
	// Tolerance defaults to DefaultTolerance.
	Tolerance time.Duration
	// Now defaults to time.Now.
	Now func() time.Time
}

// Verify is the package-level Verify with v's options.
func (v Verifier) Verify(h http.Header, body []byte) error {
	id, tsText, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || tsText == "" || sigs == "" {
		return ErrMissingHeaders
	}
	ts, err := strconv.ParseInt(tsText, 10, 64)
	if err != nil {
		return ErrInvalidTimestamp
	}
	tol, now := v.Tolerance, time.Now
	if tol <= 0 {
		tol = DefaultTolerance
	}
	if v.Now != nil {
		now = v.Now
	}
	if d := now().Sub(time.Unix(ts, 0)); d > tol || d < -tol {
		return fmt.Errorf("%w (%s)", ErrTimestampSkew, d.Round(time.Second))
	}
	for _, s := range v.Secrets {
		key, err := ParseSecret(s)
		if err != nil {
			return err
		}
		want := signature(key, id, ts, body)
		for _, sig := range strings.Fields(sigs) {
			version, value, ok := strings.Cut(sig, ",")
			if ok && version == "v1" && hmac.Equal([]byte(value), []byte(want)) {
				return nil
			}
		}
	}
	return ErrNoMatch
}
