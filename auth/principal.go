package auth

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// Kind says how a principal authenticated.
type Kind string

// Kinds of principal.
const (
	// KindUser is a person, authenticated by a JWT and authorized by the
	// role of their membership in the tenant.
	KindUser Kind = "user"
	// KindAPIKey is a tenant's API key, authorized by its scopes.
	KindAPIKey Kind = "api_key"
)

// Role is a member's role in a tenant.
type Role string

// Roles, from most to least powerful.
const (
	RoleOwner     Role = "owner"
	RoleAdmin     Role = "admin"
	RoleDeveloper Role = "developer"
	RoleViewer    Role = "viewer"
)

// Valid reports whether r is one of the roles.
func (r Role) Valid() bool {
	switch r {
	case RoleOwner, RoleAdmin, RoleDeveloper, RoleViewer:
		return true
	}
	return false
}

// Principal is who a request acts as: always exactly one tenant.
type Principal struct {
	TenantID uuid.UUID
	// Subject is the user's subject (the JWT sub) or the API key's key id.
	Subject string
	Kind    Kind
	// Role is the user's role when authenticated (KindUser only);
	// authorization reads the current membership, not this copy.
	Role Role
	// Scopes are the API key's scopes (KindAPIKey only).
	Scopes []string
	// ExpiresAt is when the credential stops working, if it expires (a
	// token's exp, a key's expiry): a long-lived connection ends then.
	ExpiresAt *time.Time
}

type principalKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the principal the request authenticated as, if any.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}
