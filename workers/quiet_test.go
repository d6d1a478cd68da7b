package workers_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/engine/taskapi"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/redisconn"
	"github.com/composer-dev/composer/tenants"
	"github.com/composer-dev/composer/workers"
)

// tenantCommands counts the Redis commands that name any of a set of
// tenants (their keys carry the tenant id in a hash tag).
type tenantCommands struct {
	mu      sync.Mutex
	watch   map[string]bool
	counted map[string]int
}

func (c *tenantCommands) note(cmd redis.Cmder) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range cmd.Args() {
		s, ok := a.(string)
		if !ok {
			continue
		}
		if i := strings.Index(s, "{"); i >= 0 && len(s) >= i+37 && c.watch[s[i+1:i+37]] {
			c.counted[cmd.Name()]++
			return
		}
	}
}

func (c *tenantCommands) reset() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.counted
	c.counted = map[string]int{}
	return out
}

func (c *tenantCommands) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *tenantCommands) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.note(cmd); return next(ctx, cmd) }
}
func (c *tenantCommands) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.note(cmd)
		}
		return next(ctx, cmds)
	}
}

// TestQuietTenantsCostAWorkerNothing: after a hundred tenants have run
// work and gone quiet, a worker sends no command naming any of them —
// no reads, no reclaims — while another tenant keeps it busy, and a quiet
// tenant that publishes again is served at once.
func TestQuietTenantsCostAWorkerNothing(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	const quiet = 100
	watch := &tenantCommands{watch: map[string]bool{}, counted: map[string]int{}}
	rdb, _, err := redisconn.Open(sys.Cfg.RedisURL)
	require.NoError(t, err)
	t.Cleanup(func() { rdb.Close() })
	rdb.AddHook(watch)
	w := workers.New(workers.Config{Queues: []string{"default"}, Concurrency: 8, LeaseTTL: 3 * time.Second, ClaimIdle: 400 * time.Millisecond,
		Namespace: sys.Cfg.RedisNamespace, IdlePoll: 20 * time.Millisecond, ShutdownTimeout: 2 * time.Second},
		rdb, taskapi.NewClient(sys.URL, sys.Cfg.WorkerToken), map[string]workers.Executor{"noop": workers.Noop}, nil)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(wctx) }()
	t.Cleanup(func() { stop(); <-done })

	def := []byte(`{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"noop","depends_on":["a"]}]}`)
	type tw struct{ tenant, wf uuid.UUID }
	var all []tw
	for i := range quiet + 1 {
		tn, err := tenants.Create(ctx, sys.Deps.DB, tenants.CreateParams{Name: "t" + uuid.NewString()[:8], StreamShards: 1 + i%4})
		require.NoError(t, err)
		wf, _, err := sys.Coordinator().CreateWorkflow(ctx, tn.ID, "chain", "", def)
		require.NoError(t, err)
		all = append(all, tw{tn.ID, wf.ID})
	}
	busy, quietOnes := all[0], all[1:]
	for _, q := range quietOnes {
		watch.watch[q.tenant.String()] = true
	}
	start := func(x tw) uuid.UUID {
		res, err := sys.Coordinator().StartRun(ctx, x.tenant, engine.StartRun{WorkflowID: x.wf})
		require.NoError(t, err)
		return res.RunID
	}
	wait := func(x tw, run uuid.UUID) {
		s := *sys
		s.Tenant = x.tenant
		v, _ := s.WaitRun(run, 30*time.Second)
		require.Equal(t, "completed", v.Status)
	}
	runs := make([]uuid.UUID, len(quietOnes))
	for i, q := range quietOnes {
		runs[i] = start(q)
	}
	for i, q := range quietOnes {
		wait(q, runs[i])
	}
	// Two reclaim passes: the first finds their streams empty.
	passes := w.ReclaimPasses()
	apptest.Eventually(t, "two reclaim passes", 10*time.Second, func() bool { return w.ReclaimPasses() >= passes+2 })
	watch.reset()

	// The busy tenant runs for at least five more passes.
	passes = w.ReclaimPasses()
	for w.ReclaimPasses() < passes+5 {
		wait(busy, start(busy))
	}
	assert.Empty(t, watch.reset(), "commands naming the quiet tenants while they were quiet")

	// A quiet tenant that publishes is served at once.
	back := quietOnes[quiet/2]
	t0 := time.Now()
	wait(back, start(back))
	assert.Less(t, time.Since(t0), 5*time.Second)
	assert.NotEmpty(t, watch.reset(), "it was read when it published")
}
