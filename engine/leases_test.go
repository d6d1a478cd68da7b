package engine

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	sm "github.com/composer-dev/composer/engine/statemachine"
	"github.com/composer-dev/composer/internal/errs"
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
		ls, _, err := f.c.AcquireLeases(ctx, f.tenant, Holder{Worker: "w1"}, 2*time.Second, []LeaseRequest{{RunID: run, TaskID: a.ID, Attempt: 1}})
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

	ls, q, err := f.c.AcquireLeases(ctx, f.tenant, Holder{Worker: "w1"}, time.Minute, []LeaseRequest{{RunID: first, TaskID: a.ID, Attempt: 1}})
	require.NoError(t, err)
	assert.False(t, ls[0].Acquired, "a duplicate gets no second lease")
	assert.Equal(t, 1, q.Running)
	held, err := slots.Held(ctx, f.tenant)
	require.NoError(t, err)
	assert.Equal(t, 1, held, "the live lease keeps its permit")

	other := f.mustTask(second, "a")
	ls, q, err = f.c.AcquireLeases(ctx, f.tenant, Holder{Worker: "w2"}, time.Minute, []LeaseRequest{{RunID: second, TaskID: other.ID, Attempt: 1}})
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

	res, err := f.c.AcquireLeasesOf(ctx, Holder{Worker: "w1"}, time.Minute, []TenantLeases{
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

// keyed is a tenant worker's lease holder: worker id w under API key k.
func keyed(w, k string) Holder { return Holder{Worker: w, Key: k} }

// TestKeyBoundLeaseAnswersOnlyItsKey: a tenant worker's lease is bound to
// the API key that took it. Another key of the tenant naming the same
// worker id and attempt renews, hands back, releases, completes and fails
// nothing of it — each call changes nothing — and gets no eager lease from
// a repeat of its report; the key that took it does all of that. The
// timeline records the key with the worker; revoking a key ends its leases
// only.
func TestKeyBoundLeaseAnswersOnlyItsKey(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	wf := f.workflow(`{"nodes":[{"id":"a","type":"task","task":{"handler":"h"},"retry":{"max_attempts":3}},
		{"id":"b","type":"task","task":{"handler":"h"},"depends_on":["a"]}]}`)
	run := f.start(wf, `{}`)
	a := f.mustTask(run, "a")
	req := []LeaseRequest{{RunID: run, TaskID: a.ID, Attempt: 1}}
	ls, _, err := f.c.AcquireLeases(ctx, f.tenant, keyed("w1", "K1"), time.Minute, req)
	require.NoError(t, err)
	require.True(t, ls[0].Acquired)
	before := f.snapshot(run)

	thief := keyed("w1", "K2")
	ren, err := f.c.RenewLeases(ctx, f.tenant, thief, time.Minute, req)
	require.NoError(t, err)
	assert.False(t, ren[0].Held, "another key renews nothing")
	again, err := f.c.ReacquireLeases(ctx, f.tenant, thief, time.Minute, req)
	require.NoError(t, err)
	assert.False(t, again[0].Acquired, "nor is handed the lease back, with its input")
	require.NoError(t, f.c.ReleaseLeases(ctx, f.tenant, thief, req))
	offer := &EagerOffer{Queue: "default", NodeTypes: []string{"task"}, Handlers: []string{"h"}, TTL: time.Minute}
	ack, err := f.c.CompleteTask(ctx, f.tenant, Report{RunID: run, TaskID: a.ID, NodeID: "a", Attempt: 1, LeaseOwner: "w1", LeaseKey: "K2",
		Output: json.RawMessage(`{"forged":true}`), Eager: offer})
	require.NoError(t, err)
	assert.True(t, ack.Ignored, "nor completes it")
	assert.Nil(t, ack.Next)
	ack, err = f.c.FailTask(ctx, f.tenant, Report{RunID: run, TaskID: a.ID, NodeID: "a", Attempt: 1, LeaseOwner: "w1", LeaseKey: "K2",
		Retryable: true, Error: sm.Error{Code: "x", Message: "forged"}})
	require.NoError(t, err)
	assert.True(t, ack.Ignored, "nor fails it")
	assert.Equal(t, before, f.snapshot(run), "nothing changed")

	ren, err = f.c.RenewLeases(ctx, f.tenant, keyed("w1", "K1"), time.Minute, req)
	require.NoError(t, err)
	assert.True(t, ren[0].Held, "the key that took it renews it")
	ack, err = f.c.CompleteTask(ctx, f.tenant, Report{RunID: run, TaskID: a.ID, NodeID: "a", Attempt: 1, LeaseOwner: "w1", LeaseKey: "K1",
		Output: json.RawMessage(`{}`), Eager: offer})
	require.NoError(t, err)
	require.False(t, ack.Ignored)
	require.NotNil(t, ack.Next, "and its report takes the next task eagerly")
	b := f.mustTask(run, "b")
	var key *string
	require.NoError(t, f.env.System.QueryRow(ctx, `SELECT lease_key_id FROM task_instances WHERE id = $1`, b.ID).Scan(&key))
	require.NotNil(t, key)
	assert.Equal(t, "K1", *key, "the eager lease is bound to the reporting key")
	var detail map[string]any
	require.NoError(t, f.env.System.QueryRow(ctx, `SELECT detail FROM run_events WHERE run_id = $1 AND kind = 'node_completed' AND node_id = 'a'`,
		run).Scan(&detail))
	assert.Equal(t, "w1", detail["worker"])
	assert.Equal(t, "K1", detail["api_key_id"], "the timeline names the key that reported")

	// A repeat of the completion (its answer lost) by another key gets no
	// eager lease back.
	ack, err = f.c.CompleteTask(ctx, f.tenant, Report{RunID: run, TaskID: a.ID, NodeID: "a", Attempt: 1, LeaseOwner: "w1", LeaseKey: "K2",
		Output: json.RawMessage(`{}`), Eager: offer})
	require.NoError(t, err)
	assert.True(t, ack.Ignored)
	assert.Nil(t, ack.Next, "another key's repeat is handed nothing")
	ack, err = f.c.CompleteTask(ctx, f.tenant, Report{RunID: run, TaskID: a.ID, NodeID: "a", Attempt: 1, LeaseOwner: "w1", LeaseKey: "K1",
		Output: json.RawMessage(`{}`), Eager: offer})
	require.NoError(t, err)
	require.NotNil(t, ack.Next, "the key's own repeat gets its eager lease back")

	// Revoking K2 leaves K1's lease; revoking K1 ends it.
	n, err := f.c.ExpireKeyLeases(ctx, f.tenant, "K2")
	require.NoError(t, err)
	assert.Zero(t, n)
	n, err = f.c.ExpireKeyLeases(ctx, f.tenant, "K1")
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)
}

// TestLeaseOfThePreviousReleaseIsBoundAtItsFirstRenewal: a lease taken
// without a key (by the previous release, during a rolling upgrade) is
// renewed by its worker's key as before, and from then on is that key's.
func TestLeaseOfThePreviousReleaseIsBoundAtItsFirstRenewal(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	run := f.start(f.workflow(`{"nodes":[{"id":"a","type":"task","task":{"handler":"h"}}]}`), `{}`)
	a := f.lease(run, "a", "w1", time.Minute)
	req := []LeaseRequest{{RunID: run, TaskID: a.ID, Attempt: 1}}
	ren, err := f.c.RenewLeases(ctx, f.tenant, keyed("w1", "K1"), time.Minute, req)
	require.NoError(t, err)
	assert.True(t, ren[0].Held, "the worker keeps its lease across the upgrade")
	ren, err = f.c.RenewLeases(ctx, f.tenant, keyed("w1", "K2"), time.Minute, req)
	require.NoError(t, err)
	assert.False(t, ren[0].Held, "and another key cannot take it over")
	ack, err := f.c.CompleteTask(ctx, f.tenant, Report{RunID: run, TaskID: a.ID, NodeID: "a", Attempt: 1, LeaseOwner: "w1", LeaseKey: "K2"})
	require.NoError(t, err)
	assert.True(t, ack.Ignored)
	assert.Equal(t, "running", f.mustTask(run, "a").State)
}

// TestKeyHolderReportsOnlyTaskNodes: a tenant worker's key completing,
// failing or renewing its own tenant's http step — here running under a
// platform worker's lease, named by that worker's id — is FORBIDDEN (or,
// for a renewal, not held) and changes nothing; nor can a key lease one.
// The SQL guard holds on its own: a task row whose stored type is not
// task is not completed by a key even when the workflow calls it a task.
func TestKeyHolderReportsOnlyTaskNodes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	wf := f.workflow(`{"nodes":[{"id":"h","type":"http","http":{"url":"https://example.com/charge"}},
		{"id":"m","type":"map","map":{"items":"input.xs","step":{"type":"http","http":{"url":"https://example.com/each"}}}}]}`)
	run := f.start(wf, `{"xs":[1]}`)
	h := f.mustTask(run, "h")
	req := []LeaseRequest{{RunID: run, TaskID: h.ID, Attempt: 1}}
	ls, _, err := f.c.AcquireLeases(ctx, f.tenant, keyed("p1", "K1"), time.Minute, req)
	require.NoError(t, err)
	assert.False(t, ls[0].Acquired, "a key is never leased an http step")
	f.lease(run, "h", "p1", time.Minute)
	before := f.snapshot(run)

	_, err = f.c.CompleteTask(ctx, f.tenant, Report{RunID: run, TaskID: h.ID, NodeID: "h", Attempt: 1, LeaseOwner: "p1", LeaseKey: "K1",
		Output: json.RawMessage(`{"status":200,"body":"forged"}`)})
	assert.Equal(t, errs.Forbidden, errs.KindOf(err), "completing an http step: %v", err)
	_, err = f.c.FailTask(ctx, f.tenant, Report{RunID: run, TaskID: h.ID, NodeID: "h", Attempt: 1, LeaseOwner: "p1", LeaseKey: "K1",
		Error: sm.Error{Code: "x", Message: "forged"}})
	assert.Equal(t, errs.Forbidden, errs.KindOf(err), "failing it: %v", err)
	ren, err := f.c.RenewLeases(ctx, f.tenant, keyed("p1", "K1"), time.Minute, req)
	require.NoError(t, err)
	assert.False(t, ren[0].Held, "renewing it")
	for _, item := range []string{"m", "m[0]"} { // the map, and its element of an http step
		tk := f.mustTask(run, item)
		_, err = f.c.CompleteTask(ctx, f.tenant, Report{RunID: run, TaskID: tk.ID, NodeID: item, Attempt: 1, LeaseOwner: "p1", LeaseKey: "K1"})
		assert.Equal(t, errs.Forbidden, errs.KindOf(err), "completing %s: %v", item, err)
	}
	assert.Equal(t, before, f.snapshot(run), "nothing changed")

	// The guard alone: a task node leased to the key, whose row says http.
	run2 := f.start(f.workflow(`{"nodes":[{"id":"a","type":"task","task":{"handler":"h"}}]}`), `{}`)
	a := f.mustTask(run2, "a")
	ls, _, err = f.c.AcquireLeases(ctx, f.tenant, keyed("w1", "K1"), time.Minute, []LeaseRequest{{RunID: run2, TaskID: a.ID, Attempt: 1}})
	require.NoError(t, err)
	require.True(t, ls[0].Acquired)
	_, err = f.env.System.Exec(ctx, `UPDATE task_instances SET node_type = 'http' WHERE id = $1`, a.ID)
	require.NoError(t, err)
	ack, err := f.c.CompleteTask(ctx, f.tenant, Report{RunID: run2, TaskID: a.ID, NodeID: "a", Attempt: 1, LeaseOwner: "w1", LeaseKey: "K1"})
	require.NoError(t, err)
	assert.True(t, ack.Ignored, "the guard refuses what the Go check let through")
	assert.Equal(t, "running", f.mustTask(run2, "a").State)
}
