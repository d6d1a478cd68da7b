package webhooks

import (
	"encoding/json"

	"github.com/composer-dev/composer/engine"
	sm "github.com/composer-dev/composer/engine/statemachine"
)

// MaxOutputBytes bounds the run output a payload carries; a larger output
// is left out ("output": null, "output_truncated": true) and read through
// the API.
const MaxOutputBytes = 64 << 10

// enqueue inserts one delivery per enabled endpoint subscribed to the
// event, in the transition's transaction. The payload is built here, once
// per endpoint row, and stored as text: every attempt sends these bytes.
const enqueue = `INSERT INTO webhook_deliveries (tenant_id, id, endpoint_id, event_type, run_id, payload)
SELECT e.tenant_id, composer_uuidv7(), e.id, $2, $3, json_build_object(
    'type', $2::text,
    'timestamp', $7::timestamptz,
    'data', json_build_object(
        'run_id', $3::uuid, 'workflow', w.name, 'workflow_id', $4::uuid, 'workflow_version', $5::int,
        'status', $6::text, 'output', $8::jsonb, 'output_truncated', $9::bool, 'error', $10::jsonb,
        'started_at', r.created_at, 'finished_at', $7::timestamptz))::text
  FROM webhook_endpoints e
  LEFT JOIN workflow_runs r ON r.tenant_id = $1 AND r.id = $3
  LEFT JOIN workflow_definitions w ON w.tenant_id = $1 AND w.id = $4
 WHERE e.tenant_id = $1 AND e.enabled AND $2 = ANY (e.event_types)`

// EventType is the webhook event of a terminal run status ("" if none).
func EventType(s sm.RunStatus) string {
	switch s {
	case sm.RunCompleted:
		return EventRunCompleted
	case sm.RunFailed:
		return EventRunFailed
	case sm.RunCancelled:
		return EventRunCancelled
	}
	return ""
}

// Hook is the engine.TxHook that enqueues deliveries when a run ends.
func Hook(t *engine.TxTransition, q engine.Queuer) {
	if !t.Terminal {
		return
	}
	typ := EventType(t.Status)
	if typ == "" {
		return
	}
	var output []byte
	truncated := false
	if len(t.Output) > MaxOutputBytes {
		truncated = true
	} else if len(t.Output) > 0 {
		output = t.Output
	}
	var errJSON []byte
	if t.Error != nil {
		// The summary: code, message and node, not the details.
		errJSON, _ = json.Marshal(sm.Error{Code: t.Error.Code, Message: t.Error.Message, Node: t.Error.Node})
	}
	q.Queue(enqueue, t.Tenant, typ, t.RunID, t.WorkflowID, t.WorkflowVersion, string(t.Status), t.Now,
		nullJSON(output), truncated, nullJSON(errJSON))
}

// nullJSON passes JSON bytes as text for a ::jsonb parameter (nil: NULL).
func nullJSON(b []byte) any {
	if b == nil {
		return nil
	}
	return string(b)
}

var _ engine.TxHook = Hook
