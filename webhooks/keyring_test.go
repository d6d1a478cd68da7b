package webhooks_test

import (
	"crypto/rand"
	"encoding/base64"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/sdk/webhook"
	"github.com/composer-dev/composer/webhooks"
)

func newKey() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.StdEncoding.EncodeToString(b)
}

func TestKeyringSealsPerRowAndRotates(t *testing.T) {
	k1, k2 := newKey(), newKey()
	old, err := webhooks.ParseKeyring([]string{k1})
	require.NoError(t, err)
	_, secret := webhook.NewSecret()
	tn, ep, id := uuid.New(), uuid.New(), uuid.New()
	sealed := old.Seal(secret, tn, ep, id)
	require.NotContains(t, string(sealed), string(secret))

	got, err := old.Open(sealed, tn, ep, id)
	require.NoError(t, err)
	require.Equal(t, secret, got)
	_, err = old.Open(sealed, uuid.New(), ep, id)
	require.Error(t, err, "copied to another tenant's row")
	_, err = old.Open(sealed, tn, ep, uuid.New())
	require.Error(t, err, "copied to another secret row")
	tampered := append([]byte{}, sealed...)
	tampered[len(tampered)-1] ^= 1
	_, err = old.Open(tampered, tn, ep, id)
	require.Error(t, err)

	// A new server key first: new secrets seal under it, old ones still open.
	rotated, err := webhooks.ParseKeyring([]string{k2, k1})
	require.NoError(t, err)
	got, err = rotated.Open(sealed, tn, ep, id)
	require.NoError(t, err)
	require.Equal(t, secret, got)
	_, err = old.Open(rotated.Seal(secret, tn, ep, id), tn, ep, id)
	require.ErrorContains(t, err, "not in COMPOSER_WEBHOOK_SECRET_KEY")

	_, err = webhooks.ParseKeyring([]string{"c2hvcnQ="})
	require.ErrorContains(t, err, "32 bytes")
	_, err = webhooks.ParseKeyring(nil)
	require.ErrorIs(t, err, webhooks.ErrNoKeyring)
}
