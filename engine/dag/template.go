package dag

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
)

// An http node's url, query values and header values are templates:
// literal text with {{ expression }} segments. A segment is CEL over the
// run input and upstream outputs (input, nodes), evaluated when the task
// is created, like the node's input; or over the tenant's secrets
// (secrets.NAME) and nothing else, kept as it is until the platform's
// HTTP executor evaluates it for the attempt it runs, so a secret's value
// never enters the task, its timeline or its errors.
//
//	"url": "https://api.example.com/orders/{{ input.order_id }}",
//	"query": {"since": "{{ nodes.last.output.body.cursor }}"},
//	"headers": {"Authorization": "Bearer {{ secrets.API_TOKEN }}"}
//
// A segment's value is a string, number or boolean (null is empty, and
// leaves a query parameter out). In the url, values are percent-escaped
// for where they land — a path segment (so "a/b" stays one segment, and
// ".." is no dot segment) or the query — and segments may only appear
// after the host: the scheme, host
// and port are literal.

// Bounds of templates and of what they render (input can be large).
const (
	MaxQueryParams  = 64
	MaxTemplateSize = 8 << 10
	// MaxRenderedValue bounds a rendered url, query value or header value.
	MaxRenderedValue = 16 << 10
	// MaxRenderedRequest bounds everything one request renders.
	MaxRenderedRequest = 64 << 10
)

var secretNamePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// ValidSecretName reports whether s can name a secret (secrets.NAME).
func ValidSecretName(s string) bool { return secretNamePattern.MatchString(s) }

// Escaping of a rendered url segment.
const (
	EscapeNone  = ""
	EscapePath  = "path"
	EscapeQuery = "query"
)

// Part is one piece of a rendered value: literal text, or an expression
// over secrets for the executor (EvalSecretPart) with the escaping it gets.
type Part struct {
	Text   string `json:"text,omitempty"`
	Secret string `json:"secret,omitempty"`
	Escape string `json:"escape,omitempty"`
}

// Value is a rendered value: Text when no part reads a secret, else Parts.
type Value struct {
	Text  string
	Parts []Part
}

// Param is a rendered query parameter.
type Param struct {
	Name  string
	Value Value
}

// Request is an http node's request as rendered for one task.
type Request struct {
	URL     Value
	Query   []Param
	Headers map[string]Value
	// Secrets names the secrets the parts read, sorted.
	Secrets []string
}

type segment struct {
	text   string
	prog   *program // over input and nodes
	secret string   // source of an expression over secrets only
	escape string
	// constant marks an expression that reads nothing (`{{ "abc" }}`):
	// literal text written another way.
	constant bool
}

type template struct {
	segments []segment
	static   bool
}

// parseTemplate splits s into literal text and {{ }} segments, compiling
// each. inURL marks the url, whose segments are escaped by position and
// may not precede the path.
func parseTemplate(s string, inURL bool, env func() (*cel.Env, error)) (*template, []string, error) {
	if len(s) > MaxTemplateSize {
		return nil, nil, fmt.Errorf("is longer than %d bytes", MaxTemplateSize)
	}
	t := &template{static: true}
	var names []string
	escape := EscapePath
	rest := s
	var literal strings.Builder
	for {
		i := strings.Index(rest, "{{")
		if i < 0 {
			if strings.Contains(rest, "}}") {
				return nil, nil, errors.New(`has "}}" without "{{"`)
			}
			t.segments = append(t.segments, segment{text: rest})
			literal.WriteString(rest)
			break
		}
		text := rest[:i]
		if strings.Contains(text, "}}") {
			return nil, nil, errors.New(`has "}}" without "{{"`)
		}
		literal.WriteString(text)
		if inURL {
			if t.static && !pathStarted(literal.String()) {
				return nil, nil, errors.New("may use {{ }} only in its path and query: the scheme, host and port are literal")
			}
			if strings.ContainsAny(literal.String(), "?#") {
				escape = EscapeQuery
			}
		}
		t.segments = append(t.segments, segment{text: text})
		end := strings.Index(rest[i+2:], "}}")
		if end < 0 {
			return nil, nil, errors.New(`has "{{" without "}}"`)
		}
		src := strings.TrimSpace(rest[i+2 : i+2+end])
		rest = rest[i+2+end+2:]
		seg, reads, err := compileSegment(src, env)
		if err != nil {
			return nil, nil, fmt.Errorf("{{ %s }}: %w", src, err)
		}
		if inURL {
			seg.escape = escape
		}
		t.segments = append(t.segments, seg)
		t.static = false
		names = append(names, reads...)
	}
	return t, names, nil
}

// pathStarted reports whether literal url text has reached its path or
// query (past "scheme://host[:port]").
func pathStarted(s string) bool {
	_, after, ok := strings.Cut(s, "://")
	return ok && strings.ContainsAny(after, "/?#")
}

var (
	secretsVar = cel.Variable("secrets", cel.MapType(cel.StringType, cel.StringType))
	// templateEnv compiles segments: input, nodes and secrets.
	templateEnv = sync.OnceValues(func() (*cel.Env, error) {
		return newEnv(cel.Variable("input", cel.DynType), cel.Variable("nodes", cel.MapType(cel.StringType, cel.DynType)), secretsVar)
	})
	// itemTemplateEnv compiles a map step's segments: item and index too.
	itemTemplateEnv = sync.OnceValues(func() (*cel.Env, error) {
		return newEnv(cel.Variable("input", cel.DynType), cel.Variable("nodes", cel.MapType(cel.StringType, cel.DynType)),
			cel.Variable("item", cel.DynType), cel.Variable("index", cel.IntType), secretsVar)
	})
	// secretsEnv evaluates segments over secrets: secrets alone.
	secretsEnv = sync.OnceValues(func() (*cel.Env, error) { return newEnv(secretsVar) })
)

func compileSegment(src string, env func() (*cel.Env, error)) (segment, []string, error) {
	e, err := env()
	if err != nil {
		return segment{}, nil, err
	}
	p, native, err := compileIn(e, src, false)
	if err != nil {
		return segment{}, nil, err
	}
	idents, names, dynamic := secretRefs(native)
	if !idents["secrets"] {
		constant := !idents["input"] && !idents["nodes"] && !idents["item"] && !idents["index"]
		return segment{prog: p, constant: constant}, nil, nil
	}
	switch {
	case idents["input"] || idents["nodes"] || idents["item"] || idents["index"]:
		return segment{}, nil, errors.New("reads secrets and the run's data: an expression over secrets may read nothing else (use one {{ }} for each)")
	case dynamic:
		return segment{}, nil, errors.New(`reads secrets other than by name: write secrets.NAME or secrets["NAME"]`)
	}
	for _, n := range names {
		if !ValidSecretName(n) {
			return segment{}, nil, fmt.Errorf("secrets.%s: a secret name is 1-64 letters, digits and _, not starting with a digit", n)
		}
	}
	if _, err := compileSecret(src); err != nil {
		return segment{}, nil, err
	}
	return segment{secret: src}, names, nil
}

// secretRefs lists the variables an expression reads, the secret names it
// reads as secrets.NAME or secrets["NAME"], and whether it uses secrets in
// any other way.
func secretRefs(a *ast.AST) (idents map[string]bool, names []string, dynamic bool) {
	names, byName := namedRefs(a, "secrets")
	idents = map[string]bool{}
	ast.PreOrderVisit(a.Expr(), ast.NewExprVisitor(func(e ast.Expr) {
		if e.Kind() == ast.IdentKind {
			idents[e.AsIdent()] = true
			dynamic = dynamic || (e.AsIdent() == "secrets" && !byName[e.ID()])
		}
	}))
	return idents, names, dynamic
}

var secretProgs sync.Map // source -> *program; bounded by secretProgsMax

const secretProgsMax = 4096

var secretProgsLen struct {
	sync.Mutex
	n int
}

// compileSecret compiles an expression over secrets alone, once per
// source (the executor evaluates the same few over and over).
func compileSecret(src string) (*program, error) {
	if p, ok := secretProgs.Load(src); ok {
		return p.(*program), nil
	}
	e, err := secretsEnv()
	if err != nil {
		return nil, err
	}
	p, _, err := compileIn(e, src, false)
	if err != nil {
		return nil, err
	}
	secretProgsLen.Lock()
	if secretProgsLen.n >= secretProgsMax {
		secretProgs.Clear()
		secretProgsLen.n = 0
	}
	secretProgsLen.n++
	secretProgsLen.Unlock()
	secretProgs.Store(src, p)
	return p, nil
}

// EvalSecretPart evaluates an expression over secrets (a Part's Secret)
// with the values given and escapes the result as the part says. Errors
// never contain a value: only the expression and what kind of result it
// gave.
func EvalSecretPart(p Part, secrets map[string]string) (string, error) {
	prg, err := compileSecret(p.Secret)
	if err != nil {
		return "", fmt.Errorf("{{ %s }}: %w", p.Secret, err)
	}
	v, _, err := prg.prg.Eval(map[string]any{"secrets": secrets})
	if err != nil {
		// A CEL runtime error names keys and types, never map values.
		return "", fmt.Errorf("{{ %s }}: %s", p.Secret, oneLine(err.Error()))
	}
	s, _, err := render(v)
	if err != nil {
		return "", fmt.Errorf("{{ %s }}: %w", p.Secret, err)
	}
	return escapeAs(s, p.Escape), nil
}

func escapeAs(s, how string) string {
	switch how {
	case EscapePath:
		if s == "." || s == ".." {
			// A dot segment would move the request up the path.
			return strings.Repeat("%2E", len(s))
		}
		return url.PathEscape(s)
	case EscapeQuery:
		return url.QueryEscape(s)
	}
	return s
}

// render writes a segment's value as text; null is reported so a query
// parameter can be left out.
func render(v ref.Val) (string, bool, error) {
	switch x := v.(type) {
	case types.Null:
		return "", true, nil
	case types.String:
		return string(x), false, nil
	case types.Bool:
		return strconv.FormatBool(bool(x)), false, nil
	case types.Int:
		return strconv.FormatInt(int64(x), 10), false, nil
	case types.Uint:
		return strconv.FormatUint(uint64(x), 10), false, nil
	case types.Double:
		return strconv.FormatFloat(float64(x), 'g', -1, 64), false, nil
	case types.Timestamp:
		return x.Time.UTC().Format(time.RFC3339Nano), false, nil
	case types.Duration:
		return x.Duration.String(), false, nil
	}
	switch x := v.Value().(type) {
	case nil:
		return "", true, nil
	case string:
		return x, false, nil
	case bool:
		return strconv.FormatBool(x), false, nil
	case int64:
		return strconv.FormatInt(x, 10), false, nil
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64), false, nil
	}
	return "", false, fmt.Errorf("evaluated to %s, not a string, number or boolean", v.Type().TypeName())
}

// eval renders the template over the scope: segments over input and nodes
// become text, segments over secrets stay parts. null reports a template
// that is one segment and nothing else, which evaluated to null.
func (t *template) eval(act map[string]any) (v Value, null bool, err error) {
	var parts []Part
	var b strings.Builder
	exprs, nulls, texts := 0, 0, 0
	for _, s := range t.segments {
		switch {
		case s.prog != nil:
			exprs++
			v, err := s.prog.evalWith(act)
			if err != nil {
				return Value{}, false, err
			}
			txt, isNull, err := render(v)
			if err != nil {
				return Value{}, false, fmt.Errorf("{{ %s }}: %w", s.prog.source, err)
			}
			if isNull {
				nulls++
			}
			b.WriteString(escapeAs(txt, s.escape))
		case s.secret != "":
			exprs++
			if b.Len() > 0 {
				parts = append(parts, Part{Text: b.String()})
				b.Reset()
			}
			parts = append(parts, Part{Secret: s.secret, Escape: s.escape})
		default:
			texts += len(s.text)
			b.WriteString(s.text)
		}
	}
	null = exprs == 1 && nulls == 1 && texts == 0
	if parts == nil {
		return Value{Text: b.String()}, null, nil
	}
	if b.Len() > 0 {
		parts = append(parts, Part{Text: b.String()})
	}
	return Value{Parts: parts}, false, nil
}

func (t *template) refs() []string {
	var out []string
	for _, s := range t.segments {
		if s.prog != nil {
			out = append(out, s.prog.refs...)
		}
	}
	return out
}

// httpTemplates are an http node's compiled templates.
type httpTemplates struct {
	url     *template
	query   map[string]*template
	headers map[string]*template
	secrets []string
	static  bool
	prefix  string // of the fields errors name: "http." or "map.step.http."
}

// compileHTTP compiles the node's url, query and header templates,
// reporting problems against http.url, http.query.NAME, http.headers.NAME.
func (n *Node) compileHTTP(ps *problems, check func(string, *program)) {
	n.HTTP.compile(ps, n.ID, "http.", templateEnv, check)
}

// compileHTTPStep compiles a map node's http step's templates, which also
// read item and index, reporting problems against the map node's
// map.step.http fields.
func (n *Node) compileHTTPStep(ps *problems, check func(string, *program)) {
	n.Map.Step.HTTP.compile(ps, n.ID, "map.step.http.", itemTemplateEnv, check)
}

func (h *HTTPSpec) compile(ps *problems, node, prefix string, env func() (*cel.Env, error), check func(string, *program)) {
	ht := &httpTemplates{query: map[string]*template{}, headers: map[string]*template{}, static: true, prefix: prefix}
	names := map[string]bool{}
	add := func(field, src string, inURL bool) *template {
		t, reads, err := parseTemplate(src, inURL, env)
		if err != nil {
			ps.add(node, field, "%v", err)
			return nil
		}
		for _, s := range t.segments {
			if s.prog != nil {
				check(field, s.prog)
			}
		}
		for _, r := range reads {
			names[r] = true
		}
		ht.static = ht.static && t.static
		return t
	}
	ht.url = add(prefix+"url", h.URL, true)
	for _, k := range slices.Sorted(maps.Keys(h.Query)) {
		ht.query[k] = add(prefix+"query."+k, h.Query[k], false)
	}
	for _, k := range slices.Sorted(maps.Keys(h.Headers)) {
		ht.headers[k] = add(prefix+"headers."+k, h.Headers[k], false)
	}
	ht.secrets = slices.Sorted(maps.Keys(names))
	h.templates = ht
}

// SecretNames lists the secrets an http node's templates read.
func (n *Node) SecretNames() []string {
	if n.HTTP == nil || n.HTTP.templates == nil {
		return nil
	}
	return n.HTTP.templates.secrets
}

// EvalRequest renders an http node's url, query and headers over the
// scope. Segments over secrets stay parts for the executor. Errors name the
// field (http.url, http.query.NAME, http.headers.NAME).
func (n *Node) EvalRequest(s Scope) (*Request, error) {
	if n.HTTP == nil {
		return nil, nil
	}
	return n.HTTP.evalRequest(s, nil)
}

// EvalItemRequest renders a map node's http step's request for element
// index, over the scope, item and index. Errors name the map.step.http
// field.
func (n *Node) EvalItemRequest(s Scope, item any, index int) (*Request, error) {
	if n.Map == nil || n.Map.Step.HTTP == nil {
		return nil, nil
	}
	return n.Map.Step.HTTP.evalRequest(s, map[string]any{"item": item, "index": int64(index)})
}

func (h *HTTPSpec) evalRequest(s Scope, extra map[string]any) (*Request, error) {
	ht := h.templates
	if ht == nil {
		return nil, nil
	}
	var refs []string
	if ht.url != nil {
		refs = append(refs, ht.url.refs()...)
	}
	for _, t := range ht.query {
		refs = append(refs, t.refs()...)
	}
	for _, t := range ht.headers {
		refs = append(refs, t.refs()...)
	}
	var act map[string]any
	if !ht.static {
		var err error
		if act, err = s.activation(refs); err != nil {
			return nil, err
		}
		maps.Copy(act, extra)
	}
	r := &Request{Headers: make(map[string]Value, len(ht.headers)), Secrets: ht.secrets}
	total := 0
	render := func(field string, t *template) (Value, bool, error) {
		v, null, err := t.eval(act)
		if err != nil {
			return Value{}, false, fmt.Errorf("%s: %w", field, err)
		}
		n := len(v.Text)
		for _, p := range v.Parts {
			n += len(p.Text) + len(p.Secret)
		}
		if total += n; n > MaxRenderedValue || total > MaxRenderedRequest {
			return Value{}, false, fmt.Errorf("%s: %w: a value may render %d bytes, a request %d", field, ErrValueTooLarge,
				MaxRenderedValue, MaxRenderedRequest)
		}
		return v, null, nil
	}
	v, _, err := render(ht.prefix+"url", ht.url)
	if err != nil {
		return nil, err
	}
	r.URL = v
	for _, k := range slices.Sorted(maps.Keys(ht.query)) {
		v, null, err := render(ht.prefix+"query."+k, ht.query[k])
		if err != nil {
			return nil, err
		}
		if !null {
			r.Query = append(r.Query, Param{Name: k, Value: v})
		}
	}
	for _, k := range slices.Sorted(maps.Keys(ht.headers)) {
		v, _, err := render(ht.prefix+"headers."+k, ht.headers[k])
		if err != nil {
			return nil, err
		}
		if strings.ContainsAny(v.Text, "\r\n\x00") {
			return nil, fmt.Errorf("%sheaders.%s: the value holds a line break or NUL", ht.prefix, k)
		}
		r.Headers[k] = v
	}
	return r, nil
}

// Templated reports whether an http node's request depends on the run
// (segments over input or nodes) or reads secrets, so each task renders
// its own; otherwise every task sends the definition's request as it is.
func (n *Node) Templated() bool {
	return n.HTTP != nil && n.HTTP.templates != nil && !n.HTTP.templates.static
}
