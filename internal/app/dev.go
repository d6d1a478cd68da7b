package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/tenants"
)

// DemoTenantName names the tenant `composer dev` creates and uses.
const DemoTenantName = "demo"

// EnsureDemoTenant returns the demo tenant, creating it on first use the
// way `composer tenants create` does; the first owner API key is returned
// only then (it is never shown again).
func EnsureDemoTenant(ctx context.Context, d *Deps) (uuid.UUID, string, error) {
	var id uuid.UUID
	err := d.DB.System().QueryRow(ctx, qDemoTenant, DemoTenantName).Scan(&id)
	if err == nil {
		return id, "", nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return uuid.Nil, "", fmt.Errorf("find demo tenant: %w", err)
	}
	p, err := ProvisionTenant(ctx, d, tenants.CreateParams{Name: DemoTenantName, Plan: "pro"}, "composer dev")
	if err != nil {
		return uuid.Nil, "", err
	}
	return p.Tenant.ID, p.APIKey, nil
}

// DemoWorkflow is the definition of the demo's "hello" workflow: a fork of
// HTTP steps against the dev server's echo endpoint, a conditional branch
// and a join.
func DemoWorkflow(base string) string {
	return fmt.Sprintf(`{
  "description": "Greets someone through two HTTP steps; the shout branch only runs when input.loud is true.",
  "nodes": [
    {"id": "greet", "type": "http", "http": {"method": "POST", "url": "%[1]s/v1/dev/echo"},
     "input": {"name": "input.name"}},
    {"id": "shout", "type": "http", "depends_on": ["greet"], "if": "has(input.loud) && input.loud == true",
     "http": {"method": "POST", "url": "%[1]s/v1/dev/echo"},
     "input": {"text": "'HELLO, ' + nodes.greet.output.body.body.name.upperAscii() + '!'"}},
    {"id": "wave", "type": "http", "depends_on": ["greet"],
     "http": {"method": "POST", "url": "%[1]s/v1/dev/echo"},
     "input": {"text": "'hello, ' + nodes.greet.output.body.body.name"}},
    {"id": "done", "type": "noop", "depends_on": ["shout", "wave"]}
  ],
  "output": {"greeting": "nodes.wave.output.body.body.text"}
}`, base)
}

// EnsureDemoWorkflow creates the demo workflow if the tenant lacks it.
func EnsureDemoWorkflow(ctx context.Context, c *engine.Coordinator, tenant uuid.UUID, base string) error {
	_, _, err := c.CreateWorkflow(ctx, tenant, "hello", "the demo workflow", []byte(DemoWorkflow(base)))
	if errors.Is(err, errs.Conflict) {
		return nil
	}
	return err
}

// DemoOwner is the subject of the demo tenant's owner under `composer dev`.
const DemoOwner = "demo@composer.local"

// PathDevSession is the console's one-click sign-in under `composer dev`:
// GET says it exists, POST mints a one-hour owner token of the demo tenant.
// It is mounted by MountDev only, so a server that is not `composer dev`
// answers 404 (TestDevSessionIsAbsentOutsideDev).
const PathDevSession = "/v1/dev/session"

// MountDev adds the development endpoints, bound to one tenant. They exist
// only under `composer dev` (COMPOSER_DEV): no authentication.
func (s *Server) MountDev(tenant uuid.UUID) {
	s.Mux.HandleFunc("GET "+PathDevSession, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"subject": DemoOwner, "tenant_id": tenant})
	})
	// A page of another origin may post here but cannot read the answer
	// (no CORS headers), so the token reaches only the console's own origin.
	s.Mux.HandleFunc("POST "+PathDevSession, func(w http.ResponseWriter, r *http.Request) {
		token, err := DevToken(r.Context(), s.Deps, tenant, DemoOwner, auth.RoleOwner, time.Hour)
		if err != nil {
			writeErr(w, err)
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		writeJSON(w, http.StatusOK, map[string]any{"token": token, "subject": DemoOwner, "tenant_id": tenant})
	})
	s.Mux.HandleFunc("POST /v1/dev/echo", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		var parsed any = string(body)
		var j any
		if json.Unmarshal(body, &j) == nil {
			parsed = j
		}
		writeJSON(w, http.StatusOK, map[string]any{"method": r.Method, "idempotency_key": r.Header.Get("Idempotency-Key"),
			"attempt": r.Header.Get("Composer-Attempt"), "body": parsed})
	})
	s.Mux.HandleFunc("POST /v1/dev/workflows", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Name       string          `json:"name"`
			Definition json.RawMessage `json:"definition"`
		}
		if !decode(w, r, &in) {
			return
		}
		wf, v, err := s.Coordinator.CreateWorkflow(r.Context(), tenant, in.Name, "", in.Definition)
		if errors.Is(err, errs.Conflict) {
			var id uuid.UUID
			id, err = s.workflowID(r.Context(), tenant, in.Name)
			if err == nil {
				v, err = s.Coordinator.PublishVersion(r.Context(), tenant, id, in.Definition)
				wf.ID = id
			}
		}
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"workflow_id": wf.ID, "version": v.Version})
	})
	s.Mux.HandleFunc("POST /v1/dev/runs", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Workflow       string          `json:"workflow"`
			Input          json.RawMessage `json:"input"`
			IdempotencyKey string          `json:"idempotency_key"`
		}
		if !decode(w, r, &in) {
			return
		}
		res, err := s.Coordinator.StartRun(r.Context(), tenant, engine.StartRun{WorkflowName: in.Workflow, Input: in.Input, IdempotencyKey: in.IdempotencyKey})
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"run_id": res.RunID, "created": res.Created, "status": res.Status})
	})
	s.Mux.HandleFunc("POST /v1/dev/runs/{id}/{action}", func(w http.ResponseWriter, r *http.Request) {
		id, err := uuid.Parse(r.PathValue("id"))
		if err != nil {
			writeErr(w, errs.E(errs.Invalid, "not a run id"))
			return
		}
		var in struct {
			ID      string          `json:"id"`
			Name    string          `json:"name"`
			Payload json.RawMessage `json:"payload"`
			Reason  string          `json:"reason"`
		}
		if r.ContentLength != 0 && !decode(w, r, &in) {
			return
		}
		var ack engine.Ack
		switch r.PathValue("action") {
		case "signal":
			ack, err = s.Coordinator.SignalRun(r.Context(), tenant, id, engine.Signal{ID: in.ID, Name: in.Name, Payload: in.Payload})
		case "cancel":
			ack, err = s.Coordinator.CancelRun(r.Context(), tenant, id, in.Reason)
		case "rerun":
			ack, err = s.Coordinator.RerunRun(r.Context(), tenant, id)
		case "rerun-as-new":
			var res engine.Started
			if res, err = s.Coordinator.RerunAsNew(r.Context(), tenant, id); err == nil {
				writeJSON(w, http.StatusOK, map[string]any{"run_id": res.RunID, "status": res.Status})
				return
			}
		default:
			writeErr(w, errs.E(errs.NotFound, "unknown action"))
			return
		}
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"ignored": ack.Ignored, "reason": ack.Reason, "status": ack.Status})
	})
	s.Mux.HandleFunc("GET /v1/dev/runs/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := uuid.Parse(r.PathValue("id"))
		if err != nil {
			writeErr(w, errs.E(errs.Invalid, "not a run id"))
			return
		}
		var out struct {
			Run   engine.RunView    `json:"run"`
			Tasks []engine.TaskView `json:"tasks"`
		}
		err = s.DB.WithTenant(r.Context(), tenant, func(ctx context.Context, tx *pg.Tx) error {
			var err error
			if out.Run, err = engine.GetRun(ctx, tx, id); err != nil {
				return err
			}
			out.Tasks, err = engine.TasksOfRuns(ctx, tx, []uuid.UUID{id})
			return err
		})
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, out)
	})
}

func (s *Server) workflowID(ctx context.Context, tenant uuid.UUID, name string) (uuid.UUID, error) {
	var id uuid.UUID
	err := s.DB.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		return tx.QueryRow(ctx, qWorkflowIDByName, tenant, name).Scan(&id)
	})
	return id, err
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 2<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeErr(w, errs.E(errs.Invalid, "bad request body: %v", err))
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeErr(w http.ResponseWriter, err error) {
	status := map[errs.Kind]int{errs.Invalid: 400, errs.NotFound: 404, errs.Conflict: 409}[errs.KindOf(err)]
	if status == 0 {
		status = 500
	}
	body := map[string]any{"code": errs.KindOf(err), "message": errs.PublicMessage(err)}
	var e *errs.Error
	if errors.As(err, &e) && len(e.Fields) > 0 {
		body["problems"] = e.Fields
	}
	writeJSON(w, status, map[string]any{"error": body})
}
