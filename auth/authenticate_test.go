package auth_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
)

// serve sends one request through the middleware and returns the response
// and the principal the handler saw (nil if it was not reached).
func serve(authn *auth.Authenticator, headers ...string) (*httptest.ResponseRecorder, *auth.Principal) {
	var seen *auth.Principal
	h := authn.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := auth.FromContext(r.Context())
		if ok {
			seen = &p
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	req := httptest.NewRequest(http.MethodPost, "/graphql", nil)
	for _, h := range headers {
		req.Header.Add("Authorization", h)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec, seen
}

// mutate changes the character at i to another base62 character.
func mutate(s string, i int) string {
	b := []byte(s)
	if b[i] == 'Z' {
		b[i] = 'Y'
	} else {
		b[i] = 'Z'
	}
	return string(b)
}

// TestMiddlewareRejectsAttacks: every case is a 401 with the JSON error
// body and WWW-Authenticate, the handler is never reached, and the same
// credential through Authenticate is Unauthenticated without panicking.
func TestMiddlewareRejectsAttacks(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	rsa1 := rsaKey1()
	pubPEM := publicPEM(t, &rsa1.PublicKey)
	// Only RS256 is configured: HS256 tokens must fail whatever their secret.
	v, err := auth.NewJWTVerifier(auth.JWTConfig{Issuer: issuer, Audience: audience, PublicKeysPEM: pubPEM})
	require.NoError(t, err)
	authn := &auth.Authenticator{DB: f.db, JWT: v}
	later := &auth.Authenticator{DB: f.db, JWT: v, Now: func() time.Time { return time.Now().Add(2 * time.Hour) }}

	f.member(t, f.a, "alice", auth.RoleDeveloper)
	f.member(t, f.b, "bob", auth.RoleOwner)
	rs := func(c auth.Claims) string { return "Bearer " + sign(t, jwt.SigningMethodRS256, rsa1, "", c) }
	with := func(edit func(c *auth.Claims)) auth.Claims {
		c := claims(f.a, "alice", auth.RoleDeveloper)
		edit(&c)
		return c
	}
	valid := claims(f.a, "alice", auth.RoleDeveloper)

	good, _ := f.key(t, f.a, []string{"runs:read"}, nil)
	revoked, revokedKey := f.key(t, f.a, []string{"runs:read"}, nil)
	f.in(t, f.a, func(ctx context.Context, tx *pg.Tx) error { return auth.Keys{}.Revoke(ctx, tx, revokedKey.ID) })
	inAnHour := time.Now().Add(time.Hour)
	expiring, _ := f.key(t, f.a, []string{"runs:read"}, &inAnHour)
	goodID, _, err := auth.ParseAPIKey(good)
	require.NoError(t, err)
	_, otherSecret, _, err := auth.NewAPIKey()
	require.NoError(t, err)
	unknownKey, _, _, err := auth.NewAPIKey()
	require.NoError(t, err)

	// The controls: the genuine credentials pass the same middleware.
	for _, h := range []string{rs(valid), "Bearer " + good, "Bearer " + expiring} {
		rec, p := serve(authn, h)
		require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
		require.NotNil(t, p)
	}

	cases := []struct {
		name    string
		headers []string
		via     *auth.Authenticator
	}{
		{name: "missing header", headers: nil},
		{name: "empty header", headers: []string{""}},
		{name: "unknown scheme", headers: []string{"Basic YWxpY2U6c2VjcmV0"}},
		{name: "API key under another scheme", headers: []string{"Token " + good}},
		{name: "scheme only", headers: []string{"Bearer"}},
		{name: "scheme and space", headers: []string{"Bearer "}},
		{name: "two tokens", headers: []string{"Bearer a b"}},
		{name: "no space", headers: []string{"Bearer" + good}},
		{name: "tab in token", headers: []string{"Bearer " + good[:10] + "\t" + good[10:]}},
		{name: "two Authorization headers", headers: []string{"Bearer " + good, "Bearer " + good}},
		{name: "alg none", headers: []string{"Bearer " + noneToken(t, valid)}},
		{name: "HS256 signed with the RSA public key", headers: []string{"Bearer " + sign(t, jwt.SigningMethodHS256, pubPEM, "", valid)}},
		{name: "expired token", headers: []string{rs(with(func(c *auth.Claims) { c.ExpiresAt = jwt.NewNumericDate(time.Now().Add(-2 * time.Minute)) }))}},
		{name: "token not yet valid", headers: []string{rs(with(func(c *auth.Claims) { c.NotBefore = jwt.NewNumericDate(time.Now().Add(2 * time.Minute)) }))}},
		{name: "wrong issuer", headers: []string{rs(with(func(c *auth.Claims) { c.Issuer = "https://evil.example.test/" }))}},
		{name: "wrong audience", headers: []string{rs(with(func(c *auth.Claims) { c.Audience = jwt.ClaimStrings{"other"} }))}},
		{name: "tampered payload", headers: []string{"Bearer " + tamper(t, strings.TrimPrefix(rs(valid), "Bearer "), with(func(c *auth.Claims) { c.Role = "owner" }))}},
		{name: "token for a tenant the subject is not a member of", headers: []string{rs(claims(f.b, "alice", auth.RoleDeveloper))}},
		{name: "token for a tenant that does not exist", headers: []string{rs(with(func(c *auth.Claims) { c.TenantID = "0190f7b8-0000-7000-8000-000000000000" }))}},
		{name: "role claim differs from the membership", headers: []string{rs(claims(f.a, "alice", auth.RoleOwner))}},
		{name: "member of B claiming A", headers: []string{rs(claims(f.a, "bob", auth.RoleOwner))}},
		{name: "revoked key", headers: []string{"Bearer " + revoked}},
		{name: "expired key", headers: []string{"Bearer " + expiring}, via: later},
		{name: "key with a bad checksum", headers: []string{"Bearer " + mutate(good, len(good)-1)}},
		{name: "key with a typo in the secret", headers: []string{"Bearer " + mutate(good, 25)}},
		{name: "key with a valid checksum and a wrong secret", headers: []string{"Bearer " + auth.FormatAPIKey(goodID, otherSecret)}},
		{name: "unknown key", headers: []string{"Bearer " + unknownKey}},
		{name: "key prefix only", headers: []string{"Bearer cmp_"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			a := authn
			if c.via != nil {
				a = c.via
			}
			var rec *httptest.ResponseRecorder
			var seen *auth.Principal
			require.NotPanics(t, func() { rec, seen = serve(a, c.headers...) })
			assert.Equal(t, http.StatusUnauthorized, rec.Code)
			assert.Nil(t, seen, "the handler is never reached")
			assert.Equal(t, "Bearer", rec.Header().Get("WWW-Authenticate"))
			assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
			var body struct {
				Error struct{ Code, Message string } `json:"error"`
			}
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
			assert.Equal(t, "UNAUTHENTICATED", body.Error.Code)
			assert.NotEmpty(t, body.Error.Message)

			if len(c.headers) == 1 {
				var err error
				require.NotPanics(t, func() { _, err = a.Authenticate(ctx, c.headers[0]) })
				assert.Equal(t, errs.Unauthenticated, errs.KindOf(err), "%v", err)
			}
		})
	}
}

func TestMiddlewareAuthenticatesKeysAndTokens(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	e1 := ecKey1()
	v, err := auth.NewJWTVerifier(auth.JWTConfig{Issuer: issuer, Audience: audience,
		JWKS: jwks(t, rsaJWK("r1", &rsaKey1().PublicKey), ecJWK(t, "e1", &e1.PublicKey))})
	require.NoError(t, err)
	authn := &auth.Authenticator{DB: f.db, JWT: v}
	f.member(t, f.a, "erin", auth.RoleViewer)
	plaintext, key := f.key(t, f.b, []string{"runs:write", "worker"}, nil)

	rec, p := serve(authn, "Bearer "+sign(t, jwt.SigningMethodES256, e1, "e1", claims(f.a, "erin", auth.RoleViewer)))
	require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
	require.NotNil(t, p)
	p.ExpiresAt = nil
	assert.Equal(t, user(f.a, "erin", auth.RoleViewer), *p, "ES256 through JWKS, with membership")

	rec, p = serve(authn, "bearer "+plaintext)
	require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
	require.NotNil(t, p)
	assert.Equal(t, auth.Principal{TenantID: f.b, Subject: key.KeyID, Kind: auth.KindAPIKey, Scopes: []string{"runs:write", "worker"}}, *p,
		"the scheme is case-insensitive; the key's tenant comes from the database")
}

// TestBadChecksumNeverTouchesDatabase authenticates through closed pools:
// a key with a bad checksum is still plainly Unauthenticated, while a
// well-formed key reaches for the database and finds it unavailable.
func TestBadChecksumNeverTouchesDatabase(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	closed, err := pgxpool.New(ctx, f.env.AppURL)
	require.NoError(t, err)
	closed.Close()
	authn := &auth.Authenticator{DB: pg.New(closed, closed, false)}
	good, _, _, err := auth.NewAPIKey()
	require.NoError(t, err)

	_, err = authn.Authenticate(ctx, "Bearer "+good)
	require.Equal(t, errs.Unavailable, errs.KindOf(err), "control: a well-formed key does use the database: %v", err)
	rec, _ := serve(authn, "Bearer "+good)
	assert.Equal(t, http.StatusServiceUnavailable, rec.Code, "a database outage is not a credentials problem")

	for _, i := range []int{5, 20, 40, len(good) - 1} {
		_, err := authn.Authenticate(ctx, "Bearer "+mutate(good, i))
		assert.Equal(t, errs.Unauthenticated, errs.KindOf(err), "position %d: %v", i, err)
	}
	_, err = (&auth.Authenticator{}).Authenticate(ctx, "Bearer "+mutate(good, 30))
	assert.Equal(t, errs.Unauthenticated, errs.KindOf(err), "without any database at all")
}

// TestAPIKeySecretNeverStoredLoggedOrEchoed creates and uses a key, then
// looks for its secret in every row of every table, every log entry and
// every error of failed attempts with near-miss keys.
func TestAPIKeySecretNeverStoredLoggedOrEchoed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	core, logs := observer.New(zap.DebugLevel)
	log := zap.New(core)
	authn := &auth.Authenticator{DB: f.db, Logger: log}

	var plaintext string
	var key auth.Key
	f.in(t, f.a, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		plaintext, key, err = auth.Keys{Logger: log}.Create(ctx, tx, "hygiene", []string{"admin"}, nil, "user-1")
		return err
	})
	keyID, secret, err := auth.ParseAPIKey(plaintext)
	require.NoError(t, err)
	_, err = authn.Authenticate(ctx, "Bearer "+plaintext)
	require.NoError(t, err)

	// Near misses: every single-character change, and a forged checksum.
	var failures []error
	var responses []string
	secretAt := len("cmp_") + 12 + 1
	nearMisses := []string{auth.FormatAPIKey(keyID, mutate(secret, 0))}
	for i := secretAt; i < len(plaintext); i += 3 {
		nearMisses = append(nearMisses, mutate(plaintext, i))
	}
	for _, nm := range nearMisses {
		_, err := authn.Authenticate(ctx, "Bearer "+nm)
		require.Error(t, err)
		failures = append(failures, err)
		rec, _ := serve(authn, "Bearer "+nm)
		responses = append(responses, rec.Body.String())
	}
	f.in(t, f.a, func(ctx context.Context, tx *pg.Tx) error { return auth.Keys{Logger: log}.Revoke(ctx, tx, key.ID) })
	_, err = authn.Authenticate(ctx, "Bearer "+plaintext)
	require.Error(t, err)
	failures = append(failures, err)

	// Fragments long enough to be meaningful, from each end of the secret.
	needles := []string{secret, secret[:16], secret[len(secret)-16:], plaintext}
	assertClean := func(where, text string) {
		t.Helper()
		for _, n := range needles {
			assert.NotContains(t, text, n, "%s contains the secret", where)
		}
	}

	// (a) Every text form of every row of every table, as the owner, under
	// each tenant's setting and none.
	owner := f.env.Owner(t)
	rows, err := owner.Query(ctx, `SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition`)
	require.NoError(t, err)
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Contains(t, tables, "api_keys")
	sawKey := false
	for _, tenant := range []string{f.a.String(), f.b.String(), ""} {
		tx, err := owner.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "SELECT set_config('app.tenant_id', $1, true)", tenant)
		require.NoError(t, err)
		for _, table := range tables {
			rows, err := tx.Query(ctx, fmt.Sprintf(`SELECT row_to_json(t)::text FROM %s t`, pgx.Identifier{table}.Sanitize()))
			require.NoError(t, err, table)
			texts, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err, table)
			for _, text := range texts {
				assertClean("table "+table, text)
				sawKey = sawKey || strings.Contains(text, keyID)
			}
		}
		require.NoError(t, tx.Rollback(ctx))
	}
	assert.True(t, sawKey, "control: the key's row was read")

	// (b) Every log entry, message and fields.
	require.NotZero(t, logs.Len())
	loggedKeyID := false
	for _, e := range logs.All() {
		text := e.Message + " " + fmt.Sprint(e.ContextMap())
		assertClean("log "+e.Message, text)
		loggedKeyID = loggedKeyID || strings.Contains(text, keyID)
	}
	assert.True(t, loggedKeyID, "control: logs do name the key by its public id")

	// (c) Every error and response of the failed attempts.
	for _, err := range failures {
		assert.Equal(t, errs.Unauthenticated, errs.KindOf(err))
		assertClean("error", err.Error())
		assertClean("public message", errs.PublicMessage(err))
	}
	for _, body := range responses {
		assertClean("response", body)
	}
	for _, nm := range nearMisses {
		for _, err := range failures {
			assert.NotContains(t, err.Error(), nm[secretAt:], "errors do not echo the presented secret either")
		}
	}
}

func TestAPIKeyLastUsedAtWrittenAtMostOncePerMinute(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	authn := &auth.Authenticator{DB: f.db}
	plaintext, key := f.key(t, f.a, []string{"runs:read"}, nil)
	lastUsed := func() *time.Time {
		var keys []auth.Key
		f.in(t, f.a, func(ctx context.Context, tx *pg.Tx) error {
			var err error
			keys, err = auth.Keys{}.List(ctx, tx, 1000, nil)
			return err
		})
		require.Len(t, keys, 1)
		return keys[0].LastUsedAt
	}
	require.Nil(t, lastUsed(), "never used")

	_, err := authn.Authenticate(ctx, "Bearer "+plaintext)
	require.NoError(t, err)
	first := lastUsed()
	require.NotNil(t, first, "the first use is recorded")
	for range 5 {
		_, err := authn.Authenticate(ctx, "Bearer "+plaintext)
		require.NoError(t, err)
	}
	assert.True(t, first.Equal(*lastUsed()), "uses within the minute write nothing")

	// Even a replica whose clock runs ahead cannot write more often: the
	// database checks the minute on its own clock.
	ahead := &auth.Authenticator{DB: f.db, Now: func() time.Time { return time.Now().Add(5 * time.Minute) }}
	_, err = ahead.Authenticate(ctx, "Bearer "+plaintext)
	require.NoError(t, err)
	assert.True(t, first.Equal(*lastUsed()))

	owner := f.env.Owner(t)
	tx, err := owner.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SELECT set_config('app.tenant_id', $1, true)", f.a.String())
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE api_keys SET last_used_at = last_used_at - interval '2 minutes' WHERE id = $1`, key.ID)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	setBack := lastUsed()

	_, err = authn.Authenticate(ctx, "Bearer "+plaintext)
	require.NoError(t, err)
	assert.True(t, lastUsed().After(setBack.Add(time.Minute)), "a use after the minute is recorded")
}

// TestKeyLookupIsNarrow checks the database side of the lookup: the app
// role gets a key only through the function, cannot read hashes directly,
// and cannot borrow the function's exception; the system role cannot call it.
func TestKeyLookupIsNarrow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	plaintext, key := f.key(t, f.a, []string{"runs:read"}, nil)
	keyID, _, err := auth.ParseAPIKey(plaintext)
	require.NoError(t, err)

	var tenant string
	require.NoError(t, f.env.App.QueryRow(ctx, `SELECT tenant_id::text FROM composer_api_key_lookup($1)`, keyID).Scan(&tenant))
	assert.Equal(t, f.a.String(), tenant, "control: the function finds the key without a tenant scope")
	var setting *string
	require.NoError(t, f.env.App.QueryRow(ctx, `SELECT current_setting('composer.api_key_lookup', true)`).Scan(&setting))
	assert.True(t, setting == nil || *setting == "", "the function leaves no setting behind")

	tx, err := f.env.App.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT set_config('composer.api_key_lookup', $1, true)`, keyID)
	require.NoError(t, err)
	var n int
	require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM api_keys`).Scan(&n))
	assert.Zero(t, n, "the lookup exception is the owner's, not the app role's")
	require.NoError(t, tx.Rollback(ctx))

	err = f.db.WithTenant(ctx, f.a, func(ctx context.Context, tx *pg.Tx) error {
		var h []byte
		return tx.QueryRow(ctx, `SELECT secret_hash FROM api_keys WHERE id = $1`, key.ID).Scan(&h)
	})
	assert.ErrorContains(t, err, "permission denied", "the app role never reads hashes directly")
	err = f.db.WithTenant(ctx, f.a, func(ctx context.Context, tx *pg.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE api_keys SET scopes = '{admin}' WHERE id = $1`, key.ID)
		return err
	})
	assert.ErrorContains(t, err, "permission denied", "the app role may only revoke")

	_, err = f.env.System.Exec(ctx, `SELECT * FROM composer_api_key_lookup($1)`, keyID)
	assert.ErrorContains(t, err, "permission denied", "only composer_app may look keys up")
}
