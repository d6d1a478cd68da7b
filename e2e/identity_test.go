package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/engine/taskapi"
	"github.com/composer-dev/composer/internal/app"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/config"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/sdk/worker"
	"github.com/composer-dev/composer/tenants"
)

// TestTenantWorkersUseScopedAPIKeys: a tenant runs its own workers with an
// API key of the worker scope; such a key reaches only its tenant's tasks,
// and a key without the scope is refused.
func TestTenantWorkersUseScopedAPIKeys(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	a, err := app.ProvisionTenant(ctx, sys.Deps, tenants.CreateParams{Name: "a"}, "test")
	require.NoError(t, err)
	b, err := app.ProvisionTenant(ctx, sys.Deps, tenants.CreateParams{Name: "b"}, "test")
	require.NoError(t, err)
	keyOf := func(tenant tenants.Tenant, scopes ...string) string {
		var plain string
		require.NoError(t, sys.Deps.DB.WithTenant(ctx, tenant.ID, func(ctx context.Context, tx *pg.Tx) error {
			var err error
			plain, _, err = auth.Keys{}.Create(ctx, tx, "worker", scopes, nil, "test")
			return err
		}))
		return plain
	}
	workerKeyA, readerKeyA := keyOf(a.Tenant, auth.ScopeWorker), keyOf(a.Tenant, auth.ScopeRunsRead)

	// Tenant B has a task for the same handler, queued before A's worker
	// connects: A's worker must never be offered it.
	sys.Tenant = b.Tenant.ID
	runB := sys.StartRun(sys.Workflow(`{"nodes":[{"id":"t","type":"task","task":{"handler":"own"}}]}`), `{}`)
	var ranFor []string
	sys.StartSDKWorker(func(w *worker.Worker) {
		w.HandleRaw("own", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			tk, _ := worker.TaskFrom(ctx)
			ranFor = append(ranFor, tk.Run.String())
			return json.RawMessage(`{"by":"tenant worker"}`), nil
		})
	}, apptest.SDKWorkerOptions{Key: workerKeyA, Options: func(o *worker.Options) { o.Concurrency = 1 }})
	sys.Tenant = a.Tenant.ID
	run := sys.StartRun(sys.Workflow(`{"nodes":[{"id":"t","type":"task","task":{"handler":"own"}}]}`), `{}`)
	got, tasks := sys.WaitRun(run, 20*time.Second)
	require.Equal(t, "completed", got.Status, "tenant A's worker ran tenant A's task")
	assert.JSONEq(t, `{"by":"tenant worker"}`, string(tasks["t"].Output))
	assert.Equal(t, []string{run.String()}, ranFor, "and nothing else")
	sys.Tenant = b.Tenant.ID
	gotB, tb := sys.Run(runB)
	assert.Equal(t, "running", gotB.Status)
	assert.Equal(t, "pending", tb["t"].State, "tenant B's task waits for tenant B's workers")

	// Tenant B's task, named with tenant A's worker key: not found; and a
	// tenant's worker cannot take stream messages at all.
	var apiErr *taskapi.APIError
	_, err = taskapi.NewClient(sys.URL, workerKeyA).Renew(ctx, taskapi.RenewRequest{WorkerID: "w", TTLMillis: 5000,
		Leases: []taskapi.Ref{{Tenant: b.Tenant.ID, Run: runB, Task: tb["t"].ID, Attempt: 1}}})
	require.True(t, errors.As(err, &apiErr), "got %v", err)
	assert.Equal(t, http.StatusNotFound, apiErr.Status)
	_, err = taskapi.NewClient(sys.URL, workerKeyA).Acquire(ctx, taskapi.AcquireRequest{WorkerID: "w", TTLMillis: 5000,
		Leases: []taskapi.Ref{{Tenant: a.Tenant.ID, Run: run, Task: tasks["t"].ID, Attempt: 1}}})
	require.True(t, errors.As(err, &apiErr), "got %v", err)
	assert.Equal(t, http.StatusForbidden, apiErr.Status)

	// A key without the worker scope.
	_, err = taskapi.NewClient(sys.URL, readerKeyA).Renew(ctx, taskapi.RenewRequest{WorkerID: "w", TTLMillis: 5000})
	require.True(t, errors.As(err, &apiErr))
	assert.Equal(t, http.StatusForbidden, apiErr.Status)
	// A mistyped key: rejected before any lookup.
	typo := "x"
	if strings.HasSuffix(workerKeyA, typo) {
		typo = "y" // (a key ending in x would not be mistyped by it)
	}
	_, err = taskapi.NewClient(sys.URL, workerKeyA[:len(workerKeyA)-1]+typo).Renew(ctx, taskapi.RenewRequest{WorkerID: "w", TTLMillis: 5000})
	require.True(t, errors.As(err, &apiErr), "got %v", err)
	assert.Equal(t, http.StatusUnauthorized, apiErr.Status)
}

func TestDevTokenMakesAMemberAndVerifies(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t, func(c *config.Config) { c.JWTHS256Secret = app.DevJWTSecret })
	ctx := context.Background()
	tok, err := app.DevToken(ctx, sys.Deps, sys.Tenant, "ada@example.com", auth.RoleDeveloper, time.Hour)
	require.NoError(t, err)
	p, err := sys.Server.Authn.Authenticate(ctx, "Bearer "+tok)
	require.NoError(t, err)
	assert.Equal(t, sys.Tenant, p.TenantID)
	assert.Equal(t, auth.RoleDeveloper, p.Role)
	// Re-minting with another role changes the membership; the old token stops working.
	_, err = app.DevToken(ctx, sys.Deps, sys.Tenant, "ada@example.com", auth.RoleViewer, time.Hour)
	require.NoError(t, err)
	_, err = sys.Server.Authn.Authenticate(ctx, "Bearer "+tok)
	assert.Error(t, err, "a token whose role no longer matches the membership is refused")
}
