package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/tenants"
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

func unzip(reqs []LeaseRequest) (runs, tasks []uuid.UUID, attempts []int32) {
	for _, r := range reqs {
		runs, tasks, attempts = append(runs, r.RunID), append(tasks, r.TaskID), append(attempts, int32(r.Attempt))
	}
	return
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
	runs, tasks, attempts := unzip(reqs)
	err := c.db.WithTenant(ctx, tenant, func(ctx context.Context, tx *tenants.Tx) error {
		rows, err := tx.Query(ctx, `UPDATE task_instances t
			   SET state = 'running', lease_owner = $2, lease_expires_at = now() + make_interval(secs => $3),
			       started_at = now(), updated_at = now()
			  FROM unnest($4::uuid[], $5::uuid[], $6::int[]) AS req(run_id, id, attempt), workflow_runs r
			 WHERE t.tenant_id = $1 AND t.run_id = req.run_id AND t.id = req.id AND t.attempt = req.attempt
			   AND t.state = 'pending'
			   AND r.tenant_id = $1 AND r.id = t.run_id AND r.status = 'running'
			RETURNING t.id, t.lease_expires_at, t.node_id, t.node_type, t.input, t.config, r.workflow_id, r.workflow_version, t.max_attempts`,
			tenant, owner, ttl.Seconds(), runs, tasks, attempts)
		if err != nil {
			return fmt.Errorf("acquire leases: %w", err)
		}
		var l Lease
		var input, config []byte
		_, err = pgx.ForEachRow(rows, []any{&l.TaskID, &l.ExpiresAt, &l.NodeID, &l.NodeType, &input, &config, &l.WorkflowID, &l.WorkflowVersion, &l.MaxAttempts},
			func() error {
				l.Acquired, l.Input, l.Config = true, append(json.RawMessage(nil), input...), append(json.RawMessage(nil), config...)
				if i := idx[l.TaskID]; len(i) > 0 {
					out[i[0]] = l // a duplicate request in the batch gets one lease, not two
				}
				return nil
			})
		return err
	})
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
	idx := map[uuid.UUID]int{}
	for i, r := range reqs {
		out[i] = Renewal{TaskID: r.TaskID}
		idx[r.TaskID] = i
	}
	runs, tasks, attempts := unzip(reqs)
	err := c.db.WithTenant(ctx, tenant, func(ctx context.Context, tx *tenants.Tx) error {
		rows, err := tx.Query(ctx, `UPDATE task_instances t SET lease_expires_at = now() + make_interval(secs => $3)
			  FROM unnest($4::uuid[], $5::uuid[], $6::int[]) AS req(run_id, id, attempt)
			 WHERE t.tenant_id = $1 AND t.run_id = req.run_id AND t.id = req.id AND t.attempt = req.attempt
			   AND t.state = 'running' AND t.lease_owner = $2
			RETURNING t.id, t.lease_expires_at`, tenant, owner, ttl.Seconds(), runs, tasks, attempts)
		if err != nil {
			return fmt.Errorf("renew leases: %w", err)
		}
		var id uuid.UUID
		var exp time.Time
		_, err = pgx.ForEachRow(rows, []any{&id, &exp}, func() error {
			out[idx[id]] = Renewal{TaskID: id, Held: true, ExpiresAt: exp}
			return nil
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
