package auth

import (
	"fmt"
	"slices"
	"strings"

	"github.com/composer-dev/composer/internal/errs"
)

// Power is what a principal, a role or a set of API key scopes may do:
// a set of actions, and whether it carries an owner's authority.
//
// The rule every grant follows: a principal can never create a credential
// or grant a role with more power than it holds itself, and owner-level
// changes — granting the owner role, changing or removing an owner,
// creating or revoking an owner-level (admin-scope) key — need an owner.
// An owner is a member with the owner role, or an API key with the admin
// scope (which only an owner can create; a tenant's first key is one).
type Power struct {
	actions map[Action]bool
	owner   bool
}

// roleActions is what each role may do, from the embedded policy.
var roleActions = func() map[Role]map[Action]bool {
	out := map[Role]map[Action]bool{}
	for _, line := range strings.Split(rbacPolicy, "\n") {
		f := strings.Split(line, ",")
		if len(f) != 3 || strings.TrimSpace(f[0]) != "p" {
			continue
		}
		role := Role(strings.TrimPrefix(strings.TrimSpace(f[1]), "role:"))
		if out[role] == nil {
			out[role] = map[Action]bool{}
		}
		out[role][Action(strings.TrimSpace(f[2]))] = true
	}
	return out
}()

// PowerOfRole is what a member with role r may do.
func PowerOfRole(r Role) Power {
	return Power{actions: roleActions[r], owner: r == RoleOwner}
}

// PowerOfScopes is what an API key with these scopes may do.
func PowerOfScopes(scopes []string) Power {
	p := Power{actions: map[Action]bool{}}
	if slices.Contains(scopes, ScopeAdmin) {
		p.owner = true
		for _, a := range AllActions() {
			p.actions[a] = true
		}
		return p
	}
	for a, s := range actionScope {
		if slices.Contains(scopes, s) {
			p.actions[a] = true
		}
	}
	return p
}

// PowerOf is what the principal may do (for a user, as of its role when
// the request was authenticated, which matched its membership then).
func PowerOf(p Principal) Power {
	if p.Kind == KindAPIKey {
		return PowerOfScopes(p.Scopes)
	}
	return PowerOfRole(p.Role)
}

// Can reports whether the power includes action.
func (p Power) Can(action Action) bool { return p.actions[action] }

// Owner reports whether the power carries an owner's authority.
func (p Power) Owner() bool { return p.owner }

// missing lists what q may do that p may not, in a stable order.
func (p Power) missing(q Power) []string {
	var out []string
	if q.owner && !p.owner {
		out = append(out, "owner authority")
	}
	for _, a := range AllActions() {
		if q.actions[a] && !p.actions[a] {
			out = append(out, string(a))
		}
	}
	return out
}

// MayCreateKey checks that p may create an API key with these scopes.
func MayCreateKey(p Principal, scopes []string) error {
	if slices.Contains(scopes, ScopeAdmin) && !PowerOf(p).owner {
		return errs.E(errs.Forbidden, "only an owner can create a key with the admin scope")
	}
	if m := PowerOf(p).missing(PowerOfScopes(scopes)); len(m) > 0 {
		return errs.E(errs.Forbidden, "a key cannot have more power than its creator: you may not %s", strings.Join(m, ", "))
	}
	return nil
}

// MayRevokeKey checks that p may revoke a key with these scopes: not one
// with more power than p's own (an admin-scope key needs an owner).
func MayRevokeKey(p Principal, scopes []string) error {
	if m := PowerOf(p).missing(PowerOfScopes(scopes)); len(m) > 0 {
		return errs.E(errs.Forbidden, "this key can do more than you (%s): only a principal with that power may revoke it", strings.Join(m, ", "))
	}
	return nil
}

// MayGrantRole checks that p may give a member role r.
func MayGrantRole(p Principal, r Role) error {
	if r == RoleOwner && !PowerOf(p).owner {
		return errs.E(errs.Forbidden, "only an owner can grant the owner role")
	}
	if m := PowerOf(p).missing(PowerOfRole(r)); len(m) > 0 {
		return errs.E(errs.Forbidden, "the %s role can do more than you (%s)", r, strings.Join(m, ", "))
	}
	return nil
}

// MayChangeMember checks that p may change or remove a member whose role
// is current: not an owner unless p is one, nor anyone with more power.
func MayChangeMember(p Principal, current Role) error {
	if current == RoleOwner && !PowerOf(p).owner {
		return errs.E(errs.Forbidden, "only an owner can change or remove an owner")
	}
	if m := PowerOf(p).missing(PowerOfRole(current)); len(m) > 0 {
		return errs.E(errs.Forbidden, "this member's %s role can do more than you (%s)", current, strings.Join(m, ", "))
	}
	return nil
}

func (p Power) String() string {
	var as []string
	for _, a := range AllActions() {
		if p.actions[a] {
			as = append(as, string(a))
		}
	}
	return fmt.Sprintf("owner=%v %s", p.owner, strings.Join(as, ","))
}
