package engine

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/engine/outbox"
	"github.com/composer-dev/composer/engine/stream"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/tenants"
)

// backlog is a tenant with tasks published to Redis that no worker takes:
// what a tenant held at its running quota, or with no worker, looks like.
type backlog struct {
	*fixture
	names stream.Names
	enq   *outbox.Enqueuer
	sw    *Sweeper
}

// newBacklog starts runs×width pending tasks (runs of width parallel noop
// nodes) and publishes them with the real enqueuer.
func newBacklog(t *testing.T, runs, width, checkBatch int) *backlog {
	t.Helper()
	env := testenv.New(t)
	db := pg.New(env.App, env.System, false)
	tn, err := tenants.Create(context.Background(), db, tenants.CreateParams{Name: "acme"})
	require.NoError(t, err)
	b := &backlog{fixture: &fixture{t: t, env: env, db: db, c: NewCoordinator(db, Options{}), tenant: tn.ID}, names: stream.NewNames(env.Namespace)}
	b.enq = outbox.New(db, env.SystemURL, env.Redis, b.names, outbox.Config{BatchSize: 1000}, nil)
	b.sw = NewSweeper(b.c, db, SweeperConfig{LostDispatchAge: time.Millisecond, CheckBatch: checkBatch,
		StillQueued: func(ctx context.Context, tenant uuid.UUID, tasks []uuid.UUID) ([]bool, error) {
			return b.names.StillQueued(ctx, env.Redis, tenant, tasks)
		}}, nil)
	var nodes []string
	for i := range width {
		nodes = append(nodes, fmt.Sprintf(`{"id":"n%d","type":"noop"}`, i))
	}
	wf := b.workflow(`{"nodes":[` + strings.Join(nodes, ",") + `]}`)
	for range runs {
		b.start(wf, `{}`)
	}
	b.publish()
	return b
}

// publish drains the outbox into the streams.
func (b *backlog) publish() {
	b.t.Helper()
	ctx := context.Background()
	// Fresh rows are due only after the fast path's grace; make them due.
	_, err := b.env.System.Exec(ctx, `UPDATE outbox SET next_attempt_at = now()`)
	require.NoError(b.t, err)
	_, err = b.enq.Drain(ctx)
	require.NoError(b.t, err)
	require.Zero(b.t, b.count(`SELECT count(*) FROM outbox`), "everything was published")
}

// streamed counts the messages in the tenant's task streams.
func (b *backlog) streamed() int {
	b.t.Helper()
	ctx := context.Background()
	keys, err := testenv.Keys(ctx, b.env.Redis, b.names.NS+":{"+b.tenant.String()+"}:q:*")
	require.NoError(b.t, err)
	n := 0
	for _, k := range keys {
		l, err := b.env.Redis.XLen(ctx, k).Result()
		require.NoError(b.t, err)
		n += int(l)
	}
	return n
}

// sweep runs n sweeps and returns how many tasks they re-dispatched.
func (b *backlog) sweep(n int) int64 {
	b.t.Helper()
	var total int64
	for range n {
		st, err := b.sw.SweepOnce(context.Background())
		require.NoError(b.t, err)
		total += st.Redispatched
	}
	return total
}

// TestAWaitingBacklogIsNeverRedispatched: 100,000 tasks wait in their
// streams, older than the lost-dispatch age, through 120 sweeps (ten
// minutes of them at the default interval; six passes over the whole
// backlog): none is dispatched again, the streams hold exactly one
// message per pending task, and the timeline does not grow.
func TestAWaitingBacklogIsNeverRedispatched(t *testing.T) {
	t.Parallel()
	b := newBacklog(t, 200, 500, 5000)
	pending := b.count(`SELECT count(*) FROM task_instances WHERE state = 'pending'`)
	require.Equal(t, 100_000, pending)
	events := b.count(`SELECT count(*) FROM run_events`)
	assert.Zero(t, b.sweep(120), "a waiting task's message still exists: nothing is lost")
	assert.Equal(t, pending, b.streamed(), "one message per pending task")
	assert.Equal(t, events, b.count(`SELECT count(*) FROM run_events`), "the timeline did not grow")
	assert.Zero(t, b.count(`SELECT count(*) FROM outbox`))
}

// TestLostMessagesAreRedispatchedOnceEach: Redis loses a tenant's
// streams (and with them its queued hash). Every waiting task is
// dispatched again exactly once — over several sweeps when the backlog
// is longer than one check — and once re-published, never again.
func TestLostMessagesAreRedispatchedOnceEach(t *testing.T) {
	t.Parallel()
	b := newBacklog(t, 6, 500, 700)
	ctx := context.Background()
	keys, err := testenv.Keys(ctx, b.env.Redis, b.names.NS+":{"+b.tenant.String()+"}:*")
	require.NoError(t, err)
	require.NotEmpty(t, keys)
	require.NoError(t, b.env.Redis.Del(ctx, keys...).Err(), "the tenant's streams and queued hash are gone")

	n := b.sweep(6) // 3,000 lost tasks, 700 checked per sweep
	assert.EqualValues(t, 3000, n)
	assert.Equal(t, 3000, b.count(`SELECT count(*) FROM outbox`))
	b.publish()
	assert.Zero(t, b.sweep(10), "re-published messages exist again")
	assert.Equal(t, 3000, b.streamed())
	assert.Equal(t, 3000, b.count(`SELECT count(DISTINCT task_id) FROM run_events WHERE kind = 'redispatched'`))
	assert.Equal(t, 3000, b.count(`SELECT count(*) FROM run_events WHERE kind = 'redispatched'`), "one timeline entry per real loss")
}

// TestOnlyTheLostMessagesOfABacklogAreRedispatched: a few messages
// disappear from a long backlog (settled by mistake: acknowledged and
// deleted without a lease); exactly those tasks are dispatched again.
func TestOnlyTheLostMessagesOfABacklogAreRedispatched(t *testing.T) {
	t.Parallel()
	b := newBacklog(t, 4, 500, 500)
	ctx := context.Background()
	keys, err := testenv.Keys(ctx, b.env.Redis, b.names.NS+":{"+b.tenant.String()+"}:q:*")
	require.NoError(t, err)
	var gone []stream.Message
	for _, k := range keys {
		xs, err := b.env.Redis.XRangeN(ctx, k, "-", "+", 5).Result()
		require.NoError(t, err)
		for _, x := range xs {
			m, err := stream.Parse(k, x)
			require.NoError(t, err)
			gone = append(gone, m)
		}
	}
	pipe := b.env.Redis.Pipeline()
	stream.Settle(ctx, pipe, gone...)
	_, err = pipe.Exec(ctx)
	require.NoError(t, err)

	assert.EqualValues(t, len(gone), b.sweep(5))
	var redispatched []uuid.UUID
	rows, err := b.env.System.Query(ctx, `SELECT task_id FROM run_events WHERE kind = 'redispatched' ORDER BY task_id`)
	require.NoError(t, err)
	for rows.Next() {
		var id uuid.UUID
		require.NoError(t, rows.Scan(&id))
		redispatched = append(redispatched, id)
	}
	require.NoError(t, rows.Err())
	var want []uuid.UUID
	for _, m := range gone {
		want = append(want, m.Task)
	}
	assert.ElementsMatch(t, want, redispatched)
}
