package tenants

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
)

// Limits are what a tenant may use. A plan gives defaults; a tenant's own
// limits override them field by field.
type Limits struct {
	// MaxRunningTasks bounds the tenant's tasks running at once, across all
	// workers (enforced when a worker takes a lease).
	MaxRunningTasks int `json:"max_running_tasks,omitempty"`
	// StartsPerSecond and StartBurst shape run starts (a token bucket).
	StartsPerSecond float64 `json:"starts_per_second,omitempty"`
	StartBurst      int     `json:"start_burst,omitempty"`
	// MaxQueuedTasks bounds the tenant's tasks waiting for a worker; a start
	// beyond it is refused.
	MaxQueuedTasks int `json:"max_queued_tasks,omitempty"`
	// Weight is the tenant's share when workers choose whose work to read.
	Weight int `json:"weight,omitempty"`
	// SpendCapCents, when set, is the most a tenant spends in a month (in
	// minor units of its plan's currency): at it, new runs are refused.
	SpendCapCents int64 `json:"spend_cap_cents,omitempty"`
	// What a tenant may accumulate: signals stored per run, versions per
	// workflow, live (unrevoked, unexpired) API keys, webhook endpoints.
	// Past one, creating another is QUOTA_EXCEEDED.
	MaxSignalsPerRun    int `json:"max_signals_per_run,omitempty"`
	MaxWorkflowVersions int `json:"max_workflow_versions,omitempty"`
	MaxAPIKeys          int `json:"max_api_keys,omitempty"`
	MaxWebhookEndpoints int `json:"max_webhook_endpoints,omitempty"`
	// MaxSchedules bounds the tenant's schedules, and
	// MinScheduleIntervalSeconds the shortest time between two fires of
	// one (an interval, or the gap between a cron expression's minutes).
	MaxSchedules               int `json:"max_schedules,omitempty"`
	MinScheduleIntervalSeconds int `json:"min_schedule_interval_seconds,omitempty"`
	// MaxRateLimits bounds the tenant's named step rate limits.
	MaxRateLimits int `json:"max_rate_limits,omitempty"`
	// AuditRetentionDays is how long audit records are kept (the sweeper
	// deletes older ones, oldest first); 0 keeps them.
	AuditRetentionDays int `json:"audit_retention_days,omitempty"`
}

// merge returns l with every zero field taken from def.
func (l Limits) merge(def Limits) Limits {
	if l.MaxRunningTasks == 0 {
		l.MaxRunningTasks = def.MaxRunningTasks
	}
	if l.StartsPerSecond == 0 {
		l.StartsPerSecond = def.StartsPerSecond
	}
	if l.StartBurst == 0 {
		l.StartBurst = def.StartBurst
	}
	if l.MaxQueuedTasks == 0 {
		l.MaxQueuedTasks = def.MaxQueuedTasks
	}
	if l.Weight == 0 {
		l.Weight = def.Weight
	}
	if l.SpendCapCents == 0 {
		l.SpendCapCents = def.SpendCapCents
	}
	if l.MaxSignalsPerRun == 0 {
		l.MaxSignalsPerRun = def.MaxSignalsPerRun
	}
	if l.MaxWorkflowVersions == 0 {
		l.MaxWorkflowVersions = def.MaxWorkflowVersions
	}
	if l.MaxAPIKeys == 0 {
		l.MaxAPIKeys = def.MaxAPIKeys
	}
	if l.MaxWebhookEndpoints == 0 {
		l.MaxWebhookEndpoints = def.MaxWebhookEndpoints
	}
	if l.MaxSchedules == 0 {
		l.MaxSchedules = def.MaxSchedules
	}
	if l.MinScheduleIntervalSeconds == 0 {
		l.MinScheduleIntervalSeconds = def.MinScheduleIntervalSeconds
	}
	if l.MaxRateLimits == 0 {
		l.MaxRateLimits = def.MaxRateLimits
	}
	if l.AuditRetentionDays == 0 {
		l.AuditRetentionDays = def.AuditRetentionDays
	}
	return l
}

func (l Limits) validate() error {
	if l.MaxRunningTasks < 0 || l.MaxQueuedTasks < 0 || l.StartBurst < 0 || l.StartsPerSecond < 0 || l.Weight < 0 || l.Weight > 1000 || l.SpendCapCents < 0 ||
		l.MaxSignalsPerRun < 0 || l.MaxWorkflowVersions < 0 || l.MaxAPIKeys < 0 || l.MaxWebhookEndpoints < 0 ||
		l.MaxSchedules < 0 || l.MinScheduleIntervalSeconds < 0 || l.MaxRateLimits < 0 || l.AuditRetentionDays < 0 {
		return errs.E(errs.Invalid, "limits must not be negative (weight at most 1000)")
	}
	return nil
}

// EffectiveLimits reads the transaction's tenant's limits: its overrides
// on top of its plan's defaults.
func EffectiveLimits(ctx context.Context, tx *pg.Tx) (Limits, error) {
	var own, plan []byte
	err := tx.QueryRow(ctx, qEffectiveLimits, tx.Tenant).Scan(&own, &plan)
	if errors.Is(err, pgx.ErrNoRows) {
		return Limits{}, errs.E(errs.NotFound, "tenant not found")
	}
	if err != nil {
		return Limits{}, fmt.Errorf("tenant limits: %w", err)
	}
	var o, p Limits
	if err := json.Unmarshal(own, &o); err != nil {
		return Limits{}, fmt.Errorf("tenant limits: %w", err)
	}
	if err := json.Unmarshal(plan, &p); err != nil {
		return Limits{}, fmt.Errorf("plan limits: %w", err)
	}
	return o.merge(p), nil
}

// UpdateParams are the changes Update makes; zero values change nothing.
type UpdateParams struct {
	Plan string
	// Limits, when set, replace the tenant's overrides; its zero fields fall
	// back to the plan.
	Limits *Limits
	// StreamShards changes how many shards per queue new tasks spread over.
	// Workers read every shard they have seen the tenant use, and tasks on
	// a shard no longer announced are re-published by the dispatch sweep, so
	// a change loses nothing.
	StreamShards int
}

// Update changes a tenant's plan, limit overrides or shard count
// (operators only: the system role).
func Update(ctx context.Context, db *pg.DB, id uuid.UUID, p UpdateParams) error {
	if p.Plan != "" && !planPattern.MatchString(p.Plan) {
		return errs.E(errs.Invalid, "plan %q is not a valid plan name", p.Plan)
	}
	if p.StreamShards < 0 || p.StreamShards > 256 {
		return errs.E(errs.Invalid, "stream shards must be between 1 and 256")
	}
	var over []byte
	if p.Limits != nil {
		if err := p.Limits.validate(); err != nil {
			return err
		}
		over, _ = json.Marshal(p.Limits)
	}
	tag, err := db.System().Exec(ctx, qUpdateTenant, id, p.Plan, over, p.StreamShards)
	if isFKViolation(err) {
		return errs.E(errs.Invalid, "no plan named %q", p.Plan)
	}
	if err != nil {
		return fmt.Errorf("update tenant: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return errs.E(errs.NotFound, "tenant %s not found", id)
	}
	return nil
}

// LimitsCache remembers tenants' effective limits for TTL (default 5 s),
// for the checks made before a request's transaction — the start rate
// limit — so they cost no transaction of their own. A change of plan or
// override reaches them within TTL; everything checked inside a
// transaction reads the limits fresh. It is safe for concurrent use.
type LimitsCache struct {
	TTL time.Duration

	mu sync.Mutex
	m  map[uuid.UUID]cachedLimits
}

type cachedLimits struct {
	l     Limits
	until time.Time
}

// Get returns the tenant's effective limits, read through db when not
// remembered.
func (c *LimitsCache) Get(ctx context.Context, db *pg.DB, tenant uuid.UUID) (Limits, error) {
	now := time.Now()
	c.mu.Lock()
	e, ok := c.m[tenant]
	c.mu.Unlock()
	if ok && now.Before(e.until) {
		return e.l, nil
	}
	var l Limits
	if err := db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		var err error
		l, err = EffectiveLimits(ctx, tx)
		return err
	}); err != nil {
		return Limits{}, err
	}
	ttl := c.TTL
	if ttl <= 0 {
		ttl = 5 * time.Second
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) > 100_000 {
		c.m = map[uuid.UUID]cachedLimits{}
	}
	c.m[tenant] = cachedLimits{l: l, until: now.Add(ttl)}
	return l, nil
}
