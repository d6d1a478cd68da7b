package taskpoll_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/engine/stream"
	"github.com/composer-dev/composer/engine/taskapi"
	"github.com/composer-dev/composer/engine/taskpoll"
	"github.com/composer-dev/composer/internal/apptest"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/tenants"
)

func request(worker string, slots int, handlers ...string) taskapi.PollRequest {
	return taskapi.PollRequest{WorkerID: worker, PollID: uuid.NewString(), Queues: []string{"default"}, Handlers: handlers,
		Slots: slots, Capacity: max(slots, 1), TTLMillis: 5000, WaitMillis: 0}
}

func taskDef(handler string) string {
	return fmt.Sprintf(`{"nodes":[{"id":"t","type":"task","task":{"handler":%q}}]}`, handler)
}

// published waits until the tenant has no outbox rows left: every
// dispatch reached its stream.
func published(t *testing.T, sys *apptest.System) {
	t.Helper()
	apptest.Eventually(t, "dispatches to reach the streams", 10*time.Second, func() bool {
		var n int
		require.NoError(t, sys.Deps.DB.System().QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&n))
		return n == 0
	})
}

func caller(sys *apptest.System) taskpoll.Caller {
	return taskpoll.Caller{Tenant: sys.Tenant, KeyID: "test-key"}
}

// TestPollLeasesOnlyWhatTheWorkerServes: a poll gets at most its slots, only
// for its handlers, with the task's input and settings; tasks of other
// handlers stay queued.
func TestPollLeasesOnlyWhatTheWorkerServes(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	charge, email := sys.Workflow(taskDef("charge")), sys.Workflow(taskDef("email"))
	for i := range 5 {
		sys.StartRun(charge, fmt.Sprintf(`{"n":%d}`, i))
	}
	emailRun := sys.StartRun(email, `{}`)
	published(t, sys)

	leases, err := sys.Server.Poller.Poll(ctx, caller(sys), request("w1", 3, "charge"))
	require.NoError(t, err)
	require.Len(t, leases, 3, "no more than the free slots")
	for _, l := range leases {
		assert.Equal(t, "t", l.NodeID)
		assert.Equal(t, "task", l.NodeType)
		assert.Equal(t, "default", l.Queue)
		var cfg taskapi.TaskConfig
		require.NoError(t, json.Unmarshal(l.Config, &cfg))
		assert.Equal(t, "charge", cfg.Task.Handler)
		assert.Contains(t, string(l.Input), `"n"`)
	}
	leases, err = sys.Server.Poller.Poll(ctx, caller(sys), request("w1", 10, "charge"))
	require.NoError(t, err)
	assert.Len(t, leases, 2, "the rest of the charges")
	leases, err = sys.Server.Poller.Poll(ctx, caller(sys), request("w1", 10, "charge"))
	require.NoError(t, err)
	assert.Empty(t, leases, "nothing left for charge; the email task is not offered")
	_, tasks := sys.Run(emailRun)
	assert.Equal(t, "pending", tasks["t"].State)
}

// TestPollNeverCrossesTenants: two tenants queue tasks for the same
// handler; each tenant's polls get only its own.
func TestPollNeverCrossesTenants(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	other, err := tenants.Create(ctx, sys.Deps.DB, tenants.CreateParams{Name: "other", Plan: "pro"})
	require.NoError(t, err)
	mine := map[uuid.UUID]bool{}
	for range 3 {
		mine[sys.StartRun(sys.Workflow(taskDef("work")), `{}`)] = true
	}
	w, _, err := sys.Coordinator().CreateWorkflow(ctx, other.ID, "theirs", "", []byte(taskDef("work")))
	require.NoError(t, err)
	for range 3 {
		_, err := sys.Coordinator().StartRun(ctx, other.ID, engine.StartRun{WorkflowID: w.ID})
		require.NoError(t, err)
	}
	published(t, sys)
	leases, err := sys.Server.Poller.Poll(ctx, caller(sys), request("w1", 10, "work"))
	require.NoError(t, err)
	require.Len(t, leases, 3)
	for _, l := range leases {
		assert.True(t, mine[l.RunID], "lease of run %s is this tenant's", l.RunID)
	}
	theirs, err := sys.Server.Poller.Poll(ctx, taskpoll.Caller{Tenant: other.ID, KeyID: "their-key"}, request("w1", 10, "work"))
	require.NoError(t, err)
	require.Len(t, theirs, 3)
	for _, l := range theirs {
		assert.False(t, mine[l.RunID])
	}
}

// TestHeldPollAnswersWhenWorkArrives: a poll finds nothing and is held;
// a run started meanwhile is answered on that same poll, long before its
// wait runs out.
func TestHeldPollAnswersWhenWorkArrives(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	wf := sys.Workflow(taskDef("work"))
	req := request("w1", 1, "work")
	req.WaitMillis = 15_000
	type answer struct {
		leases []engine.Lease
		err    error
		took   time.Duration
	}
	got := make(chan answer, 1)
	go func() {
		start := time.Now()
		l, err := sys.Server.Poller.Poll(context.Background(), caller(sys), req)
		got <- answer{l, err, time.Since(start)}
	}()
	// The poll is held once the worker is in the registry.
	apptest.Eventually(t, "the poll to be held", 10*time.Second, func() bool {
		ws, err := sys.Server.Poller.Workers(context.Background(), sys.Tenant)
		return err == nil && len(ws) == 1
	})
	run := sys.StartRun(wf, `{}`)
	a := <-got
	require.NoError(t, a.err)
	require.Len(t, a.leases, 1)
	assert.Equal(t, run, a.leases[0].RunID)
	assert.Less(t, a.took, 15*time.Second, "answered by the wake-up, not by the end of the wait")
}

// TestHeldPollEndsWhenItsCallerLeaves: a caller that goes away ends its
// held poll (nothing is leased to it).
func TestHeldPollEndsWhenItsCallerLeaves(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	req := request("w1", 1, "work")
	req.WaitMillis = 15_000
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan []engine.Lease, 1)
	go func() {
		l, _ := sys.Server.Poller.Poll(ctx, caller(sys), req)
		done <- l
	}()
	apptest.Eventually(t, "the poll to be held", 10*time.Second, func() bool {
		ws, _ := sys.Server.Poller.Workers(context.Background(), sys.Tenant)
		return len(ws) == 1
	})
	cancel()
	select {
	case l := <-done:
		assert.Empty(t, l)
	case <-time.After(5 * time.Second):
		t.Fatal("the held poll did not end with its caller")
	}
}

// pollTwo queues two tasks and answers worker w1's poll for them; it
// returns the leases and the poll.
func pollTwo(t *testing.T, sys *apptest.System) ([]engine.Lease, taskapi.PollRequest) {
	t.Helper()
	wf := sys.Workflow(taskDef("work"))
	for range 2 {
		sys.StartRun(wf, `{}`)
	}
	published(t, sys)
	req := request("w1", 5, "work")
	first, err := sys.Server.Poller.Poll(context.Background(), caller(sys), req)
	require.NoError(t, err)
	require.Len(t, first, 2)
	return first, req
}

// TestRepeatedPollGetsTheLostAnswerBack: a poll's answer is lost; the
// worker repeats it with the same poll id and gets the same leases back,
// still live, instead of waiting out their TTL.
func TestRepeatedPollGetsTheLostAnswerBack(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	first, req := pollTwo(t, sys)
	req.Retry = true
	again, err := sys.Server.Poller.Poll(ctx, caller(sys), req)
	require.NoError(t, err)
	require.Len(t, again, 2)
	for i := range first {
		assert.Equal(t, first[i].TaskID, again[i].TaskID)
		assert.Equal(t, first[i].Input, again[i].Input)
		assert.False(t, again[i].ExpiresAt.Before(first[i].ExpiresAt), "the lease was extended")
	}
	// Another worker repeating that poll id gets nothing: the leases are w1's.
	req.WorkerID = "w2"
	other, err := sys.Server.Poller.Poll(ctx, caller(sys), req)
	require.NoError(t, err)
	assert.Empty(t, other)
}

// TestAnotherKeyGetsNothingOfAKeptAnswer: a second worker key of the
// tenant repeats a poll with the first key's worker and poll ids. It is
// answered with nothing of the first answer — its leases stay the first
// key's (a renewal by the second key holds none of them) — and it does
// not disturb it: the first key's repeat still gets its leases back.
func TestAnotherKeyGetsNothingOfAKeptAnswer(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	first, req := pollTwo(t, sys)
	req.Retry = true
	thief := taskpoll.Caller{Tenant: sys.Tenant, KeyID: "other-key"}
	got, err := sys.Server.Poller.Poll(ctx, thief, req)
	require.NoError(t, err)
	assert.Empty(t, got, "another key is answered with none of the kept leases")
	reqs := make([]engine.LeaseRequest, len(first))
	for i, l := range first {
		reqs[i] = engine.LeaseRequest{RunID: l.RunID, TaskID: l.TaskID, Attempt: l.Attempt}
	}
	ren, err := sys.Coordinator().RenewLeases(ctx, sys.Tenant, engine.Holder{Worker: "w1", Key: "other-key"}, 5*time.Second, reqs)
	require.NoError(t, err)
	for _, r := range ren {
		assert.False(t, r.Held, "nor holds any of them")
	}
	again, err := sys.Server.Poller.Poll(ctx, caller(sys), req)
	require.NoError(t, err)
	require.Len(t, again, 2, "the first key's repeat is undisturbed")
	for i := range first {
		assert.Equal(t, first[i].TaskID, again[i].TaskID)
	}
	ws, err := sys.Server.Poller.Workers(ctx, sys.Tenant)
	require.NoError(t, err)
	require.Len(t, ws, 2, "w1 under each key is its own entry")
	assert.Equal(t, []string{"other-key", "test-key"}, []string{ws[0].KeyID, ws[1].KeyID})
	assert.Equal(t, "w1", ws[0].ID)
	assert.Equal(t, "w1", ws[1].ID)
}

// TestUnsettledMessagesAreTakenOver: a server that read messages and died
// before leasing them leaves them pending in the group; a later poll takes
// them over once they have been idle for ReclaimIdle.
func TestUnsettledMessagesAreTakenOver(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	run := sys.StartRun(sys.Workflow(taskDef("work")), `{}`)
	published(t, sys)
	key := stream.NewNames(sys.Cfg.RedisNamespace).HandlerStream(sys.Tenant, "default", "work")
	// The dead server's read.
	res, err := sys.Deps.Redis.XReadGroup(ctx, &redis.XReadGroupArgs{Group: stream.Group, Consumer: "poll", Streams: []string{key, ">"}, Count: 10}).Result()
	require.NoError(t, err)
	require.Len(t, res[0].Messages, 1)

	p := taskpoll.New(sys.Coordinator(), sys.Deps.Redis, stream.NewNames(sys.Cfg.RedisNamespace), nil,
		taskpoll.Config{ReclaimIdle: 300 * time.Millisecond}, sys.Log)
	leases, err := p.Poll(ctx, caller(sys), request("w1", 1, "work"))
	require.NoError(t, err)
	assert.Empty(t, leases, "a message read a moment ago may still be being leased")
	time.Sleep(400 * time.Millisecond) // past ReclaimIdle: what is being tested is the idle time
	leases, err = p.Poll(ctx, caller(sys), request("w1", 1, "work"))
	require.NoError(t, err)
	require.Len(t, leases, 1)
	assert.Equal(t, run, leases[0].RunID)
	n, err := sys.Deps.Redis.XLen(ctx, key).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "settled: the lease is the truth now")
}

// TestPollTakesNoMoreThanTheQuota: a tenant limited to 2 running tasks
// gets 2 leases however many slots its worker has; the rest wait in the
// stream.
func TestPollTakesNoMoreThanTheQuota(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	require.NoError(t, tenants.Update(ctx, sys.Deps.DB, sys.Tenant, tenants.UpdateParams{Limits: &tenants.Limits{MaxRunningTasks: 2}}))
	wf := sys.Workflow(taskDef("work"))
	for range 5 {
		sys.StartRun(wf, `{}`)
	}
	published(t, sys)
	leases, err := sys.Server.Poller.Poll(ctx, caller(sys), request("w1", 5, "work"))
	require.NoError(t, err)
	assert.Len(t, leases, 2)
	leases, err = sys.Server.Poller.Poll(ctx, caller(sys), request("w2", 5, "work"))
	require.NoError(t, err)
	assert.Empty(t, leases, "the quota is full")
	n, err := sys.Deps.Redis.XLen(ctx, stream.NewNames(sys.Cfg.RedisNamespace).HandlerStream(sys.Tenant, "default", "work")).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 3, n, "the other three wait in the stream")
}

// TestPollsAreValidated: every bound of a poll request is checked, with a
// message naming it, and nothing is read.
func TestPollsAreValidated(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	many := make([]string, 201)
	for i := range many {
		many[i] = fmt.Sprintf("h%d", i)
	}
	for name, mod := range map[string]func(*taskapi.PollRequest){
		"worker id":     func(r *taskapi.PollRequest) { r.WorkerID = "has space" },
		"poll id":       func(r *taskapi.PollRequest) { r.PollID = "" },
		"no queues":     func(r *taskapi.PollRequest) { r.Queues = nil },
		"queue name":    func(r *taskapi.PollRequest) { r.Queues = []string{"Bad:Queue"} },
		"handler name":  func(r *taskapi.PollRequest) { r.Handlers = []string{"bad-name"} },
		"many handlers": func(r *taskapi.PollRequest) { r.Handlers = many },
		"many pairs":    func(r *taskapi.PollRequest) { r.Handlers, r.Queues = many[:50], []string{"a", "b", "c", "d", "e"} },
		"slots":         func(r *taskapi.PollRequest) { r.Slots, r.Capacity = 5000, 5000 },
		"ttl":           func(r *taskapi.PollRequest) { r.TTLMillis = 10 },
		"wait":          func(r *taskapi.PollRequest) { r.WaitMillis = int64(time.Hour / time.Millisecond) },
		"label":         func(r *taskapi.PollRequest) { r.Label = "evil\u202ename" },
	} {
		req := request("w1", 1, "work")
		mod(&req)
		_, err := sys.Server.Poller.Poll(context.Background(), caller(sys), req)
		assert.Equal(t, errs.Invalid, errs.KindOf(err), "%s: %v", name, err)
	}
	_, err := sys.Server.Poller.Poll(context.Background(), taskpoll.Caller{Tenant: sys.Tenant}, request("w1", 1, "work"))
	assert.Equal(t, errs.Unauthenticated, errs.KindOf(err), "a poll without its key: %v", err)
	ws, err := sys.Server.Poller.Workers(context.Background(), sys.Tenant)
	require.NoError(t, err)
	assert.Empty(t, ws, "a refused poll registers nothing")
}

// TestWorkersAreListedAndBounded: polling workers are listed with what they
// serve; past the tenant's bound a new worker is refused; a worker that
// stops calling leaves the list.
func TestWorkersAreListedAndBounded(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	p := taskpoll.New(sys.Coordinator(), sys.Deps.Redis, stream.NewNames(sys.Cfg.RedisNamespace), nil, taskpoll.Config{MaxWorkers: 2}, sys.Log)
	for _, id := range []string{"w1", "w2"} {
		req := request(id, 1, "work", "email")
		req.Label, req.Version, req.Capacity, req.InFlight = "host-"+id, "composer-go/test", 8, 3
		_, err := p.Poll(ctx, caller(sys), req)
		require.NoError(t, err)
	}
	_, err := p.Poll(ctx, caller(sys), request("w3", 1, "work"))
	assert.Equal(t, errs.QuotaExceeded, errs.KindOf(err), "a third worker is over the bound: %v", err)
	ws, err := p.Workers(ctx, sys.Tenant)
	require.NoError(t, err)
	require.Len(t, ws, 2)
	assert.Equal(t, "w1", ws[0].ID)
	assert.Equal(t, "host-w1", ws[0].Label)
	assert.Equal(t, []string{"email", "work"}, ws[0].Handlers)
	assert.Equal(t, []string{"default"}, ws[0].Queues)
	assert.Equal(t, 8, ws[0].Capacity)
	assert.Equal(t, 3, ws[0].InFlight)
	assert.Equal(t, "test-key", ws[0].KeyID)
	assert.WithinDuration(t, time.Now(), ws[0].LastSeenAt, 5*time.Second)

	other, err := tenants.Create(ctx, sys.Deps.DB, tenants.CreateParams{Name: "other"})
	require.NoError(t, err)
	ws, err = p.Workers(ctx, other.ID)
	require.NoError(t, err)
	assert.Empty(t, ws, "another tenant's list is its own")
}

// TestRevokedKeyEndsItsWorkersLeases: revoking a key ends the live leases
// taken with it, so the sweep gives their tasks to others; the leases and
// entry of another key's worker of the same id stay.
func TestRevokedKeyEndsItsWorkersLeases(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	wf := sys.Workflow(taskDef("work"))
	run := sys.StartRun(wf, `{}`)
	published(t, sys)
	leases, err := sys.Server.Poller.Poll(ctx, caller(sys), request("w1", 1, "work"))
	require.NoError(t, err)
	require.Len(t, leases, 1)
	sys.StartRun(wf, `{}`)
	published(t, sys)
	other := taskpoll.Caller{Tenant: sys.Tenant, KeyID: "other-key"}
	theirs, err := sys.Server.Poller.Poll(ctx, other, request("w1", 1, "work"))
	require.NoError(t, err)
	require.Len(t, theirs, 1)
	require.NoError(t, sys.Server.Poller.KeyRevoked(ctx, sys.Tenant, "test-key"))
	apptest.Eventually(t, "the sweep to give the task a new attempt", 10*time.Second, func() bool {
		_, tasks := sys.Run(run)
		return tasks["t"].Attempt == 2 && tasks["t"].State == "pending"
	})
	ws, err := sys.Server.Poller.Workers(ctx, sys.Tenant)
	require.NoError(t, err)
	require.Len(t, ws, 1)
	assert.Equal(t, "other-key", ws[0].KeyID, "the other key's worker stays listed")
	ren, err := sys.Coordinator().RenewLeases(ctx, sys.Tenant, engine.Holder{Worker: "w1", Key: "other-key"}, 5*time.Second,
		[]engine.LeaseRequest{{RunID: theirs[0].RunID, TaskID: theirs[0].TaskID, Attempt: 1}})
	require.NoError(t, err)
	assert.True(t, ren[0].Held, "and keeps its lease")
}

// TestConcurrentPollsLeaseEachTaskOnce: many workers poll at once for the
// same backlog; every task is leased exactly once.
func TestConcurrentPollsLeaseEachTaskOnce(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	wf := sys.Workflow(taskDef("work"))
	const runs = 100
	for range runs {
		sys.StartRun(wf, `{}`)
	}
	published(t, sys)
	var mu sync.Mutex
	seen := map[uuid.UUID]int{}
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				leases, err := sys.Server.Poller.Poll(ctx, caller(sys), request(fmt.Sprintf("w%d", i), 3, "work"))
				if !assert.NoError(t, err) || len(leases) == 0 {
					return
				}
				mu.Lock()
				for _, l := range leases {
					seen[l.TaskID]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	assert.Len(t, seen, runs)
	for id, n := range seen {
		assert.Equal(t, 1, n, "task %s leased once", id)
	}
}

// TestPollServesHigherPrioritiesFirstAndAgesLowerOnes: task steps of a
// handler are polled highest priority first, a lower priority that has
// waited longer than a minute per level of difference goes first (never
// starved), and the streams of the priorities in use leave the tenant's
// set once drained.
func TestPollServesHigherPrioritiesFirstAndAgesLowerOnes(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	ctx := context.Background()
	names := stream.NewNames(sys.Cfg.RedisNamespace)
	wf := sys.Workflow(taskDef("work"))
	prioOf := map[uuid.UUID]int{}
	start := func(prio int) uuid.UUID {
		res, err := sys.Coordinator().StartRun(ctx, sys.Tenant, engine.StartRun{WorkflowID: wf, Input: json.RawMessage(`{}`), Priority: prio})
		require.NoError(t, err)
		prioOf[res.RunID] = prio
		return res.RunID
	}
	for _, p := range []int{-1, -1, 0, 2, 0, 2, 1} {
		start(p)
	}
	published(t, sys)
	poll := func() []int {
		var out []int
		for {
			leases, err := sys.Server.Poller.Poll(ctx, caller(sys), request("w1", 1, "work"))
			require.NoError(t, err)
			if len(leases) == 0 {
				return out
			}
			out = append(out, prioOf[leases[0].RunID])
		}
	}
	assert.Equal(t, []int{2, 2, 1, 0, 0, -1, -1}, poll())
	assert.Empty(t, sys.Deps.Redis.SMembers(ctx, names.HandlerPriorities(sys.Tenant)).Val(), "drained priorities leave the set")

	// A priority -2 step published 4.5 minutes ago goes before a priority 2
	// step published now (4 levels of a minute); a priority -1 one published
	// 2.5 minutes ago (less than its 3 levels) does not.
	old := func(prio int, age time.Duration) {
		start(prio)
		published(t, sys)
		key := names.HandlerPriorityStream(sys.Tenant, "default", "work", prio)
		msgs, err := sys.Deps.Redis.XRange(ctx, key, "-", "+").Result()
		require.NoError(t, err)
		require.Len(t, msgs, 1)
		require.NoError(t, sys.Deps.Redis.Del(ctx, key).Err())
		require.NoError(t, sys.Deps.Redis.XAdd(ctx, &redis.XAddArgs{Stream: key, ID: fmt.Sprintf("%d-0", time.Now().Add(-age).UnixMilli()),
			Values: msgs[0].Values}).Err())
	}
	old(-2, 270*time.Second)
	old(-1, 150*time.Second)
	start(2)
	published(t, sys)
	assert.Equal(t, []int{-2, 2, -1}, poll())
}
