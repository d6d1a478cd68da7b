package graph_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/tenants"
)

// TestViewerPermissionsFollowTheAuthorizer: viewer.permissions is what
// the gate allows — a role's policy, a key's scopes — in the credential's
// own tenant only (the same subject is an owner in A and a viewer in B),
// and a role change shows at the next request.
func TestViewerPermissionsFollowTheAuthorizer(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	b, err := tenants.Create(context.Background(), sys.Deps.DB, tenants.CreateParams{Name: "tenant-b"})
	require.NoError(t, err)
	perms := func(cred string) []string {
		t.Helper()
		var out struct {
			Viewer struct{ Permissions []string }
		}
		sys.GraphQL(cred, `{ viewer { permissions } }`, nil).Decode(t, &out)
		return out.Viewer.Permissions
	}
	all := []string{"runs:read", "runs:write", "workflows:read", "workflows:write", "keys:manage", "members:manage",
		"webhooks:manage", "billing:read", "worker:tasks", "events:write", "secrets:manage", "audit:read", "secrets:outputs"}

	ownerA := sys.Token(sys.Tenant, "same@example.com", auth.RoleOwner)
	viewerB := sys.Token(b.ID, "same@example.com", auth.RoleViewer)
	assert.Equal(t, all, perms(ownerA))
	assert.Equal(t, []string{"runs:read", "workflows:read", "billing:read"}, perms(viewerB),
		"B's token carries B's role only, whatever the subject is in A")
	assert.Equal(t, []string{"runs:read", "runs:write", "workflows:read", "workflows:write", "billing:read", "events:write", "secrets:outputs"},
		perms(sys.Token(sys.Tenant, "dev@example.com", auth.RoleDeveloper)))

	assert.Equal(t, []string{"runs:read", "webhooks:manage"}, perms(sys.APIKey(auth.ScopeRunsRead, auth.ScopeWebhooksManage)))
	assert.Equal(t, all, perms(sys.APIKey(auth.ScopeAdmin)))

	// A demotion applies at once: the same token now reads as a viewer.
	dev := sys.Token(sys.Tenant, "demoted@example.com", auth.RoleDeveloper)
	res := sys.GraphQL(ownerA, `mutation { changeMemberRole(subject: "demoted@example.com", role: VIEWER) { role } }`, nil)
	require.Empty(t, res.Errors)
	res = sys.GraphQL(dev, `{ viewer { permissions } }`, nil)
	assert.Equal(t, []string{"UNAUTHENTICATED"}, res.Codes(), "a token whose role claim no longer matches is refused")
	assert.Equal(t, []string{"runs:read", "workflows:read", "billing:read"},
		perms(sys.Token(sys.Tenant, "demoted@example.com", auth.RoleViewer)))
}
