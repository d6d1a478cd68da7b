package graph

import (
	"context"
	"encoding/json"

	"github.com/google/uuid"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/engine"
	"github.com/composer-dev/composer/engine/dag"
)

// hiddenNote is what a principal without secrets:outputs reads in place
// of a value that may hold what a step that read a secret produced.
const hiddenNote = "derived from a secret: reading it needs the secrets:outputs permission"

var hiddenValue = json.RawMessage(`{"hidden":"` + hiddenNote + `"}`)

// secretScope says which of a run's values may hold what a step that read
// a secret produced (dag.Workflow.SecretDerived): every value of a run
// whose input came from such a step, and otherwise its derived nodes' and
// — when any step reads a secret — its output and error. A run whose
// definition is unknown (a bare view) counts as derived throughout.
type secretScope struct {
	wf  *dag.Workflow
	all bool
}

func (s secretScope) node(id string) bool { return s.all || s.wf == nil || s.wf.SecretDerived(id) }
func (s secretScope) run() bool           { return s.all || s.wf == nil || s.wf.ReadsSecrets() }

func (r *Resolver) secretScope(ctx context.Context, run *engine.RunView) (secretScope, error) {
	if run.SecretInput {
		return secretScope{all: true}, nil
	}
	if run.WorkflowID == uuid.Nil {
		return secretScope{}, nil
	}
	wf, err := r.definition(ctx, run)
	if err != nil {
		return secretScope{}, err
	}
	return secretScope{wf: wf}, nil
}

// definition is the run's workflow version's definition, from the
// coordinator's cache (read in the principal's tenant on a miss).
func (r *Resolver) definition(ctx context.Context, run *engine.RunView) (*dag.Workflow, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	return r.Coord.DefinitionOf(ctx, p.TenantID, run.WorkflowID, run.WorkflowVersion)
}

// seesSecretOutputs reports whether the principal may read what steps
// that read secrets produced (as of its role when the request was
// authenticated, which matched its membership then).
func seesSecretOutputs(ctx context.Context) bool {
	p, err := principal(ctx)
	return err == nil && auth.PowerOf(p).Can(auth.ActionSecretOutputs)
}

// hide is v as the principal may read it: hidden when derived and the
// principal may not see such values; nil stays nil.
func hide(v json.RawMessage, derived, sees bool) json.RawMessage {
	if len(v) == 0 || !derived || sees {
		return v
	}
	return hiddenValue
}

// hideError is an error as the principal may read it: a derived one keeps
// its code and node (set by the engine and the executors, not by what a
// receiver sent) and loses its message and details.
func hideError(v json.RawMessage, derived, sees bool) json.RawMessage {
	if len(v) == 0 || !derived || sees {
		return v
	}
	var e struct {
		Code string `json:"code,omitempty"`
		Node string `json:"node,omitempty"`
	}
	_ = json.Unmarshal(v, &e)
	out, err := json.Marshal(map[string]any{"code": e.Code, "node": e.Node, "message": "hidden: " + hiddenNote, "hidden": hiddenNote})
	if err != nil {
		return hiddenValue
	}
	return out
}

// runValue is the run's output or error (v) as the principal may read
// it, hidden by hider when the run's output and error are derived.
func (r *Resolver) runValue(ctx context.Context, run *engine.RunView, v json.RawMessage,
	hider func(v json.RawMessage, derived, sees bool) json.RawMessage) (json.RawMessage, error) {
	if len(v) == 0 || seesSecretOutputs(ctx) {
		return v, nil
	}
	s, err := r.secretScope(ctx, run)
	if err != nil {
		return nil, err
	}
	return hider(v, s.run(), false), nil
}

// secretTasks returns the run's tasks marked (TaskView.SecretDerived) and,
// for a principal without secrets:outputs, with derived values hidden. The
// tasks are copied: the loaders' and a live snapshot's are shared.
func (r *Resolver) secretTasks(ctx context.Context, run *engine.RunView, tasks []engine.TaskView) ([]engine.TaskView, error) {
	if len(tasks) == 0 {
		return tasks, nil
	}
	s, err := r.secretScope(ctx, run)
	if err != nil {
		return nil, err
	}
	sees := seesSecretOutputs(ctx)
	out := make([]engine.TaskView, len(tasks))
	for i, t := range tasks {
		d := s.node(t.NodeID)
		t.SecretDerived = d
		t.Input, t.Output, t.LastError = hide(t.Input, d, sees), hide(t.Output, d, sees), hideError(t.LastError, d, sees)
		out[i] = t
	}
	return out, nil
}

// secretTimeline hides, for a principal without secrets:outputs, the
// errors a run's timeline records of derived nodes (a failed attempt's,
// a retry's, a node's failure) and the run's own failure when its error
// is derived.
func (r *Resolver) secretTimeline(ctx context.Context, run *engine.RunView, events []engine.RunEvent) ([]engine.RunEvent, error) {
	if len(events) == 0 || seesSecretOutputs(ctx) {
		return events, nil
	}
	s, err := r.secretScope(ctx, run)
	if err != nil {
		return nil, err
	}
	if !s.run() {
		return events, nil
	}
	out := make([]engine.RunEvent, len(events))
	for i, e := range events {
		out[i] = e
		var d map[string]json.RawMessage
		if json.Unmarshal(e.Detail, &d) != nil {
			out[i].Detail = hiddenValue
			continue
		}
		changed := false
		if v, ok := d["error"]; ok && (e.NodeID == nil || s.node(*e.NodeID)) {
			d["error"], changed = hideError(v, true, false), true
		}
		var actions []map[string]json.RawMessage
		if json.Unmarshal(d["actions"], &actions) == nil {
			for _, a := range actions {
				v, ok := a["error"]
				if !ok {
					continue
				}
				var node string
				_ = json.Unmarshal(a["node"], &node)
				if node == "" || s.node(node) { // (no node: the run's failure)
					a["error"], changed = hideError(v, true, false), true
				}
			}
			if changed {
				if d["actions"], err = json.Marshal(actions); err != nil {
					return nil, err
				}
			}
		}
		if changed {
			if out[i].Detail, err = json.Marshal(d); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}
