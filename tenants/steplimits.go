package tenants

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"

	"github.com/composer-dev/composer/engine/stream"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
)

// RateLimit is one of a tenant's named step rate limits: steps that name
// it (a node's "rate_limit") take a token from the bucket of their key,
// PerSecond sustained and Burst at once, before they run.
type RateLimit struct {
	Name        string
	PerSecond   float64
	Burst       int
	Description string
	CreatedAt   time.Time
	UpdatedAt   time.Time
}

// Bounds of a rate limit (the table's checks say the same).
const (
	MaxRateLimitPerSecond = 10_000
	MaxRateLimitBurst     = 100_000
	// DefaultMaxRateLimits applies when the plan says nothing.
	DefaultMaxRateLimits = 10
)

var rateLimitName = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,63}$`)

func (r RateLimit) check() error {
	var fields []errs.Field
	if !rateLimitName.MatchString(r.Name) {
		fields = append(fields, errs.Field{Field: "name", Message: "lowercase letters, digits, '_' or '-', starting with a letter (at most 64)"})
	}
	if !(r.PerSecond > 0 && r.PerSecond <= MaxRateLimitPerSecond) || math.IsNaN(r.PerSecond) {
		fields = append(fields, errs.Field{Field: "perSecond", Message: fmt.Sprintf("more than 0 and at most %d", MaxRateLimitPerSecond)})
	}
	if r.Burst < 1 || r.Burst > MaxRateLimitBurst {
		fields = append(fields, errs.Field{Field: "burst", Message: fmt.Sprintf("between 1 and %d", MaxRateLimitBurst)})
	}
	if len(r.Description) > 1000 {
		fields = append(fields, errs.Field{Field: "description", Message: "at most 1000 bytes"})
	}
	if len(fields) > 0 {
		e := errs.E(errs.Invalid, "invalid rate limit: %s %s", fields[0].Field, fields[0].Message)
		e.Fields = fields
		return e
	}
	return nil
}

const (
	rateLimitColumns = `name, per_second, burst, description, created_at, updated_at`
	qLockRateLimits  = `SELECT pg_advisory_xact_lock(hashtextextended('rate_limits:' || $1::uuid::text, 0))`
	qCountRateLimits = `SELECT count(*) FROM rate_limits WHERE tenant_id = $1`
	qInsertRateLimit = `INSERT INTO rate_limits (tenant_id, name, per_second, burst, description) VALUES ($1, $2, $3, $4, $5)
		RETURNING ` + rateLimitColumns
	qUpdateRateLimit = `UPDATE rate_limits SET per_second = $3, burst = $4, description = $5, updated_at = now()
		WHERE tenant_id = $1 AND name = $2 RETURNING ` + rateLimitColumns
	qDeleteRateLimit = `DELETE FROM rate_limits WHERE tenant_id = $1 AND name = $2`
	qListRateLimits  = `SELECT ` + rateLimitColumns + ` FROM rate_limits WHERE tenant_id = $1 ORDER BY name`
	qGetRateLimit    = `SELECT ` + rateLimitColumns + ` FROM rate_limits WHERE tenant_id = $1 AND name = $2`
)

func scanRateLimit(row pgx.Row) (RateLimit, error) {
	var r RateLimit
	err := row.Scan(&r.Name, &r.PerSecond, &r.Burst, &r.Description, &r.CreatedAt, &r.UpdatedAt)
	return r, err
}

// CreateRateLimit declares a rate limit of the transaction's tenant. A
// name already taken is CONFLICT; past the plan's max_rate_limits,
// QUOTA_EXCEEDED.
func CreateRateLimit(ctx context.Context, tx *pg.Tx, r RateLimit) (RateLimit, error) {
	if err := r.check(); err != nil {
		return RateLimit{}, err
	}
	l, err := EffectiveLimits(ctx, tx)
	if err != nil {
		return RateLimit{}, err
	}
	// Serialise creates per tenant so the cap holds.
	if _, err := tx.Exec(ctx, qLockRateLimits, tx.Tenant); err != nil {
		return RateLimit{}, fmt.Errorf("lock rate limits: %w", err)
	}
	var n int
	if err := tx.QueryRow(ctx, qCountRateLimits, tx.Tenant).Scan(&n); err != nil {
		return RateLimit{}, fmt.Errorf("count rate limits: %w", err)
	}
	max := l.MaxRateLimits
	if max <= 0 {
		max = DefaultMaxRateLimits
	}
	if n >= max {
		e := errs.E(errs.QuotaExceeded, "a tenant may have at most %d rate limits on its plan", max)
		e.Fields = []errs.Field{{Field: "maxRateLimits", Message: fmt.Sprintf("at most %d", max)}}
		return RateLimit{}, e
	}
	out, err := scanRateLimit(tx.QueryRow(ctx, qInsertRateLimit, tx.Tenant, r.Name, r.PerSecond, r.Burst, r.Description))
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" {
		return RateLimit{}, errs.E(errs.Conflict, "a rate limit named %q exists", r.Name)
	}
	if err != nil {
		return RateLimit{}, fmt.Errorf("insert rate limit: %w", err)
	}
	return out, nil
}

// UpdateRateLimit changes a rate limit's rate, burst and description.
// Lease paths read limits through a cache of a few seconds
// (RateLimitCacheTTL), so a change applies within it.
func UpdateRateLimit(ctx context.Context, tx *pg.Tx, r RateLimit) (RateLimit, error) {
	if err := r.check(); err != nil {
		return RateLimit{}, err
	}
	out, err := scanRateLimit(tx.QueryRow(ctx, qUpdateRateLimit, tx.Tenant, r.Name, r.PerSecond, r.Burst, r.Description))
	if errors.Is(err, pgx.ErrNoRows) {
		return RateLimit{}, errs.E(errs.NotFound, "rate limit %q not found", r.Name)
	}
	if err != nil {
		return RateLimit{}, fmt.Errorf("update rate limit: %w", err)
	}
	return out, nil
}

// DeleteRateLimit removes a rate limit. Steps that still name it run
// without one (their definitions were valid when written; a missing limit
// must not hold them forever).
func DeleteRateLimit(ctx context.Context, tx *pg.Tx, name string) error {
	tag, err := tx.Exec(ctx, qDeleteRateLimit, tx.Tenant, name)
	if err != nil {
		return fmt.Errorf("delete rate limit: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return errs.E(errs.NotFound, "rate limit %q not found", name)
	}
	return nil
}

// ListRateLimits lists the tenant's rate limits by name (at most the
// plan's cap, so unpaginated).
func ListRateLimits(ctx context.Context, tx *pg.Tx) ([]RateLimit, error) {
	rows, err := tx.Query(ctx, qListRateLimits, tx.Tenant)
	if err != nil {
		return nil, fmt.Errorf("list rate limits: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RateLimit, error) { return scanRateLimit(r) })
	if err != nil {
		return nil, fmt.Errorf("list rate limits: %w", err)
	}
	return out, nil
}

// GetRateLimit reads one rate limit; found is false when there is none.
func GetRateLimit(ctx context.Context, tx *pg.Tx, name string) (RateLimit, bool, error) {
	r, err := scanRateLimit(tx.QueryRow(ctx, qGetRateLimit, tx.Tenant, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return RateLimit{}, false, nil
	}
	if err != nil {
		return RateLimit{}, false, fmt.Errorf("read rate limit: %w", err)
	}
	return r, true, nil
}

// StepLimiter takes tokens of tenants' step rate limits: GCRA per
// (tenant, limit, key) in one Lua script on Redis's clock, shared by every
// server replica, like the start limiter. A step over its limit is not
// refused: it *reserves* the next token — the bucket advances as if it had
// run — and is told when that token is its own, so steps waiting on a
// busy key are spread over the coming tokens in the order they asked,
// each re-dispatched once, instead of all of them asking again at every
// refill. The reservation is by task and attempt; a reserved step that
// comes back at (or after) its time runs without taking another token.
type StepLimiter struct {
	rdb redis.UniversalClient
	ns  string
}

// NewStepLimiter returns the step limiter keeping its state under ns.
func NewStepLimiter(rdb redis.UniversalClient, ns string) *StepLimiter {
	return &StepLimiter{rdb: rdb, ns: ns}
}

// reservationKeep is how long past its time a reservation is kept for a
// step that comes back late (a backlog, a slow worker); after it the step
// asks afresh.
const reservationKeep = 10 * time.Minute

// stepGCRA: KEYS[1] the theoretical arrival time (ms), KEYS[2] the
// reservations (member: task:attempt, score: its token's time in ms).
// ARGV: emission interval (ms), burst, member, reservation keep (ms).
// Returns 0 when the step may run now, else the wait in ms.
var stepGCRA = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local keep = tonumber(ARGV[4])
local r = redis.call('ZSCORE', KEYS[2], ARGV[3])
if r then
  r = tonumber(r)
  if r <= now then
    redis.call('ZREM', KEYS[2], ARGV[3])
    return 0
  end
  return math.ceil(r - now)
end
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local next_tat = tat + interval
local allow_at = next_tat - burst * interval
redis.call('SET', KEYS[1], next_tat, 'PX', math.ceil(next_tat - now + burst * interval) + 1000)
if allow_at <= now then return 0 end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - keep)
redis.call('ZADD', KEYS[2], allow_at, ARGV[3])
redis.call('PEXPIRE', KEYS[2], math.ceil(allow_at - now) + keep)
return math.ceil(allow_at - now)
`)

// StepRequest is one step's token request.
type StepRequest struct {
	Tenant    uuid.UUID
	Limit     string
	Key       string
	Task      uuid.UUID
	Attempt   int
	PerSecond float64
	Burst     int
}

// Take asks for each request's token in one pipelined round trip and
// answers, per request, zero (run now) or how long to wait. A request
// whose call failed answers zero and its error is returned: callers let
// the step run (fail open, as the start limiter does; the worker quota
// still holds).
func (l *StepLimiter) Take(ctx context.Context, reqs []StepRequest) ([]time.Duration, error) {
	out := make([]time.Duration, len(reqs))
	if len(reqs) == 0 {
		return out, nil
	}
	names := stream.NewNames(l.ns)
	pipe := l.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(reqs))
	for i, r := range reqs {
		tat, res := names.RateBucket(r.Tenant, r.Limit, r.Key)
		cmds[i] = stepGCRA.Eval(ctx, pipe, []string{tat, res}, 1000/r.PerSecond, max(r.Burst, 1),
			fmt.Sprintf("%s:%d", r.Task, r.Attempt), reservationKeep.Milliseconds())
	}
	_, _ = pipe.Exec(ctx) // per-command errors below
	var first error
	for i, c := range cmds {
		ms, err := c.Int64()
		if err != nil {
			if first == nil {
				first = fmt.Errorf("step rate limit: %w", err)
			}
			continue
		}
		out[i] = time.Duration(ms) * time.Millisecond
	}
	return out, first
}
