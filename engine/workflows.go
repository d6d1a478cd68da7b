package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/composer-dev/composer/audit"
	"github.com/composer-dev/composer/engine/dag"
	"github.com/composer-dev/composer/engine/taskapi"
	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
	"github.com/composer-dev/composer/tenants"
)

// Workflow is a named workflow of a tenant; its definitions are immutable
// numbered versions.
type Workflow struct {
	ID            uuid.UUID
	Name          string
	Description   string
	LatestVersion int
	CreatedAt     time.Time
	UpdatedAt     time.Time
	// PausedAt is set while the workflow is paused (pause.go).
	PausedAt    *time.Time
	PauseReason *string
}

// Version is one immutable definition of a workflow.
type Version struct {
	WorkflowID uuid.UUID
	Version    int
	Definition json.RawMessage
	CreatedAt  time.Time
}

// invalidDefinition turns a dag validation error into an Invalid error whose
// fields name each node and field.
func invalidDefinition(err error) error {
	var ve *dag.ValidationError
	if !errors.As(err, &ve) {
		return errs.Wrap(errs.Invalid, err, "invalid workflow definition")
	}
	e := &errs.Error{Kind: errs.Invalid, Message: ve.Error()}
	for _, p := range ve.Problems {
		e.Fields = append(e.Fields, errs.Field{Node: p.Node, Field: p.Field, Message: p.Message})
	}
	return e
}

// CreateWorkflow creates a workflow with its first version. An invalid
// definition or a taken name changes nothing.
func (c *Coordinator) CreateWorkflow(ctx context.Context, tenant uuid.UUID, name, description string, definition []byte) (Workflow, Version, error) {
	if !dag.WorkflowName.MatchString(name) {
		return Workflow{}, Version{}, errs.E(errs.Invalid, "workflow name must be 1-128 letters, digits, '_', '.' or '-', starting with a letter or digit")
	}
	if len(description) > 2000 {
		return Workflow{}, Version{}, errs.E(errs.Invalid, "description is longer than 2000 characters")
	}
	wf, err := dag.ParseForPublish(definition)
	if err != nil {
		return Workflow{}, Version{}, invalidDefinition(err)
	}
	w := Workflow{ID: uuid.Must(uuid.NewV7()), Name: name, Description: description, LatestVersion: 1}
	v := Version{WorkflowID: w.ID, Version: 1, Definition: wf.Canonical()}
	audit.Identify(ctx, w.ID.String())
	err = c.db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		if err := gate(ctx, tx); err != nil {
			return err
		}
		err := tx.QueryRow(ctx, qInsertWorkflow, tenant, w.ID, name, description).
			Scan(&w.CreatedAt, &w.UpdatedAt)
		if isUniqueViolation(err) {
			return errs.E(errs.Conflict, "a workflow named %q already exists", name)
		}
		if err != nil {
			return fmt.Errorf("insert workflow: %w", err)
		}
		if err := tx.QueryRow(ctx, qInsertVersion, tenant, w.ID, v.Definition).Scan(&v.CreatedAt); err != nil {
			return err
		}
		return writeTriggers(ctx, tx, w.ID, 1, wf)
	})
	if err != nil {
		return Workflow{}, Version{}, err
	}
	return w, v, nil
}

// PublishVersion adds the next version of a workflow.
func (c *Coordinator) PublishVersion(ctx context.Context, tenant, workflowID uuid.UUID, definition []byte) (Version, error) {
	wf, err := dag.ParseForPublish(definition)
	if err != nil {
		return Version{}, invalidDefinition(err)
	}
	v := Version{WorkflowID: workflowID, Definition: wf.Canonical()}
	err = c.db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		if err := gate(ctx, tx); err != nil {
			return err
		}
		err := tx.QueryRow(ctx, qBumpVersion, tenant, workflowID).Scan(&v.Version)
		if errors.Is(err, pgx.ErrNoRows) {
			return errs.E(errs.NotFound, "workflow %s not found", workflowID)
		}
		if err != nil {
			return fmt.Errorf("bump version: %w", err)
		}
		l, err := tenants.EffectiveLimits(ctx, tx)
		if err != nil {
			return err
		}
		if l.MaxWorkflowVersions > 0 && v.Version > l.MaxWorkflowVersions {
			return errs.E(errs.QuotaExceeded, "a workflow may have at most %d versions on this plan; create a new workflow", l.MaxWorkflowVersions)
		}
		if err := tx.QueryRow(ctx, qInsertNextVersion, tenant, workflowID, v.Version, v.Definition).Scan(&v.CreatedAt); err != nil {
			return err
		}
		return writeTriggers(ctx, tx, workflowID, v.Version, wf)
	})
	if err != nil {
		return Version{}, err
	}
	return v, nil
}

func isUniqueViolation(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == "23505"
}

// compiled is a parsed definition plus what the coordinator derives from it
// once: each worker node's executor settings.
type compiled struct {
	wf     *dag.Workflow
	config map[string]json.RawMessage
}

// configOf is the task config of a node, or of a map element (its map's
// step's); nil for nodes that run on no worker.
func (c *compiled) configOf(node string) []byte {
	if cfg, ok := c.config[node]; ok {
		return cfg
	}
	if base, _, ok := dag.ParseItemID(node); ok {
		return c.config[base]
	}
	return nil
}

// stepOf is the node a task of node runs: the node, or a map element's
// step.
func (c *compiled) stepOf(node string) *dag.Node {
	if n := c.wf.Node(node); n != nil {
		return n
	}
	if base, _, ok := dag.ParseItemID(node); ok {
		if n := c.wf.Node(base); n != nil && n.Map != nil {
			return n.Map.Step
		}
	}
	return nil
}

// defCache holds compiled definitions. Versions are immutable, so an entry
// never goes stale; the cache is only bounded.
type defCache struct {
	mu      sync.Mutex
	entries map[defKey]*compiled
	max     int
}

type defKey struct {
	tenant, workflow uuid.UUID
	version          int
}

func newDefCache(max int) *defCache { return &defCache{entries: map[defKey]*compiled{}, max: max} }

// cached is the entry of k, or nil.
func (d *defCache) cached(k defKey) *compiled {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.entries[k]
}

// load returns the compiled definition, reading it through tx (so row-level
// security applies) on a miss.
func (d *defCache) load(ctx context.Context, tx *pg.Tx, workflow uuid.UUID, version int) (*compiled, error) {
	k := defKey{tx.Tenant, workflow, version}
	c := d.cached(k)
	if c != nil {
		return c, nil
	}
	var raw []byte
	err := tx.QueryRow(ctx, qLoadDefinition,
		tx.Tenant, workflow, version).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, errs.E(errs.NotFound, "workflow %s version %d not found", workflow, version)
	}
	if err != nil {
		return nil, fmt.Errorf("load definition: %w", err)
	}
	wf, err := dag.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("stored definition of %s v%d no longer parses: %w", workflow, version, err)
	}
	c = &compiled{wf: wf, config: map[string]json.RawMessage{}}
	for _, n := range wf.Nodes {
		// A templated request is rendered for each task (CreateTask.Request).
		if n.Type.RunsOnWorker() && !n.Templated() {
			c.config[n.ID] = nodeConfig(n, nil)
		}
		if n.Map != nil && n.Map.Step.Type.RunsOnWorker() && !n.Map.Step.Templated() {
			c.config[n.ID] = nodeConfig(n.Map.Step, nil) // (its elements')
		}
	}
	d.mu.Lock()
	if len(d.entries) >= d.max {
		for k := range d.entries { // evict an arbitrary entry
			delete(d.entries, k)
			break
		}
	}
	d.entries[k] = c
	d.mu.Unlock()
	return c, nil
}

// DefinitionOf is the parsed definition of a workflow version of the
// tenant, for readers that decide what a run's values may show
// (dag.Workflow.SecretDerived) and who may answer its approvals. Versions
// are immutable: it is read once (in the tenant's scope) and then cached.
func (c *Coordinator) DefinitionOf(ctx context.Context, tenant, workflow uuid.UUID, version int) (*dag.Workflow, error) {
	if d := c.defs.cached(defKey{tenant, workflow, version}); d != nil {
		return d.wf, nil
	}
	var wf *dag.Workflow
	err := c.db.WithTenant(ctx, tenant, func(ctx context.Context, tx *pg.Tx) error {
		d, err := c.defs.load(ctx, tx, workflow, version)
		if err == nil {
			wf = d.wf
		}
		return err
	})
	return wf, err
}

// StoredCredential is a stored version that writes a credential into an
// http step literally: one published before publishing refused that.
type StoredCredential struct {
	Tenant, Workflow uuid.UUID
	Version          int
	// Fields name each, as "<node> <field>" (e.g. "call http.headers.Authorization").
	Fields []string
}

// StoredCredentials reports every stored version of every tenant that
// writes a credential literally, for the operator to have moved into
// secrets (a migration cannot seal them: it has no key, and versions are
// immutable). It reads as the system role, a version at a time.
func StoredCredentials(ctx context.Context, db *pg.DB, visit func(StoredCredential)) error {
	return db.WithSystem(ctx, func(ctx context.Context, tx *pg.Tx) error {
		rows, err := tx.Query(ctx, qAllDefinitions)
		if err != nil {
			return fmt.Errorf("read definitions: %w", err)
		}
		var c StoredCredential
		var raw []byte
		_, err = pgx.ForEachRow(rows, []any{&c.Tenant, &c.Workflow, &c.Version, &raw}, func() error {
			wf, err := dag.Parse(raw)
			if err != nil {
				return nil // (a version that no longer parses runs nothing)
			}
			if c.Fields = wf.LiteralCredentials(); len(c.Fields) > 0 {
				visit(c)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("read definitions: %w", err)
		}
		return nil
	})
}

// nodeConfig is what a worker needs to run a task of n: its request as
// rendered by the state machine for the task (req), or, for a node whose
// request is not templated, the definition's.
func nodeConfig(n *dag.Node, req *dag.Request) json.RawMessage {
	cfg := taskapi.TaskConfig{TimeoutMS: n.Timeout.Std().Milliseconds()}
	if h := n.HTTP; h != nil {
		if req == nil {
			var err error
			if req, err = n.EvalRequest(dag.Scope{}); err != nil {
				panic(fmt.Sprintf("engine: a request without templates failed to render: %v", err)) // literal text only
			}
		}
		cfg.HTTP = httpSpec(h, req)
	}
	if t := n.Task; t != nil {
		cfg.Task = &taskapi.TaskSpec{Handler: t.Handler}
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		panic(fmt.Sprintf("engine: marshal node config: %v", err)) // plain data
	}
	return b
}

// httpSpec is the worker's form of an http node's rendered request.
func httpSpec(h *dag.HTTPSpec, r *dag.Request) *taskapi.HTTPSpec {
	spec := &taskapi.HTTPSpec{Method: h.Method, Body: h.Body, TimeoutMS: h.Timeout.Std().Milliseconds(), Secrets: r.Secrets}
	if r.URL.Parts != nil {
		spec.URLParts = parts(r.URL.Parts)
	} else {
		spec.URL = r.URL.Text
	}
	for _, q := range r.Query {
		spec.Query = append(spec.Query, taskapi.Param{Name: q.Name, Value: q.Value.Text, Parts: parts(q.Value.Parts)})
	}
	for k, v := range r.Headers {
		if v.Parts != nil {
			if spec.SecretHeaders == nil {
				spec.SecretHeaders = map[string][]taskapi.Part{}
			}
			spec.SecretHeaders[k] = parts(v.Parts)
			continue
		}
		if spec.Headers == nil {
			spec.Headers = map[string]string{}
		}
		spec.Headers[k] = v.Text
	}
	return spec
}

func parts(ps []dag.Part) []taskapi.Part {
	if ps == nil {
		return nil
	}
	out := make([]taskapi.Part, len(ps))
	for i, p := range ps {
		out[i] = taskapi.Part{Text: p.Text, Secret: p.Secret, Escape: p.Escape}
	}
	return out
}

// MaskedValue replaces what MaskHeaders hides.
const MaskedValue = "********"

// MaskHeaders returns a stored definition with every HTTP step header
// and query parameter value replaced by MaskedValue (the names stay), for
// readers who may not change the workflow. A definition that does not decode is returned
// masked whole.
func MaskHeaders(def json.RawMessage) json.RawMessage {
	var d map[string]any
	if err := json.Unmarshal(def, &d); err != nil {
		return json.RawMessage(`{}`)
	}
	nodes, _ := d["nodes"].([]any)
	for _, n := range nodes {
		node, _ := n.(map[string]any)
		h, _ := node["http"].(map[string]any)
		for _, field := range []string{"headers", "query"} {
			values, _ := h[field].(map[string]any)
			for k := range values {
				values[k] = MaskedValue
			}
		}
	}
	out, err := json.Marshal(d)
	if err != nil {
		return json.RawMessage(`{}`)
	}
	return out
}
