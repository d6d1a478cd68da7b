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

// Hook is the engine.TxHook that enqueues deliveries when a run ends, and
// when it starts waiting for a signal or an event (run.waiting) or an
// approval (approval.requested), so someone can be told.
func Hook(t *engine.TxTransition, q engine.Queuer) {
	for _, w := range t.Waits {
		typ := EventRunWaiting
		if w.Approval {
			typ = EventApprovalRequested
		}
		q.Queue(enqueueWait, t.Tenant, typ, t.RunID, t.WorkflowID, t.WorkflowVersion, t.Now, w.Node, nullIfEmpty(w.Signal), w.TimeoutAt,
			nullIfEmpty(w.Event))
	}
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

func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// nullJSON passes JSON bytes as text for a ::jsonb parameter (nil: NULL).
func nullJSON(b []byte) any {
	if b == nil {
		return nil
	}
	return string(b)
}

var _ engine.TxHook = Hook
