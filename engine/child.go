package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/composer-dev/composer/engine/dag"
	sm "github.com/composer-dev/composer/engine/statemachine"
	"github.com/composer-dev/composer/internal/errs"
)

// parentLink is what a child run records of the task that started it.
type parentLink struct {
	run   uuid.UUID
	task  uuid.UUID
	node  string
	depth int
}

// Timer kinds of the crossings between a parent run and its child (see
// migration 00020): the child ended; the parent no longer waits for it.
const (
	timerChildFinished   = "child_finished"
	timerParentCancelled = "parent_cancelled"
)

// childKey is the idempotency key of the child run a task starts: one
// child per task, however often its transaction is retried.
func childKey(task uuid.UUID) string { return "child:" + task.String() }

// startChild starts the child run of a StartChild action inside the
// transition's transaction, in a savepoint: the child's own start path
// (admission, the workflow's validation of its input) with the parent
// recorded on it. A start refused for a reason the tenant is told (no such
// workflow, the input, admission, nesting deeper than dag.MaxChildDepth) is
// rolled back alone and comes back to the parent as a failed
// ChildFinished through a due child_finished timer; any other error fails
// the transition.
func (p *persister) startChild(ctx context.Context, a sm.StartChild) error {
	t := p.task(a.NodeID)
	refuse := func(err error) {
		detail := errJSON(&sm.Error{Code: sm.CodeChildRefused,
			Message: fmt.Sprintf("starting a run of workflow %q was refused: %s", a.Workflow, errs.PublicMessage(err)),
			Details: json.RawMessage(fmt.Sprintf(`{"code":%q}`, errs.KindOf(err)))})
		p.exec(qInsertParentTimer, p.tx.Tenant, p.runID, timerChildFinished, a.NodeID, t.id, detail)
		p.wakeTimers = true
	}
	if p.depth+1 > dag.MaxChildDepth {
		refuse(errs.E(errs.Invalid, "child runs nest at most %d deep", dag.MaxChildDepth))
		return nil
	}
	if _, err := p.tx.Exec(ctx, "SAVEPOINT child_start"); err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	// The child is not what the caller asked to read back.
	cctx := context.WithValue(ctx, readBackKey{}, (*RunView)(nil))
	// A child runs at its node's priority, else its parent's.
	prio := p.priority
	if n := p.def.wf.Node(a.NodeID); n != nil && n.Priority != nil {
		prio = *n.Priority
	}
	req := StartRun{WorkflowName: a.Workflow, Version: a.Version, Input: a.Input, IdempotencyKey: childKey(t.id), Priority: prio,
		parent: &parentLink{run: p.runID, task: t.id, node: a.NodeID, depth: p.depth + 1}, secretInput: p.def.wf.SecretDerived(a.NodeID)}
	s, err := p.c.startIn(cctx, p.tx, req, jsonOrEmpty(a.Input), true)
	if err == nil {
		if _, err := p.tx.Exec(ctx, "RELEASE SAVEPOINT child_start"); err != nil {
			return fmt.Errorf("release savepoint: %w", err)
		}
		if p.children == nil {
			p.children = map[string]uuid.UUID{}
		}
		p.children[a.NodeID] = s.RunID
		return nil
	}
	if kind := errs.KindOf(err); kind == errs.Internal || kind == errs.Unavailable {
		return err
	}
	if _, rerr := p.tx.Exec(ctx, "ROLLBACK TO SAVEPOINT child_start"); rerr != nil {
		return fmt.Errorf("rollback to savepoint: %w", rerr)
	}
	refuse(err)
	return nil
}

// childEnded tells the parent of a run that just ended (in this
// transition's batch).
func (p *persister) childEnded() {
	if l := p.parent; l != nil {
		p.exec(qInsertParentTimer, p.tx.Tenant, l.run, timerChildFinished, l.node, l.task, nil)
		p.wakeTimers = true
	}
}

// cancelChild cancels the child run of a task the transition cancels, if
// it has one still running.
func (p *persister) cancelChild(node string, task uuid.UUID) {
	if n := p.def.wf.Node(node); n != nil && n.Type == dag.TypeWorkflow {
		p.exec(qCancelChild, p.tx.Tenant, p.runID, task)
		p.wakeTimers = true
	}
}

// childEvent is the event a fired crossing timer delivers: the end of the
// task's child run, or (to the child) its parent's cancellation.
func childEvent(ctx context.Context, tx interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, tenant, runID uuid.UUID, kind, node string, task *uuid.UUID, detail []byte) (sm.Event, error) {
	if kind == timerParentCancelled {
		return sm.CancelRequested{Reason: "the run that started it no longer waits for it (cancelled, failed or timed out)"}, nil
	}
	if task == nil {
		return nil, ignored("a child_finished timer without a task")
	}
	ev := sm.ChildFinished{NodeID: node, TaskID: task.String(), Attempt: 1}
	var id uuid.UUID
	var status string
	var output, errDoc []byte
	err := tx.QueryRow(ctx, qChildOf, tenant, runID, *task).Scan(&id, &status, &output, &errDoc)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// The start was refused: the timer carries why.
		ev.Status, ev.Error = sm.RunFailed, &sm.Error{Code: sm.CodeChildRefused, Message: "the child run could not be started"}
		if len(detail) > 0 {
			_ = json.Unmarshal(detail, ev.Error)
		}
		return ev, nil
	case err != nil:
		return nil, fmt.Errorf("read child run: %w", err)
	}
	ev.ChildID, ev.Status, ev.Output = id.String(), sm.RunStatus(status), output
	if ev.Status == sm.RunRunning {
		return nil, ignored("child run %s is running again", id)
	}
	if len(errDoc) > 0 {
		ev.Error = &sm.Error{}
		_ = json.Unmarshal(errDoc, ev.Error)
	}
	return ev, nil
}

const (
	qInsertParentTimer = `INSERT INTO timers (tenant_id, run_id, kind, node_id, task_id, attempt, fire_at, detail)
			VALUES ($1, $2, $3, $4, $5, 1, now(), $6)`
	qCancelChild = `INSERT INTO timers (tenant_id, run_id, kind, fire_at)
			SELECT tenant_id, id, 'parent_cancelled', now() FROM workflow_runs
			 WHERE tenant_id = $1 AND parent_run_id = $2 AND parent_task_id = $3 AND status IN ('running', 'queued')`
	qChildOf = `SELECT id, status, output, error FROM workflow_runs
			 WHERE tenant_id = $1 AND parent_run_id = $2 AND parent_task_id = $3 ORDER BY id DESC LIMIT 1`
)
