package dag

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"
	"cel.dev/cel-go/ext"
)

// costLimit bounds the work one expression evaluation may do, so a
// definition cannot stall the coordinator with a pathological expression.
const costLimit = 100_000

// MaxValueBytes bounds what one evaluation may produce — a node's whole
// input, a run's output — as JSON, so a mapping cannot amplify its input
// (64 keys that each copy a 1 MiB input would otherwise make 64 MiB).
const MaxValueBytes = 1 << 20

// ErrValueTooLarge is the error of an evaluation whose value is larger
// than MaxValueBytes.
var ErrValueTooLarge = errors.New("value too large")

var (
	envOnce sync.Once
	celEnv  *cel.Env
	envErr  error
)

// env is the CEL environment of every expression: `input` is the run input
// and `nodes.<id>` holds {"status": ..., "output": ...} of finished nodes.
func env() (*cel.Env, error) {
	envOnce.Do(func() {
		celEnv, envErr = newEnv(
			cel.Variable("input", cel.DynType),
			cel.Variable("nodes", cel.MapType(cel.StringType, cel.DynType)))
	})
	return celEnv, envErr
}

// newEnv is a CEL environment of the given variables with what every
// expression gets: the standard extensions for strings, encoders, math and
// lists, and bounds on size and nesting.
func newEnv(vars ...cel.EnvOption) (*cel.Env, error) {
	return cel.NewEnv(append(vars,
		ext.Strings(), ext.Encoders(), ext.Math(), ext.Lists(),
		cel.ParserExpressionSizeLimit(MaxExpressionBytes),
		cel.ParserRecursionLimit(64))...)
}

type program struct {
	source string
	prg    cel.Program
	refs   []string // node ids read through nodes.<id>
}

// compile checks and plans one expression. wantBool demands a boolean (or
// dyn) result.
func compile(src string, wantBool bool) (*program, error) {
	e, err := env()
	if err != nil {
		return nil, err
	}
	p, _, err := compileIn(e, src, wantBool)
	return p, err
}

// compileIn checks and plans src in e, returning the checked AST too.
func compileIn(e *cel.Env, src string, wantBool bool) (*program, *ast.AST, error) {
	if strings.TrimSpace(src) == "" {
		return nil, nil, errors.New("expression is empty")
	}
	checked, iss := e.Compile(src)
	if iss != nil && iss.Err() != nil {
		return nil, nil, fmt.Errorf("does not compile: %s", oneLine(iss.Err().Error()))
	}
	if wantBool {
		out := checked.OutputType()
		if !out.IsExactType(types.BoolType) && !out.IsExactType(types.DynType) {
			return nil, nil, fmt.Errorf("must be a boolean expression, not %s", out)
		}
	}
	prg, err := e.Program(checked, cel.EvalOptions(cel.OptOptimize), cel.CostLimit(costLimit))
	if err != nil {
		return nil, nil, fmt.Errorf("does not compile: %s", oneLine(err.Error()))
	}
	native := checked.NativeRep()
	return &program{source: src, prg: prg, refs: nodeRefs(native)}, native, nil
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}

// nodeRefs lists the node ids an expression reads as nodes.<id> or
// nodes["<id>"].
func nodeRefs(a *ast.AST) []string {
	refs, _ := namedRefs(a, "nodes")
	return refs
}

// namedRefs lists the keys an expression reads of a map variable by name
// (variable.<key> or variable["<key>"]), sorted, and the ids of the
// variable's identifier expressions so used.
func namedRefs(a *ast.AST, variable string) ([]string, map[int64]bool) {
	seen := map[string]bool{}
	operands := map[int64]bool{}
	ast.PreOrderVisit(a.Expr(), ast.NewExprVisitor(func(e ast.Expr) {
		switch e.Kind() {
		case ast.SelectKind:
			s := e.AsSelect()
			if op := s.Operand(); op.Kind() == ast.IdentKind && op.AsIdent() == variable {
				seen[s.FieldName()] = true
				operands[op.ID()] = true
			}
		case ast.CallKind:
			c := e.AsCall()
			if c.FunctionName() == "_[_]" && len(c.Args()) == 2 {
				op, key := c.Args()[0], c.Args()[1]
				if op.Kind() == ast.IdentKind && op.AsIdent() == variable && key.Kind() == ast.LiteralKind {
					if s, ok := key.AsLiteral().Value().(string); ok {
						seen[s] = true
						operands[op.ID()] = true
					}
				}
			}
		}
	}))
	return slices.Sorted(maps.Keys(seen)), operands
}

// NodeResult is what expressions see of a finished upstream node.
type NodeResult struct {
	Status string
	Output json.RawMessage
}

// Scope is the data expressions are evaluated over.
type Scope struct {
	Input json.RawMessage
	Nodes map[string]NodeResult
}

// activation decodes the scope lazily: only the nodes an expression reads.
func (s Scope) activation(refs []string) (map[string]any, error) {
	in, err := DecodeJSON(s.Input)
	if err != nil {
		return nil, fmt.Errorf("run input: %w", err)
	}
	nodes := make(map[string]any, len(refs))
	for _, id := range refs {
		r, ok := s.Nodes[id]
		if !ok {
			continue
		}
		out, err := DecodeJSON(r.Output)
		if err != nil {
			return nil, fmt.Errorf("output of %s: %w", id, err)
		}
		nodes[id] = map[string]any{"status": r.Status, "output": out}
	}
	return map[string]any{"input": in, "nodes": nodes}, nil
}

func (p *program) eval(s Scope) (ref.Val, error) {
	act, err := s.activation(p.refs)
	if err != nil {
		return nil, err
	}
	return p.evalWith(act)
}

func (p *program) evalWith(act map[string]any) (ref.Val, error) {
	v, _, err := p.prg.Eval(act)
	if err != nil {
		return nil, fmt.Errorf("%s: %s", p.source, oneLine(err.Error()))
	}
	return v, nil
}

// EvalIf evaluates the node's `if`; a node without one runs.
func (n *Node) EvalIf(s Scope) (bool, error) {
	if n.cond == nil {
		return true, nil
	}
	v, err := n.cond.eval(s)
	if err != nil {
		return false, err
	}
	b, ok := v.Value().(bool)
	if !ok {
		return false, fmt.Errorf("%s: evaluated to %s, not a boolean", n.cond.source, v.Type().TypeName())
	}
	return b, nil
}

// WakeAt is when a sleep node that starts now wakes: now plus its
// duration, or the instant its until expression names (now when that is
// past). An until more than MaxDuration away, or not a timestamp, is an
// error.
func (n *Node) WakeAt(s Scope, now time.Time) (time.Time, error) {
	if n.Sleep == nil {
		return now, nil
	}
	if n.Sleep.until == nil {
		return now.Add(n.Sleep.Duration.Std()), nil
	}
	v, err := n.Sleep.until.eval(s)
	if err != nil {
		return time.Time{}, fmt.Errorf("sleep.until: %w", err)
	}
	var at time.Time
	switch x := v.(type) {
	case types.Timestamp:
		at = x.Time
	case types.String:
		if at, err = time.Parse(time.RFC3339Nano, string(x)); err != nil {
			return time.Time{}, fmt.Errorf("sleep.until: %s evaluated to %q, not an RFC 3339 timestamp", n.Sleep.until.source, oneLine(string(x)))
		}
	default:
		return time.Time{}, fmt.Errorf("sleep.until: %s evaluated to %s, not a timestamp", n.Sleep.until.source, v.Type().TypeName())
	}
	if at.Sub(now) > MaxDuration {
		return time.Time{}, fmt.Errorf("sleep.until: %s is more than %s away", at.UTC().Format(time.RFC3339), MaxDuration)
	}
	if at.Before(now) {
		return now, nil
	}
	return at, nil
}

// RateKey evaluates the node's rate-limit key: "" for a node without a
// rate limit or a key. Strings are kept, numbers and booleans written as
// JSON writes them; anything else, or a value longer than MaxRateKeyChars,
// is an error.
func (n *Node) RateKey(s Scope) (string, error) {
	if n.RateLimit == nil || n.RateLimit.key == nil {
		return "", nil
	}
	p := n.RateLimit.key
	v, err := p.eval(s)
	if err != nil {
		return "", fmt.Errorf("rate_limit.key: %w", err)
	}
	return rateKeyValue(p, v)
}

// ItemRateKey is RateKey of a map node's step for element index (its key
// also sees `item` and `index`).
func (n *Node) ItemRateKey(s Scope, item any, index int) (string, error) {
	st := n.Map.Step
	if st.RateLimit == nil || st.RateLimit.key == nil {
		return "", nil
	}
	p := st.RateLimit.key
	act, err := s.activation(p.refs)
	if err != nil {
		return "", err
	}
	act["item"], act["index"] = item, int64(index)
	v, err := p.evalWith(act)
	if err != nil {
		return "", fmt.Errorf("map.step.rate_limit.key: %w", err)
	}
	return rateKeyValue(p, v)
}

func rateKeyValue(p *program, v ref.Val) (string, error) {
	nv, err := toNative(v, &budget{left: 4 * MaxRateKeyChars})
	if err != nil {
		return "", fmt.Errorf("rate_limit.key: %w", err)
	}
	var key string
	switch x := nv.(type) {
	case string:
		key = x
	case bool, float64, int64, uint64, json.Number:
		b, _ := json.Marshal(x)
		key = string(b)
	default:
		return "", fmt.Errorf("rate_limit.key: %s is not a string, number or boolean", p.source)
	}
	if len(key) > MaxRateKeyChars {
		return "", fmt.Errorf("rate_limit.key: %s evaluated to more than %d characters", p.source, MaxRateKeyChars)
	}
	return key, nil
}

// EvalInput evaluates the node's input mapping into a JSON object; a node
// without a mapping gets the run input unchanged.
func (n *Node) EvalInput(s Scope) (json.RawMessage, error) {
	if len(n.input) == 0 {
		if len(s.Input) == 0 {
			return json.RawMessage("{}"), nil
		}
		return s.Input, nil
	}
	return evalObject("input", n.input, s)
}

// EvalOutput evaluates the workflow's output mapping. Without one the output
// is an object of the sink nodes' outputs, keyed by node id.
func (w *Workflow) EvalOutput(s Scope) (json.RawMessage, error) {
	if len(w.output) > 0 {
		return evalObject("output", w.output, s)
	}
	out := make(map[string]json.RawMessage, len(w.sinks))
	size := 2
	for _, id := range w.sinks {
		if r, ok := s.Nodes[id]; ok && r.Status == "completed" && len(r.Output) > 0 {
			out[id] = r.Output
			if size += len(id) + 4 + len(r.Output); size > MaxValueBytes {
				return nil, fmt.Errorf("the outputs of the sink nodes: %w: more than %d bytes (give the workflow an output mapping)",
					ErrValueTooLarge, MaxValueBytes)
			}
		}
	}
	return json.Marshal(out)
}

// Run metadata bounds: keys, the characters of a key, a value's length and
// the JSON size of the whole object.
const (
	MaxMetadataKeys       = 16
	MaxMetadataValueChars = 256
	MaxMetadataBytes      = 4 << 10
)

// MetadataKey is what a metadata key looks like.
var MetadataKey = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.-]{0,63}$`)

// EvalMetadata evaluates the workflow's metadata mapping over the run
// input. Strings are kept, numbers and booleans written as JSON writes
// them; null leaves the key out; anything else is an error naming the key.
func (w *Workflow) EvalMetadata(input json.RawMessage) (map[string]string, error) {
	if len(w.metadata) == 0 {
		return nil, nil
	}
	act, err := Scope{Input: input}.activation(nil)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(w.metadata))
	for _, k := range slices.Sorted(maps.Keys(w.metadata)) {
		v, err := w.metadata[k].evalWith(act)
		if err != nil {
			return nil, fmt.Errorf("metadata.%s: %w", k, err)
		}
		nv, err := toNative(v, &budget{left: MaxMetadataBytes})
		if err != nil {
			return nil, fmt.Errorf("metadata.%s: %w", k, err)
		}
		switch x := nv.(type) {
		case nil:
			continue
		case string:
			out[k] = x
		case bool, float64, int64, uint64, json.Number:
			b, _ := json.Marshal(x)
			out[k] = string(b)
		default:
			return nil, fmt.Errorf("metadata.%s: %s is not a string, number or boolean", k, w.metadata[k].source)
		}
	}
	return out, nil
}

// evalObject evaluates a mapping into a JSON object of at most
// MaxValueBytes. The scope is decoded once for all its expressions.
func evalObject(field string, progs map[string]*program, s Scope) (json.RawMessage, error) {
	return evalObjectWith(field, progs, s, nil)
}

// evalObjectWith is evalObject with more variables in the activation.
func evalObjectWith(field string, progs map[string]*program, s Scope, extra map[string]any) (json.RawMessage, error) {
	var refs []string
	keys := make([]string, 0, len(progs))
	for k, p := range progs {
		refs = append(refs, p.refs...)
		keys = append(keys, k)
	}
	sort.Strings(keys)
	act, err := s.activation(refs)
	if err != nil {
		return nil, err
	}
	maps.Copy(act, extra)
	b := &budget{left: MaxValueBytes}
	out := make(map[string]any, len(progs))
	for _, k := range keys {
		v, err := progs[k].evalWith(act)
		if err != nil {
			return nil, fmt.Errorf("%s.%s: %w", field, k, err)
		}
		if err := b.spend(len(k) + 4); err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		nv, err := toNative(v, b)
		if err != nil {
			return nil, fmt.Errorf("%s.%s: %w", field, k, err)
		}
		out[k] = nv
	}
	return json.Marshal(out)
}

// budget counts the JSON size of converted values (a close upper bound)
// and stops a conversion as soon as it is spent, before anything large is
// built.
type budget struct{ left int }

func (b *budget) spend(n int) error {
	if b.left -= n; b.left < 0 {
		return fmt.Errorf("%w: more than %d bytes", ErrValueTooLarge, MaxValueBytes)
	}
	return nil
}

// DecodeJSON decodes JSON for CEL: integral numbers become int64 (so
// `input.n + 1` type-checks at run time), others float64.
func DecodeJSON(b json.RawMessage) (any, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return map[string]any{}, nil
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	return numbers(v), nil
}

func numbers(v any) any {
	switch x := v.(type) {
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i
		}
		f, _ := x.Float64()
		return f
	case map[string]any:
		for k, e := range x {
			x[k] = numbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = numbers(e)
		}
	}
	return v
}

// toNative converts a CEL value into plain Go values that encoding/json
// writes, charging their size to b.
func toNative(v ref.Val, b *budget) (any, error) {
	switch x := v.(type) {
	case types.Null:
		return nil, b.spend(4)
	case types.String:
		return x.Value(), b.spend(len(x) + 2)
	case types.Bool, types.Int, types.Uint:
		return x.Value(), b.spend(21)
	case types.Double:
		f := float64(x)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("%v cannot be written as JSON", f)
		}
		return f, b.spend(24)
	case types.Bytes:
		return x.Value(), b.spend(len(x)*4/3 + 4) // base64 in JSON
	case types.Duration:
		return x.Duration.String(), b.spend(24)
	case types.Timestamp:
		return x.Time.UTC().Format(time.RFC3339Nano), b.spend(32)
	case traits.Lister:
		n := x.Size().(types.Int)
		if err := b.spend(2 + int(n)); err != nil {
			return nil, err
		}
		out := make([]any, 0, int(n))
		for i := types.Int(0); i < n; i++ {
			e, err := toNative(x.Get(i), b)
			if err != nil {
				return nil, err
			}
			out = append(out, e)
		}
		return out, nil
	case traits.Mapper:
		out := map[string]any{}
		it := x.Iterator()
		for it.HasNext() == types.True {
			k := it.Next()
			ks, ok := k.Value().(string)
			if !ok {
				return nil, fmt.Errorf("map key %v is not a string", k.Value())
			}
			if err := b.spend(len(ks) + 4); err != nil {
				return nil, err
			}
			e, err := toNative(x.Get(k), b)
			if err != nil {
				return nil, err
			}
			out[ks] = e
		}
		return out, nil
	}
	switch x := v.Value().(type) {
	case nil, bool, string, int64, uint64, float64, map[string]any, []any:
		// Plain Go values (from decoded JSON): charge their encoded size.
		enc, err := json.Marshal(x)
		if err != nil {
			return nil, err
		}
		return x, b.spend(len(enc))
	}
	return nil, fmt.Errorf("value of type %s cannot be written as JSON", v.Type().TypeName())
}

var (
	itemEnvOnce sync.Once
	itemEnv     *cel.Env
	itemEnvErr  error
)

// compileItemExpr compiles an expression of a map step's input mapping:
// the run's variables and the element (`item`) and its position (`index`).
func compileItemExpr(src string) (*program, error) {
	itemEnvOnce.Do(func() {
		itemEnv, itemEnvErr = newEnv(
			cel.Variable("input", cel.DynType),
			cel.Variable("nodes", cel.MapType(cel.StringType, cel.DynType)),
			cel.Variable("item", cel.DynType),
			cel.Variable("index", cel.IntType))
	})
	if itemEnvErr != nil {
		return nil, itemEnvErr
	}
	p, _, err := compileIn(itemEnv, src, false)
	return p, err
}

// EvalItems evaluates a map node's items: a list of at most MaxMapItems
// elements, as plain JSON values, within MaxValueBytes.
func (n *Node) EvalItems(s Scope) ([]any, error) {
	if n.Map == nil || n.Map.items == nil {
		return nil, fmt.Errorf("map.items: not a map node")
	}
	v, err := n.Map.items.eval(s)
	if err != nil {
		return nil, fmt.Errorf("map.items: %w", err)
	}
	l, ok := v.(traits.Lister)
	if !ok {
		return nil, fmt.Errorf("map.items: %s evaluated to %s, not a list", n.Map.items.source, v.Type().TypeName())
	}
	if size := int(l.Size().(types.Int)); size > MaxMapItems {
		return nil, fmt.Errorf("map.items: %d elements; a map runs at most %d", size, MaxMapItems)
	}
	nv, err := toNative(v, &budget{left: MaxValueBytes})
	if err != nil {
		return nil, fmt.Errorf("map.items: %w", err)
	}
	return nv.([]any), nil
}

// EvalItemInput evaluates the input of a map node's step for element
// index: its input mapping over the scope, `item` and `index`, or
// {"item": item, "index": index} without one.
func (n *Node) EvalItemInput(s Scope, item any, index int) (json.RawMessage, error) {
	st := n.Map.Step
	if len(st.input) == 0 {
		b, err := json.Marshal(map[string]any{"item": item, "index": index})
		if err != nil {
			return nil, fmt.Errorf("map.step.input: %w", err)
		}
		if len(b) > MaxValueBytes {
			return nil, fmt.Errorf("map.step.input: %w: more than %d bytes", ErrValueTooLarge, MaxValueBytes)
		}
		return b, nil
	}
	out, err := evalObjectWith("map.step.input", st.input, s, map[string]any{"item": item, "index": int64(index)})
	if err != nil {
		return nil, err
	}
	return out, nil
}
