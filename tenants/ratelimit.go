package tenants

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/composer-dev/composer/engine/stream"
	"github.com/composer-dev/composer/internal/obs"
)

// RateLimiter shapes each tenant's run starts with a token bucket shared by
// every gateway replica: GCRA (the generic cell rate algorithm) in one Lua
// script on Redis's own clock, so replicas and clock skew cannot add
// capacity. It is safe for concurrent use.
//
// It sits on the path of every start, so it never holds one up for long:
// a call gets limiterTimeout, and after a failure the limiter answers
// ErrLimiterDown at once for limiterPause instead of waiting on Redis
// again (callers admit the start; the quota checks in its transaction
// still apply).
type RateLimiter struct {
	rdb       redis.UniversalClient
	ns        string
	timeout   time.Duration
	downUntil atomic.Int64 // unix nanoseconds
}

// ErrLimiterDown is the answer while Redis recently failed.
var ErrLimiterDown = errors.New("rate limiter unavailable")

const (
	limiterTimeout = 100 * time.Millisecond
	limiterPause   = time.Second
)

// NewRateLimiter returns a limiter keeping its state under namespace ns.
func NewRateLimiter(rdb redis.UniversalClient, ns string) *RateLimiter {
	return &RateLimiter{rdb: rdb, ns: ns, timeout: limiterTimeout}
}

// WithTimeout sets how long one call may wait on Redis (limiterTimeout by
// default: the limiter is on the path of every start). Tests of the
// bucket's exactness on a loaded machine give it longer, since a call cut
// short may still have taken its token.
func (r *RateLimiter) WithTimeout(d time.Duration) *RateLimiter {
	r.timeout = d
	return r
}

// gcra: KEYS[1] holds the theoretical arrival time (ms). ARGV: emission
// interval (ms per start), burst. Returns 0 when allowed, else the wait in
// ms before a start would be.
var gcra = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local next_tat = tat + interval
local allow_at = next_tat - burst * interval
if allow_at > now then return math.ceil(allow_at - now) end
redis.call('SET', KEYS[1], next_tat, 'PX', math.ceil(burst * interval) + 1000)
return 0
`)

// Allow takes one start from the tenant's bucket (perSecond sustained,
// burst at once). It returns zero when the start may proceed, else how long
// to wait. A perSecond of zero means unlimited.
func (r *RateLimiter) Allow(ctx context.Context, tenant uuid.UUID, perSecond float64, burst int) (time.Duration, error) {
	if perSecond <= 0 {
		return 0, nil
	}
	interval := 1000 / perSecond
	burst = max(burst, 1)
	key := stream.NewNames(r.ns).StartBucket(tenant)
	if time.Now().UnixNano() < r.downUntil.Load() {
		return 0, ErrLimiterDown
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	ms, err := gcra.Run(ctx, r.rdb, []string{key}, interval, burst).Int64()
	if err != nil {
		r.downUntil.Store(time.Now().Add(limiterPause).UnixNano())
		return 0, fmt.Errorf("rate limit: %w", err)
	}
	if ms > 0 {
		obs.Refused(ctx, obs.RefusedStartRate)
	}
	return time.Duration(ms) * time.Millisecond, nil
}
