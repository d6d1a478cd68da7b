package dag

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"

	"cel.dev/cel-go/cel"
)

// MaxTriggers bounds a workflow's event triggers.
const MaxTriggers = 10

// MaxEventNameChars bounds an event name and a trigger's pattern.
const MaxEventNameChars = 128

// Trigger starts a run of the workflow for each published event whose name
// matches Event and, when If is set, for which If (a CEL expression over
// `event`: {"id", "name", "payload"}) is true.
type Trigger struct {
	// Event is an event name or a pattern: dot-separated segments, where a
	// segment "*" matches any one segment ("order.*" matches
	// "order.created", not "order" nor "order.item.added").
	Event string `json:"event"`
	If    string `json:"if,omitempty"`
	// Priority is the priority of the runs the trigger starts
	// (MinPriority..MaxPriority, 0 by default).
	Priority int `json:"priority,omitempty"`

	cond *program
}

// eventSegment is one dot-separated segment of an event name.
var eventSegment = regexp.MustCompile(`^[A-Za-z0-9_:/-]+$`)

// ValidEventName reports what is wrong with a published event's name, or "".
func ValidEventName(name string) string {
	return checkEventName(name, false)
}

func checkEventName(name string, pattern bool) string {
	if name == "" {
		return "is required"
	}
	if len(name) > MaxEventNameChars {
		return fmt.Sprintf("is longer than %d characters", MaxEventNameChars)
	}
	for _, seg := range strings.Split(name, ".") {
		if pattern && seg == "*" {
			continue
		}
		if !eventSegment.MatchString(seg) {
			if pattern {
				return "must be dot-separated segments of letters, digits, '_', ':', '/' or '-', or a segment \"*\""
			}
			return "must be dot-separated segments of letters, digits, '_', ':', '/' or '-'"
		}
	}
	return ""
}

// Wildcard reports whether the trigger's pattern has a "*" segment.
func (t *Trigger) Wildcard() bool { return t.Prefix() != t.Event }

// Prefix is the literal part of the pattern before its first "*" segment
// (the whole pattern when it has none).
func (t *Trigger) Prefix() string {
	if t.Event == "*" || strings.HasPrefix(t.Event, "*.") {
		return ""
	}
	if i := strings.Index(t.Event, ".*"); i >= 0 {
		return t.Event[:i+1]
	}
	return t.Event
}

// Segments is the number of dot-separated segments the pattern matches.
func (t *Trigger) Segments() int { return strings.Count(t.Event, ".") + 1 }

// MatchesName reports whether an event name matches the trigger's pattern.
func (t *Trigger) MatchesName(name string) bool {
	ps, ns := strings.Split(t.Event, "."), strings.Split(name, ".")
	if len(ps) != len(ns) {
		return false
	}
	for i := range ps {
		if ps[i] != "*" && ps[i] != ns[i] {
			return false
		}
	}
	return true
}

// Matches reports whether the event (payload a JSON object) passes the
// trigger's condition; the name is not checked (see MatchesName).
func (t *Trigger) Matches(id, name string, payload json.RawMessage) (bool, error) {
	if t.cond == nil {
		return true, nil
	}
	p, err := DecodeJSON(payload)
	if err != nil {
		return false, fmt.Errorf("payload: %w", err)
	}
	v, err := t.cond.evalWith(map[string]any{"event": map[string]any{"id": id, "name": name, "payload": p}})
	if err != nil {
		return false, err
	}
	b, ok := v.Value().(bool)
	if !ok {
		return false, fmt.Errorf("%s: is not a boolean", t.cond.source)
	}
	return b, nil
}

var (
	eventEnvOnce sync.Once
	eventEnv     *cel.Env
	eventEnvErr  error
)

// compileEventExpr compiles an expression whose only variable is `event`:
// a trigger's condition (wantBool), or the event side of a keyed match.
func compileEventExpr(src string, wantBool bool) (*program, error) {
	eventEnvOnce.Do(func() { eventEnv, eventEnvErr = newEnv(cel.Variable("event", cel.DynType)) })
	if eventEnvErr != nil {
		return nil, eventEnvErr
	}
	p, _, err := compileIn(eventEnv, src, wantBool)
	return p, err
}

func (w *Workflow) validateTriggers(ps *problems) {
	if len(w.Triggers) > MaxTriggers {
		ps.add("", "triggers", "%d triggers; at most %d", len(w.Triggers), MaxTriggers)
		return
	}
	seen := map[string]bool{}
	for i, t := range w.Triggers {
		field := fmt.Sprintf("triggers[%d]", i)
		if t == nil {
			ps.add("", field, "is null")
			continue
		}
		if msg := checkEventName(t.Event, true); msg != "" {
			ps.add("", field+".event", "%s", msg)
		}
		if t.Priority < MinPriority || t.Priority > MaxPriority {
			ps.add("", field+".priority", "must be between %d and %d", MinPriority, MaxPriority)
		}
		key := t.Event + "\x00" + t.If
		if seen[key] {
			ps.add("", field, "repeats an earlier trigger")
		}
		seen[key] = true
		if t.If != "" {
			p, err := compileEventExpr(t.If, true)
			if err != nil {
				ps.add("", field+".if", "%v", err)
				continue
			}
			t.cond = p
		}
	}
}
