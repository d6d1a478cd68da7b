package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/composer-dev/composer/audit"
	"github.com/composer-dev/composer/engine/dag"
	sm "github.com/composer-dev/composer/engine/statemachine"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/jsoncheck"
	"github.com/composer-dev/composer/internal/pg"
)

// MaxEventPayloadBytes bounds a published event's payload.
const MaxEventPayloadBytes = 256 << 10

// MaxEventIDChars bounds the publisher's event id.
const MaxEventIDChars = 255

// PublishEvent asks to publish an event.
type PublishEvent struct {
	// ID is the publisher's id for the event, its dedupe key within the
	// tenant: publishing it again answers the event already recorded.
	ID   string
	Name string
	// Payload is a JSON object (empty means {}).
	Payload json.RawMessage
}

// Event outcomes for one matching workflow.
const (
	EventRunStarted   = "started"
	EventRunRefused   = "refused"
	EventRunResumed   = "resumed"   // an event wait of the run matched it
	EventRunCancelled = "cancelled" // a cancel_on entry of the run matched it
)

// MaxEventDeliveries bounds the running runs one event resumes or cancels
// (the oldest first); MaxEventKeyExprs the distinct keyed matches of waits
// for one event name a publish evaluates.
const (
	MaxEventDeliveries = 1000
	MaxEventKeyExprs   = 100
)

// EventRun is what an event did: to one workflow a trigger of which
// matched it, the run it started or why the start was refused; to a
// running run, that it resumed an event wait or cancelled it.
type EventRun struct {
	WorkflowID   uuid.UUID
	RunID        uuid.UUID // uuid.Nil when refused
	Outcome      string
	ErrorCode    string
	ErrorMessage string
}

// Event is a recorded event with what it did.
type Event struct {
	// Key is Composer's id for the event; ID is the publisher's.
	Key        uuid.UUID
	ID         string
	Name       string
	Payload    json.RawMessage
	ReceivedAt time.Time
	Runs       []EventRun
}

// Published is PublishEvent's answer.
type Published struct {
	Event
	// Created is false when the id named an event already recorded (whose
	// runs are the ones it started then; nothing was started again).
	Created bool
}

// PublishEvent records an event, resumes the event waits and applies the
// cancel_on entries of running runs it matches, and starts every workflow
// of the tenant a trigger of which matches it, all in one transaction:
// either the event is recorded with everything it did, or nothing is.
//
// Each start is the coordinator's own (startIn) with admission, under an
// idempotency key derived from the event and the workflow, inside a
// savepoint: a start that admission (or the workflow's own validation of
// the input, or a failing trigger condition) refuses is rolled back alone
// and recorded as refused with its error code and message, and the others
// commit. Any other error fails the whole publish.
//
// A repeat of an id answers the event recorded first, with its runs, and
// starts nothing; the same id with another name or payload is a Conflict.
// Concurrent publishes of one id wait on the id's unique key, so one of
// them records the event and the others read it.
func (c *Coordinator) PublishEvent(ctx context.Context, tenant uuid.UUID, req PublishEvent) (Published, error) {
	payload, hash, err := checkEvent(req)
	if err != nil {
		return Published{}, err
	}
	var out Published
	err = c.db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		out = Published{}
		if err := gate(ctx, tx); err != nil {
			return err
		}
		key := uuid.Must(uuid.NewV7())
		var received time.Time
		err := tx.QueryRow(ctx, qInsertEventRow, tenant, key, req.ID, req.Name, payload, hash).Scan(&received)
		if errors.Is(err, pgx.ErrNoRows) {
			ev, have, err := eventByID(ctx, tx, req.ID)
			if err != nil {
				return err
			}
			if string(have) != string(hash) {
				return errs.E(errs.Conflict, "event id %q was already published with another name or payload", req.ID)
			}
			out = Published{Event: ev}
			audit.Skip(ctx) // a repeat changes nothing
			return nil
		}
		if err != nil {
			return fmt.Errorf("insert event: %w", err)
		}
		out = Published{Event: Event{Key: key, ID: req.ID, Name: req.Name, Payload: payload, ReceivedAt: received}, Created: true}
		// Waiting runs first: a run this event starts does not see it.
		delivered, err := c.deliverEvent(ctx, tx, dag.EventData{ID: req.ID, Name: req.Name, Payload: payload})
		if err != nil {
			return err
		}
		runs, err := c.fireTriggers(ctx, tx, req, payload)
		if err != nil {
			return err
		}
		if len(delivered) == 0 {
			// The audit log records events that change runs (resume or
			// cancel them); starting runs is not audited (see graph/audit.go).
			audit.Skip(ctx)
		}
		runs = append(runs, delivered...)
		for _, r := range runs {
			var run *uuid.UUID
			if r.RunID != uuid.Nil {
				run = &r.RunID
			}
			if _, err := tx.Exec(ctx, qInsertEventRun, tenant, key, r.WorkflowID, run, r.Outcome,
				nullIfEmpty(r.ErrorCode), nullIfEmpty(truncate(r.ErrorMessage, 1000))); err != nil {
				return fmt.Errorf("insert event run: %w", err)
			}
		}
		out.Runs = runs
		return nil
	})
	if err != nil {
		return Published{}, err
	}
	return out, nil
}

func checkEvent(req PublishEvent) (json.RawMessage, []byte, error) {
	if req.ID == "" {
		return nil, nil, fieldError("id", "is required")
	}
	if len(req.ID) > MaxEventIDChars {
		return nil, nil, fieldError("id", fmt.Sprintf("is longer than %d characters", MaxEventIDChars))
	}
	if msg := dag.ValidEventName(req.Name); msg != "" {
		return nil, nil, fieldError("name", msg)
	}
	payload := req.Payload
	if len(payload) == 0 || string(payload) == "null" {
		payload = json.RawMessage(`{}`)
	}
	if len(payload) > MaxEventPayloadBytes {
		return nil, nil, fieldError("payload", fmt.Sprintf("is %d bytes; the limit is %d", len(payload), MaxEventPayloadBytes))
	}
	var obj map[string]any
	if err := json.Unmarshal(payload, &obj); err != nil {
		return nil, nil, fieldError("payload", "must be a JSON object")
	}
	if msg := jsoncheck.Check(payload); msg != "" {
		return nil, nil, fieldError("payload", msg)
	}
	canon, _ := json.Marshal(obj) // sorted keys: equal payloads hash equal
	h := sha256.New()
	h.Write([]byte(req.Name))
	h.Write([]byte{0})
	h.Write(canon)
	return payload, h.Sum(nil), nil
}

func fieldError(field, msg string) error {
	e := errs.E(errs.Invalid, "event %s %s", field, msg)
	e.Fields = []errs.Field{{Field: field, Message: msg}}
	return e
}

// EventRunKey is the idempotency key of the run an event starts of a
// workflow.
func EventRunKey(eventID string, workflow uuid.UUID) string {
	h := sha256.Sum256([]byte(eventID))
	return "event:" + hex.EncodeToString(h[:]) + ":" + workflow.String()
}

type triggerRow struct {
	workflow uuid.UUID
	version  int
	position int
}

// fireTriggers starts every workflow whose latest version has a trigger
// matching the event, each in a savepoint of tx, in workflow id order.
func (c *Coordinator) fireTriggers(ctx context.Context, tx *pg.Tx, req PublishEvent, payload json.RawMessage) ([]EventRun, error) {
	rows, err := tx.Query(ctx, qMatchingTriggers, tx.Tenant, req.Name, len(splitDots(req.Name)))
	if err != nil {
		return nil, fmt.Errorf("read triggers: %w", err)
	}
	var cands []triggerRow
	var t triggerRow
	if _, err := pgx.ForEachRow(rows, []any{&t.workflow, &t.version, &t.position}, func() error {
		cands = append(cands, t)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read triggers: %w", err)
	}
	input, err := json.Marshal(map[string]any{"event": map[string]any{"id": req.ID, "name": req.Name, "payload": payload}})
	if err != nil {
		return nil, err
	}
	var out []EventRun
	for i := 0; i < len(cands); {
		wid, version := cands[i].workflow, cands[i].version
		var positions []int
		for ; i < len(cands) && cands[i].workflow == wid; i++ {
			positions = append(positions, cands[i].position)
		}
		def, err := c.defs.load(ctx, tx, wid, version)
		if err != nil {
			return nil, err
		}
		matched, condErr, priority := false, error(nil), 0
		for _, p := range positions {
			if p >= len(def.wf.Triggers) {
				continue
			}
			tr := def.wf.Triggers[p]
			if !tr.MatchesName(req.Name) {
				continue
			}
			ok, err := tr.Matches(req.ID, req.Name, payload)
			if err != nil {
				condErr = fmt.Errorf("triggers[%d].if: %w", p, err)
				continue
			}
			if ok {
				matched, priority = true, tr.Priority
				break
			}
		}
		if !matched {
			if condErr != nil {
				out = append(out, EventRun{WorkflowID: wid, Outcome: EventRunRefused, ErrorCode: string(errs.Invalid),
					ErrorMessage: "the trigger's condition failed on this event: " + condErr.Error()})
			}
			continue
		}
		r, err := c.startForEvent(ctx, tx, StartRun{WorkflowID: wid, Version: version, Input: input,
			IdempotencyKey: EventRunKey(req.ID, wid), Priority: priority}, input)
		if err != nil {
			return nil, err
		}
		r.WorkflowID = wid
		out = append(out, r)
	}
	return out, nil
}

type eventWaiter struct {
	run, workflow uuid.UUID
}

// deliverEvent applies the event to every running run registered in the
// index of waits as waiting for it (the oldest MaxEventDeliveries): the
// distinct key expressions of waits on its name are evaluated over it
// once each and the waits holding the values they give are read, with
// the unkeyed waits on the name. Each delivery is the run's own
// transition (its lock, the state machine deciding whether the match
// holds) in a savepoint of tx; runs are taken in id order, so concurrent
// publishes lock them in one order.
func (c *Coordinator) deliverEvent(ctx context.Context, tx *pg.Tx, ev dag.EventData) ([]EventRun, error) {
	rows, err := tx.Query(ctx, qEventWaitKeyExprs, tx.Tenant, ev.Name, MaxEventKeyExprs)
	if err != nil {
		return nil, fmt.Errorf("read event waits: %w", err)
	}
	exprs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read event waits: %w", err)
	}
	if len(exprs) == 0 {
		return nil, nil
	}
	var keyExprs, keys []string
	for _, e := range exprs {
		if e == "" {
			continue
		}
		if k, err := dag.EventKeyValue(e, ev); err == nil {
			keyExprs, keys = append(keyExprs, e), append(keys, k)
		}
	}
	rows, err = tx.Query(ctx, qEventWaiters, tx.Tenant, ev.Name, keyExprs, keys, MaxEventDeliveries)
	if err != nil {
		return nil, fmt.Errorf("read event waits: %w", err)
	}
	var waiters []eventWaiter
	var w eventWaiter
	if _, err := pgx.ForEachRow(rows, []any{&w.run, &w.workflow}, func() error {
		waiters = append(waiters, w)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read event waits: %w", err)
	}
	var out []EventRun
	for _, w := range waiters {
		r, ok, err := c.deliverTo(ctx, tx, w.run, ev)
		if err != nil {
			return nil, err
		}
		if ok {
			r.WorkflowID = w.workflow
			out = append(out, r)
		}
	}
	return out, nil
}

// deliverTo applies the event to one run in a savepoint; ok is false when
// the run ignored it (nothing of it matched).
func (c *Coordinator) deliverTo(ctx context.Context, tx *pg.Tx, run uuid.UUID, ev dag.EventData) (EventRun, bool, error) {
	if _, err := tx.Exec(ctx, "SAVEPOINT event_delivery"); err != nil {
		return EventRun{}, false, fmt.Errorf("savepoint: %w", err)
	}
	ack, err := c.applyIn(ctx, tx, run, eventRef{}, func(context.Context, *pg.Tx, *sm.Run) (sm.Event, error) {
		return sm.EventReceived{Event: ev}, nil
	}, true)
	if err != nil {
		if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT event_delivery"); rerr != nil {
			return EventRun{}, false, fmt.Errorf("rollback to savepoint: %w", rerr)
		}
		var ig ignoredError
		if errors.As(err, &ig) || errs.KindOf(err) == errs.NotFound {
			return EventRun{}, false, nil
		}
		return EventRun{}, false, err
	}
	if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT event_delivery"); err != nil {
		return EventRun{}, false, fmt.Errorf("release savepoint: %w", err)
	}
	outcome := EventRunResumed
	if ack.Status == sm.RunCancelled {
		outcome = EventRunCancelled
	}
	return EventRun{RunID: run, Outcome: outcome}, true, nil
}

// startForEvent runs one start in a savepoint: a refusal (an error of a
// kind the caller is told) rolls back only that start.
func (c *Coordinator) startForEvent(ctx context.Context, tx *pg.Tx, req StartRun, input json.RawMessage) (EventRun, error) {
	if _, err := tx.Exec(ctx, "SAVEPOINT event_start"); err != nil {
		return EventRun{}, fmt.Errorf("savepoint: %w", err)
	}
	s, err := c.startIn(ctx, tx, req, input, true)
	if err == nil {
		if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT event_start"); err != nil {
			return EventRun{}, fmt.Errorf("release savepoint: %w", err)
		}
		return EventRun{RunID: s.RunID, Outcome: EventRunStarted}, nil
	}
	kind := errs.KindOf(err)
	if kind == errs.Internal || kind == errs.Unavailable {
		return EventRun{}, err // (deadlocks and serialization failures retry the whole publish)
	}
	if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT event_start"); rerr != nil {
		return EventRun{}, fmt.Errorf("rollback to savepoint: %w", rerr)
	}
	return EventRun{Outcome: EventRunRefused, ErrorCode: string(kind), ErrorMessage: errs.PublicMessage(err)}, nil
}

// writeTriggers replaces the workflow's trigger rows with those of its
// version just created (the latest).
func writeTriggers(ctx context.Context, tx *pg.Tx, workflow uuid.UUID, version int, wf *dag.Workflow) error {
	if _, err := tx.Exec(ctx, qDeleteTriggers, tx.Tenant, workflow); err != nil {
		return fmt.Errorf("delete triggers: %w", err)
	}
	for i, t := range wf.Triggers {
		if _, err := tx.Exec(ctx, qInsertTrigger, tx.Tenant, workflow, i, version, t.Event, t.Wildcard(), t.Segments(), t.Prefix()); err != nil {
			return fmt.Errorf("insert trigger: %w", err)
		}
	}
	return nil
}

// EventByKey reads an event by Composer's id, with its runs; NotFound when
// tx's tenant has no such event.
func EventByKey(ctx context.Context, tx *pg.Tx, key uuid.UUID) (Event, error) {
	ev, err := scanEvent(tx.QueryRow(ctx, qEventByKey, tx.Tenant, key))
	if err != nil {
		return Event{}, err
	}
	ev.Runs, err = eventRuns(ctx, tx, ev.Key)
	return ev, err
}

func eventByID(ctx context.Context, tx *pg.Tx, id string) (Event, []byte, error) {
	var ev Event
	var hash []byte
	err := tx.QueryRow(ctx, qEventByID, tx.Tenant, id).Scan(&ev.Key, &ev.ID, &ev.Name, &ev.Payload, &ev.ReceivedAt, &hash)
	if errors.Is(err, pgx.ErrNoRows) {
		// (The key was taken by a publish that has since been removed.)
		return Event{}, nil, errs.E(errs.Conflict, "event id %q is taken", id)
	}
	if err != nil {
		return Event{}, nil, fmt.Errorf("read event: %w", err)
	}
	ev.Runs, err = eventRuns(ctx, tx, ev.Key)
	return ev, hash, err
}

func scanEvent(row pgx.Row) (Event, error) {
	var ev Event
	err := row.Scan(&ev.Key, &ev.ID, &ev.Name, &ev.Payload, &ev.ReceivedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Event{}, errs.E(errs.NotFound, "event not found")
	}
	if err != nil {
		return Event{}, fmt.Errorf("read event: %w", err)
	}
	return ev, nil
}

func eventRuns(ctx context.Context, tx *pg.Tx, key uuid.UUID) ([]EventRun, error) {
	rows, err := tx.Query(ctx, qEventRuns, tx.Tenant, key)
	if err != nil {
		return nil, fmt.Errorf("read event runs: %w", err)
	}
	var out []EventRun
	var r EventRun
	var run *uuid.UUID
	var code, msg *string
	_, err = pgx.ForEachRow(rows, []any{&r.WorkflowID, &run, &r.Outcome, &code, &msg}, func() error {
		e := r
		if run != nil {
			e.RunID = *run
		}
		if code != nil {
			e.ErrorCode = *code
		}
		if msg != nil {
			e.ErrorMessage = *msg
		}
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read event runs: %w", err)
	}
	return out, nil
}

// MaxEventsPage bounds one page of ListEvents.
const MaxEventsPage = 100

// ListEvents lists tx's tenant's events newest first, after the event
// whose key is after (uuid.Nil: from the newest), optionally only those
// named name, each with its runs. It returns up to limit+1 events so the
// caller can tell whether there is a next page.
func ListEvents(ctx context.Context, tx *pg.Tx, name string, after uuid.UUID, limit int) ([]Event, error) {
	if limit < 1 || limit > MaxEventsPage {
		return nil, errs.E(errs.Invalid, "first must be between 1 and %d", MaxEventsPage)
	}
	var namep *string
	if name != "" {
		namep = &name
	}
	var afterp *uuid.UUID
	if after != uuid.Nil {
		afterp = &after
	}
	rows, err := tx.Query(ctx, qListEvents, tx.Tenant, namep, afterp, limit+1)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	var out []Event
	var ev Event
	if _, err := pgx.ForEachRow(rows, []any{&ev.Key, &ev.ID, &ev.Name, &ev.Payload, &ev.ReceivedAt}, func() error {
		out = append(out, ev)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	if len(out) == 0 {
		return out, nil
	}
	keys := make([]uuid.UUID, len(out))
	at := make(map[uuid.UUID]int, len(out))
	for i, e := range out {
		keys[i], at[e.Key] = e.Key, i
	}
	rows, err = tx.Query(ctx, qEventRunsOf, tx.Tenant, keys)
	if err != nil {
		return nil, fmt.Errorf("read event runs: %w", err)
	}
	var key uuid.UUID
	var r EventRun
	var run *uuid.UUID
	var code, msg *string
	if _, err := pgx.ForEachRow(rows, []any{&key, &r.WorkflowID, &run, &r.Outcome, &code, &msg}, func() error {
		e := r
		if run != nil {
			e.RunID = *run
		}
		if code != nil {
			e.ErrorCode = *code
		}
		if msg != nil {
			e.ErrorMessage = *msg
		}
		out[at[key]].Runs = append(out[at[key]].Runs, e)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read event runs: %w", err)
	}
	for i := range out {
		sort.Slice(out[i].Runs, func(a, b int) bool {
			return out[i].Runs[a].WorkflowID.String() < out[i].Runs[b].WorkflowID.String()
		})
	}
	return out, nil
}

func splitDots(s string) []string {
	n := []string{}
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '.' {
			n = append(n, s[start:i])
			start = i + 1
		}
	}
	return append(n, s[start:])
}

func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

const (
	qInsertEventRow = `INSERT INTO events (tenant_id, id, event_id, name, payload, request_hash)
			VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (tenant_id, event_id) DO NOTHING RETURNING received_at`
	qInsertEventRun = `INSERT INTO event_runs (tenant_id, event, workflow_id, run_id, outcome, error_code, error_message)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`
	qEventByID = `SELECT id, event_id, name, payload, received_at, request_hash FROM events
			WHERE tenant_id = $1 AND event_id = $2`
	qEventByKey = `SELECT id, event_id, name, payload, received_at FROM events WHERE tenant_id = $1 AND id = $2`
	qEventRuns  = `SELECT workflow_id, run_id, outcome, error_code, error_message FROM event_runs
			WHERE tenant_id = $1 AND event = $2 ORDER BY workflow_id, run_id NULLS FIRST`
	qEventRunsOf = `SELECT event, workflow_id, run_id, outcome, error_code, error_message FROM event_runs
			WHERE tenant_id = $1 AND event = ANY($2)`
	qListEvents = `SELECT id, event_id, name, payload, received_at FROM events
			WHERE tenant_id = $1 AND ($2::text IS NULL OR name = $2) AND ($3::uuid IS NULL OR id < $3)
			ORDER BY id DESC LIMIT $4`
	// Exact names through workflow_triggers_exact, patterns through
	// workflow_triggers_wildcard (those of the name's segment count whose
	// literal prefix the name starts with); the pattern itself is matched
	// in Go.
	qMatchingTriggers = `SELECT workflow_id, version, position FROM workflow_triggers
			WHERE tenant_id = $1 AND ((NOT wildcard AND pattern = $2) OR (wildcard AND segments = $3 AND starts_with($2, prefix)))
			ORDER BY workflow_id, position`
	// The distinct key expressions of the waits on an event name: a loose
	// index scan of event_waits_lookup (one probe per expression, however
	// many runs wait).
	qEventWaitKeyExprs = `WITH RECURSIVE k AS (
			(SELECT key_expr FROM event_waits WHERE tenant_id = $1 AND name = $2 ORDER BY key_expr LIMIT 1)
			UNION ALL
			SELECT (SELECT w.key_expr FROM event_waits w WHERE w.tenant_id = $1 AND w.name = $2 AND w.key_expr > k.key_expr
			         ORDER BY w.key_expr LIMIT 1)
			  FROM k WHERE k.key_expr IS NOT NULL)
		SELECT key_expr FROM k WHERE key_expr IS NOT NULL LIMIT $3`
	// The running runs with a wait on the name that is unkeyed or holds
	// the value one of the key expressions gave, oldest (lowest id) first.
	qEventWaiters = `SELECT r.id, r.workflow_id FROM workflow_runs r
		 WHERE r.tenant_id = $1 AND r.status = 'running' AND r.id IN (
			SELECT w.run_id FROM event_waits w WHERE w.tenant_id = $1 AND w.name = $2 AND w.key_expr = ''
			UNION
			SELECT w.run_id FROM unnest($3::text[], $4::text[]) AS k(expr, key)
			  JOIN event_waits w ON w.tenant_id = $1 AND w.name = $2 AND w.key_expr = k.expr AND w.match_key = k.key)
		 ORDER BY r.id LIMIT $5`
	qDeleteTriggers = `DELETE FROM workflow_triggers WHERE tenant_id = $1 AND workflow_id = $2`
	qInsertTrigger  = `INSERT INTO workflow_triggers (tenant_id, workflow_id, position, version, pattern, wildcard, segments, prefix)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`
)
