package workers_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/engine/stream"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/redisconn"
	"github.com/composer-dev/composer/workers"
)

// loseAnswers is a client hook that, once armed, runs every command as
// usual but loses the answer of the first pipeline that runs a script
// (the worker's read) and of every command after it until disarmed: the
// commands ran in Redis, the client is told they timed out — as a frozen
// Redis or a connection broken mid-answer leaves it. (Until the read,
// the worker still learns which tenants published.)
type loseAnswers struct{ armed, losing *atomic.Bool }

var errAnswerLost = errors.New("i/o timeout (the answer was lost)")

func (loseAnswers) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h loseAnswers) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if h.losing.Load() {
			cmd.SetErr(errAnswerLost)
			return errAnswerLost
		}
		return err
	}
}

func (h loseAnswers) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if h.armed.Load() && slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return c.Name() == "eval" || c.Name() == "evalsha" }) {
			h.losing.Store(true)
		}
		if !h.losing.Load() {
			return err
		}
		for _, c := range cmds {
			c.SetErr(errAnswerLost)
		}
		return errAnswerLost
	}
}

// retryAnswers is a client hook that, once armed, makes the first script
// pipeline that reads something (the worker's read delivering a message)
// behave as go-redis does when an answer times out: that try ran and its
// answer is dropped, and after the client's read timeout a retry runs
// and its answer — nothing new to read — is the one the worker gets.
type retryAnswers struct{ armed *atomic.Bool }

func (retryAnswers) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (retryAnswers) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h retryAnswers) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if !h.armed.Load() || !slices.ContainsFunc(cmds, func(c redis.Cmder) bool {
			res, ok := c.(*redis.Cmd)
			if !ok || (c.Name() != "eval" && c.Name() != "evalsha") {
				return false
			}
			vals, _ := res.Slice()
			return len(vals) > 0
		}) || !h.armed.CompareAndSwap(true, false) {
			return err
		}
		time.Sleep(1100 * time.Millisecond) // the client's read timeout
		return next(ctx, cmds)
	}
}

// lostReadWorker starts a worker whose Redis client carries hook, with
// ClaimIdle at ten minutes (so no reclaim can be what recovers a message),
// and checks it runs a first run.
func lostReadWorker(t *testing.T, sys *apptest.System, hook redis.Hook, runs *atomic.Int32) *workers.Worker {
	rdb, _, err := redisconn.Open(sys.Cfg.RedisURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = rdb.Close() })
	rdb.AddHook(hook)
	noop := workers.ExecutorFunc(func(ctx context.Context, t workers.Task) (json.RawMessage, error) {
		runs.Add(1)
		return json.RawMessage(`{}`), nil
	})
	w, _ := sys.StartWorker(apptest.WorkerOptions{Noop: noop, Redis: rdb, Config: func(c *workers.Config) {
		c.ClaimIdle = 10 * time.Minute
		c.Concurrency = 4
	}})
	got, _ := sys.WaitRun(sys.StartRun(sys.Workflow(`{"nodes":[{"id":"warm","type":"noop"}]}`), `{}`), 20*time.Second)
	require.Equal(t, "completed", got.Status)
	return w
}

// ranOnceAndHoldsNothing checks the run completed on its first attempt,
// each of the two tasks ran once, and the worker keeps nothing.
func ranOnceAndHoldsNothing(t *testing.T, sys *apptest.System, w *workers.Worker, run uuid.UUID, runs *atomic.Int32) {
	got, tasks := sys.WaitRun(run, 30*time.Second)
	require.Equal(t, "completed", got.Status, "the worker took its message back long before ClaimIdle")
	assert.Equal(t, 1, tasks["lost"].Attempt)
	assert.EqualValues(t, 2, runs.Load(), "each task ran once")
	apptest.Eventually(t, "the worker to hold nothing", 10*time.Second, func() bool {
		known, suspect := w.OwnPending()
		return known == 0 && suspect == 0
	})
}

// TestAReadWhoseAnswerIsLostDoesNotStrandItsMessages: a worker's read runs
// in Redis but its answer is lost, so the message it delivered sits in
// the worker's own pending list unseen, its task pending. The worker
// takes it back itself once Redis answers again, and runs the task once.
func TestAReadWhoseAnswerIsLostDoesNotStrandItsMessages(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	var armed, losing atomic.Bool
	var runs atomic.Int32
	w := lostReadWorker(t, sys, loseAnswers{&armed, &losing}, &runs)

	armed.Store(true)
	run := sys.StartRun(sys.Workflow(`{"nodes":[{"id":"lost","type":"noop"}]}`), `{}`)
	names := stream.NewNames(sys.Cfg.RedisNamespace)
	apptest.Eventually(t, "a read to deliver the message to the worker unseen", 20*time.Second, func() bool {
		if !losing.Load() {
			return false
		}
		for _, k := range names.Streams(sys.Tenant, "default", 4) {
			p, err := sys.Deps.Redis.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: k, Group: stream.Group,
				Start: "-", End: "+", Count: 10, Consumer: w.ID()}).Result()
			if err == nil && len(p) > 0 {
				return true
			}
		}
		return false
	})
	_, tasks := sys.Run(run)
	require.Equal(t, "pending", tasks["lost"].State, "the worker never saw it")
	armed.Store(false)
	losing.Store(false)
	ranOnceAndHoldsNothing(t, sys, w, run, &runs)
}

// TestAReadAnsweredByARetryDoesNotStrandItsMessages: the read that
// delivered the message timed out and the client's retry answered
// instead, with nothing — no error reaches the worker, only a read that
// took longer than a second. The worker takes the message back all the
// same.
func TestAReadAnsweredByARetryDoesNotStrandItsMessages(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	var armed atomic.Bool
	var runs atomic.Int32
	w := lostReadWorker(t, sys, retryAnswers{&armed}, &runs)

	armed.Store(true)
	run := sys.StartRun(sys.Workflow(`{"nodes":[{"id":"lost","type":"noop"}]}`), `{}`)
	ranOnceAndHoldsNothing(t, sys, w, run, &runs)
	assert.False(t, armed.Load(), "the read that delivered the message was answered by its retry")
}
