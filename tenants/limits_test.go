package tenants_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/tenants"
)

func limitsOf(t *testing.T, db *pg.DB, id uuid.UUID) (l tenants.Limits, shards int) {
	require.NoError(t, db.WithTenant(context.Background(), id, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		if l, err = tenants.EffectiveLimits(ctx, tx); err != nil {
			return err
		}
		tn, err := tenants.Get(ctx, tx)
		shards = tn.StreamShards
		return err
	}))
	return l, shards
}

func TestOverridesApplyFieldByFieldOverThePlan(t *testing.T) {
	t.Parallel()
	env := testenv.NewPG(t)
	db := pg.New(env.App, env.System, false)
	ctx := context.Background()
	tn, err := tenants.Create(ctx, db, tenants.CreateParams{Name: "a"})
	require.NoError(t, err)
	l, _ := limitsOf(t, db, tn.ID)
	assert.Equal(t, tenants.Limits{MaxRunningTasks: 10, StartsPerSecond: 5, StartBurst: 20, MaxQueuedTasks: 1000, Weight: 1,
		MaxSignalsPerRun: 100, MaxWorkflowVersions: 100, MaxAPIKeys: 20, MaxWebhookEndpoints: 5,
		MaxSchedules: 10, MinScheduleIntervalSeconds: 60, MaxRateLimits: 10, AuditRetentionDays: 30}, l, "the free plan")

	require.NoError(t, tenants.Update(ctx, db, tn.ID, tenants.UpdateParams{Plan: "pro", Limits: &tenants.Limits{MaxRunningTasks: 7}, StreamShards: 8}))
	l, shards := limitsOf(t, db, tn.ID)
	assert.Equal(t, tenants.Limits{MaxRunningTasks: 7, StartsPerSecond: 50, StartBurst: 200, MaxQueuedTasks: 100000, Weight: 4,
		MaxSignalsPerRun: 1000, MaxWorkflowVersions: 1000, MaxAPIKeys: 200, MaxWebhookEndpoints: 20,
		MaxSchedules: 200, MinScheduleIntervalSeconds: 10, MaxRateLimits: 100, AuditRetentionDays: 90}, l,
		"the override, the rest from the new plan")
	assert.Equal(t, 8, shards)

	require.NoError(t, tenants.Update(ctx, db, tn.ID, tenants.UpdateParams{Limits: &tenants.Limits{}}))
	l, _ = limitsOf(t, db, tn.ID)
	assert.Equal(t, 100, l.MaxRunningTasks, "empty overrides fall back to the plan")
}

func TestBadUpdatesAreRefusedAndChangeNothing(t *testing.T) {
	t.Parallel()
	env := testenv.NewPG(t)
	db := pg.New(env.App, env.System, false)
	ctx := context.Background()
	tn, err := tenants.Create(ctx, db, tenants.CreateParams{Name: "a", Plan: "pro"})
	require.NoError(t, err)
	before, shards := limitsOf(t, db, tn.ID)
	for name, p := range map[string]tenants.UpdateParams{
		"unknown plan":     {Plan: "platinum", Limits: &tenants.Limits{MaxRunningTasks: 1}},
		"malformed plan":   {Plan: "Pro Plan"},
		"negative limit":   {Limits: &tenants.Limits{MaxRunningTasks: -1}},
		"weight too large": {Limits: &tenants.Limits{Weight: 5000}},
		"too many shards":  {StreamShards: 1000},
	} {
		err := tenants.Update(ctx, db, tn.ID, p)
		assert.True(t, errors.Is(err, errs.Invalid), "%s: %v", name, err)
	}
	after, shardsAfter := limitsOf(t, db, tn.ID)
	assert.Equal(t, before, after)
	assert.Equal(t, shards, shardsAfter)
	assert.True(t, errors.Is(tenants.Update(ctx, db, uuid.New(), tenants.UpdateParams{Plan: "pro"}), errs.NotFound))
}

func TestRateLimiterAllowsTheBurstThenTheRate(t *testing.T) {
	t.Parallel()
	env := testenv.NewRedis(t)
	rl := tenants.NewRateLimiter(env.Redis, env.Namespace)
	ctx := context.Background()
	a, b := uuid.New(), uuid.New()
	for i := 0; i < 3; i++ {
		wait, err := rl.Allow(ctx, a, 2, 3)
		require.NoError(t, err)
		require.Zero(t, wait, "start %d is within the burst", i)
	}
	wait, err := rl.Allow(ctx, a, 2, 3)
	require.NoError(t, err)
	assert.InDelta(t, 500, wait.Milliseconds(), 60, "the next token comes at the rate (2/s)")

	wait, err = rl.Allow(ctx, b, 2, 3)
	require.NoError(t, err)
	assert.Zero(t, wait, "tenants have buckets of their own")

	wait, err = rl.Allow(ctx, a, 0, 0)
	require.NoError(t, err)
	assert.Zero(t, wait, "a zero rate is unlimited")
}

// TestRateLimiterIsExactUnderConcurrency: 40 goroutines from 4 clients
// (as if 4 gateway replicas) race for a bucket of 25 at 0.01/s: exactly 25
// starts are admitted.
func TestRateLimiterIsExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	env := testenv.NewRedis(t)
	ctx := context.Background()
	for iter := 0; iter < 20; iter++ {
		tenant := uuid.New()
		var limiters []*tenants.RateLimiter
		for range 4 {
			// (Exactness, not latency, is under test: a call cut short by the
			// production timeout on a loaded machine may still take a token.)
			limiters = append(limiters, tenants.NewRateLimiter(env.Redis, env.Namespace).WithTimeout(10*time.Second))
		}
		var allowed atomic.Int32
		var wg sync.WaitGroup
		for g := 0; g < 40; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 5 {
					wait, err := limiters[g%4].Allow(ctx, tenant, 0.01, 25)
					if !assert.NoError(t, err) {
						return
					}
					if wait == 0 {
						allowed.Add(1)
					} else {
						assert.Greater(t, wait, 90*time.Second, "a retry-after of about 1/rate")
					}
				}
			}()
		}
		wg.Wait()
		require.Equal(t, int32(25), allowed.Load(), "iteration %d", iter)
	}
}
