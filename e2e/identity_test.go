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

	leasesAreBoundToTheirKey(t, sys, a.Tenant, workerKeyA, keyOf(a.Tenant, auth.ScopeWorker), keyOf(b.Tenant, auth.ScopeWorker))
	httpStepsAreThePlatforms(t, sys, a.Tenant, workerKeyA, keyOf(b.Tenant, auth.ScopeWorker))
}

// leasesAreBoundToTheirKey: tenant A's worker key K1 polls a task. Its
// tenant's second worker key K2, naming K1's worker id, poll id and
// attempt, renews, completes, fails and recovers nothing of the lease, and
// nothing changes; tenant B's key is NOT_FOUND for it and recovers nothing
// either. K1 then completes it.
func leasesAreBoundToTheirKey(t *testing.T, sys *apptest.System, a tenants.Tenant, k1, k2, keyB string) {
	ctx := context.Background()
	sys.Tenant = a.ID
	run := sys.StartRun(sys.Workflow(`{"nodes":[{"id":"t","type":"task","task":{"handler":"manual"}}]}`), `{}`)
	poll := taskapi.PollRequest{WorkerID: "w-manual", PollID: "p1", Queues: []string{"default"}, Handlers: []string{"manual"},
		Slots: 1, Capacity: 1, TTLMillis: 60_000, WaitMillis: 10_000}
	first := taskapi.NewClient(sys.URL, k1)
	got, err := first.Poll(ctx, poll)
	require.NoError(t, err)
	require.Len(t, got.Leases, 1, "K1's worker gets the task")
	l := got.Leases[0]
	require.Equal(t, run, l.Run)
	_, before := sys.Run(run)

	for name, c := range map[string]*taskapi.Client{"same tenant's other key": taskapi.NewClient(sys.URL, k2), "tenant B's key": taskapi.NewClient(sys.URL, keyB)} {
		ren, err := c.Renew(ctx, taskapi.RenewRequest{WorkerID: poll.WorkerID, TTLMillis: 60_000, Leases: []taskapi.Ref{l.Ref}})
		if name == "tenant B's key" {
			var apiErr *taskapi.APIError
			require.True(t, errors.As(err, &apiErr), "%s renews: %v", name, err)
			assert.Equal(t, http.StatusNotFound, apiErr.Status)
			for _, report := range []func() error{
				func() error {
					_, err := c.Complete(ctx, taskapi.CompleteRequest{Ref: l.Ref, NodeID: "t", WorkerID: poll.WorkerID, Output: json.RawMessage(`{"forged":1}`)})
					return err
				},
				func() error {
					_, err := c.Fail(ctx, taskapi.FailRequest{Ref: l.Ref, NodeID: "t", WorkerID: poll.WorkerID, Error: taskapi.Error{Code: "x", Message: "forged"}})
					return err
				},
			} {
				err := report()
				require.True(t, errors.As(err, &apiErr), "%s reports: %v", name, err)
				assert.Equal(t, http.StatusNotFound, apiErr.Status)
			}
		} else {
			require.NoError(t, err)
			assert.False(t, ren.Leases[0].Held, "%s renews nothing", name)
			res, err := c.Complete(ctx, taskapi.CompleteRequest{Ref: l.Ref, NodeID: "t", WorkerID: poll.WorkerID, Output: json.RawMessage(`{"forged":1}`),
				Eager: &taskapi.EagerOffer{Queue: "default", NodeTypes: []string{"task"}, Handlers: []string{"manual"}, TTLMillis: 60_000}})
			require.NoError(t, err)
			assert.True(t, res.Ignored, "%s completes nothing", name)
			assert.Nil(t, res.Next)
			res, err = c.Fail(ctx, taskapi.FailRequest{Ref: l.Ref, NodeID: "t", WorkerID: poll.WorkerID, Retryable: true,
				Error: taskapi.Error{Code: "x", Message: "forged"}})
			require.NoError(t, err)
			assert.True(t, res.Ignored, "%s fails nothing", name)
		}
		again := poll
		again.Retry, again.WaitMillis = true, 0
		stolen, err := c.Poll(ctx, again)
		require.NoError(t, err)
		assert.Empty(t, stolen.Leases, "%s repeating K1's poll gets none of its leases", name)
	}
	_, after := sys.Run(run)
	assert.Equal(t, before["t"], after["t"], "nothing changed")

	res, err := first.Complete(ctx, taskapi.CompleteRequest{Ref: l.Ref, NodeID: "t", WorkerID: poll.WorkerID, Output: json.RawMessage(`{"by":"K1"}`)})
	require.NoError(t, err)
	assert.False(t, res.Ignored, "the key that took the lease completes it")
	assert.Equal(t, "completed", res.RunStatus)
}

// httpStepsAreThePlatforms: a tenant's worker key cannot finish its own
// tenant's http step — even naming the platform worker that holds its
// lease — with a forged response: FORBIDDEN, and the step is neither
// completed nor failed, its attempt unchanged; its renewal holds nothing.
// Tenant B's key is NOT_FOUND for it.
func httpStepsAreThePlatforms(t *testing.T, sys *apptest.System, a tenants.Tenant, keyA, keyB string) {
	ctx := context.Background()
	sys.Tenant = a.ID
	run := sys.StartRun(sys.Workflow(`{"nodes":[{"id":"h","type":"http","http":{"method":"POST","url":"https://example.com/pay"}}]}`), `{}`)
	_, tasks := sys.Run(run)
	ref := taskapi.Ref{Tenant: a.ID, Run: run, Task: tasks["h"].ID, Attempt: 1}
	acq, err := taskapi.NewClient(sys.URL, sys.Cfg.WorkerToken).Acquire(ctx, taskapi.AcquireRequest{WorkerID: "platform-1", TTLMillis: 60_000,
		Leases: []taskapi.Ref{ref}})
	require.NoError(t, err)
	require.True(t, acq.Leases[0].Acquired, "a platform worker runs the step")
	_, before := sys.Run(run)

	forged := json.RawMessage(`{"status":200,"headers":{},"body":{"paid":true}}`)
	for _, c := range []struct {
		key    string
		status int
	}{{keyA, http.StatusForbidden}, {keyB, http.StatusNotFound}} {
		cl := taskapi.NewClient(sys.URL, c.key)
		var apiErr *taskapi.APIError
		_, err := cl.Complete(ctx, taskapi.CompleteRequest{Ref: ref, NodeID: "h", WorkerID: "platform-1", Output: forged})
		require.True(t, errors.As(err, &apiErr), "got %v", err)
		assert.Equal(t, c.status, apiErr.Status, "complete")
		_, err = cl.Fail(ctx, taskapi.FailRequest{Ref: ref, NodeID: "h", WorkerID: "platform-1", Error: taskapi.Error{Code: "x", Message: "forged"}})
		require.True(t, errors.As(err, &apiErr), "got %v", err)
		assert.Equal(t, c.status, apiErr.Status, "fail")
		ren, err := cl.Renew(ctx, taskapi.RenewRequest{WorkerID: "platform-1", TTLMillis: 60_000, Leases: []taskapi.Ref{ref}})
		if c.status == http.StatusForbidden {
			require.NoError(t, err)
			assert.False(t, ren.Leases[0].Held, "renew")
		} else {
			require.True(t, errors.As(err, &apiErr), "got %v", err)
			assert.Equal(t, c.status, apiErr.Status, "renew")
		}
	}
	_, after := sys.Run(run)
	assert.Equal(t, before["h"], after["h"], "the step is unchanged")
	assert.Equal(t, "running", after["h"].State)
	assert.Equal(t, 1, after["h"].Attempt)
	assert.Empty(t, after["h"].Output)
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
