package client

import (
	"context"
	"encoding/json"
	"time"
)

// BulkOperation is a bulk job and its progress (Matched = Done + Skipped +
// Failed, counted after each batch).
type BulkOperation = BulkOperationFields

// QueuePause is a paused queue.
type QueuePause = pauseQueuePauseQueueQueuePause

// PauseWorkflow pauses a workflow: new runs are created QUEUED instead of
// starting; running runs go on. Needs runs:write.
func (c *Client) PauseWorkflow(ctx context.Context, workflowID, reason string) (pausedAt time.Time, err error) {
	res, err := pauseWorkflow(ctx, c.gql, workflowID, ptr(reason))
	if err != nil {
		return time.Time{}, apiError(err)
	}
	if res.PauseWorkflow.PausedAt != nil {
		pausedAt = *res.PauseWorkflow.PausedAt
	}
	return pausedAt, nil
}

// ResumeWorkflow resumes a paused workflow; the answer is the bulk
// operation starting its queued runs, oldest first (nil when the workflow
// was not paused). Needs runs:write.
func (c *Client) ResumeWorkflow(ctx context.Context, workflowID string) (*BulkOperation, error) {
	res, err := resumeWorkflow(ctx, c.gql, workflowID)
	if err != nil {
		return nil, apiError(err)
	}
	if res.ResumeWorkflow.Resume == nil {
		return nil, nil
	}
	return &res.ResumeWorkflow.Resume.BulkOperationFields, nil
}

// PauseQueue pauses one of the tenant's queues: its tasks wait and are not
// handed to workers; running tasks finish. Needs runs:write.
func (c *Client) PauseQueue(ctx context.Context, queue, reason string) (*QueuePause, error) {
	res, err := pauseQueue(ctx, c.gql, queue, ptr(reason))
	if err != nil {
		return nil, apiError(err)
	}
	return &res.PauseQueue, nil
}

// ResumeQueue resumes a paused queue; it answers how many waiting tasks were
// dispatched again. Needs runs:write.
func (c *Client) ResumeQueue(ctx context.Context, queue string) (int, error) {
	res, err := resumeQueue(ctx, c.gql, queue)
	if err != nil {
		return 0, apiError(err)
	}
	return res.ResumeQueue.Redispatched, nil
}

// BulkFilter selects the runs of a bulk operation (zero fields select
// everything); Statuses are narrowed to those the action applies to.
type BulkFilter struct {
	Statuses      []RunStatus
	WorkflowID    string
	CreatedAfter  time.Time
	CreatedBefore time.Time
	Metadata      map[string]string
}

// BulkRequest asks for a bulk operation. IdempotencyKey makes a retried
// request answer the first operation (created false); when empty,
// CreateBulkOperation makes one for its own repeats.
type BulkRequest struct {
	Action         BulkAction
	Filter         BulkFilter
	Reason         string
	IdempotencyKey string
}

// CreateBulkOperation starts an asynchronous bulk operation (cancel, rerun
// or resume of every matching run); follow it with GetBulkOperation or
// WaitBulkOperation. Needs runs:write.
func (c *Client) CreateBulkOperation(ctx context.Context, req BulkRequest) (op *BulkOperation, created bool, err error) {
	var meta *json.RawMessage
	if len(req.Filter.Metadata) > 0 {
		b, err := json.Marshal(req.Filter.Metadata)
		if err != nil {
			return nil, false, err
		}
		raw := json.RawMessage(b)
		meta = &raw
	}
	key, own := req.IdempotencyKey, false
	if key == "" {
		if key, err = newKey(); err != nil {
			return nil, false, err
		}
		own = true
	}
	f := req.Filter
	var res *createBulkOperationResponse
	err = c.repeat(ctx, func() (err error) {
		res, err = createBulkOperation(ctx, c.gql, req.Action, f.Statuses, ptr(f.WorkflowID), timePtr(f.CreatedAfter), timePtr(f.CreatedBefore), meta,
			ptr(req.Reason), &key)
		return apiError(err)
	})
	if err != nil {
		return nil, false, err
	}
	return &res.CreateBulkOperation.Operation.BulkOperationFields, res.CreateBulkOperation.Created || own, nil
}

// GetBulkOperation reads a bulk operation and its progress. Needs runs:read.
func (c *Client) GetBulkOperation(ctx context.Context, id string) (*BulkOperation, error) {
	res, err := getBulkOperation(ctx, c.gql, id)
	if err != nil {
		return nil, apiError(err)
	}
	return &res.BulkOperation.BulkOperationFields, nil
}

// CancelBulkOperation stops a running bulk operation after its current
// batch. Needs runs:write.
func (c *Client) CancelBulkOperation(ctx context.Context, id string) (*BulkOperation, error) {
	res, err := cancelBulkOperation(ctx, c.gql, id)
	if err != nil {
		return nil, apiError(err)
	}
	return &res.CancelBulkOperation.BulkOperationFields, nil
}

// WaitBulkOperation polls a bulk operation every interval (default 1s)
// until it is no longer running or ctx ends.
func (c *Client) WaitBulkOperation(ctx context.Context, id string, interval time.Duration) (*BulkOperation, error) {
	if interval <= 0 {
		interval = time.Second
	}
	for {
		op, err := c.GetBulkOperation(ctx, id)
		if err != nil || op.Status != BulkOperationStatusRunning {
			return op, err
		}
		select {
		case <-ctx.Done():
			return op, ctx.Err()
		case <-time.After(interval):
		}
	}
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
