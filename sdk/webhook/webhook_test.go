package webhook_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/sdk/webhook"
)

// specSign is a second implementation written from the Standard Webhooks
// specification: signed content is "{id}.{timestamp}.{body}", the key is
// the base64 part of the secret after "whsec_", the signature is
// base64(HMAC-SHA256), prefixed "v1,".
func specSign(secret, id string, ts int64, body string) string {
	key, err := base64.StdEncoding.DecodeString(strings.Split(secret, "_")[1])
	if err != nil {
		panic(err)
	}
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s.%d.%s", id, ts, body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

func TestSignatureMatchesTheSpecVector(t *testing.T) {
	// The example of the Standard Webhooks specification and its reference
	// libraries.
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	const id, ts, body = "msg_p5jXN8AQM9LWM0D4loKWxJek", int64(1614265330), `{"test": 2432232314}`
	const want = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	key, err := webhook.ParseSecret(secret)
	require.NoError(t, err)
	require.Equal(t, want, webhook.Sign(id, time.Unix(ts, 0), []byte(body), key))
	require.Equal(t, want, specSign(secret, id, ts, body))

	h := http.Header{}
	h.Set("webhook-id", id)
	h.Set("webhook-timestamp", fmt.Sprint(ts))
	h.Set("webhook-signature", want)
	v := webhook.Verifier{Secrets: []string{secret}, Now: func() time.Time { return time.Unix(ts+10, 0) }}
	require.NoError(t, v.Verify(h, []byte(body)))
}

func TestSignatureAgreesWithTheSpecOnRandomMessages(t *testing.T) {
	for i := range 200 {
		secret, key := webhook.NewSecret()
		require.True(t, strings.HasPrefix(secret, "whsec_"))
		id := fmt.Sprintf("msg_%d", i)
		ts := time.Unix(1_700_000_000+int64(i)*7919, 0)
		body := strings.Repeat(fmt.Sprintf(`{"n":%d,"s":"ü"}`, i), i%5+1)
		require.Equal(t, specSign(secret, id, ts.Unix(), body), webhook.Sign(id, ts, []byte(body), key))
	}
}

func headers(id string, ts time.Time, body []byte, keys ...[]byte) http.Header {
	h := http.Header{}
	webhook.Headers(h, id, ts, body, keys...)
	return h
}

func TestRotationSignsWithBothSecretsAndEitherVerifies(t *testing.T) {
	oldSecret, oldKey := webhook.NewSecret()
	newSecret, newKey := webhook.NewSecret()
	otherSecret, _ := webhook.NewSecret()
	body := []byte(`{"type":"run.completed"}`)
	now := time.Now()
	h := headers("msg_1", now, body, newKey, oldKey)

	sigs := strings.Fields(h.Get("webhook-signature"))
	require.Len(t, sigs, 2)
	require.Equal(t, specSign(newSecret, "msg_1", now.Unix(), string(body)), sigs[0])
	require.Equal(t, specSign(oldSecret, "msg_1", now.Unix(), string(body)), sigs[1])

	require.NoError(t, webhook.Verify(oldSecret, h, body), "a receiver still on the old secret")
	require.NoError(t, webhook.Verify(newSecret, h, body), "a receiver already on the new one")
	require.ErrorIs(t, webhook.Verify(otherSecret, h, body), webhook.ErrNoMatch)
	require.NoError(t, webhook.Verifier{Secrets: []string{otherSecret, newSecret}}.Verify(h, body))
}

func TestVerifyRefuses(t *testing.T) {
	secret, key := webhook.NewSecret()
	body := []byte(`{"a":1}`)
	now := time.Unix(1_800_000_000, 0)
	at := func(d time.Duration) webhook.Verifier {
		return webhook.Verifier{Secrets: []string{secret}, Now: func() time.Time { return now.Add(d) }}
	}
	good := headers("msg_x", now, body, key)

	require.NoError(t, at(4*time.Minute).Verify(good, body), "within the 5 minute tolerance")
	require.NoError(t, at(-4*time.Minute).Verify(good, body), "a receiver clock behind the sender's")
	require.ErrorIs(t, at(6*time.Minute).Verify(good, body), webhook.ErrTimestampSkew, "a replay")
	require.ErrorIs(t, at(-6*time.Minute).Verify(good, body), webhook.ErrTimestampSkew, "from the future")
	require.NoError(t, webhook.Verifier{Secrets: []string{secret}, Tolerance: time.Hour,
		Now: func() time.Time { return now.Add(30 * time.Minute) }}.Verify(good, body))

	require.ErrorIs(t, at(0).Verify(good, []byte(`{"a":2}`)), webhook.ErrNoMatch, "a changed body")
	moved := good.Clone()
	moved.Set("webhook-id", "msg_y")
	require.ErrorIs(t, at(0).Verify(moved, body), webhook.ErrNoMatch, "another message's signature")
	shifted := good.Clone()
	shifted.Set("webhook-timestamp", fmt.Sprint(now.Unix()+1))
	require.ErrorIs(t, at(0).Verify(shifted, body), webhook.ErrNoMatch, "a changed timestamp")
	v2 := good.Clone()
	v2.Set("webhook-signature", strings.Replace(good.Get("webhook-signature"), "v1,", "v2,", 1))
	require.ErrorIs(t, at(0).Verify(v2, body), webhook.ErrNoMatch, "an unknown signature version")
	for _, name := range []string{"webhook-id", "webhook-timestamp", "webhook-signature"} {
		h := good.Clone()
		h.Del(name)
		require.ErrorIs(t, at(0).Verify(h, body), webhook.ErrMissingHeaders, name)
	}
	bad := good.Clone()
	bad.Set("webhook-timestamp", "yesterday")
	require.ErrorIs(t, at(0).Verify(bad, body), webhook.ErrInvalidTimestamp)
	require.ErrorIs(t, webhook.Verifier{Secrets: []string{"whsec_not base64!"}, Now: func() time.Time { return now }}.Verify(good, body),
		webhook.ErrInvalidSecret)
}
