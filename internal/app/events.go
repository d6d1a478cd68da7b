package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"

	"github.com/composer-dev/composer/audit"
	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/graph"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/tenants"
)

// PathEvents is the plain HTTPS endpoint that publishes an event, for
// systems that cannot speak GraphQL.
const PathEvents = "/v1/events"

// maxEventBody bounds a POST /v1/events body: the largest payload and
// room for the rest.
const maxEventBody = engine.MaxEventPayloadBytes + 16<<10

// EventRequest is the body of POST /v1/events. Unknown fields are refused
// (UNKNOWN_FIELD, naming the field).
type EventRequest struct {
	// ID is the publisher's id for the event, its dedupe key.
	ID      string          `json:"id"`
	Name    string          `json:"name"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// EventResponse is the 200 answer of POST /v1/events, for a new event
// and for a repeated id alike (created tells them apart).
type EventResponse struct {
	Created bool      `json:"created"`
	Event   EventBody `json:"event"`
}

// EventBody is a recorded event with what it did.
type EventBody struct {
	ID         string         `json:"id"`
	EventID    string         `json:"event_id"`
	Name       string         `json:"name"`
	ReceivedAt time.Time      `json:"received_at"`
	Runs       []EventRunBody `json:"runs"`
}

// EventRunBody is what the event did to one matching workflow.
type EventRunBody struct {
	WorkflowID string     `json:"workflow_id"`
	Outcome    string     `json:"outcome"` // started or refused
	RunID      string     `json:"run_id,omitempty"`
	Error      *ErrorBody `json:"error,omitempty"`
}

// ErrorBody is an error code and message.
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Field names the request field at fault, when one is.
	Field string `json:"field,omitempty"`
}

// eventsHandler serves POST /v1/events: an API key with the events:write
// (or admin) scope as a bearer token; the start rate limit takes one token
// per publish, like a startRun.
type eventsHandler struct {
	s      *Server
	limits tenants.LimitsCache
}

func (h *eventsHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || !strings.HasPrefix(token, auth.APIKeyPrefix) {
		h.fail(w, errs.E(errs.Unauthenticated, "an API key is required (Authorization: Bearer <key>)"), "")
		return
	}
	p, err := h.s.Authn.APIKey(ctx, token)
	if err != nil {
		h.fail(w, err, "")
		return
	}
	if !auth.PowerOf(p).Can(auth.ActionEventsWrite) {
		err := errs.E(errs.Forbidden, "the API key lacks the %s scope", auth.ScopeEventsWrite)
		h.audit(ctx, audit.NewEntry(h.s.AuditKeys, p.TenantID, string(p.Kind), p.Subject, "publishEvent", "event", "", nil), err)
		h.fail(w, err, "")
		return
	}
	var in EventRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxEventBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			writeJSON(w, http.StatusRequestEntityTooLarge, map[string]ErrorBody{"error": {Code: string(errs.Invalid),
				Message: fmt.Sprintf("the body is larger than %d bytes", maxEventBody)}})
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			field, _ := strconv.Unquote(strings.TrimPrefix(err.Error(), "json: unknown field "))
			writeJSON(w, http.StatusBadRequest, map[string]ErrorBody{"error": {Code: "UNKNOWN_FIELD", Field: field,
				Message: fmt.Sprintf("the server does not know the field %q", field)}})
		default:
			h.fail(w, errs.E(errs.Invalid, "the body must be a JSON object {id, name, payload}"), "")
		}
		return
	}
	if h.s.Limiter != nil {
		l, err := h.limits.Get(ctx, h.s.DB, p.TenantID)
		if err != nil {
			h.fail(w, err, "")
			return
		}
		wait, err := h.s.Limiter.Allow(ctx, p.TenantID, l.StartsPerSecond, l.StartBurst)
		if err != nil {
			h.s.Log.Warn("rate limiter unavailable; admitting the event", zap.Error(err))
		} else if wait > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(int(wait.Seconds()+0.999)))
			h.fail(w, errs.E(errs.RateLimited, "run starts are limited to %g per second (burst %d); retry in %s",
				l.StartsPerSecond, l.StartBurst, wait.Round(time.Millisecond)), "")
			return
		}
	}
	// Audited like the publishEvent mutation: the record is sealed into
	// the publish's transaction by its gate, or written after a refusal.
	entry := audit.NewEntry(h.s.AuditKeys, p.TenantID, string(p.Kind), p.Subject, "publishEvent", "event", in.ID, map[string]any{"name": in.Name, "via": "rest"})
	ctx = engine.WithActor(ctx, graph.Actor(p)) // the starter of the runs it starts
	ctx = engine.WithGate(audit.With(ctx, entry), func(ctx context.Context, tx *pg.Tx) error {
		if err := h.s.Authz.Allowed(ctx, tx, p, auth.ActionEventsWrite); err != nil {
			return err
		}
		audit.Seal(ctx, tx)
		return nil
	})
	res, err := h.s.Coordinator.PublishEvent(ctx, p.TenantID, engine.PublishEvent{ID: in.ID, Name: in.Name, Payload: in.Payload})
	h.audit(ctx, entry, err)
	if err != nil {
		field := ""
		var e *errs.Error
		if errors.As(err, &e) && len(e.Fields) > 0 {
			field = e.Fields[0].Field
		}
		h.fail(w, err, field)
		return
	}
	out := EventResponse{Created: res.Created, Event: EventBody{ID: res.Key.String(), EventID: res.ID, Name: res.Name,
		ReceivedAt: res.ReceivedAt, Runs: make([]EventRunBody, 0, len(res.Runs))}}
	for _, run := range res.Runs {
		b := EventRunBody{WorkflowID: run.WorkflowID.String(), Outcome: run.Outcome}
		if run.RunID != uuid.Nil {
			b.RunID = run.RunID.String()
		}
		if run.ErrorCode != "" {
			b.Error = &ErrorBody{Code: run.ErrorCode, Message: run.ErrorMessage}
		}
		out.Event.Runs = append(out.Event.Runs, b)
	}
	writeJSON(w, http.StatusOK, out)
}

// audit records what a publish did not commit (see audit.Finish).
func (h *eventsHandler) audit(ctx context.Context, e *audit.Entry, err error) {
	if _, werr := audit.Finish(ctx, h.s.DB, e, err); werr != nil {
		h.s.Log.Error("audit record not written", zap.Error(werr))
	}
}

func (h *eventsHandler) fail(w http.ResponseWriter, err error, field string) {
	kind := errs.KindOf(err)
	status := errs.HTTPStatus(kind)
	if status == http.StatusInternalServerError {
		h.s.Log.Error("event publish failed", zap.Error(err))
	}
	if after := errs.RetryAfter(err); after > 0 && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", strconv.Itoa(int(after.Seconds()+0.999)))
	}
	writeJSON(w, status, map[string]ErrorBody{"error": {Code: string(kind), Message: errs.PublicMessage(err), Field: field}})
}
