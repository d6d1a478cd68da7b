package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/composer-dev/composer/engine/dag"
	"github.com/composer-dev/composer/engine/outbox"
	sm "github.com/composer-dev/composer/engine/statemachine"
	"github.com/composer-dev/composer/internal/pg"
)

// persister writes one transition's actions in one pipelined batch. Every
// statement that applies a result repeats the state machine's fence in SQL
// (`attempt = $n AND state IN (active)`), and a guard that matches no row
// rolls the whole transition back as ignored: something changed the task
// under us (a sweep requeued it), so the event is stale.
type persister struct {
	c           *Coordinator
	tx          *pg.Tx
	def         *compiled
	runID       uuid.UUID
	now         time.Time
	tasks       map[string]taskRef // node -> the task as the actions leave it
	traceparent string
	workflowID  uuid.UUID
	version     int
	started     map[string]time.Time // node -> lease start of its running attempt
	dispatched  bool
	// fresh are immediate dispatches this process publishes after commit.
	fresh []outbox.Fresh
	// eagerNode is the new task leased to the reporting worker in this
	// transaction, if any, and next its lease.
	eagerNode string
	next      *Lease
	// readBack, when set, receives the run as the transaction leaves it.
	readBack *RunView
	// priority is the run's (its tasks' when their node sets none).
	priority int
	// open leaves the transaction open after the transition (a start
	// among others in one publish's transaction) instead of committing
	// with its last batch.
	open bool
	// parent is the task that started this run, when it is a child run;
	// depth its nesting (0 at the top).
	parent *parentLink
	depth  int
	// concurrencyKey is the run's concurrency key ("" without one).
	concurrencyKey string
	// children are the child runs this transition started, by node.
	children map[string]uuid.UUID
	// wakeTimers asks the timer loop to look now (a crossing timer between
	// a parent and a child was inserted).
	wakeTimers bool

	b pgx.Batch
}

type taskRef struct {
	id      uuid.UUID
	attempt int
}

// guarded queues a statement that must change exactly one row. The check
// runs in the database (composer_guard raises CM409), so a failed guard
// aborts the pipeline before its COMMIT.
func (p *persister) guarded(what string, sql string, args ...any) {
	args = append(args, what)
	p.b.Queue(fmt.Sprintf(qGuard, sql, len(args)), args...)
}

// guardFailed turns a failed guard into an ignored event.
func guardFailed(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "CM409" {
		return ignoredError{pg.Message}
	}
	return err
}

func (p *persister) exec(sql string, args ...any) { p.b.Queue(sql, args...) }

func (p *persister) task(node string) taskRef {
	t, ok := p.tasks[node]
	if !ok {
		panic(fmt.Sprintf("engine: action on node %s, which has no task", node)) // the state machine never does this
	}
	return t
}

func (p *persister) persist(ctx context.Context, ev sm.Event, tr sm.Transition, ref eventRef) error {
	tenant := p.tx.Tenant
	// The lease owner (and a tenant worker's key) fences a worker's report
	// for its own task.
	ownerFor := func(taskID string) (string, string) {
		if ref.owner != "" && ref.task.String() == taskID {
			return ref.owner, ref.key
		}
		return "", ""
	}
	// An unleased report may only touch its task while nobody runs it; an
	// expired lease only while it is running with that lease expired.
	states := func(taskID string) string {
		switch {
		case ref.pendingOnly && ref.task.String() == taskID:
			return `('pending')`
		case ref.expiredOnly && ref.task.String() == taskID:
			return `('running') AND lease_expires_at < now()`
		}
		return activeStates
	}
	report := p.report(ev, ref)
	if len(p.c.opts.Hooks) > 0 {
		t := &TxTransition{Tenant: tenant, RunID: p.runID, WorkflowID: p.workflowID, WorkflowVersion: p.version,
			Event: sm.Kind(ev), Status: tr.Status, Now: p.now, Report: report}
		for _, a := range tr.Actions {
			switch a := a.(type) {
			case sm.CompleteRun:
				t.Terminal, t.Output = true, a.Output
			case sm.FailRun:
				t.Terminal, t.Error = true, &a.Error
			case sm.CancelRun:
				t.Terminal, t.Error = true, &sm.Error{Code: sm.CodeCancelled, Message: a.Reason}
			case sm.CreateTask:
				if a.Type == dag.TypeWait && a.State == sm.TaskWaiting {
					if n := p.def.wf.Node(a.NodeID); n != nil && n.Wait != nil {
						w := WaitStarted{Node: a.NodeID, Signal: n.Wait.Signal, Event: n.Wait.Event, Approval: n.Wait.Approval}
						if d := n.Wait.Timeout.Std(); d > 0 {
							at := p.now.Add(d)
							w.TimeoutAt = &at
						}
						t.Waits = append(t.Waits, w)
					}
				}
			}
		}
		for _, h := range p.c.opts.Hooks {
			h(t, batchQueuer{&p.b})
		}
	}
	p.eagerNode = p.eagerCandidate(tr, ref)
	for i, a := range tr.Actions {
		if p.c.fault != nil && p.c.fault(i) {
			p.exec("SELECT 1/0 -- injected fault")
		}
		switch a := a.(type) {
		case sm.CreateTask:
			id := uuid.Must(uuid.NewV7())
			p.tasks[a.NodeID] = taskRef{id: id, attempt: 1}
			var dispatchAt, finishedAt *time.Time
			if a.State == sm.TaskPending {
				dispatchAt = &p.now
			}
			if !a.State.Active() {
				finishedAt = &p.now
			}
			config := p.def.configOf(a.NodeID)
			if a.Request != nil {
				config = nodeConfig(p.def.stepOf(a.NodeID), a.Request)
			}
			if config != nil {
				config = taskConfig(config, p.def.wf.Node(a.NodeID), a.Priority, a.RateKey)
			}
			if a.NodeID == p.eagerNode {
				// Created already leased to the reporting worker: the
				// state and lease columns the lease UPDATE would write.
				ttl := ref.eager.TTL
				next := &Lease{TaskID: id, RunID: p.runID, Attempt: 1, Queue: p.def.wf.Node(a.NodeID).QueueName(), TraceParent: p.traceparent,
					Acquired: true, ExpiresAt: p.now.Add(ttl), NodeID: a.NodeID, NodeType: string(a.Type), WorkflowID: p.workflowID,
					WorkflowVersion: p.version, MaxAttempts: a.MaxAttempts}
				p.next = next
				// Input and config as stored (jsonb), byte for byte what an
				// acquired lease of the same task would carry.
				p.b.Queue(qInsertLeasedTask,
					tenant, p.runID, id, a.NodeID, string(a.Type), a.Queue, a.MaxAttempts, jsonOrNil(a.Input), config, ref.owner, ttl.Seconds(),
					ref.key).
					QueryRow(func(r pgx.Row) error {
						var in, cfg []byte
						if err := r.Scan(&in, &cfg); err != nil {
							return err
						}
						next.Input, next.Config = in, cfg
						return nil
					})
				continue
			}
			var key string
			if a.ConcurrencyKey != "" {
				base, _, isItem := dag.ParseItemID(a.NodeID)
				if !isItem {
					base = a.NodeID
				}
				key = p.workflowID.String() + "/" + base + "/" + a.ConcurrencyKey
			}
			p.exec(qInsertTask,
				tenant, p.runID, id, a.NodeID, string(a.Type), a.Queue, string(a.State), a.MaxAttempts,
				jsonOrNil(a.Input), config, jsonOrNil(a.Output), errJSON(a.Error), a.Reason, dispatchAt, finishedAt, key, a.ConcurrencyLimit)
		case sm.Dispatch:
			if a.NodeID == p.eagerNode && a.Attempt == 1 {
				continue // leased in its INSERT: nothing to publish
			}
			p.dispatch(a.NodeID, a.Attempt, a.NotBefore)
		case sm.ScheduleTimer:
			var task *uuid.UUID
			var attempt *int
			var node *string
			if a.NodeID != "" {
				t := p.task(a.NodeID)
				task, attempt, node = &t.id, &a.Attempt, &a.NodeID
			}
			p.exec(qInsertTimer,
				tenant, p.runID, string(a.Kind), node, task, attempt, a.FireAt)
		case sm.CompleteTask:
			t := p.task(a.NodeID)
			owner, key := ownerFor(a.TaskID)
			p.guarded("completing "+a.NodeID, qCompleteTask,
				tenant, p.runID, t.id, []byte(a.Output), a.Attempt, owner, key)
			p.releaseSlot(a.NodeID, t.id)
			p.stopAwaiting(a.NodeID, t.id)
		case sm.RetryTask:
			t := p.task(a.NodeID)
			owner, key := ownerFor(a.TaskID)
			p.guarded("retrying "+a.NodeID, fmt.Sprintf(qRetryTask, states(a.TaskID)),
				tenant, p.runID, t.id, errJSON(&a.Error), a.NotBefore, a.Attempt, owner, key)
			p.tasks[a.NodeID] = taskRef{id: t.id, attempt: a.Attempt + 1}
			p.dispatch(a.NodeID, a.Attempt+1, a.NotBefore)
		case sm.FailTask:
			t := p.task(a.NodeID)
			owner, key := ownerFor(a.TaskID)
			p.guarded("failing "+a.NodeID, fmt.Sprintf(qFailTask, states(a.TaskID)),
				tenant, p.runID, t.id, errJSON(&a.Error), a.Attempt, owner, key)
			p.releaseSlot(a.NodeID, t.id)
			p.stopAwaiting(a.NodeID, t.id)
		case sm.CancelTask:
			t := p.task(a.NodeID)
			p.guarded("cancelling "+a.NodeID, qCancelTask,
				tenant, p.runID, t.id)
			p.releaseSlot(a.NodeID, t.id)
			p.stopAwaiting(a.NodeID, t.id)
			p.cancelChild(a.NodeID, t.id)
		case sm.ResetNode:
			t := p.task(a.NodeID)
			p.exec(qDeleteTaskTimers, tenant, p.runID, t.id)
			p.guarded("resetting "+a.NodeID, qDeleteTask, tenant, p.runID, t.id)
			delete(p.tasks, a.NodeID)
		case sm.RecordSignal:
			p.exec(qInsertSignal,
				tenant, p.runID, a.Signal.ID, a.Signal.Name, jsonOrEmpty(a.Signal.Payload), a.ConsumedBy, a.Signal.By.String())
		case sm.ConsumeSignal:
			p.guarded("consuming signal "+a.SignalID, qConsumeSignal, tenant, p.runID, a.SignalID, a.NodeID)
		case sm.StartChild:
			if err := p.startChild(ctx, a); err != nil {
				return err
			}
		case sm.AwaitEvent:
			var task *uuid.UUID
			var node *string
			var cancelOn *int
			if a.NodeID != "" {
				t := p.task(a.NodeID)
				task, node = &t.id, &a.NodeID
			} else {
				cancelOn = &a.CancelOn
			}
			p.exec(qInsertEventWait, tenant, p.runID, task, node, cancelOn, a.Name, a.KeyExpr, a.Key)
		case sm.CompleteRun:
			p.finishRun("completed", a.Output, nil)
		case sm.FailRun:
			p.finishRun("failed", nil, errJSON(&a.Error))
		case sm.CancelRun:
			p.finishRun("cancelled", nil, errJSON(&sm.Error{Code: sm.CodeCancelled, Message: a.Reason}))
		case sm.ReopenRun:
			p.guarded("reopening the run", qReopenRun, tenant, p.runID)
		default:
			return fmt.Errorf("engine: no persistence for action %T", a)
		}
	}
	d := timelineDetail(ev, tr)
	if e, ok := ev.(sm.SignalReceived); ok {
		// The policy the approver was held to, in words.
		for _, n := range p.def.wf.Approvals() {
			if n.Wait.Signal == e.Signal.Name && n.Wait.Approvers != nil {
				d["approvers"] = n.Wait.Approvers.Who()
			}
		}
	}
	if len(p.children) > 0 {
		d["children"] = p.children
	}
	if report != nil {
		// Who ran the attempt, with which key, and since when: the audit
		// trail of usage.
		d["worker"], d["started_at"] = report.Worker, report.StartedAt
		if report.Key != "" {
			d["api_key_id"] = report.Key
		}
	}
	detail, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("timeline detail: %w", err)
	}
	var task *uuid.UUID
	var attempt *int
	if ref.task != uuid.Nil {
		task, attempt = &ref.task, &ref.attempt
	}
	p.exec(qInsertEvent,
		tenant, p.runID, sm.Kind(ev), eventNode(ev, ref), task, attempt, detail)
	if p.readBack != nil {
		// The API's answer is the run as this transaction leaves it, read
		// in the same round trip as the COMMIT.
		// Its failure must not fail the call: the COMMIT behind it in the
		// pipeline has run by then. The target is left empty instead.
		p.b.Queue(qReadBackRun, tenant, p.runID).QueryRow(func(row pgx.Row) error {
			if v, err := scanRun(row); err == nil {
				*p.readBack = v
			}
			return nil
		})
	}
	// The transition and its COMMIT travel in one round trip.
	send := p.tx.CommitWith
	if p.open {
		send = func(ctx context.Context, b *pgx.Batch) error { return p.tx.SendBatch(ctx, b).Close() }
	}
	if err := send(ctx, &p.b); err != nil {
		if err = guardFailed(err); errors.As(err, new(ignoredError)) {
			return err
		}
		return fmt.Errorf("persist transition: %w", err)
	}
	return nil
}

type batchQueuer struct{ b *pgx.Batch }

func (q batchQueuer) Queue(sql string, args ...any) { q.b.Queue(sql, args...) }

// report describes the attempt a worker's result ends: a result for an
// attempt the worker leased (not an unleased report, nor the sweeper's).
func (p *persister) report(ev sm.Event, ref eventRef) *AttemptReport {
	if ref.owner == "" || ref.pendingOnly || ref.task == uuid.Nil {
		return nil
	}
	switch ev.(type) {
	case sm.NodeCompleted, sm.NodeFailed:
	default:
		return nil
	}
	started, ok := p.started[ref.node]
	if !ok {
		return nil // not running: the guards will ignore this report
	}
	return &AttemptReport{Task: ref.task, Node: ref.node, Attempt: ref.attempt, Worker: ref.owner, Key: ref.key, StartedAt: started}
}

// eagerCandidate picks the task, if any, to lease to the reporting worker
// in this transaction: the first task the transition both creates pending
// and dispatches now, on the offered queue and of an offered node type.
// One at most: the offer is the one slot the report frees.
func (p *persister) eagerCandidate(tr sm.Transition, ref eventRef) string {
	if ref.eager == nil || ref.owner == "" {
		return ""
	}
	// The slot offered is the reported task's: its queue only.
	if n := p.def.wf.Node(ref.node); n == nil || n.QueueName() != ref.eager.Queue {
		return ""
	}
	created := map[string]bool{}
	for _, a := range tr.Actions {
		switch a := a.(type) {
		case sm.CreateTask:
			if a.State == sm.TaskPending && a.ConcurrencyKey == "" {
				created[a.NodeID] = true // (a keyed step first waits for its key's slot)
			}
		case sm.Dispatch:
			n := p.def.wf.Node(a.NodeID)
			// A rate-limited step takes its token where leases are taken:
			// it is never leased eagerly.
			if created[a.NodeID] && a.Attempt == 1 && !a.NotBefore.After(p.now) && ref.eager.accepts(n) && n.RateLimit == nil {
				return a.NodeID
			}
		}
	}
	return ""
}

func (p *persister) dispatch(node string, attempt int, notBefore time.Time) {
	n := p.def.wf.Node(node)
	t := p.task(node)
	p.dispatched = true
	handler := n.HandlerName()
	prio := p.priority
	if n.Priority != nil {
		prio = *n.Priority
	}
	if n.Concurrency != nil {
		p.dispatchKeyed(n, node, t, attempt, notBefore, prio)
		return
	}
	const insert = qInsertOutbox
	if p.c.opts.PublishNow == nil || notBefore.After(p.now) {
		p.exec(insert, p.tx.Tenant, n.QueueName(), p.runID, t.id, node, string(n.Type), handler, attempt, p.traceparent, notBefore, prio)
		return
	}
	// The fast path: published by this process after commit; due for
	// everyone else only if that never happens.
	f := outbox.Fresh{Tenant: p.tx.Tenant, Queue: n.QueueName(), Run: p.runID, Task: t.id, Node: node, Type: string(n.Type),
		Handler: handler, Attempt: attempt, TraceParent: p.traceparent, Priority: prio}
	i := len(p.fresh)
	p.fresh = append(p.fresh, f)
	p.b.Queue(insert+` RETURNING id`, p.tx.Tenant, n.QueueName(), p.runID, t.id, node, string(n.Type), handler, attempt, p.traceparent,
		notBefore.Add(outbox.FastPathGrace), prio).QueryRow(func(r pgx.Row) error { return r.Scan(&p.fresh[i].ID) })
}

// finishRun writes the run's terminal state once (the status guard) and
// drops its timers and registered waits, which can no longer matter.
func (p *persister) finishRun(status string, output, errDoc []byte) {
	p.guarded("finishing the run", qFinishRun, p.tx.Tenant, p.runID, status, output, errDoc)
	p.exec(qDeleteRunTimers, p.tx.Tenant, p.runID)
	if p.def.wf.HasEventWaits() {
		p.exec(qDeleteRunEventWaits, p.tx.Tenant, p.runID)
	}
	p.childEnded()
	p.releaseKey()
}

// stopAwaiting drops the registration of an event wait whose task ends.
func (p *persister) stopAwaiting(node string, task uuid.UUID) {
	if n := p.def.wf.Node(node); n != nil && n.IsEventWait() {
		p.exec(qDeleteTaskEventWait, p.tx.Tenant, task)
	}
}

func jsonOrNil(b json.RawMessage) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

func jsonOrEmpty(b json.RawMessage) []byte {
	if len(b) == 0 {
		return []byte("{}")
	}
	return b
}

func errJSON(e *sm.Error) []byte {
	if e == nil {
		return nil
	}
	b, err := json.Marshal(e)
	if err != nil {
		panic(fmt.Sprintf("engine: marshal error: %v", err))
	}
	return b
}

// signalDetail is what the timeline records of a signal: its id, name
// and sender (the approver, for an approval).
func signalDetail(s sm.Signal) map[string]string {
	d := map[string]string{"id": s.ID, "name": s.Name}
	if by := s.By.String(); by != "" {
		d["by"] = by
	}
	return d
}

func eventNode(ev sm.Event, ref eventRef) string {
	switch e := ev.(type) {
	case sm.TimerFired:
		return e.NodeID
	}
	return ref.node
}

// timelineDetail is what the run's timeline records of a transition: the
// event's facts and a compact list of what it changed.
func timelineDetail(ev sm.Event, tr sm.Transition) map[string]any {
	d := map[string]any{"status": tr.Status}
	switch e := ev.(type) {
	case sm.NodeFailed:
		d["error"] = e.Error
		d["retryable"] = e.Retryable
	case sm.TimerFired:
		d["timer"] = e.Kind
	case sm.SignalReceived:
		d["signal"] = signalDetail(e.Signal)
	case sm.EventReceived:
		d["event"] = map[string]string{"id": e.Event.ID, "name": e.Event.Name}
	case sm.ChildFinished:
		d["child"] = map[string]any{"run_id": e.ChildID, "status": e.Status}
	case sm.CancelRequested:
		d["reason"] = e.Reason
	}
	actions := make([]map[string]any, 0, len(tr.Actions))
	for _, a := range tr.Actions {
		m := map[string]any{"kind": sm.ActionKind(a)}
		switch a := a.(type) {
		case sm.CreateTask:
			m["node"], m["state"] = a.NodeID, a.State
			if a.Reason != "" {
				m["reason"] = a.Reason
			}
		case sm.Dispatch:
			m["node"], m["attempt"] = a.NodeID, a.Attempt
		case sm.ScheduleTimer:
			m["timer"], m["fire_at"] = a.Kind, a.FireAt
			if a.NodeID != "" {
				m["node"] = a.NodeID
			}
		case sm.CompleteTask:
			m["node"], m["attempt"] = a.NodeID, a.Attempt
		case sm.RetryTask:
			m["node"], m["attempt"], m["not_before"], m["error"] = a.NodeID, a.Attempt, a.NotBefore, a.Error
		case sm.FailTask:
			m["node"], m["attempt"], m["error"] = a.NodeID, a.Attempt, a.Error
		case sm.CancelTask:
			m["node"] = a.NodeID
		case sm.ResetNode:
			m["node"] = a.NodeID
		case sm.RecordSignal:
			m["signal"], m["consumed_by"] = a.Signal.Name, a.ConsumedBy
		case sm.ConsumeSignal:
			m["node"] = a.NodeID
		case sm.StartChild:
			m["node"], m["workflow"] = a.NodeID, a.Workflow
		case sm.AwaitEvent:
			m["event"] = a.Name
			if a.NodeID != "" {
				m["node"] = a.NodeID
			} else {
				m["cancel_on"] = a.CancelOn
			}
		case sm.FailRun:
			m["error"] = a.Error
		case sm.CancelRun:
			m["reason"] = a.Reason
		}
		actions = append(actions, m)
	}
	d["actions"] = actions
	return d
}
