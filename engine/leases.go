package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/composer-dev/composer/internal/errs"
)

// LeaseRequest names one attempt of one task a worker wants to run.
type LeaseRequest struct {
	RunID   uuid.UUID
	TaskID  uuid.UUID
	Attempt int
}

// Lease is the answer to one LeaseRequest. When Acquired, the worker holds
// the task until ExpiresAt (database clock) unless it renews.
type Lease struct {
	TaskID          uuid.UUID
	Acquired        bool
	ExpiresAt       time.Time
	NodeID          string
	NodeType        string
	Input           json.RawMessage
	Config          json.RawMessage
	WorkflowID      uuid.UUID
	WorkflowVersion int
	MaxAttempts     int
}

// maxLeaseTTL bounds a lease: a worker that wants longer renews.
const maxLeaseTTL = 10 * time.Minute

func checkLease(owner string, ttl time.Duration, n int) error {
	if owner == "" || len(owner) > 200 {
		return errs.E(errs.Invalid, "a lease owner (worker id) of 1-200 characters is required")
	}
	if ttl < time.Second || ttl > maxLeaseTTL {
		return errs.E(errs.Invalid, "lease TTL must be between 1s and %s", maxLeaseTTL)
	}
	if n > 1000 {
		return errs.E(errs.Invalid, "at most 1000 leases per call")
	}
	return nil
}

// AcquireLeases leases pending tasks of running runs to owner, in one
// conditional UPDATE on the database clock: a task already leased or
// finished, a stale attempt, or a run that is no longer running is not
// acquired — the worker drops that message. A lease never goes through the
// run lock: it changes no decision of the state machine.
func (c *Coordinator) AcquireLeases(ctx context.Context, tenant uuid.UUID, owner string, ttl time.Duration, reqs []LeaseRequest) ([]Lease, error) {
	if err := checkLease(owner, ttl, len(reqs)); err != nil {
		return nil, err
	}
	out := make([]Lease, len(reqs))
	idx := map[uuid.UUID][]int{}
	for i, r := range reqs {
		out[i] = Lease{TaskID: r.TaskID}
		idx[r.TaskID] = append(idx[r.TaskID], i)
	}
	// One primary-key UPDATE per request, all in one implicit transaction
	// and one round trip. (A single UPDATE ... FROM unnest(...) is planned,
	// as a generic plan, as a join over every pending task of the tenant.)
	b := &pgx.Batch{}
	for i, r := range reqs {
		b.Queue(`UPDATE task_instances t
			   SET state = 'running', lease_owner = $5, lease_expires_at = now() + make_interval(secs => $6),
			       started_at = now(), updated_at = now()
			  FROM workflow_runs r
			 WHERE t.tenant_id = $1 AND t.run_id = $2 AND t.id = $3 AND t.attempt = $4 AND t.state = 'pending'
			   AND r.tenant_id = $1 AND r.id = $2 AND r.status = 'running'
			RETURNING t.lease_expires_at, t.node_id, t.node_type, t.input, t.config, t.max_attempts, r.workflow_id, r.workflow_version`,
			tenant, r.RunID, r.TaskID, r.Attempt, owner, ttl.Seconds()).Query(func(rows pgx.Rows) error {
			l := Lease{TaskID: r.TaskID}
			var input, config []byte
			_, err := pgx.ForEachRow(rows, []any{&l.ExpiresAt, &l.NodeID, &l.NodeType, &input, &config, &l.MaxAttempts, &l.WorkflowID, &l.WorkflowVersion},
				func() error {
					l.Acquired, l.Input, l.Config = true, append(json.RawMessage(nil), input...), append(json.RawMessage(nil), config...)
					if first := idx[r.TaskID][0]; first == i {
						out[i] = l // a duplicate request in the batch gets no second lease
					}
					return nil
				})
			return err
		})
	}
	err := c.db.Pipeline(ctx, tenant, b)
	if err != nil {
		err = fmt.Errorf("acquire leases: %w", err)
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Renewal answers one renewal: Held is false when the lease is gone — it
// expired and was taken away, the task finished, or the run was cancelled —
// and the worker must stop.
type Renewal struct {
	TaskID    uuid.UUID
	Held      bool
	ExpiresAt time.Time
}

// RenewLeases extends owner's leases, on the database clock.
func (c *Coordinator) RenewLeases(ctx context.Context, tenant uuid.UUID, owner string, ttl time.Duration, reqs []LeaseRequest) ([]Renewal, error) {
	if err := checkLease(owner, ttl, len(reqs)); err != nil {
		return nil, err
	}
	out := make([]Renewal, len(reqs))
	for i, r := range reqs {
		out[i] = Renewal{TaskID: r.TaskID}
	}
	b := &pgx.Batch{}
	for i, r := range reqs {
		b.Queue(`UPDATE task_instances SET lease_expires_at = now() + make_interval(secs => $6)
			 WHERE tenant_id = $1 AND run_id = $2 AND id = $3 AND attempt = $4 AND state = 'running' AND lease_owner = $5
			RETURNING lease_expires_at`, tenant, r.RunID, r.TaskID, r.Attempt, owner, ttl.Seconds()).Query(func(rows pgx.Rows) error {
			var exp time.Time
			_, err := pgx.ForEachRow(rows, []any{&exp}, func() error {
				out[i] = Renewal{TaskID: r.TaskID, Held: true, ExpiresAt: exp}
				return nil
			})
			return err
		})
	}
	err := c.db.Pipeline(ctx, tenant, b)
	if err != nil {
		err = fmt.Errorf("renew leases: %w", err)
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}
