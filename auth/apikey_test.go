package auth_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
)

func TestAPIKeyFormatRoundTrips(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 100 {
		plaintext, keyID, secret, err := auth.NewAPIKey()
		require.NoError(t, err)
		assert.True(t, strings.HasPrefix(plaintext, "cmp_"+keyID+"_"+secret), "prefix, key id, then secret")
		assert.Len(t, secret, 40)
		assert.True(t, auth.APIKeyPattern.MatchString("token="+plaintext+"\n"), "scanners find it in text")
		gotID, gotSecret, err := auth.ParseAPIKey(plaintext)
		require.NoError(t, err)
		assert.Equal(t, keyID, gotID)
		assert.Equal(t, secret, gotSecret)
		assert.False(t, seen[secret], "secrets are unique")
		seen[secret] = true
	}
}

func TestParseAPIKeyRejectsTyposAndRandomStrings(t *testing.T) {
	t.Parallel()
	good, _, _, err := auth.NewAPIKey()
	require.NoError(t, err)
	swap := func(i int) string {
		b := []byte(good)
		if b[i] == 'a' {
			b[i] = 'b'
		} else {
			b[i] = 'a'
		}
		return string(b)
	}
	// Transpose the first two different adjacent characters of the secret.
	i := 30
	for good[i] == good[i+1] {
		i++
	}
	transposed := good[:i] + good[i+1:i+2] + good[i:i+1] + good[i+2:]
	cases := map[string]string{
		"empty":              "",
		"prefix only":        "cmp_",
		"random string":      "cmp_" + strings.Repeat("x", len(good)-4),
		"typo in key id":     swap(6),
		"typo in secret":     swap(30),
		"typo in checksum":   swap(len(good) - 1),
		"truncated":          good[:len(good)-1],
		"extended":           good + "0",
		"wrong prefix":       "cmq_" + good[4:],
		"missing separator":  strings.Replace(good, "_", "", 2),
		"non-base62 byte":    good[:20] + "-" + good[21:],
		"transposed secret":  transposed,
		"jwt-looking string": "eyJhbGciOiJIUzI1NiJ9.e30.sig",
	}
	for name, s := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if s == good {
				t.Fatalf("case %q did not change the key", name)
			}
			_, _, err := auth.ParseAPIKey(s)
			require.Error(t, err)
			assert.Equal(t, errs.Unauthenticated, errs.KindOf(err))
			assert.Equal(t, "invalid API key", errs.PublicMessage(err), "one answer for every malformed key")
		})
	}
}

func TestKeysCreateListRevoke(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	expires := time.Now().Add(24 * time.Hour).Truncate(time.Microsecond)
	var plaintext string
	var created auth.Key
	f.in(t, f.a, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		plaintext, created, err = auth.Keys{}.Create(ctx, tx, " deploy bot ", []string{"runs:write", "runs:read", "runs:read"}, &expires, "user-1")
		return err
	})
	keyID, _, err := auth.ParseAPIKey(plaintext)
	require.NoError(t, err)
	assert.Equal(t, keyID, created.KeyID)
	assert.Equal(t, "deploy bot", created.Name)
	assert.Equal(t, []string{"runs:read", "runs:write"}, created.Scopes, "sorted and deduplicated")

	var listed []auth.Key
	f.in(t, f.a, func(ctx context.Context, tx *pg.Tx) error {
		listed, err = auth.Keys{}.List(ctx, tx, 1000, nil)
		return err
	})
	require.Len(t, listed, 1)
	assert.Equal(t, created.ID, listed[0].ID)
	assert.Equal(t, created.KeyID, listed[0].KeyID)
	assert.Equal(t, "user-1", listed[0].CreatedBy)
	require.NotNil(t, listed[0].ExpiresAt)
	assert.True(t, expires.Equal(*listed[0].ExpiresAt))
	assert.Nil(t, listed[0].RevokedAt)

	// Another tenant neither sees nor revokes it.
	require.NoError(t, f.db.WithTenant(ctx, f.b, func(ctx context.Context, tx *pg.Tx) error {
		keys, err := auth.Keys{}.List(ctx, tx, 1000, nil)
		assert.Empty(t, keys)
		return err
	}))
	err = f.db.WithTenant(ctx, f.b, func(ctx context.Context, tx *pg.Tx) error {
		return auth.Keys{}.Revoke(ctx, tx, created.ID)
	})
	assert.Equal(t, errs.NotFound, errs.KindOf(err))

	f.in(t, f.a, func(ctx context.Context, tx *pg.Tx) error { return auth.Keys{}.Revoke(ctx, tx, created.ID) })
	f.in(t, f.a, func(ctx context.Context, tx *pg.Tx) error {
		listed, err = auth.Keys{}.List(ctx, tx, 1000, nil)
		return err
	})
	require.NotNil(t, listed[0].RevokedAt)
	first := *listed[0].RevokedAt
	f.in(t, f.a, func(ctx context.Context, tx *pg.Tx) error { return auth.Keys{}.Revoke(ctx, tx, created.ID) })
	f.in(t, f.a, func(ctx context.Context, tx *pg.Tx) error {
		listed, err = auth.Keys{}.List(ctx, tx, 1000, nil)
		return err
	})
	assert.True(t, first.Equal(*listed[0].RevokedAt), "revoking again keeps the first revocation time")

	err = f.db.WithTenant(ctx, f.a, func(ctx context.Context, tx *pg.Tx) error {
		return auth.Keys{}.Revoke(ctx, tx, uuid.New())
	})
	assert.Equal(t, errs.NotFound, errs.KindOf(err))
}

func TestKeysCreateRejectsBadInput(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	past := time.Now().Add(-time.Minute)
	cases := []struct {
		name      string
		keyName   string
		scopes    []string
		expiresAt *time.Time
		createdBy string
	}{
		{"unknown scope", "k", []string{"runs:read", "runs:delete"}, nil, "u"},
		{"no scope", "k", nil, nil, "u"},
		{"empty name", "  ", []string{"runs:read"}, nil, "u"},
		{"control character in name", "a\nb", []string{"runs:read"}, nil, "u"},
		{"long name", strings.Repeat("n", 201), []string{"runs:read"}, nil, "u"},
		{"expiry in the past", "k", []string{"runs:read"}, &past, "u"},
		{"no creator", "k", []string{"runs:read"}, nil, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			err := f.db.WithTenant(context.Background(), f.a, func(ctx context.Context, tx *pg.Tx) error {
				_, _, err := auth.Keys{}.Create(ctx, tx, c.keyName, c.scopes, c.expiresAt, c.createdBy)
				return err
			})
			assert.Equal(t, errs.Invalid, errs.KindOf(err), "%v", err)
		})
	}
}
