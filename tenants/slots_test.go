package tenants_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/tenants"
)

// TestSlotsNeverExceedTheLimitUnderConcurrency: 32 goroutines (four
// clients, as if four servers) take and give back permits of a limit-5
// semaphore as fast as they can; a shared counter of holders never goes
// above 5, and every permit is given back at the end.
func TestSlotsNeverExceedTheLimitUnderConcurrency(t *testing.T) {
	t.Parallel()
	env := testenv.NewRedis(t)
	ctx := context.Background()
	tenant := uuid.New()
	var gates []*tenants.Slots
	for range 4 {
		gates = append(gates, tenants.NewSlots(env.Redis, env.Namespace, nil))
	}
	var holding, peak, granted atomic.Int32
	var wg sync.WaitGroup
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			gate := gates[g%4]
			for i := 0; i < 40; i++ {
				m := tenants.SlotMember(uuid.New(), 1, fmt.Sprintf("w%d", g))
				ok, running, err := gate.Acquire(ctx, tenant, 5, time.Minute, []string{m})
				if !assert.NoError(t, err) {
					return
				}
				assert.LessOrEqual(t, running, 5)
				if !ok[0].Granted() {
					continue
				}
				granted.Add(1)
				n := holding.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				holding.Add(-1)
				assert.NoError(t, gate.Release(ctx, tenant, []string{m}))
			}
		}()
	}
	wg.Wait()
	assert.LessOrEqual(t, peak.Load(), int32(5))
	assert.Greater(t, granted.Load(), int32(100))
	held, err := gates[0].Held(ctx, tenant)
	require.NoError(t, err)
	assert.Zero(t, held)
}

func TestSlotsLapseRenewAndAreIdempotent(t *testing.T) {
	t.Parallel()
	env := testenv.NewRedis(t)
	ctx := context.Background()
	gate := tenants.NewSlots(env.Redis, env.Namespace, nil)
	tenant := uuid.New()
	a, b, c := tenants.SlotMember(uuid.New(), 1, "w1"), tenants.SlotMember(uuid.New(), 1, "w1"), tenants.SlotMember(uuid.New(), 1, "w2")

	start := time.Now() // before the permits are taken: they cannot lapse sooner than TTL+grace after it
	ok, running, err := gate.Acquire(ctx, tenant, 2, 300*time.Millisecond, []string{a, a, b, c})
	require.NoError(t, err)
	assert.Equal(t, []tenants.Permit{tenants.PermitTaken, tenants.PermitHeld, tenants.PermitTaken, tenants.PermitRefused}, ok,
		"a repeated member holds one permit; the third is refused")
	assert.Equal(t, 2, running)

	// b is renewed, a is not: a lapses, b stays.
	require.NoError(t, gate.Renew(ctx, tenant, 2*time.Second, []string{b}))
	require.Eventually(t, func() bool {
		ok, running, err = gate.Acquire(ctx, tenant, 2, time.Second, []string{c})
		return err == nil && ok[0] == tenants.PermitTaken && running == 2
	}, 5*time.Second, 10*time.Millisecond, "a's lapsed permit is free again")
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond+tenants.PermitGrace, "but not before it lapsed")

	// Redis lost the set: the next renewal restores the live permits.
	require.NoError(t, env.Redis.Del(ctx, env.Namespace+":{"+tenant.String()+"}:running").Err())
	require.NoError(t, gate.Renew(ctx, tenant, time.Second, []string{b, c}))
	held, err := gate.Held(ctx, tenant)
	require.NoError(t, err)
	assert.Equal(t, 2, held)

	gate.ReleaseLater(tenant, b, c)
	require.Eventually(t, func() bool {
		n, err := gate.Held(ctx, tenant)
		return err == nil && n == 0
	}, 5*time.Second, 5*time.Millisecond, "released in the background")
}
