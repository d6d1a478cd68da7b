package dag

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"
)

var (
	idPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)
	// WorkflowName is what a workflow's name looks like.
	WorkflowName  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)
	queuePattern  = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,63}$`)
	signalPattern = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,128}$`)
	headerPattern = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")
	inputKey      = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)
	// queryNamePattern: printable ASCII without space (names are escaped
	// when the URL is built).
	queryNamePattern = regexp.MustCompile(`^[!-~]{1,128}$`)
	httpMethods      = map[string]bool{"GET": true, "HEAD": true, "POST": true, "PUT": true, "PATCH": true, "DELETE": true, "OPTIONS": true}
)

// ValidQueue reports whether s is a valid queue name.
func ValidQueue(s string) bool { return queuePattern.MatchString(s) }

// ValidHandler reports whether s is a valid task handler name.
func ValidHandler(s string) bool { return idPattern.MatchString(s) }

type problems []Problem

func (ps *problems) add(node, field, format string, args ...any) {
	*ps = append(*ps, Problem{Node: node, Field: field, Message: fmt.Sprintf(format, args...)})
}

// validate checks the decoded structure, builds the graph indexes and
// compiles every expression. It reports every problem it can find.
func (w *Workflow) validate() []Problem {
	var ps problems
	if len(w.Nodes) == 0 {
		ps.add("", "nodes", "a workflow needs at least one node")
	}
	if len(w.Nodes) > MaxNodes {
		ps.add("", "nodes", "%d nodes; the limit is %d", len(w.Nodes), MaxNodes)
	}
	checkDuration(&ps, "", "timeout", w.Timeout, false)
	w.validateTriggers(&ps)
	w.validateConcurrency(&ps)

	w.byID = make(map[string]*Node, len(w.Nodes))
	for i, n := range w.Nodes {
		label := n.ID
		switch {
		case n.ID == "":
			label = fmt.Sprintf("nodes[%d]", i)
			ps.add(label, "id", "is required")
		case !idPattern.MatchString(n.ID):
			ps.add(n.ID, "id", "must start with a letter or _ and hold only letters, digits and _ (at most 64)")
		case w.byID[n.ID] != nil:
			ps.add(n.ID, "id", "duplicate node id")
		default:
			w.byID[n.ID] = n
		}
		n.validate(&ps, label)
	}
	for _, n := range w.Nodes {
		seen := map[string]bool{}
		for _, d := range n.DependsOn {
			switch {
			case d == n.ID:
				ps.add(n.ID, "depends_on", "a node cannot depend on itself")
			case seen[d]:
				ps.add(n.ID, "depends_on", "%q is listed twice", d)
			case w.byID[d] == nil:
				ps.add(n.ID, "depends_on", "unknown node %q", d)
			}
			seen[d] = true
		}
	}
	if len(ps) > 0 {
		return ps // the graph is not sound enough to order or compile against
	}
	if cycle := w.buildOrder(); cycle != nil {
		ps.add(cycle[0], "depends_on", "cycle: %s", strings.Join(cycle, " -> "))
		return ps
	}
	w.compile(&ps)
	w.markSecretDerived()
	return ps
}

func (n *Node) validate(ps *problems, label string) {
	switch n.Type {
	case TypeHTTP, TypeTask, TypeSleep, TypeWait, TypeNoop, TypeWorkflow, TypeMap:
	case "":
		ps.add(label, "type", "is required (http, task, sleep, wait, noop, workflow or map)")
	default:
		ps.add(label, "type", "unknown type %q (use http, task, sleep, wait, noop, workflow or map)", n.Type)
	}
	spec := map[NodeType]bool{TypeHTTP: n.HTTP != nil, TypeTask: n.Task != nil, TypeSleep: n.Sleep != nil, TypeWait: n.Wait != nil,
		TypeWorkflow: n.Workflow != nil, TypeMap: n.Map != nil}
	for t, present := range spec {
		if present && t != n.Type {
			ps.add(label, string(t), "is only allowed on nodes of type %s", t)
		}
		if !present && t == n.Type {
			ps.add(label, string(t), "is required for a node of type %s", t)
		}
	}
	if n.Queue != "" {
		if !queuePattern.MatchString(n.Queue) {
			ps.add(label, "queue", "must be lowercase letters, digits, '.', '_' or '-' (at most 64)")
		}
		if !n.Type.RunsOnWorker() {
			ps.add(label, "queue", "nodes of type %s do not run on a worker", n.Type)
		}
	}
	checkDuration(ps, label, "timeout", n.Timeout, false)
	checkDuration(ps, label, "schedule_to_start_timeout", n.ScheduleToStartTimeout, false)
	if (n.Timeout > 0 || n.ScheduleToStartTimeout > 0) && !n.Type.RunsOnWorker() && n.Type != "" {
		ps.add(label, "timeout", "nodes of type %s do not run on a worker; use the %s settings", n.Type, n.Type)
	}
	if r := n.Retry; r != nil {
		if r.MaxAttempts < 1 || r.MaxAttempts > MaxAttempts {
			ps.add(label, "retry.max_attempts", "must be between 1 and %d", MaxAttempts)
		}
		checkDuration(ps, label, "retry.backoff", r.Backoff, false)
		checkDuration(ps, label, "retry.max_backoff", r.MaxBackoff, false)
		if r.MaxBackoff > 0 && r.MaxBackoff < r.Backoff {
			ps.add(label, "retry.max_backoff", "is shorter than retry.backoff")
		}
	}
	if h := n.HTTP; h != nil {
		if h.Method == "" {
			h.Method = "GET"
		}
		h.Method = strings.ToUpper(h.Method)
		if !httpMethods[h.Method] {
			ps.add(label, "http.method", "unsupported method %q", h.Method)
		}
		if u, err := url.Parse(withoutSegments(h.URL)); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			ps.add(label, "http.url", "must be an absolute http or https URL")
		} else if u.User != nil {
			ps.add(label, "http.url", "must not embed credentials; use a header")
		}
		for k := range h.Headers {
			if !headerPattern.MatchString(k) {
				ps.add(label, "http.headers", "invalid header name %q", k)
			}
		}
		if len(h.Query) > MaxQueryParams {
			ps.add(label, "http.query", "has %d parameters; at most %d", len(h.Query), MaxQueryParams)
		}
		for k := range h.Query {
			if !queryNamePattern.MatchString(k) {
				ps.add(label, "http.query", "invalid parameter name %q (1-128 printable characters)", k)
			}
		}
		if len(h.Body) > 0 && !json.Valid(h.Body) {
			ps.add(label, "http.body", "is not valid JSON")
		}
		checkDuration(ps, label, "http.timeout", h.Timeout, false)
	}
	if t := n.Task; t != nil && !idPattern.MatchString(t.Handler) {
		ps.add(label, "task.handler", "must be a handler name of letters, digits and _")
	}
	if s := n.Sleep; s != nil {
		switch {
		case s.Until != "" && s.Duration != 0:
			ps.add(label, "sleep", "give a duration or until, not both")
		case s.Until != "":
			if len(s.Until) > MaxExpressionBytes {
				ps.add(label, "sleep.until", "is longer than %d bytes", MaxExpressionBytes)
			}
		default:
			checkDuration(ps, label, "sleep.duration", s.Duration, true)
		}
	}
	if wt := n.Wait; wt != nil {
		switch {
		case wt.Signal != "" && wt.Event != "":
			ps.add(label, "wait", "give a signal or an event, not both")
		case wt.Event != "":
			if msg := ValidEventName(wt.Event); msg != "" {
				ps.add(label, "wait.event", "%s", msg)
			}
			if wt.Approval {
				ps.add(label, "wait.approval", "is for signals; an event wait completes with the event")
			}
			if len(wt.Match) > MaxExpressionBytes {
				ps.add(label, "wait.match", "is longer than %d bytes", MaxExpressionBytes)
			}
		case !signalPattern.MatchString(wt.Signal):
			ps.add(label, "wait.signal", "must be 1-128 letters, digits, '_', '.', ':' or '-' (or give wait.event)")
		}
		if wt.Match != "" && wt.Event == "" {
			ps.add(label, "wait.match", "is for event waits (give wait.event)")
		}
		if wt.Approvers != nil {
			if !wt.Approval {
				ps.add(label, "wait.approvers", "is for approval waits (set wait.approval)")
			} else {
				wt.Approvers.validate(ps, label)
			}
		}
		checkDuration(ps, label, "wait.timeout", wt.Timeout, false)
	}
	for k := range n.Input {
		if !inputKey.MatchString(k) {
			ps.add(label, "input", "key %q must be an identifier", k)
		}
	}
	if n.Priority != nil {
		if *n.Priority < MinPriority || *n.Priority > MaxPriority {
			ps.add(label, "priority", "must be between %d and %d", MinPriority, MaxPriority)
		}
		if !n.Type.RunsOnWorker() && n.Type != "" && n.Type != TypeWorkflow {
			ps.add(label, "priority", "nodes of type %s do not run on a worker (a workflow node's priority is its child run's)", n.Type)
		}
	}
	if rl := n.RateLimit; rl != nil {
		if !RateLimitName.MatchString(rl.Name) {
			ps.add(label, "rate_limit.name", "must name a rate limit: lowercase letters, digits, '_' or '-' (at most 64)")
		}
		if len(rl.Key) > MaxExpressionBytes {
			ps.add(label, "rate_limit.key", "is longer than %d bytes", MaxExpressionBytes)
		}
		if !n.Type.RunsOnWorker() && n.Type != "" {
			ps.add(label, "rate_limit", "nodes of type %s do not run on a worker", n.Type)
		}
		if n.ScheduleToStartTimeout > 0 {
			// Waiting for a token is not a failure; a schedule-to-start
			// timeout would make it one.
			ps.add(label, "rate_limit", "cannot be combined with schedule_to_start_timeout (waiting for the limit is not a failure)")
		}
	}
	n.validateStepConcurrency(ps, label)
	if wf := n.Workflow; wf != nil {
		if !WorkflowName.MatchString(wf.Name) {
			ps.add(label, "workflow.name", "must name a workflow: 1-128 letters, digits, '_', '.' or '-', starting with a letter or digit")
		}
		if wf.Version < 0 {
			ps.add(label, "workflow.version", "must be positive (or left out for the latest)")
		}
	}
	if m := n.Map; m != nil {
		switch {
		case strings.TrimSpace(m.Items) == "":
			ps.add(label, "map.items", "is required: an expression giving a list")
		case len(m.Items) > MaxExpressionBytes:
			ps.add(label, "map.items", "is longer than %d bytes", MaxExpressionBytes)
		}
		if m.MaxParallelism < 0 || m.MaxParallelism > MaxMapParallelism {
			ps.add(label, "map.max_parallelism", "must be between 1 and %d", MaxMapParallelism)
		}
		st := m.Step
		if st == nil {
			ps.add(label, "map.step", "is required")
			return
		}
		switch st.Type {
		case TypeHTTP, TypeTask, TypeNoop, TypeWorkflow:
		default:
			ps.add(label, "map.step.type", "must be http, task, noop or workflow")
		}
		if st.ID != "" || len(st.DependsOn) > 0 || st.If != "" {
			ps.add(label, "map.step", "takes no id, depends_on or if (the map node has them)")
		}
		var inner problems
		st.validate(&inner, label)
		for _, p := range inner {
			if p.Field != "type" { // (reported above, in the step's terms)
				ps.add(label, "map.step."+p.Field, "%s", p.Message)
			}
		}
	}
}

// withoutSegments replaces each {{ }} segment of a template with "x", to
// check the shape of a templated URL.
func withoutSegments(s string) string {
	var b strings.Builder
	for {
		i := strings.Index(s, "{{")
		if i < 0 {
			return b.String() + s
		}
		j := strings.Index(s[i:], "}}")
		if j < 0 {
			return b.String() + s
		}
		b.WriteString(s[:i])
		b.WriteString("x")
		s = s[i+j+2:]
	}
}

func checkDuration(ps *problems, node, field string, d Duration, required bool) {
	switch {
	case d < 0:
		ps.add(node, field, "must not be negative")
	case d == 0 && required:
		ps.add(node, field, "must be a positive duration")
	case time.Duration(d) > MaxDuration:
		ps.add(node, field, "is longer than the limit of %s", MaxDuration)
	}
}

// buildOrder computes a topological order (Kahn's algorithm, ties broken by
// definition order so the result is deterministic) and the dependents and
// sinks indexes. It returns a cycle when there is one.
func (w *Workflow) buildOrder() []string {
	w.deps = make(map[string][]string, len(w.Nodes))
	indeg := make(map[string]int, len(w.Nodes))
	for _, n := range w.Nodes {
		indeg[n.ID] = len(n.DependsOn)
		for _, d := range n.DependsOn {
			w.deps[d] = append(w.deps[d], n.ID)
		}
	}
	var queue []string
	for _, n := range w.Nodes {
		if indeg[n.ID] == 0 {
			queue = append(queue, n.ID)
		}
	}
	w.order = w.order[:0]
	for len(queue) > 0 {
		id := queue[0]
		queue = queue[1:]
		w.order = append(w.order, id)
		for _, c := range w.deps[id] {
			if indeg[c]--; indeg[c] == 0 {
				queue = append(queue, c)
			}
		}
	}
	if len(w.order) != len(w.Nodes) {
		return w.findCycle(indeg)
	}
	w.sinks = nil
	for _, n := range w.Nodes {
		if len(w.deps[n.ID]) == 0 {
			w.sinks = append(w.sinks, n.ID)
		}
	}
	return nil
}

// findCycle walks dependencies among the nodes left with in-degree > 0 until
// a node repeats, and returns that loop in dependency order.
func (w *Workflow) findCycle(indeg map[string]int) []string {
	var start string
	for _, n := range w.Nodes {
		if indeg[n.ID] > 0 {
			start = n.ID
			break
		}
	}
	pos := map[string]int{}
	var path []string
	for cur := start; ; {
		if i, ok := pos[cur]; ok {
			loop := append([]string{}, path[i:]...)
			// path follows "depends on" edges; print it as data flows.
			for l, r := 0, len(loop)-1; l < r; l, r = l+1, r-1 {
				loop[l], loop[r] = loop[r], loop[l]
			}
			return append(loop, loop[0])
		}
		pos[cur] = len(path)
		path = append(path, cur)
		for _, d := range w.byID[cur].DependsOn {
			if indeg[d] > 0 {
				cur = d
				break
			}
		}
	}
}

// ancestors returns every node id upstream of id.
func (w *Workflow) ancestors(id string) map[string]bool {
	out := map[string]bool{}
	stack := append([]string{}, w.byID[id].DependsOn...)
	for len(stack) > 0 {
		d := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if !out[d] {
			out[d] = true
			stack = append(stack, w.byID[d].DependsOn...)
		}
	}
	return out
}

// compile compiles every expression and checks that each reads only nodes
// whose results exist when it is evaluated.
func (w *Workflow) compile(ps *problems) {
	for _, n := range w.Nodes {
		up := w.ancestors(n.ID)
		check := func(field string, p *program) {
			for _, r := range p.refs {
				switch {
				case w.byID[r] == nil:
					ps.add(n.ID, field, "reads nodes.%s, which does not exist", r)
				case !up[r]:
					ps.add(n.ID, field, "reads nodes.%s, which is not upstream of %s (add it to depends_on)", r, n.ID)
				}
			}
		}
		if n.If != "" {
			p, err := compile(n.If, true)
			if err != nil {
				ps.add(n.ID, "if", "%v", err)
			} else {
				check("if", p)
				n.cond = p
			}
		}
		if c := n.Concurrency; c != nil && c.Key != "" {
			if p, err := compile(c.Key, false); err != nil {
				ps.add(n.ID, "concurrency.key", "%v", err)
			} else {
				check("concurrency.key", p)
				c.key = p
			}
		}
		if n.Sleep != nil && n.Sleep.Until != "" {
			p, err := compile(n.Sleep.Until, false)
			if err != nil {
				ps.add(n.ID, "sleep.until", "%v", err)
			} else {
				check("sleep.until", p)
				n.Sleep.until = p
			}
		}
		if rl := n.RateLimit; rl != nil && rl.Key != "" {
			p, err := compile(rl.Key, false)
			if err != nil {
				ps.add(n.ID, "rate_limit.key", "%v", err)
			} else {
				check("rate_limit.key", p)
				rl.key = p
			}
		}
		if n.HTTP != nil {
			n.compileHTTP(ps, check)
		}
		n.input = make(map[string]*program, len(n.Input))
		for _, k := range slices.Sorted(maps.Keys(n.Input)) {
			field := "input." + k
			p, err := compile(n.Input[k], false)
			if err != nil {
				ps.add(n.ID, field, "%v", err)
				continue
			}
			check(field, p)
			n.input[k] = p
		}
		if m := n.Map; m != nil {
			if p, err := compile(m.Items, false); err != nil {
				ps.add(n.ID, "map.items", "%v", err)
			} else {
				check("map.items", p)
				m.items = p
			}
			st := m.Step
			if rl := st.RateLimit; rl != nil && rl.Key != "" {
				if p, err := compileItemExpr(rl.Key); err != nil {
					ps.add(n.ID, "map.step.rate_limit.key", "%v", err)
				} else {
					check("map.step.rate_limit.key", p)
					rl.key = p
				}
			}
			if c := st.Concurrency; c != nil && c.Key != "" {
				if p, err := compileItemExpr(c.Key); err != nil {
					ps.add(n.ID, "map.step.concurrency.key", "%v", err)
				} else {
					check("map.step.concurrency.key", p)
					c.key = p
				}
			}
			st.input = make(map[string]*program, len(st.Input))
			for _, k := range slices.Sorted(maps.Keys(st.Input)) {
				field := "map.step.input." + k
				p, err := compileItemExpr(st.Input[k])
				if err != nil {
					ps.add(n.ID, field, "%v", err)
					continue
				}
				check(field, p)
				st.input[k] = p
			}
			if st.HTTP != nil {
				n.compileHTTPStep(ps, check)
			}
		}
	}
	w.output = make(map[string]*program, len(w.Output))
	for _, k := range slices.Sorted(maps.Keys(w.Output)) {
		field := "output." + k
		if !inputKey.MatchString(k) {
			ps.add("", "output", "key %q must be an identifier", k)
			continue
		}
		p, err := compile(w.Output[k], false)
		if err != nil {
			ps.add("", field, "%v", err)
			continue
		}
		for _, r := range p.refs {
			if w.byID[r] == nil {
				ps.add("", field, "reads nodes.%s, which does not exist", r)
			}
		}
		w.output[k] = p
	}
	w.compileEventMatches(ps)
	if len(w.Metadata) > MaxMetadataKeys {
		ps.add("", "metadata", "has %d keys; at most %d", len(w.Metadata), MaxMetadataKeys)
	}
	w.metadata = make(map[string]*program, len(w.Metadata))
	for _, k := range slices.Sorted(maps.Keys(w.Metadata)) {
		field := "metadata." + k
		if !MetadataKey.MatchString(k) {
			ps.add("", "metadata", "key %q must be 1-64 letters, digits, '_', '.' or '-', starting with a letter", k)
			continue
		}
		p, err := compile(w.Metadata[k], false)
		if err != nil {
			ps.add("", field, "%v", err)
			continue
		}
		if len(p.refs) > 0 {
			ps.add("", field, "reads nodes.%s: metadata is set when the run starts, from its input only", p.refs[0])
			continue
		}
		w.metadata[k] = p
	}
}
