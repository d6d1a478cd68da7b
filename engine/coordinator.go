package engine

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/engine/dag"
	"github.com/composer-dev/composer/engine/outbox"
	sm "github.com/composer-dev/composer/engine/statemachine"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/jsoncheck"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/tenants"
)

// MaxInputBytes bounds a run's input and a task's output.
const MaxInputBytes = 1 << 20

// Options configures a Coordinator.
type Options struct {
	Logger *zap.Logger
	// Wake, when set, is called after a commit that added outbox rows, so an
	// enqueuer in the same process publishes at once.
	Wake func()
	// PublishNow, when set, publishes a commit's immediate dispatches right
	// after the commit (the outbox fast path, see engine/outbox); their rows
	// are inserted due only after outbox.FastPathGrace, as a safety net.
	PublishNow func(context.Context, []outbox.Fresh)
	// WakeTimers, when set, is called after a commit that scheduled a
	// timer, so the timer loop in the same process re-reads the next due time.
	WakeTimers func()
	// OnTransition, when set, is called after every committed transition
	// (e.g. to publish live updates).
	OnTransition func(Transition)
	// Admit, when set, decides in a new run's transaction, before anything
	// is written, whether the tenant may start it (quotas, spend caps); its
	// error is returned as is and nothing is written.
	Admit func(ctx context.Context, tx *pg.Tx) error
	// BulkWake, when set, is called after a commit that created a bulk
	// operation, so a bulk runner in the same process starts it at once.
	BulkWake func()
	// Slots, when set, enforces each tenant's running-task quota when leases
	// are granted (see SlotGate); without it there is no such quota.
	Slots SlotGate
	// StepLimits, when set, enforces steps' rate limits when leases are
	// granted (ratelimit.go); without it they run unlimited.
	StepLimits StepLimits
	// Hooks see every transition inside its transaction, before its
	// actions are written, and queue statements that commit with it (usage
	// meters, webhook deliveries): what they write exists if and only if
	// the transition committed.
	Hooks []TxHook
}

// TxHook queues statements into a transition's transaction. It runs no
// statement itself and must not fail: a statement that fails rolls the
// transition back, and the event is retried by whoever sent it.
type TxHook func(t *TxTransition, q Queuer)

// Queuer queues a statement into the transaction's single round trip.
type Queuer interface {
	Queue(sql string, args ...any)
}

// TxTransition is what a TxHook knows of a transition.
type TxTransition struct {
	Tenant          uuid.UUID
	RunID           uuid.UUID
	WorkflowID      uuid.UUID
	WorkflowVersion int
	// Event is the event's kind ("run_started", "node_completed", ...).
	Event string
	// Status is the run's status after the transition; Terminal reports
	// that the transition ended the run, with Output or Error.
	Status   sm.RunStatus
	Terminal bool
	Output   json.RawMessage
	Error    *sm.Error
	// Now is the transaction's time on the database clock.
	Now time.Time
	// Report is set when the event is a worker's result for an attempt it
	// held the lease of.
	Report *AttemptReport
	// Waits are the wait nodes that started waiting in this transition.
	Waits []WaitStarted
}

// WaitStarted is a wait node that began waiting for its signal (or
// approval), with its deadline when it has one.
type WaitStarted struct {
	Node   string
	Signal string
	// Event is the event an event wait waits for (Signal is then "").
	Event     string
	Approval  bool
	TimeoutAt *time.Time
}

// AttemptReport is the attempt a worker's result ended.
type AttemptReport struct {
	Task    uuid.UUID
	Node    string
	Attempt int
	Worker  string
	// Key is the API key the worker reported with (a tenant's own worker).
	Key string
	// StartedAt is when the attempt's lease was granted (database clock).
	StartedAt time.Time
}

// SlotGate is the running-task quota: a semaphore per tenant whose permits
// are leases, given back when a lease ends and lapsing when it expires
// (tenants.Slots).
type SlotGate interface {
	// Acquire takes a permit per member while the tenant holds fewer than
	// limit; it reports what it did for each member and how many are held.
	Acquire(ctx context.Context, tenant uuid.UUID, limit int, ttl time.Duration, members []string) ([]tenants.Permit, int, error)
	Renew(ctx context.Context, tenant uuid.UUID, ttl time.Duration, members []string) error
	Release(ctx context.Context, tenant uuid.UUID, members []string) error
	// ReleaseLater is Release in the background, batched.
	ReleaseLater(tenant uuid.UUID, members ...string)
	// Transfer hands the permit of one lease to another (an ended
	// attempt's slot, eagerly given to the run's next task): the count of
	// permits does not change.
	Transfer(ctx context.Context, tenant uuid.UUID, ttl time.Duration, from, to string) error
}

// Transition describes a committed transition, for after-commit observers.
type Transition struct {
	Tenant uuid.UUID
	RunID  uuid.UUID
	Event  string
	// Node is the node the event was about ("" for run-level events).
	Node     string
	Status   sm.RunStatus
	Terminal bool // the transition ended the run
}

// Coordinator applies events to runs. It is stateless apart from a cache of
// immutable definitions: any number of replicas may run against one
// database. It is safe for concurrent use.
type Coordinator struct {
	db     *pg.DB
	log    *zap.Logger
	defs   *defCache
	opts   Options
	limits *limitCache
	// rateLimits caches tenants' step rate limits; rateDeferred counts
	// the steps deferred for theirs.
	rateLimits   *rateLimitCache
	rateDeferred atomic.Int64
	// fault, in tests, makes persisting fail at a given action index.
	fault func(action int) bool
}

// NewCoordinator returns a coordinator over db.
func NewCoordinator(db *pg.DB, o Options) *Coordinator {
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return &Coordinator{db: db, log: o.Logger, defs: newDefCache(10_000), opts: o, limits: newLimitCache(db),
		rateLimits: newRateLimitCache(db)}
}

// Ack answers a report or command. Ignored events are acknowledged too:
// the sender must stop retrying them.
type Ack struct {
	Ignored bool
	Reason  string
	Status  sm.RunStatus
	// Next, on a completion that carried an EagerOffer, is the lease of
	// the run's next task, granted to the reporting worker in the
	// completion's own transaction (see EagerOffer).
	Next *Lease
}

// StartRun asks to start a run of a workflow.
type StartRun struct {
	// WorkflowID or WorkflowName selects the workflow.
	WorkflowID   uuid.UUID
	WorkflowName string
	// Version picks a version; 0 means the latest.
	Version int
	// Input is the run input, a JSON object (empty means {}).
	Input json.RawMessage
	// IdempotencyKey makes the start idempotent: starting again with the
	// same key returns the same run.
	IdempotencyKey string
	// RerunOf links a re-run to the run it repeats.
	RerunOf uuid.UUID
	// Metadata are key/value business keys kept with the run (bounded:
	// dag.MaxMetadataKeys keys, dag.MaxMetadataValueChars per value); they
	// override the keys the workflow's own metadata mapping derives from
	// the input.
	Metadata map[string]string

	// parent is set for the child run a workflow node starts (child.go);
	// secretInput marks a child whose input derives from a secret.
	parent      *parentLink
	secretInput bool
	// Priority is the run's priority, dag.MinPriority..dag.MaxPriority (0
	// by default): its tasks', unless their node sets one.
	Priority int
}

// Started is StartRun's answer.
type Started struct {
	RunID uuid.UUID
	// Created is false when the idempotency key named an existing run.
	Created bool
	Status  sm.RunStatus
}

// MaxSignalBytes bounds one signal's payload.
const MaxSignalBytes = 64 << 10

// StartRun creates and starts a run in one transaction. With an
// idempotency key, concurrent and repeated starts return the same run; the
// same key with a different workflow or input is a Conflict.
func (c *Coordinator) StartRun(ctx context.Context, tenant uuid.UUID, req StartRun) (Started, error) {
	input, err := normalizeInput(req.Input)
	if err != nil {
		return Started{}, err
	}
	if len(req.IdempotencyKey) > 255 {
		return Started{}, errs.E(errs.Invalid, "idempotency key is longer than 255 characters")
	}
	if req.Version < 0 {
		return Started{}, errs.E(errs.Invalid, "version must be positive")
	}
	if err := checkMetadata("metadata", req.Metadata, dag.MaxMetadataKeys); err != nil {
		return Started{}, err
	}
	if err := checkPriority(req.Priority); err != nil {
		return Started{}, err
	}
	var out Started
	err = c.db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		out = Started{}
		if err := gate(ctx, tx); err != nil {
			return err
		}
		var err error
		out, err = c.startIn(ctx, tx, req, input, false)
		return err
	})
	if err != nil {
		return Started{}, err
	}
	return out, nil
}

// startIn is StartRun's work inside tx (whose tenant it starts the run
// of), the gate aside; input is normalized. Admission applies. It commits
// tx with its last batch unless open is set: a publish runs several in
// one transaction and commits once (events.go).
func (c *Coordinator) startIn(ctx context.Context, tx *pg.Tx, req StartRun, input json.RawMessage, open bool) (Started, error) {
	tenant := tx.Tenant
	var out Started
	var tr sm.Transition
	err := func() error {
		wid, version, paused, err := resolveWorkflow(ctx, tx, req)
		if err != nil {
			return err
		}
		if paused {
			// See pause.go: the lock makes a resume wait for this start (or
			// this start see the resume), so no queued run is left behind.
			if paused, err = lockPausedWorkflow(ctx, tx, wid); err != nil {
				return err
			}
		}
		runID := uuid.Must(uuid.NewV7())
		if req.IdempotencyKey != "" {
			h := requestHash(wid, req.Version, input, req.Metadata)
			// A repeat returns the run it named, admitted or not today.
			if done, err := existingRun(ctx, tx, req.IdempotencyKey, h, &out); done || err != nil {
				if err == nil {
					err = readBack(ctx, tx, out.RunID)
				}
				return err
			}
			if c.opts.Admit != nil {
				if err := c.opts.Admit(ctx, tx); err != nil {
					return err
				}
			}
			var claimed uuid.UUID
			err := tx.QueryRow(ctx, qClaimIdempotencyKey, tenant, req.IdempotencyKey, runID, h).Scan(&claimed)
			if errors.Is(err, pgx.ErrNoRows) {
				// Taken by a start that committed while we waited on the key.
				done, err := existingRun(ctx, tx, req.IdempotencyKey, h, &out)
				if err == nil && !done {
					err = errs.E(errs.Conflict, "idempotency key %q names a run that no longer exists", req.IdempotencyKey)
				}
				if err == nil {
					err = readBack(ctx, tx, out.RunID)
				}
				return err
			}
			if err != nil {
				return fmt.Errorf("claim idempotency key: %w", err)
			}
		} else if c.opts.Admit != nil {
			if err := c.opts.Admit(ctx, tx); err != nil {
				return err
			}
		}
		def, err := c.defs.load(ctx, tx, wid, version)
		if err != nil {
			return err
		}
		var now time.Time
		var rerunOf *uuid.UUID
		if req.RerunOf != uuid.Nil {
			rerunOf = &req.RerunOf
		}
		meta, err := runMetadata(def.wf, input, req.Metadata)
		if err != nil {
			return err
		}
		var parentRun, parentTask *uuid.UUID
		var parentNode *string
		depth := 0
		if l := req.parent; l != nil {
			parentRun, parentTask, parentNode, depth = &l.run, &l.task, &l.node, l.depth
		}
		adm, err := admitKey(ctx, tx, wid, def.wf, input, meta, paused)
		if err != nil {
			return err
		}
		status := sm.RunRunning
		if paused || adm.queue {
			status = RunQueued
		}
		var ckey *string
		if adm.key != "" {
			ckey = &adm.key
		}
		startedBy := actorOf(ctx).String() // a child inherits its parent's (qInsertRun)
		if req.parent != nil {
			startedBy = ""
		}
		err = tx.QueryRow(ctx, qInsertRun,
			tenant, runID, wid, version, input, req.IdempotencyKey, rerunOf, traceParent(ctx), metadataJSON(meta),
			parentRun, parentTask, parentNode, depth, string(status), ckey, req.Priority, startedBy, req.secretInput).Scan(&now)
		if err != nil {
			return fmt.Errorf("insert run: %w", err)
		}
		if len(meta) > 0 {
			keys := slices.Sorted(maps.Keys(meta))
			values := make([]string, len(keys))
			for i, k := range keys {
				values[i] = meta[k]
			}
			if _, err := tx.Exec(ctx, qInsertRunMetadata, tenant, runID, keys, values); err != nil {
				return fmt.Errorf("insert run metadata: %w", err)
			}
		}
		switch {
		case paused:
			out, err = c.queueRun(ctx, tx, runID, "the workflow is paused")
			return err
		case adm.queue:
			out, err = c.queueRun(ctx, tx, runID, fmt.Sprintf("concurrency key %q is at its limit of %d", adm.key, def.wf.Concurrency.Limit))
			return err
		}
		run := &sm.Run{ID: runID.String(), Status: sm.RunRunning, Input: input, Tasks: map[string]*sm.Task{}, Priority: req.Priority,
			StartedBy: dag.ParsePrincipal(startedBy)}
		var first sm.Event = sm.RunStarted{}
		if adm.cancel != "" {
			first = sm.CancelRequested{Reason: adm.cancel}
		}
		tr = sm.Decide(def.wf, run, first, now)
		if tr.Ignored {
			return fmt.Errorf("a new run was not started: %s", tr.Reason)
		}
		if err := tooLarge(tr); err != nil {
			return err // the input would be amplified past the bound: refuse the start, write nothing
		}
		p := &persister{c: c, tx: tx, def: def, runID: runID, now: now, tasks: map[string]taskRef{}, traceparent: traceParent(ctx),
			workflowID: wid, version: version, readBack: readBackOf(ctx), open: open, parent: req.parent, depth: depth,
			concurrencyKey: adm.key, wakeTimers: adm.supersedes, priority: req.Priority}
		if err := p.persist(ctx, first, tr, eventRef{}); err != nil {
			return err
		}
		out = Started{RunID: runID, Created: true, Status: tr.Status}
		c.afterCommit(ctx, tx, runID, first, tr, p, eventRef{})
		return nil
	}()
	return out, err
}

// tooLarge is the BAD_USER_INPUT of a start whose first nodes' inputs (or
// the run's output) would be larger than dag.MaxValueBytes, naming each.
func tooLarge(tr sm.Transition) error {
	var fields []errs.Field
	for _, a := range tr.Actions {
		switch a := a.(type) {
		case sm.CreateTask:
			if a.Error != nil && a.Error.Code == sm.CodeValueTooLarge {
				fields = append(fields, errs.Field{Node: a.NodeID, Field: "input", Message: a.Error.Message})
			}
		case sm.FailRun:
			if a.Error.Code == sm.CodeValueTooLarge && a.Error.Node == "" {
				fields = append(fields, errs.Field{Field: "output", Message: a.Error.Message})
			}
		}
	}
	if len(fields) == 0 {
		return nil
	}
	e := errs.E(errs.Invalid, "the run's input would make a value larger than %d bytes: %s", dag.MaxValueBytes, fields[0].Message)
	e.Fields = fields
	return e
}

// existingRun reads the run an idempotency key already names into out; it
// reports false when the key is free, and Conflict when it was used with
// other parameters.
func existingRun(ctx context.Context, tx *pg.Tx, key string, hash []byte, out *Started) (bool, error) {
	var id uuid.UUID
	var have []byte
	var status string
	err := tx.QueryRow(ctx, qIdempotentRun, tx.Tenant, key).Scan(&id, &have, &status)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read idempotency key: %w", err)
	}
	if string(have) != string(hash) {
		return false, errs.E(errs.Conflict, "idempotency key %q was already used with a different workflow or input", key)
	}
	*out = Started{RunID: id, Status: sm.RunStatus(status)}
	return true, nil
}

func normalizeInput(in json.RawMessage) (json.RawMessage, error) {
	if len(strings.TrimSpace(string(in))) == 0 {
		return json.RawMessage(`{}`), nil
	}
	if len(in) > MaxInputBytes {
		return nil, errs.E(errs.Invalid, "input is %d bytes; the limit is %d", len(in), MaxInputBytes)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(in, &obj); err != nil {
		return nil, errs.E(errs.Invalid, "input must be a JSON object")
	}
	if msg := jsoncheck.Check(in); msg != "" {
		return nil, errs.E(errs.Invalid, "input %s", msg)
	}
	return in, nil
}

// resolveWorkflow finds the workflow and version a start names, and
// whether the workflow is paused.
func resolveWorkflow(ctx context.Context, tx *pg.Tx, req StartRun) (uuid.UUID, int, bool, error) {
	var id uuid.UUID
	var latest int
	var paused bool
	var err error
	switch {
	case req.WorkflowID != uuid.Nil:
		err = tx.QueryRow(ctx, qWorkflowByID, tx.Tenant, req.WorkflowID).Scan(&id, &latest, &paused)
	case req.WorkflowName != "":
		err = tx.QueryRow(ctx, qWorkflowByName, tx.Tenant, req.WorkflowName).Scan(&id, &latest, &paused)
	default:
		return uuid.Nil, 0, false, errs.E(errs.Invalid, "name a workflow by id or name")
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return uuid.Nil, 0, false, errs.E(errs.NotFound, "workflow not found")
	}
	if err != nil {
		return uuid.Nil, 0, false, fmt.Errorf("resolve workflow: %w", err)
	}
	v := req.Version
	if v == 0 {
		v = latest
	}
	if v > latest {
		return uuid.Nil, 0, false, errs.E(errs.NotFound, "workflow version %d not found (latest is %d)", v, latest)
	}
	return id, v, paused, nil
}

// requestHash identifies what an idempotent start asked for.
func requestHash(workflow uuid.UUID, version int, input json.RawMessage, metadata map[string]string) []byte {
	h := sha256.New()
	h.Write(workflow[:])
	fmt.Fprintf(h, "/%d/", version)
	var v any
	if json.Unmarshal(input, &v) == nil {
		canon, _ := json.Marshal(v) // sorted keys: equal inputs hash equal
		h.Write(canon)
	}
	if len(metadata) > 0 {
		// (Only when given, so keys stored before metadata existed still match.)
		h.Write([]byte("/metadata/"))
		h.Write(metadataJSON(metadata)) // sorted keys
	}
	return h.Sum(nil)
}

// runMetadata is a new run's metadata: what the workflow's mapping derives
// from the input, overridden by what the start gave.
func runMetadata(wf *dag.Workflow, input json.RawMessage, given map[string]string) (map[string]string, error) {
	derived, err := wf.EvalMetadata(input)
	if err != nil {
		e := errs.E(errs.Invalid, "the workflow's metadata mapping failed on this input: %s", err.Error())
		e.Fields = []errs.Field{{Field: "metadata", Message: err.Error()}}
		return nil, e
	}
	if len(derived) == 0 {
		return given, nil
	}
	for k, v := range given {
		derived[k] = v
	}
	if err := checkMetadata("metadata", derived, dag.MaxMetadataKeys); err != nil {
		return nil, err
	}
	return derived, nil
}

func traceParent(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	carrier := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, carrier)
	return carrier["traceparent"]
}

// Report is a worker's result for one attempt of a task.
type Report struct {
	RunID   uuid.UUID
	TaskID  uuid.UUID
	NodeID  string
	Attempt int
	// LeaseOwner, when set, must hold the task's lease for the report to
	// apply (the attempt fence applies either way).
	LeaseOwner string
	// LeaseKey is the API key LeaseOwner authenticated with, for a
	// tenant's own worker (see Holder): the report applies only to a lease
	// taken with that key, and is FORBIDDEN for a node tenant workers do
	// not run.
	LeaseKey string
	// Unleased reports on an attempt no worker has leased (a message that
	// was delivered too often without ever being run): it applies only
	// while the task is still pending, never to a running attempt.
	Unleased   bool
	Output     json.RawMessage
	Error      sm.Error
	Retryable  bool
	RetryAfter time.Duration
	// Eager, on a completion, offers the slot the attempt frees to the
	// run's next task.
	Eager *EagerOffer
}

// EagerOffer is a worker's offer, with its result, to run the next task
// of the same run in the slot the result frees (eager dispatch). When the
// transition dispatches a new task the worker can run — on the offered
// queue, of a node type it executes, due now — the task is written
// already leased to the worker, in the completion's transaction, and
// returned as Ack.Next: no lease transaction, outbox row, stream message
// or quota round trip for that step. A lease the worker never learns of
// (the answer was lost) expires and is swept like any other. The worker
// decides whether to offer: it offers only while no other tenant has work
// on it, so the fair scheduler's choice between tenants is kept; the
// tenant's running-task quota is kept by handing the ended attempt's
// permit to the new lease.
type EagerOffer struct {
	Queue     string
	NodeTypes []string
	// Handlers are the task handlers the worker runs: a task node is
	// offered only to a worker that registered its handler.
	Handlers []string
	TTL      time.Duration
}

func (o *EagerOffer) check(h Holder) error {
	if o == nil {
		return nil
	}
	if o.Queue == "" || len(o.NodeTypes) == 0 || len(o.NodeTypes) > 64 || len(o.Handlers) > MaxWorkerHandlers {
		return errs.E(errs.Invalid, "an eager offer names its queue, 1-64 node types and at most %d handlers", MaxWorkerHandlers)
	}
	return checkLease(h, o.TTL, 1)
}

// MaxWorkerHandlers bounds the handlers one worker may serve.
const MaxWorkerHandlers = 200

// accepts reports whether the offer covers node n: its queue, its type
// and, for a task node, its handler.
func (o *EagerOffer) accepts(n *dag.Node) bool {
	if o == nil || n.QueueName() != o.Queue || !slices.Contains(o.NodeTypes, string(n.Type)) {
		return false
	}
	if h := n.HandlerName(); h != "" || n.Type == dag.TypeTask {
		return h != "" && slices.Contains(o.Handlers, h)
	}
	return true
}

// CompleteTask applies a successful result.
func (c *Coordinator) CompleteTask(ctx context.Context, tenant uuid.UUID, r Report) (Ack, error) {
	if len(r.Output) > MaxInputBytes {
		return c.FailTask(ctx, tenant, Report{RunID: r.RunID, TaskID: r.TaskID, NodeID: r.NodeID, Attempt: r.Attempt,
			LeaseOwner: r.LeaseOwner, LeaseKey: r.LeaseKey,
			Error: sm.Error{Code: sm.CodeOutputTooLarge, Message: fmt.Sprintf("output is %d bytes; the limit is %d", len(r.Output), MaxInputBytes)}})
	}
	if len(r.Output) > 0 {
		if msg := jsoncheck.Check(r.Output); msg != "" {
			return Ack{}, errs.E(errs.Invalid, "output %s", msg)
		}
	}
	if err := r.checkHolder(); err != nil {
		return Ack{}, err
	}
	if r.Eager != nil && r.LeaseOwner == "" {
		return Ack{}, errs.E(errs.Invalid, "an eager offer needs the lease owner")
	}
	if r.Eager != nil && r.LeaseKey != "" {
		// A tenant's worker runs task nodes only, whatever it offers.
		o := *r.Eager
		o.NodeTypes = slices.DeleteFunc(slices.Clone(o.NodeTypes), func(t string) bool { return t != tenantWorkerNodeType })
		r.Eager = &o
		if len(o.NodeTypes) == 0 {
			r.Eager = nil
		}
	}
	if err := r.Eager.check(Holder{Worker: r.LeaseOwner, Key: r.LeaseKey}); err != nil {
		return Ack{}, err
	}
	ev := sm.NodeCompleted{NodeID: r.NodeID, TaskID: r.TaskID.String(), Attempt: r.Attempt, Output: r.Output}
	ack, err := c.apply(ctx, tenant, r.RunID, eventRef{node: r.NodeID, task: r.TaskID, attempt: r.Attempt, owner: r.LeaseOwner, key: r.LeaseKey,
		eager: r.Eager},
		func(context.Context, *pg.Tx, *sm.Run) (sm.Event, error) { return ev, nil })
	if err == nil && ack.Ignored && r.Eager != nil {
		// A repeated report (its first answer was lost) gets the eager lease
		// the first one was given, so that task runs now instead of waiting
		// out its lease and losing an attempt it never used.
		if ack.Next, err = c.eagerAgain(ctx, tenant, r); err != nil {
			c.log.Warn("looking up the eager lease of a repeated report failed", zap.Error(err))
			ack.Next, err = nil, nil
		}
	}
	return ack, err
}

// eagerAgain finds the task the applied completion of r's attempt leased
// to r's worker — created in that completion's transaction, so it started
// at the very timestamp the reported task finished — still running on its
// first attempt under a live lease, and extends that lease. (An expired
// one is the sweep's: it may be failing it right now.)
func (c *Coordinator) eagerAgain(ctx context.Context, tenant uuid.UUID, r Report) (*Lease, error) {
	var next *Lease
	err := c.db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		next = nil
		l := Lease{RunID: r.RunID, Attempt: 1, Acquired: true}
		var input, config []byte
		err := tx.QueryRow(ctx, qExtendEagerLease,
			tenant, r.RunID, r.TaskID, r.Attempt, r.LeaseOwner, r.Eager.TTL.Seconds(), r.LeaseKey).Scan(&l.TaskID, &l.NodeID, &l.NodeType, &l.Queue,
			&input, &config, &l.MaxAttempts, &l.ExpiresAt, &l.WorkflowID, &l.WorkflowVersion, &l.TraceParent)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		if l.Queue == "" {
			l.Queue = dag.DefaultQueue
		}
		if tp := traceParent(ctx); tp != "" {
			l.TraceParent = tp // the report's trace, as the first answer had
		}
		l.Input, l.Config = input, config
		next = &l
		return nil
	})
	return next, err
}

// FailTask applies a failed attempt.
func (c *Coordinator) FailTask(ctx context.Context, tenant uuid.UUID, r Report) (Ack, error) {
	if err := r.checkHolder(); err != nil {
		return Ack{}, err
	}
	if r.Error.Code == "" {
		r.Error.Code = "task_failed"
	}
	ev := sm.NodeFailed{NodeID: r.NodeID, TaskID: r.TaskID.String(), Attempt: r.Attempt, Error: r.Error, Retryable: r.Retryable, RetryAfter: r.RetryAfter}
	return c.apply(ctx, tenant, r.RunID, eventRef{node: r.NodeID, task: r.TaskID, attempt: r.Attempt, owner: r.LeaseOwner, key: r.LeaseKey,
		pendingOnly: r.Unleased},
		func(context.Context, *pg.Tx, *sm.Run) (sm.Event, error) { return ev, nil })
}

// checkHolder refuses a key without its worker (the key binds a lease
// holder, it is not one) and an unleased report by a key.
func (r Report) checkHolder() error {
	switch {
	case r.LeaseKey == "":
		return nil
	case r.LeaseOwner == "" || r.Unleased:
		return errs.E(errs.Invalid, "a report with a lease key names the lease owner and its lease")
	case len(r.LeaseKey) > maxKeyID:
		return errs.E(errs.Invalid, "a lease key id is at most %d characters", maxKeyID)
	}
	return nil
}

// ExpiredLease names a running attempt whose lease the sweep found expired.
type ExpiredLease struct {
	RunID   uuid.UUID
	TaskID  uuid.UUID
	NodeID  string
	Attempt int
}

// ExpireLease applies an expired lease as an event: the state machine
// retries the attempt with the node's backoff (and schedule-to-start
// timer) or, on its last attempt, fails the node — through the same path,
// guards, timeline, hooks and live updates as every other change. It is
// fenced by the attempt and applies only while that attempt is running
// with its lease expired: a report or renewal that got in first wins.
func (c *Coordinator) ExpireLease(ctx context.Context, tenant uuid.UUID, l ExpiredLease) (Ack, error) {
	ev := sm.LeaseExpired{NodeID: l.NodeID, TaskID: l.TaskID.String(), Attempt: l.Attempt}
	return c.apply(ctx, tenant, l.RunID, eventRef{node: l.NodeID, task: l.TaskID, attempt: l.Attempt, expiredOnly: true},
		func(context.Context, *pg.Tx, *sm.Run) (sm.Event, error) { return ev, nil })
}

// CancelRun cancels a run: pending tasks are cancelled, running ones lose
// their lease at the next renewal, finished outputs are kept.
func (c *Coordinator) CancelRun(ctx context.Context, tenant, runID uuid.UUID, reason string) (Ack, error) {
	if len(reason) > 1000 {
		reason = reason[:1000]
	}
	return c.apply(ctx, tenant, runID, eventRef{}, func(ctx context.Context, tx *pg.Tx, run *sm.Run) (sm.Event, error) {
		// A queued run (its workflow paused) has no tasks: it is made
		// running in this transaction so the machine cancels it as any run.
		if err := unqueue(ctx, tx, run); err != nil {
			return nil, err
		}
		return sm.CancelRequested{Reason: reason}, nil
	})
}

// Signal is a named message to a run. ID makes delivery idempotent: a
// signal whose id the run already has is acknowledged and ignored.
type Signal struct {
	ID      string
	Name    string
	Payload json.RawMessage
}

// SignalRun delivers a signal (or an approval decision) to a run, sent by
// the context's actor (WithActor): an approval wait of the signal's name
// records it as its approver, and a sender its policy refuses is
// FORBIDDEN, with nothing written.
func (c *Coordinator) SignalRun(ctx context.Context, tenant, runID uuid.UUID, s Signal) (Ack, error) {
	if s.ID == "" {
		s.ID = uuid.Must(uuid.NewV7()).String()
	}
	if len(s.ID) > 255 || s.Name == "" || len(s.Name) > 128 {
		return Ack{}, errs.E(errs.Invalid, "a signal needs a name (at most 128 characters) and an id of at most 255")
	}
	payload, err := normalizeInput(s.Payload)
	if err != nil {
		return Ack{}, errs.E(errs.Invalid, "signal payload must be a JSON object")
	}
	if len(payload) > MaxSignalBytes {
		return Ack{}, errs.E(errs.Invalid, "a signal payload may be at most %d bytes", MaxSignalBytes)
	}
	by := actorOf(ctx)
	return c.apply(ctx, tenant, runID, eventRef{}, func(ctx context.Context, tx *pg.Tx, run *sm.Run) (sm.Event, error) {
		var dup bool
		var stored, version int
		var wid uuid.UUID
		if err := tx.QueryRow(ctx, qSignalSeen,
			tx.Tenant, runID, s.ID).Scan(&dup, &stored, &wid, &version); err != nil {
			return nil, fmt.Errorf("check signal: %w", err)
		}
		// An approval's policy is kept before anything else, whatever the
		// run's state: a refused sender changes nothing.
		def, err := c.defs.load(ctx, tx, wid, version)
		if err != nil {
			return nil, err
		}
		if why := def.wf.ApprovalRefusal(s.Name, by, run.StartedBy); why != "" {
			return nil, errs.E(errs.Forbidden, "%s", why)
		}
		if dup {
			return nil, ignored("signal %s was already delivered", s.ID)
		}
		l, err := tenants.EffectiveLimits(ctx, tx)
		if err != nil {
			return nil, err
		}
		if l.MaxSignalsPerRun > 0 && stored >= l.MaxSignalsPerRun {
			return nil, errs.E(errs.QuotaExceeded, "a run may hold at most %d signals on this plan", l.MaxSignalsPerRun)
		}
		if run.Status == RunQueued {
			return nil, keepSignal(ctx, tx, run, s.ID, s.Name, payload, by)
		}
		return sm.SignalReceived{Signal: sm.Signal{ID: s.ID, Name: s.Name, Payload: payload, By: by}}, nil
	})
}

// RerunRun re-runs a failed or cancelled run from the nodes that did not
// finish; finished nodes keep their outputs.
func (c *Coordinator) RerunRun(ctx context.Context, tenant, runID uuid.UUID) (Ack, error) {
	return c.apply(ctx, tenant, runID, eventRef{}, func(ctx context.Context, tx *pg.Tx, run *sm.Run) (sm.Event, error) {
		// A rerun takes a slot of its concurrency key, if it has one, and
		// does not queue: a key without room refuses it.
		if run.Status == sm.RunFailed || run.Status == sm.RunCancelled {
			if err := c.rerunKeyHasRoom(ctx, tx, runID); err != nil {
				return nil, err
			}
		}
		// A rerun creates work as a start does: the same admission (queued
		// limit, caps) in its transaction, before anything is written.
		if c.opts.Admit != nil {
			if err := c.opts.Admit(ctx, tx); err != nil {
				return nil, err
			}
		}
		return sm.RerunRequested{}, nil
	})
}

// FireTimer fires a due timer. The timer row is deleted in the same
// transaction whether or not the state machine still cares, so a moot
// timer fires once and is gone; a timer already fired is ignored.
func (c *Coordinator) FireTimer(ctx context.Context, tenant, runID uuid.UUID, timerID int64) (Ack, error) {
	return c.apply(ctx, tenant, runID, eventRef{commitIgnored: true}, func(ctx context.Context, tx *pg.Tx, run *sm.Run) (sm.Event, error) {
		var kind, node string
		var task *uuid.UUID
		var attempt *int
		var detail []byte
		err := tx.QueryRow(ctx, qTakeTimer, tx.Tenant, timerID, runID).Scan(&kind, &node, &task, &attempt, &detail)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, ignored("timer %d already fired", timerID)
		}
		if err != nil {
			return nil, fmt.Errorf("take timer: %w", err)
		}
		switch kind {
		case timerParentCancelled, timerCancel:
			// A queued child (its workflow paused, or its key full) is
			// cancelled as CancelRun cancels one: made running first.
			if err := unqueue(ctx, tx, run); err != nil {
				return nil, err
			}
			if kind == timerCancel {
				return cancelEvent(detail), nil
			}
			return childEvent(ctx, tx, tx.Tenant, runID, kind, node, task, detail)
		case timerChildFinished:
			return childEvent(ctx, tx, tx.Tenant, runID, kind, node, task, detail)
		}
		ev := sm.TimerFired{Kind: sm.TimerKind(kind), NodeID: node}
		if task != nil {
			ev.TaskID = task.String()
		}
		if attempt != nil {
			ev.Attempt = *attempt
		}
		return ev, nil
	})
}

// gateKey carries a caller's check for the transaction of its event.
type gateKey struct{}

// WithGate makes the coordinator run check first in the transaction of
// the event (or start) made with ctx: an API's authorization is then
// decided in the same transaction as the change it allows, and a refusal
// writes nothing.
func WithGate(ctx context.Context, check func(context.Context, *pg.Tx) error) context.Context {
	return context.WithValue(ctx, gateKey{}, check)
}

func gate(ctx context.Context, tx *pg.Tx) error {
	if check, _ := ctx.Value(gateKey{}).(func(context.Context, *pg.Tx) error); check != nil {
		return check(ctx, tx)
	}
	return nil
}

// readBackKey carries where a caller wants the run as its event's
// transaction leaves it.
type readBackKey struct{}

// WithReadBack asks the coordinator to read the run an event changes (or
// a start creates) into v inside the event's own transaction, so an API
// answer is what was committed: no later read can fail for a change that
// was made. v means something only when the call succeeds, and is left
// empty (zero ID) when nothing was committed (an ignored event: the
// caller reads the run as it is) or in the rare case the read failed.
func WithReadBack(ctx context.Context, v *RunView) context.Context {
	return context.WithValue(ctx, readBackKey{}, v)
}

func readBackOf(ctx context.Context) *RunView {
	v, _ := ctx.Value(readBackKey{}).(*RunView)
	return v
}

// readBack reads the run into the caller's read-back target, in a
// transaction still open (one the persister commits reads it in its
// commit's batch instead).
func readBack(ctx context.Context, tx *pg.Tx, runID uuid.UUID) error {
	v := readBackOf(ctx)
	if v == nil {
		return nil
	}
	got, err := GetRun(ctx, tx, runID)
	if err != nil {
		return fmt.Errorf("read the run back: %w", err)
	}
	*v = got
	return nil
}

// ignoredError ends an event's transaction without applying it.
type ignoredError struct{ reason string }

func (e ignoredError) Error() string { return "ignored: " + e.reason }

func ignored(format string, args ...any) error { return ignoredError{fmt.Sprintf(format, args...)} }

// eventRef identifies what an event is about, for the timeline and the SQL
// guards.
type eventRef struct {
	node    string
	task    uuid.UUID
	attempt int
	owner   string
	// key is the API key owner reported with (a tenant's worker): its
	// lease must have been taken with it, and be of a task node.
	key string
	// pendingOnly restricts the report to a task no worker has leased.
	pendingOnly bool
	// expiredOnly restricts the event to a running task whose lease has
	// expired.
	expiredOnly bool
	// commitIgnored commits the transaction even when the event is ignored
	// (a fired timer must be consumed either way).
	commitIgnored bool
	// eager is the reporting worker's offer to run the next task.
	eager *EagerOffer
}

// mayReport refuses a tenant worker's report (one with a key) on a node
// tenant workers do not run — an http step, a wait, a map — before
// anything is written. (The guards fence the same in SQL, on the task
// row's type; a node the workflow lacks is left to the state machine,
// which ignores it.)
func (ref eventRef) mayReport(wf *dag.Workflow) error {
	if ref.key == "" {
		return nil
	}
	if n := wf.Node(ref.node); n != nil && n.Type != dag.TypeTask {
		return errs.E(errs.Forbidden, "node %s is a %s step, which the platform runs; a tenant's worker reports only the task steps it leased",
			ref.node, n.Type)
	}
	return nil
}

// apply is the one path every event of an existing run takes: lock the
// run, load it, decide, persist, commit.
func (c *Coordinator) apply(ctx context.Context, tenant, runID uuid.UUID, ref eventRef,
	prepare func(context.Context, *pg.Tx, *sm.Run) (sm.Event, error)) (Ack, error) {
	var ack Ack
	err := c.db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		ack = Ack{}
		if err := gate(ctx, tx); err != nil {
			return err
		}
		var err error
		ack, err = c.applyIn(ctx, tx, runID, ref, prepare, false)
		return err
	})
	var ig ignoredError
	if errors.As(err, &ig) {
		return ack, nil
	}
	return ack, err
}

// applyIn is apply's work inside tx. An ignored event returns an
// ignoredError (with the Ack saying why) unless ref.commitIgnored. It
// commits tx with the transition's batch unless open is set (an event's
// publish delivers to several runs in its one transaction).
func (c *Coordinator) applyIn(ctx context.Context, tx *pg.Tx, runID uuid.UUID, ref eventRef,
	prepare func(context.Context, *pg.Tx, *sm.Run) (sm.Event, error), open bool) (Ack, error) {
	pausable := ""
	if ref.eager != nil {
		pausable = ref.eager.Queue
	}
	row, run, err := loadRun(ctx, tx, runID, pausable)
	if err != nil {
		return Ack{}, err
	}
	if row.queuePaused {
		ref.eager = nil // a paused queue's task waits in the outbox (pause.go)
	}
	def, err := c.defs.load(ctx, tx, row.workflowID, row.version)
	if err != nil {
		return Ack{}, err
	}
	if err := ref.mayReport(def.wf); err != nil {
		return Ack{}, err
	}
	if def.wf.HasWaits() {
		if run.Signals, err = loadSignals(ctx, tx, runID); err != nil {
			return Ack{}, err
		}
	}
	ev, err := prepare(ctx, tx, run)
	if errors.Is(err, errKept) {
		return Ack{Status: run.Status}, nil // prepare wrote the event itself (pause.go)
	}
	var ig ignoredError
	if errors.As(err, &ig) {
		ack := Ack{Ignored: true, Reason: ig.reason, Status: run.Status}
		if ref.commitIgnored {
			return ack, nil
		}
		return ack, err
	}
	if err != nil {
		return Ack{}, err
	}
	tr := sm.Decide(def.wf, run, ev, row.now)
	if tr.Ignored {
		ack := Ack{Ignored: true, Reason: tr.Reason, Status: tr.Status}
		if ref.commitIgnored {
			return ack, nil
		}
		return ack, ignoredError{tr.Reason}
	}
	p := &persister{c: c, tx: tx, def: def, runID: runID, now: row.now, tasks: map[string]taskRef{}, traceparent: traceParent(ctx),
		workflowID: row.workflowID, version: row.version, started: row.started, readBack: readBackOf(ctx), open: open,
		parent: row.parent, depth: row.depth, concurrencyKey: row.concurrencyKey, priority: run.Priority}
	for id, t := range run.Tasks {
		p.tasks[id] = taskRef{id: uuid.MustParse(t.ID), attempt: t.Attempt}
	}
	if err := p.persist(ctx, ev, tr, ref); err != nil {
		if errors.As(err, &ig) {
			return Ack{Ignored: true, Reason: ig.reason, Status: run.Status}, err
		}
		return Ack{}, err
	}
	c.afterCommit(ctx, tx, runID, ev, tr, p, ref)
	return Ack{Status: tr.Status, Next: p.next}, nil
}

type runRow struct {
	workflowID uuid.UUID
	version    int
	now        time.Time
	parent     *parentLink
	depth      int
	// concurrencyKey is the run's key ("" without one).
	concurrencyKey string
	// started is when each running task's lease was granted, by node.
	started map[string]time.Time
	// queuePaused reports that the queue loadRun was asked about is paused.
	queuePaused bool
}

// loadRun locks the run row and reads its tasks in one round trip (with the
// transaction's BEGIN and tenant setting).
// The lock is an UPDATE (FOR NO KEY UPDATE), which serialises events of one
// run without blocking the foreign-key checks of task and event inserts.
// With queue set it also reads, in the same round trip, whether that queue
// is paused (an eager offer's).
func loadRun(ctx context.Context, tx *pg.Tx, runID uuid.UUID, queue string) (runRow, *sm.Run, error) {
	b := &pgx.Batch{}
	var row runRow
	var status string
	var input []byte
	var parentRun, parentTask *uuid.UUID
	var parentNode *string
	var startedBy string
	run := &sm.Run{ID: runID.String(), Tasks: map[string]*sm.Task{}}
	b.Queue(qLockRun, tx.Tenant, runID).
		QueryRow(func(r pgx.Row) error {
			var ckey *string
			err := r.Scan(&row.workflowID, &row.version, &status, &input, &row.now, &parentRun, &parentTask, &parentNode, &row.depth, &ckey,
				&run.Priority, &startedBy)
			if ckey != nil {
				row.concurrencyKey = *ckey
			}
			if err == nil && parentRun != nil && parentTask != nil && parentNode != nil {
				row.parent = &parentLink{run: *parentRun, task: *parentTask, node: *parentNode, depth: row.depth}
			}
			return err
		})
	if queue != "" {
		b.Queue(qQueuePaused, tx.Tenant, queue).QueryRow(func(r pgx.Row) error { return r.Scan(&row.queuePaused) })
	}
	row.started = map[string]time.Time{}
	b.Queue(qRunTasks, tx.Tenant, runID).
		Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var id uuid.UUID
				var t sm.Task
				var state string
				var out, lastErr []byte
				var started *time.Time
				if err := rows.Scan(&id, &t.NodeID, &state, &t.Attempt, &out, &lastErr, &started); err != nil {
					return err
				}
				if started != nil && state == "running" {
					row.started[t.NodeID] = *started
				}
				t.ID, t.State, t.Output = id.String(), sm.TaskState(state), out
				if lastErr != nil {
					t.Error = &sm.Error{}
					_ = json.Unmarshal(lastErr, t.Error)
				}
				run.Tasks[t.NodeID] = &t
			}
			return rows.Err()
		})
	err := tx.SendBatch(ctx, b).Close()
	if errors.Is(err, pgx.ErrNoRows) {
		return runRow{}, nil, errs.E(errs.NotFound, "run %s not found", runID)
	}
	if err != nil {
		return runRow{}, nil, fmt.Errorf("load run %s: %w", runID, err)
	}
	run.Status, run.Input, run.StartedBy = sm.RunStatus(status), input, dag.ParsePrincipal(startedBy)
	return row, run, nil
}

// loadSignals reads the run's signals no wait node has consumed yet.
func loadSignals(ctx context.Context, tx *pg.Tx, runID uuid.UUID) ([]sm.Signal, error) {
	rows, err := tx.Query(ctx, qUnconsumedSignals, tx.Tenant, runID)
	if err != nil {
		return nil, fmt.Errorf("load signals: %w", err)
	}
	var out []sm.Signal
	var s sm.Signal
	var p []byte
	var by string
	_, err = pgx.ForEachRow(rows, []any{&s.ID, &s.Name, &p, &by}, func() error {
		s.Payload = append(json.RawMessage(nil), p...)
		s.By = dag.ParsePrincipal(by)
		out = append(out, s)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("load signals: %w", err)
	}
	return out, nil
}

// afterCommit registers what happens once the transition is durable.
func (c *Coordinator) afterCommit(ctx context.Context, tx *pg.Tx, runID uuid.UUID, ev sm.Event, tr sm.Transition, p *persister, ref eventRef) {
	tenant := tx.Tenant
	dispatched, fresh, next := p.dispatched, p.fresh, p.next
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetName("transition " + sm.Kind(ev))
		span.SetAttributes(attribute.String("composer.run_id", runID.String()), attribute.String("composer.event", sm.Kind(ev)))
	}
	tx.AfterCommit(func() {
		var took time.Duration // first statement to commit
		if b := tx.Began(); !b.IsZero() {
			took = time.Since(b)
		}
		switch {
		case ref.owner == "" || ref.task == uuid.Nil || c.opts.Slots == nil:
		case next != nil:
			// The ended attempt's permit becomes the eager lease's, before
			// the worker hears of that lease (so before it can end). Lost,
			// the old permit lapses with its lease TTL and the new one is
			// added back by the lease's first renewal.
			from, to := tenants.SlotMember(ref.task, ref.attempt, ref.owner), tenants.SlotMember(next.TaskID, next.Attempt, ref.owner)
			tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			if err := c.opts.Slots.Transfer(tctx, tenant, ref.eager.TTL, from, to); err != nil {
				c.log.Warn("handing a quota permit to an eager lease failed", zap.Error(err))
			}
			cancel()
		default:
			// A worker's result ended its lease: its quota permit goes back.
			// (Lost, it lapses with the lease TTL.)
			c.opts.Slots.ReleaseLater(tenant, tenants.SlotMember(ref.task, ref.attempt, ref.owner))
		}
		if next != nil {
			eagerDispatches.Add(context.WithoutCancel(ctx), 1)
		}
		if len(fresh) > 0 {
			c.opts.PublishNow(context.WithoutCancel(ctx), fresh)
		}
		terminal, timers, nretries := false, false, 0
		for _, a := range tr.Actions {
			switch a.(type) {
			case sm.CompleteRun, sm.FailRun, sm.CancelRun:
				terminal = true
			case sm.ScheduleTimer:
				timers = true
			case sm.RetryTask:
				nretries++
			}
		}
		if dispatched && c.opts.Wake != nil {
			c.opts.Wake()
		}
		if (timers || p.wakeTimers) && c.opts.WakeTimers != nil {
			c.opts.WakeTimers()
		}
		_, expired := ev.(sm.LeaseExpired)
		countTransition(context.WithoutCancel(ctx), sm.Kind(ev), string(tr.Status), terminal, took, nretries, expired)
		if terminal {
			c.log.Info("run finished", zap.Stringer("tenant_id", tenant), zap.Stringer("run_id", runID), zap.String("status", string(tr.Status)))
		} else if ce := c.log.Check(zap.DebugLevel, "transition"); ce != nil {
			ce.Write(zap.Stringer("tenant_id", tenant), zap.Stringer("run_id", runID), zap.String("event", sm.Kind(ev)), zap.Int("actions", len(tr.Actions)))
		}
		if c.opts.OnTransition != nil {
			c.opts.OnTransition(Transition{Tenant: tenant, RunID: runID, Event: sm.Kind(ev), Node: eventNode(ev, ref), Status: tr.Status, Terminal: terminal})
		}
	})
}

// RerunAsNew starts a new run of the same workflow version with the same
// input as runID; the new run records what it repeats.
func (c *Coordinator) RerunAsNew(ctx context.Context, tenant, runID uuid.UUID) (Started, error) {
	var old RunView
	err := c.db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		if err := gate(ctx, tx); err != nil {
			return err
		}
		var err error
		old, err = GetRun(ctx, tx, runID)
		return err
	})
	if err != nil {
		return Started{}, err
	}
	return c.StartRun(ctx, tenant, StartRun{WorkflowID: old.WorkflowID, Version: old.WorkflowVersion, Input: old.Input, RerunOf: runID,
		Metadata: old.Metadata, Priority: old.Priority})
}
