package dag

import (
	"encoding/json"
	"fmt"
	"sync"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/types/ref"
)

// Bounds of event matching.
const (
	// MaxCancelOn bounds a workflow's cancel_on entries.
	MaxCancelOn = 5
	// MaxMatchKeyBytes bounds the JSON of a match key (the run's side of a
	// match's equality, stored in the index of waits).
	MaxMatchKeyBytes = 512
	// MaxKeyExprChars bounds the event side of a keyed match; a longer one
	// leaves the match unkeyed.
	MaxKeyExprChars = 1000
)

// CancelOn cancels a run when an event named Event is published while the
// run is running and Match (a CEL expression over `event` and `input`,
// true when empty) holds.
type CancelOn struct {
	Event string `json:"event"`
	Match string `json:"match,omitempty"`

	match *eventMatch
}

// eventMatch is a compiled match expression: the whole condition (over
// `input`, `nodes` and `event`) and, when it has the form `<event side> ==
// <run side>` (alone or as a term of a top-level &&), the two sides apart,
// so a wait can be indexed by its run side's value and an event look up
// the waits whose value its event side gives.
type eventMatch struct {
	full      *program
	eventSide *program // over `event`; nil when unkeyed
	runSide   *program // over `input` and `nodes`
}

// EventData is a published event as match expressions see it.
type EventData struct {
	ID      string
	Name    string
	Payload json.RawMessage
}

func (e EventData) activation() (map[string]any, error) {
	p, err := DecodeJSON(e.Payload)
	if err != nil {
		return nil, fmt.Errorf("event payload: %w", err)
	}
	return map[string]any{"id": e.ID, "name": e.Name, "payload": p}, nil
}

// Output is what a wait node resolved by the event outputs.
func (e EventData) Output() json.RawMessage {
	p := e.Payload
	if len(p) == 0 {
		p = json.RawMessage(`{}`)
	}
	b, err := json.Marshal(map[string]any{"id": e.ID, "name": e.Name, "payload": p})
	if err != nil {
		return json.RawMessage(`{}`)
	}
	return b
}

var (
	matchEnvOnce sync.Once
	matchEnv     *cel.Env
	matchEnvErr  error
)

// compileMatch compiles a match expression, over `input`, `nodes` and
// `event`; inputOnly forbids `nodes` (cancel_on is matched against the run
// input alone).
func compileMatch(src string, inputOnly bool) (*eventMatch, error) {
	matchEnvOnce.Do(func() {
		matchEnv, matchEnvErr = newEnv(
			cel.Variable("input", cel.DynType),
			cel.Variable("nodes", cel.MapType(cel.StringType, cel.DynType)),
			cel.Variable("event", cel.DynType))
	})
	if matchEnvErr != nil {
		return nil, matchEnvErr
	}
	full, native, err := compileIn(matchEnv, src, true)
	if err != nil {
		return nil, err
	}
	m := &eventMatch{full: full}
	if inputOnly && len(full.refs) > 0 {
		return nil, fmt.Errorf("reads nodes.%s: cancel_on is matched against the run input only", full.refs[0])
	}
	ev, run := keyedTerm(native.Expr(), inputOnly)
	if ev == nil {
		return m, nil
	}
	evSrc, err1 := cel.ExprToString(ev, native.SourceInfo())
	runSrc, err2 := cel.ExprToString(run, native.SourceInfo())
	if err1 != nil || err2 != nil || len(evSrc) > MaxKeyExprChars {
		return m, nil // left unkeyed: matched by evaluating the whole condition
	}
	if m.eventSide, err = compileEventExpr(evSrc, false); err != nil {
		return m, nil
	}
	if m.runSide, err = compile(runSrc, false); err != nil {
		m.eventSide = nil
	}
	return m, nil
}

// keyedTerm finds, in e or in a term of its top-level conjunction, an
// equality one side of which reads only `event` and the other only the
// run (`input`, and `nodes` unless inputOnly). It returns the two sides,
// event side first, or nils.
func keyedTerm(e ast.Expr, inputOnly bool) (ast.Expr, ast.Expr) {
	if e.Kind() != ast.CallKind {
		return nil, nil
	}
	c := e.AsCall()
	switch {
	case c.FunctionName() == "_&&_":
		for _, a := range c.Args() {
			if ev, run := keyedTerm(a, inputOnly); ev != nil {
				return ev, run
			}
		}
	case c.FunctionName() == "_==_" && len(c.Args()) == 2:
		l, r := c.Args()[0], c.Args()[1]
		runVars := map[string]bool{"input": true, "nodes": !inputOnly}
		switch {
		case readsOnly(l, map[string]bool{"event": true}) && readsOnly(r, runVars):
			return l, r
		case readsOnly(r, map[string]bool{"event": true}) && readsOnly(l, runVars):
			return r, l
		}
	}
	return nil, nil
}

// readsOnly reports whether e reads at least one variable and only
// variables allowed (a comprehension's own variables disqualify it).
func readsOnly(e ast.Expr, allowed map[string]bool) bool {
	any, ok := false, true
	ast.PreOrderVisit(e, ast.NewExprVisitor(func(x ast.Expr) {
		switch x.Kind() {
		case ast.IdentKind:
			any = true
			if !allowed[x.AsIdent()] {
				ok = false
			}
		case ast.ComprehensionKind:
			ok = false
		}
	}))
	return any && ok
}

// matchKey writes a value as the canonical JSON the index compares: equal
// CEL values of JSON types give equal keys (object keys sorted, integral
// numbers without a fraction).
func matchKey(v ref.Val) (string, error) {
	nv, err := toNative(v, &budget{left: MaxMatchKeyBytes})
	if err != nil {
		return "", err
	}
	if f, ok := nv.(float64); ok && f == float64(int64(f)) {
		nv = int64(f)
	}
	b, err := json.Marshal(nv)
	if err != nil {
		return "", err
	}
	if len(b) > MaxMatchKeyBytes {
		return "", fmt.Errorf("%w: more than %d bytes", ErrValueTooLarge, MaxMatchKeyBytes)
	}
	return string(b), nil
}

// key evaluates the run side: the key expression (the event side's
// source) and the value the run waits for under it; both "" when the
// match is unkeyed.
func (m *eventMatch) key(s Scope) (string, string, error) {
	if m == nil || m.eventSide == nil {
		return "", "", nil
	}
	v, err := m.runSide.eval(s)
	if err != nil {
		return "", "", err
	}
	k, err := matchKey(v)
	if err != nil {
		return "", "", fmt.Errorf("%s: %w", m.runSide.source, err)
	}
	return m.eventSide.source, k, nil
}

func (m *eventMatch) matches(s Scope, e EventData) (bool, error) {
	if m == nil {
		return true, nil
	}
	act, err := s.activation(m.full.refs)
	if err != nil {
		return false, err
	}
	if act["event"], err = e.activation(); err != nil {
		return false, err
	}
	v, err := m.full.evalWith(act)
	if err != nil {
		return false, err
	}
	b, ok := v.Value().(bool)
	if !ok {
		return false, fmt.Errorf("%s: evaluated to %s, not a boolean", m.full.source, v.Type().TypeName())
	}
	return b, nil
}

// IsEventWait reports whether the node is a wait node waiting for a
// published event (rather than a signal).
func (n *Node) IsEventWait() bool { return n.Type == TypeWait && n.Wait != nil && n.Wait.Event != "" }

// EventKey is what an event wait registers when it starts waiting: the
// key expression and the value it waits for ("", "" when its match is
// not keyed: every event of its name is tried).
func (n *Node) EventKey(s Scope) (string, string, error) {
	if !n.IsEventWait() {
		return "", "", nil
	}
	expr, key, err := n.Wait.match.key(s)
	if err != nil {
		return "", "", fmt.Errorf("wait.match: %w", err)
	}
	return expr, key, nil
}

// MatchesEvent reports whether an event resolves the event wait: its name
// is the one waited for and the match holds over the run and the event.
func (n *Node) MatchesEvent(s Scope, e EventData) (bool, error) {
	if !n.IsEventWait() || n.Wait.Event != e.Name {
		return false, nil
	}
	ok, err := n.Wait.match.matches(s, e)
	if err != nil {
		return false, fmt.Errorf("wait.match: %w", err)
	}
	return ok, nil
}

// Key is what a cancel_on entry registers when the run starts (see
// Node.EventKey).
func (c *CancelOn) Key(input json.RawMessage) (string, string, error) {
	return c.match.key(Scope{Input: input})
}

// Matches reports whether an event cancels the run.
func (c *CancelOn) Matches(input json.RawMessage, e EventData) (bool, error) {
	if c.Event != e.Name {
		return false, nil
	}
	return c.match.matches(Scope{Input: input}, e)
}

// HasEventWaits reports whether the workflow registers anything in the
// index of waits (an event wait node or a cancel_on entry).
func (w *Workflow) HasEventWaits() bool {
	if len(w.CancelOn) > 0 {
		return true
	}
	for _, n := range w.Nodes {
		if n.IsEventWait() {
			return true
		}
	}
	return false
}

// keyPrograms caches the compiled event sides publishes evaluate, by
// source (they come from the index of waits, written from definitions);
// at most maxKeyPrograms are kept, the rest compiled each time.
var keyPrograms = struct {
	sync.Mutex
	m map[string]*program
}{m: map[string]*program{}}

const maxKeyPrograms = 10_000

func keyProgram(expr string) (*program, error) {
	keyPrograms.Lock()
	p := keyPrograms.m[expr]
	keyPrograms.Unlock()
	if p != nil {
		return p, nil
	}
	p, err := compileEventExpr(expr, false)
	if err != nil {
		return nil, err
	}
	keyPrograms.Lock()
	if len(keyPrograms.m) < maxKeyPrograms {
		keyPrograms.m[expr] = p
	}
	keyPrograms.Unlock()
	return p, nil
}

// EventKeyValue evaluates a key expression (an event side as EventKey
// returned it) over an event, giving the key waits registered under that
// expression must hold to match. An error means no wait keyed by expr can
// match the event (a field it reads is missing, say).
func EventKeyValue(expr string, e EventData) (string, error) {
	p, err := keyProgram(expr)
	if err != nil {
		return "", err
	}
	act, err := e.activation()
	if err != nil {
		return "", err
	}
	v, err := p.evalWith(map[string]any{"event": act})
	if err != nil {
		return "", err
	}
	return matchKey(v)
}

// compileEventMatches compiles the match of every event wait and every
// cancel_on entry, checking what they read.
func (w *Workflow) compileEventMatches(ps *problems) {
	for _, n := range w.Nodes {
		if !n.IsEventWait() || n.Wait.Match == "" {
			continue
		}
		m, err := compileMatch(n.Wait.Match, false)
		if err != nil {
			ps.add(n.ID, "wait.match", "%v", err)
			continue
		}
		up := w.ancestors(n.ID)
		bad := false
		for _, r := range m.full.refs {
			switch {
			case w.byID[r] == nil:
				ps.add(n.ID, "wait.match", "reads nodes.%s, which does not exist", r)
				bad = true
			case !up[r]:
				ps.add(n.ID, "wait.match", "reads nodes.%s, which is not upstream of %s (add it to depends_on)", r, n.ID)
				bad = true
			}
		}
		if !bad {
			n.Wait.match = m
		}
	}
	if len(w.CancelOn) > MaxCancelOn {
		ps.add("", "cancel_on", "%d entries; at most %d", len(w.CancelOn), MaxCancelOn)
		return
	}
	for i, c := range w.CancelOn {
		field := fmt.Sprintf("cancel_on[%d]", i)
		if c == nil {
			ps.add("", field, "is null")
			continue
		}
		if msg := ValidEventName(c.Event); msg != "" {
			ps.add("", field+".event", "%s", msg)
		}
		if c.Match == "" {
			continue
		}
		m, err := compileMatch(c.Match, true)
		if err != nil {
			ps.add("", field+".match", "%v", err)
			continue
		}
		c.match = m
	}
}
