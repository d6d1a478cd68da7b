package auth_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
)

// allowed reports whether az allows p the action in tenant's transaction,
// failing the test on any error other than Forbidden.
func allowed(t *testing.T, f *fixture, az *auth.Authorizer, tenant uuid.UUID, p auth.Principal, action auth.Action) bool {
	t.Helper()
	var verdict error
	f.in(t, tenant, func(ctx context.Context, tx *pg.Tx) error {
		verdict = az.Allowed(ctx, tx, p, action)
		return nil
	})
	if verdict != nil {
		require.Equal(t, errs.Forbidden, errs.KindOf(verdict), "%v", verdict)
	}
	return verdict == nil
}

func user(tenant uuid.UUID, subject string, role auth.Role) auth.Principal {
	return auth.Principal{TenantID: tenant, Subject: subject, Kind: auth.KindUser, Role: role}
}

func TestRolePermissions(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	az, err := auth.NewAuthorizer()
	require.NoError(t, err)
	everything := auth.AllActions()
	want := map[auth.Role][]auth.Action{
		auth.RoleOwner: everything,
		auth.RoleAdmin: everything,
		auth.RoleDeveloper: {auth.ActionRunsRead, auth.ActionRunsWrite, auth.ActionWorkflowsRead,
			auth.ActionWorkflowsWrite, auth.ActionBillingRead, auth.ActionEventsWrite, auth.ActionSecretOutputs},
		auth.RoleViewer: {auth.ActionRunsRead, auth.ActionWorkflowsRead, auth.ActionBillingRead},
	}
	for role := range want {
		f.member(t, f.a, string(role)+"-user", role)
	}
	// A subject named like a role gets its membership's role, not that one.
	f.member(t, f.a, "role:owner", auth.RoleViewer)
	f.member(t, f.a, "owner", auth.RoleViewer)

	for role, actions := range want {
		for _, action := range everything {
			name := fmt.Sprintf("%s/%s", role, action)
			expect := false
			for _, a := range actions {
				expect = expect || a == action
			}
			assert.Equal(t, expect, allowed(t, f, az, f.a, user(f.a, string(role)+"-user", role), action), name)
		}
	}
	for _, action := range everything {
		viewer := action == auth.ActionRunsRead || action == auth.ActionWorkflowsRead || action == auth.ActionBillingRead
		assert.Equal(t, viewer, allowed(t, f, az, f.a, user(f.a, "role:owner", auth.RoleOwner), action), "subject role:owner, %s", action)
		assert.Equal(t, viewer, allowed(t, f, az, f.a, user(f.a, "owner", auth.RoleOwner), action), "subject owner, %s", action)
		assert.False(t, allowed(t, f, az, f.a, user(f.a, "stranger", auth.RoleOwner), action), "non-member, %s", action)
		assert.False(t, allowed(t, f, az, f.a, auth.Principal{TenantID: f.a, Subject: "owner-user"}, action), "no kind, %s", action)
	}
	assert.False(t, allowed(t, f, az, f.a, user(f.a, "owner-user", auth.RoleOwner), auth.Action("runs:delete")), "unknown action")
}

func TestAPIKeyScopes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	az, err := auth.NewAuthorizer()
	require.NoError(t, err)
	key := func(scopes ...string) auth.Principal {
		return auth.Principal{TenantID: f.a, Subject: "k", Kind: auth.KindAPIKey, Scopes: scopes}
	}
	cases := []struct {
		scopes []string
		action auth.Action
		want   bool
	}{
		{[]string{"runs:read"}, auth.ActionRunsRead, true},
		{[]string{"runs:read"}, auth.ActionRunsWrite, false},
		{[]string{"runs:write"}, auth.ActionRunsRead, false},
		{[]string{"workflows:read"}, auth.ActionWorkflowsWrite, false},
		{[]string{"workflows:write"}, auth.ActionWorkflowsWrite, true},
		{[]string{"keys:manage"}, auth.ActionKeysManage, true},
		{[]string{"runs:write", "workflows:write"}, auth.ActionKeysManage, false},
		{[]string{"members:manage"}, auth.ActionMembersManage, true},
		{[]string{"webhooks:manage"}, auth.ActionWebhooksManage, true},
		{[]string{"billing:read"}, auth.ActionBillingRead, true},
		{[]string{"worker"}, auth.ActionWorkerTasks, true},
		{[]string{"worker"}, auth.ActionRunsRead, false},
		{[]string{"runs:read"}, auth.ActionWorkerTasks, false},
		{[]string{"secrets:outputs"}, auth.ActionSecretOutputs, true},
		{[]string{"runs:read", "secrets:manage"}, auth.ActionSecretOutputs, false},
		{nil, auth.ActionRunsRead, false},
	}
	for _, action := range auth.AllActions() {
		cases = append(cases, struct {
			scopes []string
			action auth.Action
			want   bool
		}{[]string{"admin"}, action, true})
	}
	for _, c := range cases {
		assert.Equal(t, c.want, allowed(t, f, az, f.a, key(c.scopes...), c.action), "scopes %v, action %s", c.scopes, c.action)
	}
}

// TestNeverAllowedAcrossTenants presents tenant A's principals — from a
// real API key and a real token — in tenant B's transaction.
func TestNeverAllowedAcrossTenants(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	az, err := auth.NewAuthorizer()
	require.NoError(t, err)
	f.member(t, f.a, "alice", auth.RoleOwner)
	f.member(t, f.b, "alice", auth.RoleViewer) // the same subject is a member of B too
	v, err := auth.NewJWTVerifier(auth.JWTConfig{Issuer: issuer, Audience: audience, HS256Secret: []byte(hsSecret)})
	require.NoError(t, err)
	authn := &auth.Authenticator{DB: f.db, JWT: v}

	plaintext, _ := f.key(t, f.a, []string{"admin"}, nil)
	keyP, err := authn.Authenticate(ctx, "Bearer "+plaintext)
	require.NoError(t, err)
	userP, err := authn.Authenticate(ctx, "Bearer "+sign(t, jwt.SigningMethodHS256, []byte(hsSecret), "", claims(f.a, "alice", auth.RoleOwner)))
	require.NoError(t, err)
	require.Equal(t, f.a, keyP.TenantID)
	require.Equal(t, f.a, userP.TenantID)

	for _, action := range auth.AllActions() {
		assert.True(t, allowed(t, f, az, f.a, keyP, action), "control: the key works in its tenant")
		assert.True(t, allowed(t, f, az, f.a, userP, action), "control: the owner works in her tenant")
		assert.False(t, allowed(t, f, az, f.b, keyP, action), "A's admin key in B's transaction: %s", action)
		assert.False(t, allowed(t, f, az, f.b, userP, action), "A's owner in B's transaction: %s", action)
	}
	// A principal with no tenant is never allowed anywhere.
	assert.False(t, allowed(t, f, az, f.a, auth.Principal{Subject: "alice", Kind: auth.KindUser}, auth.ActionRunsRead))
	assert.Equal(t, errs.Forbidden, errs.KindOf(az.Allowed(ctx, nil, keyP, auth.ActionRunsRead)), "no transaction")
}

// TestMembershipChangeDeniesNextRequestOnEveryReplica uses two Authorizers
// as two replicas, both holding the old rules when the change commits.
func TestMembershipChangeDeniesNextRequestOnEveryReplica(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	f.member(t, f.a, "olivia", auth.RoleOwner)
	f.member(t, f.a, "dev", auth.RoleDeveloper)
	replicas := make([]*auth.Authorizer, 2)
	for i := range replicas {
		var err error
		replicas[i], err = auth.NewAuthorizer()
		require.NoError(t, err)
	}
	v, err := auth.NewJWTVerifier(auth.JWTConfig{Issuer: issuer, Audience: audience, HS256Secret: []byte(hsSecret)})
	require.NoError(t, err)
	authn := &auth.Authenticator{DB: f.db, JWT: v}
	token := func(role auth.Role) string {
		return "Bearer " + sign(t, jwt.SigningMethodHS256, []byte(hsSecret), "", claims(f.a, "dev", role))
	}
	dev := user(f.a, "dev", auth.RoleDeveloper)

	for i, az := range replicas {
		assert.True(t, allowed(t, f, az, f.a, dev, auth.ActionRunsWrite), "replica %d caches dev as developer", i)
	}
	_, err = authn.Authenticate(ctx, token(auth.RoleDeveloper))
	require.NoError(t, err)

	f.in(t, f.a, func(ctx context.Context, tx *pg.Tx) error {
		_, err := auth.Members{}.ChangeRole(ctx, tx, "dev", auth.RoleViewer)
		return err
	})
	for i, az := range replicas {
		assert.False(t, allowed(t, f, az, f.a, dev, auth.ActionRunsWrite), "replica %d: the downgrade denies the next request", i)
		assert.True(t, allowed(t, f, az, f.a, dev, auth.ActionRunsRead), "replica %d: viewers still read", i)
	}
	_, err = authn.Authenticate(ctx, token(auth.RoleDeveloper))
	assert.Equal(t, errs.Unauthenticated, errs.KindOf(err), "a token with the old role is rejected")
	_, err = authn.Authenticate(ctx, token(auth.RoleViewer))
	require.NoError(t, err, "a token with the new role works")

	// A third replica that never saw the tenant loads the current rules.
	fresh, err := auth.NewAuthorizer()
	require.NoError(t, err)
	assert.False(t, allowed(t, f, fresh, f.a, dev, auth.ActionRunsWrite))

	f.in(t, f.a, func(ctx context.Context, tx *pg.Tx) error { return auth.Members{}.Remove(ctx, tx, "dev") })
	for i, az := range append(replicas, fresh) {
		for _, action := range auth.AllActions() {
			assert.False(t, allowed(t, f, az, f.a, dev, action), "replica %d: removal denies %s", i, action)
		}
		assert.True(t, allowed(t, f, az, f.a, user(f.a, "olivia", auth.RoleOwner), auth.ActionMembersManage), "replica %d: others keep access", i)
	}
	_, err = authn.Authenticate(ctx, token(auth.RoleViewer))
	assert.Equal(t, errs.Unauthenticated, errs.KindOf(err), "a removed member's token is rejected")

	// Re-adding restores access everywhere, again without any notification.
	f.member(t, f.a, "dev", auth.RoleAdmin)
	for i, az := range replicas {
		assert.True(t, allowed(t, f, az, f.a, user(f.a, "dev", auth.RoleAdmin), auth.ActionKeysManage), "replica %d", i)
	}
}

// TestMembershipVersionTracksRoleChangesOnly checks the trigger: role
// changes, additions and removals bump the version, an email change does
// not, and the app role cannot set the version itself.
func TestMembershipVersionTracksRoleChangesOnly(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	version := func() int64 {
		var v int64
		f.in(t, f.a, func(ctx context.Context, tx *pg.Tx) error {
			return tx.QueryRow(ctx, `SELECT membership_version FROM tenants WHERE id = $1`, f.a).Scan(&v)
		})
		return v
	}
	v0 := version()
	f.member(t, f.a, "x", auth.RoleViewer)
	assert.Equal(t, v0+1, version(), "insert")
	f.in(t, f.a, func(ctx context.Context, tx *pg.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE memberships SET email = 'x@example.test' WHERE subject = 'x'`)
		return err
	})
	assert.Equal(t, v0+1, version(), "an email change does not affect authorization")
	f.in(t, f.a, func(ctx context.Context, tx *pg.Tx) error {
		_, err := auth.Members{}.ChangeRole(ctx, tx, "x", auth.RoleAdmin)
		return err
	})
	assert.Equal(t, v0+2, version(), "role change")
	f.in(t, f.a, func(ctx context.Context, tx *pg.Tx) error { return auth.Members{}.Remove(ctx, tx, "x") })
	assert.Equal(t, v0+3, version(), "removal")

	// The app role cannot write the version itself.
	err := f.db.WithTenant(ctx, f.a, func(ctx context.Context, tx *pg.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE tenants SET membership_version = 0`)
		return err
	})
	assert.ErrorContains(t, err, "permission denied")
}
