package dag

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Problem is one thing wrong with a definition.
type Problem struct {
	// Node is the id of the node at fault ("" for the workflow itself).
	Node string `json:"node,omitempty"`
	// Field is the offending field, e.g. "depends_on" or "input.amount".
	Field string `json:"field,omitempty"`
	// Message says what is wrong.
	Message string `json:"message"`
}

func (p Problem) String() string {
	var b strings.Builder
	if p.Node != "" {
		fmt.Fprintf(&b, "node %q: ", p.Node)
	}
	if p.Field != "" {
		fmt.Fprintf(&b, "%s: ", p.Field)
	}
	b.WriteString(p.Message)
	return b.String()
}

// ValidationError lists every problem found in a definition.
type ValidationError struct {
	Problems []Problem
}

func (e *ValidationError) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = p.String()
	}
	return "invalid workflow definition: " + strings.Join(parts, "; ")
}

// Parse reads a definition from JSON or YAML, validates and compiles it.
// Problems are returned as a *ValidationError.
func Parse(data []byte) (*Workflow, error) {
	if len(data) > MaxDefinitionBytes {
		return nil, &ValidationError{[]Problem{{Message: fmt.Sprintf("definition is %d bytes; the limit is %d", len(data), MaxDefinitionBytes)}}}
	}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return nil, &ValidationError{[]Problem{{Message: "definition is empty"}}}
	}
	if trimmed[0] != '{' {
		j, err := yamlToJSON(trimmed)
		if err != nil {
			return nil, &ValidationError{[]Problem{{Message: "not valid JSON or YAML: " + oneLine(err.Error())}}}
		}
		trimmed = j
	}
	w, problems := decode(trimmed)
	if len(problems) == 0 {
		problems = w.validate()
	}
	if len(problems) > 0 {
		return nil, &ValidationError{problems}
	}
	return w, nil
}

// MustParse is Parse for definitions known to be valid (tests, examples).
func MustParse(data string) *Workflow {
	w, err := Parse([]byte(data))
	if err != nil {
		panic(err)
	}
	return w
}

// Canonical returns the definition as compact JSON, the form stored in a
// workflow version.
func (w *Workflow) Canonical() json.RawMessage {
	b, err := json.Marshal(w)
	if err != nil {
		panic(fmt.Sprintf("dag: marshal a parsed workflow: %v", err)) // all fields are plain data
	}
	return b
}

type rawWorkflow struct {
	Name        string            `json:"name"`
	Description string            `json:"description"`
	Timeout     json.RawMessage   `json:"timeout"`
	Output      map[string]string `json:"output"`
	Metadata    map[string]string `json:"metadata"`
	Triggers    []*Trigger        `json:"triggers"`
	CancelOn    []*CancelOn       `json:"cancel_on"`
	Concurrency *ConcurrencySpec  `json:"concurrency"`
	Nodes       []json.RawMessage `json:"nodes"`
}

// decode reads the structure strictly, node by node, so an unknown or
// mistyped field is reported against the node that holds it.
func decode(data []byte) (*Workflow, []Problem) {
	var raw rawWorkflow
	if err := strictUnmarshal(data, &raw); err != nil {
		return nil, []Problem{{Message: jsonProblem(err)}}
	}
	w := &Workflow{Name: raw.Name, Description: raw.Description, Output: raw.Output, Metadata: raw.Metadata, Triggers: raw.Triggers,
		CancelOn: raw.CancelOn, Concurrency: raw.Concurrency}
	var problems []Problem
	if len(raw.Timeout) > 0 && string(raw.Timeout) != "null" {
		if err := json.Unmarshal(raw.Timeout, &w.Timeout); err != nil {
			problems = append(problems, Problem{Field: "timeout", Message: err.Error()})
		}
	}
	for i, rn := range raw.Nodes {
		n := &Node{}
		if err := strictUnmarshal(rn, n); err != nil {
			var probe struct {
				ID string `json:"id"`
			}
			_ = json.Unmarshal(rn, &probe)
			label := probe.ID
			if label == "" {
				label = fmt.Sprintf("nodes[%d]", i)
			}
			problems = append(problems, Problem{Node: label, Field: durationField(rn), Message: jsonProblem(err)})
			continue
		}
		w.Nodes = append(w.Nodes, n)
	}
	return w, problems
}

func strictUnmarshal(data []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return errors.New("trailing data after the definition")
	}
	return nil
}

// jsonProblem turns encoding/json errors into messages that name the field.
func jsonProblem(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field != "" {
			return fmt.Sprintf("field %s: expected %s, got JSON %s", te.Field, te.Type, te.Value)
		}
		return fmt.Sprintf("expected %s, got JSON %s", te.Type, te.Value)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("invalid JSON at byte %d: %s", se.Offset, se.Error())
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return "invalid JSON: unexpected end of input"
	}
	msg := err.Error()
	if f, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		return "unknown field " + f
	}
	return strings.TrimPrefix(msg, "json: ")
}

// durationField finds which duration field of a node failed to decode, so
// the problem can name it (encoding/json does not for custom types).
func durationField(raw json.RawMessage) string {
	var probe struct {
		Timeout                json.RawMessage `json:"timeout"`
		ScheduleToStartTimeout json.RawMessage `json:"schedule_to_start_timeout"`
		Retry                  *struct {
			Backoff    json.RawMessage `json:"backoff"`
			MaxBackoff json.RawMessage `json:"max_backoff"`
		} `json:"retry"`
		HTTP *struct {
			Timeout json.RawMessage `json:"timeout"`
		} `json:"http"`
		Sleep *struct {
			Duration json.RawMessage `json:"duration"`
		} `json:"sleep"`
		Wait *struct {
			Timeout json.RawMessage `json:"timeout"`
		} `json:"wait"`
	}
	if json.Unmarshal(raw, &probe) != nil {
		return ""
	}
	type field struct {
		name string
		raw  json.RawMessage
	}
	fields := []field{{"timeout", probe.Timeout}, {"schedule_to_start_timeout", probe.ScheduleToStartTimeout}}
	if probe.Retry != nil {
		fields = append(fields, field{"retry.backoff", probe.Retry.Backoff}, field{"retry.max_backoff", probe.Retry.MaxBackoff})
	}
	if probe.HTTP != nil {
		fields = append(fields, field{"http.timeout", probe.HTTP.Timeout})
	}
	if probe.Sleep != nil {
		fields = append(fields, field{"sleep.duration", probe.Sleep.Duration})
	}
	if probe.Wait != nil {
		fields = append(fields, field{"wait.timeout", probe.Wait.Timeout})
	}
	for _, f := range fields {
		var d Duration
		if len(f.raw) > 0 && string(f.raw) != "null" && json.Unmarshal(f.raw, &d) != nil {
			return f.name
		}
	}
	return ""
}

// yamlToJSON converts a YAML 1.2 document (so `n: 1` keeps the key "n",
// unlike YAML 1.1's booleans) into JSON.
func yamlToJSON(data []byte) ([]byte, error) {
	var v any
	if err := yaml.Unmarshal(data, &v); err != nil {
		return nil, err
	}
	v, err := jsonable(v)
	if err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

func jsonable(v any) (any, error) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			c, err := jsonable(e)
			if err != nil {
				return nil, err
			}
			x[k] = c
		}
		return x, nil
	case map[any]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("map key %v is not a string", k)
			}
			c, err := jsonable(e)
			if err != nil {
				return nil, err
			}
			out[ks] = c
		}
		return out, nil
	case []any:
		for i, e := range x {
			c, err := jsonable(e)
			if err != nil {
				return nil, err
			}
			x[i] = c
		}
		return x, nil
	}
	return v, nil
}
