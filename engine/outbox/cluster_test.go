package outbox

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/engine/stream"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/internal/testenv"
	"github.com/composer-dev/composer/tenants"
)

// pipelines records the commands of every pipeline a client executes.
type pipelines struct {
	mu   sync.Mutex
	seen [][]string
}

func (p *pipelines) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (p *pipelines) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (p *pipelines) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		names := make([]string, len(cmds))
		for i, c := range cmds {
			names[i] = c.Name()
		}
		p.mu.Lock()
		p.seen = append(p.seen, names)
		p.mu.Unlock()
		return next(ctx, cmds)
	}
}

// TestOnAClusterWakeUpsFollowTheirMessages: workers let a tenant rest
// after an empty read until its next wake-up or active-set score, so news
// of work must never arrive before the work. A cluster's pipeline sends
// each node its commands concurrently, so the enqueuer writes the active
// set and publishes the wake-ups only once the messages are in: a
// subscriber reading a tenant's streams the moment it hears of them
// always finds the messages, and no pipeline mixes messages with news.
func TestOnAClusterWakeUpsFollowTheirMessages(t *testing.T) {
	t.Parallel()
	env := testenv.WithCluster(t)
	db := pg.New(env.App, env.System, false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	names := stream.NewNames(env.Namespace)
	var ts []tenants.Tenant
	for range 6 { // (spread over the masters by their hash tags)
		tn, err := tenants.Create(ctx, db, tenants.CreateParams{Name: "t", StreamShards: 2})
		require.NoError(t, err)
		ts = append(ts, tn)
	}
	rec := &pipelines{}
	env.Redis.AddHook(rec)
	ps := env.Redis.Subscribe(ctx, names.Wake("default"), names.HandlerWake())
	defer ps.Close()
	for range 2 {
		_, err := ps.ReceiveTimeout(ctx, 10*time.Second)
		require.NoError(t, err)
	}
	// Each wake-up is checked the moment it arrives.
	checked := make(chan error, 1000)
	go func() {
		for msg := range ps.Channel() {
			var tenant uuid.UUID
			var keys []string
			if msg.Channel == names.HandlerWake() {
				tn, q, h, err := stream.ParseHandlerRoute(msg.Payload)
				if err != nil {
					checked <- err
					continue
				}
				tenant, keys = tn, []string{names.HandlerStream(tn, q, h)}
			} else {
				tn, shards, _, _, err := stream.ParseWake(msg.Payload)
				if err != nil {
					checked <- err
					continue
				}
				tenant, keys = tn, names.Streams(tn, "default", shards)
			}
			var n int64
			for _, k := range keys {
				l, err := env.Redis.XLen(ctx, k).Result()
				if err != nil {
					checked <- err
					continue
				}
				n += l
			}
			if n == 0 {
				checked <- fmt.Errorf("a wake-up for tenant %s arrived before its messages", tenant)
				continue
			}
			checked <- nil
		}
	}()
	e := New(db, env.SystemURL, env.Redis, names, Config{}, nil)
	wakes := 0
	for round := range 10 {
		for i, tn := range ts {
			handler := ""
			if i == 0 {
				handler = "charge"
			}
			require.NoError(t, db.WithTenant(ctx, tn.ID, func(ctx context.Context, tx *pg.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO outbox (tenant_id, queue, run_id, task_id, node_id, node_type, handler, attempt, next_attempt_at)
					VALUES ($1, 'default', $2, $3, 'n', 'noop', nullif($4, ''), 1, now() - interval '1 minute')`, tn.ID, uuid.New(), uuid.New(), handler)
				return err
			}))
		}
		n, err := e.publishBatch(ctx)
		require.NoError(t, err)
		require.Equal(t, len(ts), n, "round %d", round)
		wakes += len(ts)
	}
	for range wakes {
		select {
		case err := <-checked:
			require.NoError(t, err)
		case <-ctx.Done():
			t.Fatal("wake-ups missing")
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, p := range rec.seen {
		news, msgs := false, false
		for _, c := range p {
			switch c {
			case "publish", "zadd":
				news = true
			case "eval", "evalsha":
				msgs = true
			}
		}
		assert.False(t, news && msgs, "a pipeline mixes messages and the news of them: %v", p)
	}
}
