package telemetry

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"

	"github.com/composer-dev/composer/internal/obs"
)

// Pools are a process's connection pools, reported by RegisterPools.
type Pools struct {
	// App and System are the PostgreSQL pools (nil in a worker).
	App, System *pgxpool.Pool
	Redis       redis.UniversalClient
}

// RegisterPools reports the pools' health as observable instruments, read
// from the pools' own counters at collection (no I/O): connections by
// state, waits for a PostgreSQL connection, Redis pool timeouts. The
// returned function unregisters them (when the process closes its pools).
func RegisterPools(p Pools) (unregister func(), err error) {
	m := obs.Meter("internal/telemetry")
	pgConns, err := m.Int64ObservableGauge("composer.db.pool.connections", metric.WithDescription("PostgreSQL connections of a pool (role: app, system), by state (acquired, idle, max)"))
	if err != nil {
		return nil, err
	}
	pgWaits, err := m.Int64ObservableCounter("composer.db.pool.empty_acquires", metric.WithDescription("acquires that had to wait for a PostgreSQL connection (the pool was empty), by role"))
	if err != nil {
		return nil, err
	}
	pgWait, err := m.Float64ObservableCounter("composer.db.pool.acquire_wait", metric.WithUnit("s"), metric.WithDescription("total time spent waiting for a PostgreSQL connection, by role"))
	if err != nil {
		return nil, err
	}
	rConns, err := m.Int64ObservableGauge("composer.redis.pool.connections", metric.WithDescription("Redis connections, by state (total, idle)"))
	if err != nil {
		return nil, err
	}
	rTimeouts, err := m.Int64ObservableCounter("composer.redis.pool.timeouts", metric.WithDescription("times a Redis command waited its pool timeout for a connection"))
	if err != nil {
		return nil, err
	}
	type role struct {
		pool                     *pgxpool.Pool
		acquired, idle, max, all metric.ObserveOption
	}
	var roles []role
	for name, pool := range map[string]*pgxpool.Pool{"app": p.App, "system": p.System} {
		if pool == nil {
			continue
		}
		roles = append(roles, role{pool: pool, all: obs.ObserveAttrs("role", name),
			acquired: obs.ObserveAttrs("role", name, "state", "acquired"), idle: obs.ObserveAttrs("role", name, "state", "idle"), max: obs.ObserveAttrs("role", name, "state", "max")})
	}
	rTotal, rIdle := obs.ObserveAttrs("state", "total"), obs.ObserveAttrs("state", "idle")
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, r := range roles {
			s := r.pool.Stat()
			o.ObserveInt64(pgConns, int64(s.AcquiredConns()), r.acquired)
			o.ObserveInt64(pgConns, int64(s.IdleConns()), r.idle)
			o.ObserveInt64(pgConns, int64(s.MaxConns()), r.max)
			o.ObserveInt64(pgWaits, s.EmptyAcquireCount(), r.all)
			o.ObserveFloat64(pgWait, s.AcquireDuration().Seconds(), r.all)
		}
		if p.Redis != nil {
			s := p.Redis.PoolStats()
			o.ObserveInt64(rConns, int64(s.TotalConns), rTotal)
			o.ObserveInt64(rConns, int64(s.IdleConns), rIdle)
			o.ObserveInt64(rTimeouts, int64(s.Timeouts))
		}
		return nil
	}, pgConns, pgWaits, pgWait, rConns, rTimeouts)
	if err != nil {
		return nil, err
	}
	return func() { _ = reg.Unregister() }, nil
}
