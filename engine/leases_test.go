package engine

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/tenants"
)

// TestPermitOutlivesALateLease: the lease transaction starts (and takes
// its expiry from now()) long after the quota permit was taken — here it
// waits for a pooled connection; the permit is re-scored so that it still
// outlives the lease it stands for, otherwise it would lapse first and
// admit a task over the quota.
func TestPermitOutlivesALateLease(t *testing.T) {
	t.Parallel()
	f, _ := newQuotaFixture(t, 1)
	env, ctx := f.env, context.Background()
	run := f.start(f.workflow(`{"nodes":[{"id":"a","type":"noop"}]}`), `{}`)
	a := f.mustTask(run, "a")
	// The running-task limit is cached by the coordinator: read it now, so
	// the lease call below needs no connection before its transaction.
	_, err := f.c.limits.get(ctx, f.tenant)
	require.NoError(t, err)

	// Every connection of the app pool is taken: the lease call will wait.
	var held []*pgxpool.Conn
	for range int(env.App.Config().MaxConns) {
		c, err := env.App.Acquire(ctx)
		require.NoError(t, err)
		held = append(held, c)
	}
	type result struct {
		leases []Lease
		err    error
	}
	done := make(chan result, 1)
	go func() {
		ls, _, err := f.c.AcquireLeases(ctx, f.tenant, "w1", 2*time.Second, []LeaseRequest{{RunID: run, TaskID: a.ID, Attempt: 1}})
		done <- result{ls, err}
	}()
	key, member := env.Namespace+":{"+f.tenant.String()+"}:running", tenants.SlotMember(a.ID, 1, "w1")
	eventually(t, "the permit to be taken", 10*time.Second, func() bool {
		return env.Redis.ZScore(ctx, key, member).Err() == nil
	})
	time.Sleep(2 * tenants.PermitGrace) // the delay under test: the permit ages while the lease waits
	for _, c := range held {
		c.Release()
	}
	res := <-done
	require.NoError(t, res.err)
	require.True(t, res.leases[0].Acquired)

	score, err := env.Redis.ZScore(ctx, key, member).Result()
	require.NoError(t, err)
	permitExpiry := time.UnixMilli(int64(score))
	assert.True(t, permitExpiry.After(res.leases[0].ExpiresAt), "permit lapses at %s, lease at %s", permitExpiry, res.leases[0].ExpiresAt)
}

// TestDuplicateAcquireKeepsTheLivePermit: the owner of a live lease asks
// for the same task again (a duplicate message): the lease is not granted
// twice, and the permit stays with the live lease — giving it back would
// let another task run in that lease's place, over the quota.
func TestDuplicateAcquireKeepsTheLivePermit(t *testing.T) {
	t.Parallel()
	f, slots := newQuotaFixture(t, 1)
	ctx := context.Background()
	wf := f.workflow(`{"nodes":[{"id":"a","type":"noop"}]}`)
	first, second := f.start(wf, `{}`), f.start(wf, `{}`)
	a := f.lease(first, "a", "w1", time.Minute)

	ls, q, err := f.c.AcquireLeases(ctx, f.tenant, "w1", time.Minute, []LeaseRequest{{RunID: first, TaskID: a.ID, Attempt: 1}})
	require.NoError(t, err)
	assert.False(t, ls[0].Acquired, "a duplicate gets no second lease")
	assert.Equal(t, 1, q.Running)
	held, err := slots.Held(ctx, f.tenant)
	require.NoError(t, err)
	assert.Equal(t, 1, held, "the live lease keeps its permit")

	other := f.mustTask(second, "a")
	ls, q, err = f.c.AcquireLeases(ctx, f.tenant, "w2", time.Minute, []LeaseRequest{{RunID: second, TaskID: other.ID, Attempt: 1}})
	require.NoError(t, err)
	assert.False(t, ls[0].Acquired, "another task waits: the quota of 1 is held")
	assert.True(t, q.Full())
}

// TestOneLeaseCallForSeveralTenantsKeepsEachToItsOwn: a platform worker's lease
// call for several tenants (one pg.DB.PipelineTenants transaction; what
// that saves is measured by the tenants-N benchmarks' commits per step)
// leases each tenant's own task,
// keeps each tenant's quota, and cannot lease one tenant's task under
// another tenant's name (row-level security and the tenant column scope
// every statement to its own tenant).
func TestOneLeaseCallForSeveralTenantsKeepsEachToItsOwn(t *testing.T) {
	t.Parallel()
	f, slots := newQuotaFixture(t, 1)
	ctx := context.Background()
	other, err := tenants.Create(ctx, f.db, tenants.CreateParams{Name: "globex"})
	require.NoError(t, err)
	g := &fixture{t: t, env: f.env, db: f.db, c: f.c, tenant: other.ID}
	def := `{"nodes":[{"id":"a","type":"noop"}]}`
	runA1, runA2 := f.start(f.workflow(def), `{}`), f.start(f.workflow(def), `{}`)
	runB := g.start(g.workflow(def), `{}`)
	a1, a2, b := f.mustTask(runA1, "a"), f.mustTask(runA2, "a"), g.mustTask(runB, "a")

	res, err := f.c.AcquireLeasesOf(ctx, "w1", time.Minute, []TenantLeases{
		{Tenant: f.tenant, Requests: []LeaseRequest{{RunID: runA1, TaskID: a1.ID, Attempt: 1}, {RunID: runA2, TaskID: a2.ID, Attempt: 1}}},
		// Tenant B names its own task, and tenant A's under B's name.
		{Tenant: other.ID, Requests: []LeaseRequest{{RunID: runB, TaskID: b.ID, Attempt: 1}, {RunID: runA2, TaskID: a2.ID, Attempt: 1}}},
	})
	require.NoError(t, err)
	require.Len(t, res, 2)
	assert.True(t, res[0].Leases[0].Acquired, "A's first task")
	assert.False(t, res[0].Leases[1].Acquired, "A's quota of 1 is full")
	assert.True(t, res[0].Quota.Full())
	assert.True(t, res[1].Leases[0].Acquired, "B's own task")
	assert.False(t, res[1].Leases[1].Acquired, "A's task under B's name is not B's to lease")
	assert.Equal(t, "pending", f.mustTask(runA2, "a").State)
	held, err := slots.Held(ctx, f.tenant)
	require.NoError(t, err)
	assert.Equal(t, 1, held, "the refused permit went back")
}
