package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/composer-dev/composer/internal/obs"
	"github.com/composer-dev/composer/internal/pg"
)

// FleetSampleInterval is how long a sample of the fleet gauges serves
// scrapes: however often /metrics is scraped, the database answers the
// gauges' queries at most once per interval per process.
const FleetSampleInterval = 10 * time.Second

// fleetCap bounds the task counts: each is an index-only walk of a partial
// index of in-flight tasks (pending, running), stopped at the cap.
const fleetCap = 100_000

// RegisterGauges reports fleet-wide figures as observable gauges: tasks
// waiting and running (exact up to fleetCap, read from the partial indexes
// of in-flight tasks: the cost follows the work in flight, not the history),
// tenants at their running-task quota, the age of the oldest due outbox row
// (one index probe), and the planner's estimate of runs not yet finished
// (EXPLAIN: no rows read). One sample serves FleetSampleInterval. None
// carries a tenant id (unbounded label cardinality); per-tenant figures are
// in the API. The returned function unregisters them.
func RegisterGauges(db *pg.DB) (unregister func(), err error) {
	m := obs.Meter("engine")
	queued, err := m.Int64ObservableGauge("composer.tasks.queued", metric.WithDescription("tasks waiting for a worker (exact up to 100000)"))
	if err != nil {
		return nil, err
	}
	running, err := m.Int64ObservableGauge("composer.tasks.running", metric.WithDescription("tasks leased by a worker (exact up to 100000)"))
	if err != nil {
		return nil, err
	}
	runs, err := m.Int64ObservableGauge("composer.runs.running_estimate", metric.WithDescription("runs not yet finished, as the query planner estimates them from table statistics"))
	if err != nil {
		return nil, err
	}
	atQuota, err := m.Int64ObservableGauge("composer.tenants.at_quota", metric.WithDescription("tenants whose running tasks reach their quota"))
	if err != nil {
		return nil, err
	}
	lag, err := m.Float64ObservableGauge("composer.outbox.lag", metric.WithUnit("s"), metric.WithDescription("age of the oldest due outbox row not yet published to a stream (0 when none)"))
	if err != nil {
		return nil, err
	}
	s := &fleetSampler{db: db}
	reg, err := m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		v, err := s.sample(ctx)
		if err != nil {
			return err
		}
		o.ObserveInt64(queued, v.queued)
		o.ObserveInt64(running, v.running)
		o.ObserveInt64(runs, v.runs)
		o.ObserveInt64(atQuota, v.atQuota)
		o.ObserveFloat64(lag, v.lag)
		return nil
	}, queued, running, runs, atQuota, lag)
	if err != nil {
		return nil, err
	}
	return func() { _ = reg.Unregister() }, nil
}

type fleetSample struct {
	queued, running, runs, atQuota int64
	lag                            float64
}

// fleetSampler serves one sample per FleetSampleInterval; concurrent
// scrapes wait for the one refresh in flight.
type fleetSampler struct {
	db   *pg.DB
	mu   sync.Mutex
	at   time.Time
	last fleetSample
}

func (s *fleetSampler) sample(ctx context.Context) (fleetSample, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.at.IsZero() && time.Since(s.at) < FleetSampleInterval {
		return s.last, nil
	}
	var v fleetSample
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := s.db.System().QueryRow(ctx, qFleetGauges, fleetCap).Scan(&v.queued, &v.running, &v.atQuota, &v.lag); err != nil {
		return s.last, fmt.Errorf("fleet gauges: %w", err)
	}
	var plan []struct {
		Plan struct {
			Rows float64 `json:"Plan Rows"`
		} `json:"Plan"`
	}
	var raw []byte
	if err := s.db.System().QueryRow(ctx, qRunsRunningEstimate).Scan(&raw); err != nil {
		return s.last, fmt.Errorf("runs estimate: %w", err)
	}
	if err := json.Unmarshal(raw, &plan); err == nil && len(plan) == 1 {
		v.runs = int64(plan[0].Plan.Rows)
	}
	s.at, s.last = time.Now(), v
	return v, nil
}

var (
	meter = obs.Meter("engine")

	transitions     = obs.Counter(meter, "composer.transitions", "committed transitions, by event kind")
	finished        = obs.Counter(meter, "composer.runs.finished", "runs that reached a terminal state, by status")
	eagerDispatches = obs.Counter(meter, "composer.tasks.eager_dispatched", "tasks leased to the worker that reported the previous step, in that report's transaction")
	leaseExpiries   = obs.Counter(meter, "composer.leases.expired", "task leases that expired (the worker died, hung or lost its lease) and went through the state machine")
	retries         = obs.Counter(meter, "composer.tasks.retries", "failed attempts scheduled for another attempt")
	commitLatency   = obs.Seconds(meter, "composer.transition.duration", "a transition's transaction, from its first statement to its commit, by event kind")

	byEvent  = obs.NewLabelled("event")
	byStatus = obs.NewLabelled("status")
)

func init() {
	obs.OnPrime(func(ctx context.Context) {
		leaseExpiries.Add(ctx, 0)
		retries.Add(ctx, 0)
		eagerDispatches.Add(ctx, 0)
	})
}

// countTransition records a committed transition: its kind, its
// transaction's duration (took: first statement to commit), the run's end,
// and the retries and lease expiries it carried.
func countTransition(ctx context.Context, event, status string, terminal bool, took time.Duration, nretries int, expired bool) {
	ev := byEvent.Get(event)
	transitions.Add(ctx, 1, ev)
	commitLatency.Record(ctx, took.Seconds(), ev)
	if terminal {
		finished.Add(ctx, 1, byStatus.Get(status))
	}
	if nretries > 0 {
		retries.Add(ctx, int64(nretries))
	}
	if expired {
		leaseExpiries.Add(ctx, 1)
	}
}
