// Package engine is Composer's durable core: the coordinator that applies
// every event of a run in one PostgreSQL transaction, the transactional
// outbox that carries dispatches to Redis streams, and the sweeps and
// timers that recover what was lost.
//
// The promise: a run's state changes if and only if the transaction that
// decided the change commits, and a task message is published if and only
// if that transaction commits (at least once; duplicates are harmless).
//
// Every event follows the same path (Coordinator.apply):
//
//  1. open a transaction as the tenant (tenants.WithTenant);
//  2. lock the run row — an UPDATE, so concurrent events of the same run
//     queue behind each other and a fork's two branches completing at once
//     cannot both miss the join;
//  3. load the run's tasks and pending signals;
//  4. let the pure state machine decide (engine/statemachine);
//  5. persist every action, each guarded in SQL as the machine guarded it
//     (a result applies only to `attempt = $n AND state IN (active)`),
//     plus outbox rows and a timeline entry;
//  6. commit, then run after-commit hooks (logs, metrics, waking the
//     local enqueuer).
//
// An ignored event (stale, duplicate, irrelevant) rolls back and is still
// acknowledged, so its sender stops retrying.
//
//	c := engine.NewCoordinator(db, engine.Options{Logger: log})
//	res, err := c.StartRun(ctx, tenantID, engine.StartRun{WorkflowName: "order", Input: in, IdempotencyKey: "order-42"})
//	ack, err := c.CompleteTask(ctx, tenantID, engine.Report{RunID: res.RunID, TaskID: t, NodeID: "charge", Attempt: 1, Output: out})
package engine
