package auth

import (
	"context"
	_ "embed" // the casbin model and policy
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/casbin/casbin/v2"
	"github.com/casbin/casbin/v2/model"
	"github.com/casbin/casbin/v2/persist"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
)

//go:embed rbac_model.conf
var rbacModel string

//go:embed rbac_policy.csv
var rbacPolicy string

// Action is something a principal may be allowed to do in a tenant.
type Action string

// Actions.
const (
	ActionRunsRead       Action = "runs:read"
	ActionRunsWrite      Action = "runs:write"
	ActionWorkflowsRead  Action = "workflows:read"
	ActionWorkflowsWrite Action = "workflows:write"
	ActionKeysManage     Action = "keys:manage"
	ActionMembersManage  Action = "members:manage"
	ActionWebhooksManage Action = "webhooks:manage"
	ActionBillingRead    Action = "billing:read"
	ActionWorkerTasks    Action = "worker:tasks"
	// ActionEventsWrite publishes events (which start the workflows they
	// trigger); reading events is runs:read.
	ActionEventsWrite Action = "events:write"
	// ActionSecretsManage sets, deletes and lists secrets; no action reads
	// a value back.
	ActionSecretsManage Action = "secrets:manage"
	// ActionAuditRead reads and verifies the tenant's audit log: owners
	// and admins, and admin-scope keys (no narrower scope grants it).
	ActionAuditRead Action = "audit:read"
	// ActionSecretOutputs reads what steps that use a secret produced —
	// their inputs, outputs and errors, those of every step downstream of
	// them, the run's output and error — in which a receiver may echo the
	// secret in any encoding; without it the API hides those values. It
	// reads no secret's value (nothing does). Owners, admins and
	// developers hold it (they may write workflows, so they could send a
	// secret anywhere anyway); keys by the secrets:outputs scope.
	ActionSecretOutputs Action = "secrets:outputs"
)

// actionScope is the API key scope that grants each action (ScopeAdmin
// grants them all).
var actionScope = map[Action]string{
	ActionRunsRead:       ScopeRunsRead,
	ActionRunsWrite:      ScopeRunsWrite,
	ActionWorkflowsRead:  ScopeWorkflowsRead,
	ActionWorkflowsWrite: ScopeWorkflowsWrite,
	ActionKeysManage:     ScopeKeysManage,
	ActionMembersManage:  ScopeMembersManage,
	ActionWebhooksManage: ScopeWebhooksManage,
	ActionBillingRead:    ScopeBillingRead,
	ActionWorkerTasks:    ScopeWorker,
	ActionEventsWrite:    ScopeEventsWrite,
	ActionSecretsManage:  ScopeSecretsManage,
	ActionAuditRead:      ScopeAdmin,
	ActionSecretOutputs:  ScopeSecretOutputs,
}

// AllActions returns every action, in a stable order.
func AllActions() []Action {
	return []Action{ActionRunsRead, ActionRunsWrite, ActionWorkflowsRead, ActionWorkflowsWrite, ActionKeysManage,
		ActionMembersManage, ActionWebhooksManage, ActionBillingRead, ActionWorkerTasks, ActionEventsWrite, ActionSecretsManage, ActionAuditRead,
		ActionSecretOutputs}
}

// Authorizer answers whether a principal may perform an action. Users are
// authorized by casbin from their current membership role; API keys by
// their scopes. Safe for concurrent use; create one per process.
type Authorizer struct {
	enforcer *casbin.SyncedEnforcer
	adapter  policyAdapter

	mu sync.Mutex
	// loaded is the membership version whose role assignments the enforcer
	// holds, per tenant; a tenant not in it has none loaded.
	loaded map[uuid.UUID]int64
}

// NewAuthorizer returns an Authorizer with the embedded model and policy.
func NewAuthorizer() (*Authorizer, error) {
	m, err := model.NewModelFromString(rbacModel)
	if err != nil {
		return nil, fmt.Errorf("casbin model: %w", err)
	}
	a := &Authorizer{loaded: map[uuid.UUID]int64{}}
	e, err := casbin.NewSyncedEnforcer(m, a.adapter)
	if err != nil {
		return nil, fmt.Errorf("casbin enforcer: %w", err)
	}
	// Rules change in memory only; the adapter is read-only.
	e.EnableAutoSave(false)
	a.enforcer = e
	return a, nil
}

// Allowed returns nil if p may perform action in the transaction's tenant,
// else a Forbidden error. It never allows acting in a tenant other than
// the principal's. A user's role is read as of this transaction: a changed
// or removed membership applies from the next request on, on every replica.
func (a *Authorizer) Allowed(ctx context.Context, tx *pg.Tx, p Principal, action Action) error {
	scope, known := actionScope[action]
	if !known {
		return errs.E(errs.Forbidden, "unknown action %q", action)
	}
	if tx == nil || tx.Tenant == uuid.Nil || p.TenantID != tx.Tenant {
		return errs.E(errs.Forbidden, "not allowed to %s in this tenant", action)
	}
	switch p.Kind {
	case KindAPIKey:
		if slices.Contains(p.Scopes, ScopeAdmin) || slices.Contains(p.Scopes, scope) {
			return nil
		}
		return errs.E(errs.Forbidden, "the API key lacks the %s scope", scope)
	case KindUser:
		if err := a.refresh(ctx, tx); err != nil {
			return err
		}
		ok, err := a.enforcer.Enforce(userSubject(p.Subject), tx.Tenant.String(), string(action))
		if err != nil {
			return fmt.Errorf("authorize %s: %w", action, err)
		}
		if !ok {
			return errs.E(errs.Forbidden, "not allowed to %s", action)
		}
		return nil
	}
	return errs.E(errs.Forbidden, "not allowed to %s", action)
}

// refresh makes the enforcer hold the tenant's role assignments at least
// as new as the membership version this transaction reads. The common
// case costs one primary-key read; a stale tenant is reloaded from
// memberships, outside the enforcer's lock, and swapped in under it.
func (a *Authorizer) refresh(ctx context.Context, tx *pg.Tx) error {
	var version int64
	err := tx.QueryRow(ctx, qMembershipVersion, tx.Tenant).Scan(&version)
	if errors.Is(err, pgx.ErrNoRows) {
		return errs.E(errs.Forbidden, "tenant not found")
	}
	if err != nil {
		return fmt.Errorf("membership version: %w", err)
	}
	a.mu.Lock()
	have, ok := a.loaded[tx.Tenant]
	a.mu.Unlock()
	if ok && have >= version {
		return nil
	}
	version, rules, err := a.adapter.tenantRoles(ctx, tx)
	if err != nil {
		return err
	}
	return a.swap(tx.Tenant, version, rules)
}

// swap replaces the tenant's role assignments. It holds the enforcer's
// write lock across the removal and the addition, so no Enforce sees the
// tenant half-loaded, and keeps the newest version when reloads race.
func (a *Authorizer) swap(tenant uuid.UUID, version int64, rules [][]string) error {
	lock := a.enforcer.GetLock()
	lock.Lock()
	defer lock.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	if have, ok := a.loaded[tenant]; ok && have >= version {
		return nil
	}
	// Calls on the embedded Enforcer: the synced wrappers would take the
	// lock already held here.
	e := a.enforcer.Enforcer
	delete(a.loaded, tenant)
	if _, err := e.RemoveFilteredGroupingPolicy(2, tenant.String()); err != nil {
		return fmt.Errorf("unload roles of tenant %s: %w", tenant, err)
	}
	if len(rules) > 0 {
		if _, err := e.AddGroupingPolicies(rules); err != nil {
			return fmt.Errorf("load roles of tenant %s: %w", tenant, err)
		}
	}
	a.loaded[tenant] = version
	return nil
}

func userSubject(subject string) string { return "user:" + subject }
func roleSubject(role string) string    { return "role:" + role }

// policyAdapter is casbin's storage: the role→permission policy embedded
// in the binary, and each tenant's role assignments read from memberships
// in the request's own transaction (tenantRoles). It is read-only:
// memberships change through Members, never through casbin.
type policyAdapter struct{}

var errReadOnly = errors.New("auth: the casbin policy is read-only; change memberships through Members")

// LoadPolicy loads the embedded role→permission rules.
func (policyAdapter) LoadPolicy(m model.Model) error {
	for _, line := range strings.Split(rbacPolicy, "\n") {
		if err := persist.LoadPolicyLine(strings.TrimSpace(line), m); err != nil {
			return fmt.Errorf("casbin policy: %w", err)
		}
	}
	return nil
}

func (policyAdapter) SavePolicy(model.Model) error                { return errReadOnly }
func (policyAdapter) AddPolicy(string, string, []string) error    { return errReadOnly }
func (policyAdapter) RemovePolicy(string, string, []string) error { return errReadOnly }
func (policyAdapter) RemoveFilteredPolicy(string, string, int, ...string) error {
	return errReadOnly
}

// tenantRoles reads the tenant's membership version and its role
// assignments as casbin grouping rules (user, role, tenant).
func (policyAdapter) tenantRoles(ctx context.Context, tx *pg.Tx) (int64, [][]string, error) {
	rows, err := tx.Query(ctx, qTenantRoles, tx.Tenant)
	if err != nil {
		return 0, nil, fmt.Errorf("load roles: %w", err)
	}
	var version int64
	var subject, role *string
	var rules [][]string
	n := 0
	_, err = pgx.ForEachRow(rows, []any{&version, &subject, &role}, func() error {
		n++
		if subject != nil && role != nil {
			rules = append(rules, []string{userSubject(*subject), roleSubject(*role), tx.Tenant.String()})
		}
		return nil
	})
	if err != nil {
		return 0, nil, fmt.Errorf("load roles: %w", err)
	}
	if n == 0 {
		return 0, nil, errs.E(errs.Forbidden, "tenant not found")
	}
	return version, rules, nil
}
