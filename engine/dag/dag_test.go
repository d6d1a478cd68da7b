package dag

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const forkJoin = `{
  "name": "fork-join",
  "nodes": [
    {"id": "a", "type": "http", "http": {"method": "post", "url": "https://example.com/a"}, "input": {"n": "input.n + 1"}},
    {"id": "b", "type": "noop", "depends_on": ["a"], "if": "nodes.a.output.ok == true"},
    {"id": "c", "type": "task", "depends_on": ["a"], "task": {"handler": "resize"}, "retry": {"max_attempts": 5, "backoff": "1s", "max_backoff": "1m"}},
    {"id": "d", "type": "noop", "depends_on": ["b", "c"], "input": {"from_c": "nodes.c.output"}}
  ]}`

func TestParseBuildsTheGraph(t *testing.T) {
	w, err := Parse([]byte(forkJoin))
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b", "c", "d"}, w.Order())
	assert.Equal(t, []string{"b", "c"}, w.Dependents("a"))
	assert.Equal(t, []string{"d"}, w.Sinks())
	assert.Equal(t, "POST", w.Node("a").HTTP.Method, "methods are normalised")
	assert.Equal(t, DefaultQueue, w.Node("a").QueueName())
	assert.Equal(t, DefaultRetry, w.Node("a").RetryPolicy())
	assert.Equal(t, 5, w.Node("c").RetryPolicy().MaxAttempts)
	assert.True(t, w.Node("b").HasCondition())
	assert.Nil(t, w.Node("zzz"))
}

func TestParseYAMLEqualsJSON(t *testing.T) {
	y := `
name: fork-join
nodes:
  - id: a
    type: http
    http: {method: post, url: "https://example.com/a"}
    input: {n: "input.n + 1"}
  - id: b
    type: noop
    depends_on: [a]
    if: "nodes.a.output.ok == true"
  - id: c
    type: task
    depends_on: [a]
    task: {handler: resize}
    retry: {max_attempts: 5, backoff: 1s, max_backoff: 1m}
  - id: d
    type: noop
    depends_on: [b, c]
    input: {from_c: "nodes.c.output"}
`
	fromYAML, err := Parse([]byte(y))
	require.NoError(t, err)
	fromJSON := MustParse(forkJoin)
	assert.JSONEq(t, string(fromJSON.Canonical()), string(fromYAML.Canonical()))
}

func TestCanonicalRoundTrips(t *testing.T) {
	w := MustParse(forkJoin)
	again, err := Parse(w.Canonical())
	require.NoError(t, err)
	assert.Equal(t, string(w.Canonical()), string(again.Canonical()))
}

// TestInvalidDefinitionsNameNodeAndField is the table of bad inputs: each
// must be rejected with a problem that names the node and field at fault.
func TestInvalidDefinitionsNameNodeAndField(t *testing.T) {
	cases := []struct {
		name, def   string
		node, field string
		message     string
	}{
		{"empty", ``, "", "", "empty"},
		{"not json", `{"nodes": [`, "", "", "invalid JSON"},
		{"no nodes", `{"nodes": []}`, "", "nodes", "at least one node"},
		{"unknown top-level field", `{"nodez": []}`, "", "", `unknown field "nodez"`},
		{"unknown node field", `{"nodes":[{"id":"a","type":"noop","dependson":["x"]}]}`, "a", "", `unknown field "dependson"`},
		{"wrong field type", `{"nodes":[{"id":"a","type":"noop","depends_on":"b"}]}`, "a", "", "depends_on"},
		{"missing id", `{"nodes":[{"type":"noop"}]}`, "nodes[0]", "id", "required"},
		{"bad id", `{"nodes":[{"id":"my-node","type":"noop"}]}`, "my-node", "id", "letters, digits and _"},
		{"duplicate id", `{"nodes":[{"id":"a","type":"noop"},{"id":"a","type":"noop"}]}`, "a", "id", "duplicate"},
		{"missing type", `{"nodes":[{"id":"a"}]}`, "a", "type", "required"},
		{"unknown type", `{"nodes":[{"id":"a","type":"lambda"}]}`, "a", "type", `unknown type "lambda"`},
		{"unknown dependency", `{"nodes":[{"id":"a","type":"noop","depends_on":["ghost"]}]}`, "a", "depends_on", `unknown node "ghost"`},
		{"self dependency", `{"nodes":[{"id":"a","type":"noop","depends_on":["a"]}]}`, "a", "depends_on", "itself"},
		{"repeated dependency", `{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"noop","depends_on":["a","a"]}]}`, "b", "depends_on", "twice"},
		{"cycle", `{"nodes":[{"id":"a","type":"noop","depends_on":["c"]},{"id":"b","type":"noop","depends_on":["a"]},{"id":"c","type":"noop","depends_on":["b"]}]}`, "b", "depends_on", "cycle: b -> c -> a -> b"},
		{"bad duration", `{"nodes":[{"id":"a","type":"noop","timeout":"soon"}]}`, "a", "timeout", `invalid duration "soon"`},
		{"bad retry backoff", `{"nodes":[{"id":"a","type":"noop","retry":{"max_attempts":2,"backoff":"x"}}]}`, "a", "retry.backoff", "invalid duration"},
		{"negative sleep", `{"nodes":[{"id":"a","type":"sleep","sleep":{"duration":"-1s"}}]}`, "a", "sleep.duration", "negative"},
		{"zero sleep", `{"nodes":[{"id":"a","type":"sleep","sleep":{"duration":"0s"}}]}`, "a", "sleep.duration", "positive"},
		{"sleep with both", `{"nodes":[{"id":"a","type":"sleep","sleep":{"duration":"1s","until":"input.at"}}]}`, "a", "sleep", "not both"},
		{"sleep until bad expression", `{"nodes":[{"id":"a","type":"sleep","sleep":{"until":"input.at +"}}]}`, "a", "sleep.until", ""},
		{"sleep until a node not upstream", `{"nodes":[{"id":"b","type":"noop"},{"id":"a","type":"sleep","sleep":{"until":"nodes.b.output.at"}}]}`, "a", "sleep.until", "not upstream"},
		{"metadata reads a node", `{"metadata":{"k":"nodes.a.output.x"},"nodes":[{"id":"a","type":"noop"}]}`, "", "metadata.k", "from its input only"},
		{"too long", `{"nodes":[{"id":"a","type":"noop","timeout":"9000h"}]}`, "a", "timeout", "longer than"},
		{"retry attempts", `{"nodes":[{"id":"a","type":"noop","retry":{"max_attempts":0}}]}`, "a", "retry.max_attempts", "between 1 and"},
		{"retry cap below base", `{"nodes":[{"id":"a","type":"noop","retry":{"max_attempts":3,"backoff":"1m","max_backoff":"1s"}}]}`, "a", "retry.max_backoff", "shorter"},
		{"http spec missing", `{"nodes":[{"id":"a","type":"http"}]}`, "a", "http", "required"},
		{"spec on wrong type", `{"nodes":[{"id":"a","type":"noop","sleep":{"duration":"1s"}}]}`, "a", "sleep", "only allowed"},
		{"http url relative", `{"nodes":[{"id":"a","type":"http","http":{"url":"/x"}}]}`, "a", "http.url", "absolute"},
		{"http url ftp", `{"nodes":[{"id":"a","type":"http","http":{"url":"ftp://x/y"}}]}`, "a", "http.url", "http or https"},
		{"http url creds", `{"nodes":[{"id":"a","type":"http","http":{"url":"https://u:p@x/y"}}]}`, "a", "http.url", "credentials"},
		{"http method", `{"nodes":[{"id":"a","type":"http","http":{"method":"BREW","url":"https://x"}}]}`, "a", "http.method", "unsupported"},
		{"http header", `{"nodes":[{"id":"a","type":"http","http":{"url":"https://x","headers":{"bad header":"1"}}}]}`, "a", "http.headers", "invalid header"},
		{"wait signal", `{"nodes":[{"id":"a","type":"wait","wait":{"signal":""}}]}`, "a", "wait.signal", "letters"},
		{"task handler", `{"nodes":[{"id":"a","type":"task","task":{"handler":"a b"}}]}`, "a", "task.handler", "handler name"},
		{"queue on sleep", `{"nodes":[{"id":"a","type":"sleep","queue":"q","sleep":{"duration":"1s"}}]}`, "a", "queue", "do not run on a worker"},
		{"bad queue", `{"nodes":[{"id":"a","type":"noop","queue":"Big Queue"}]}`, "a", "queue", "lowercase"},
		{"if does not compile", `{"nodes":[{"id":"a","type":"noop","if":"input.x =="}]}`, "a", "if", "does not compile"},
		{"if not boolean", `{"nodes":[{"id":"a","type":"noop","if":"1 + 2"}]}`, "a", "if", "boolean"},
		{"input does not compile", `{"nodes":[{"id":"a","type":"noop","input":{"x":"input."}}]}`, "a", "input.x", "does not compile"},
		{"input unknown variable", `{"nodes":[{"id":"a","type":"noop","input":{"x":"secrets.key"}}]}`, "a", "input.x", "does not compile"},
		{"input reads non-upstream", `{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"noop","input":{"x":"nodes.a.output"}}]}`, "b", "input.x", "not upstream"},
		{"if reads missing node", `{"nodes":[{"id":"a","type":"noop","if":"nodes.ghost.status == 'completed'"}]}`, "a", "if", "does not exist"},
		{"index syntax checked too", `{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"noop","input":{"x":"nodes['a'].output"}}]}`, "b", "input.x", "not upstream"},
		{"bad input key", `{"nodes":[{"id":"a","type":"noop","input":{"a-b":"1"}}]}`, "a", "input", "identifier"},
		{"output mapping", `{"output":{"x":"nodes.zz.output"},"nodes":[{"id":"a","type":"noop"}]}`, "", "output.x", "does not exist"},
		{"workflow timeout", `{"timeout":"forever","nodes":[{"id":"a","type":"noop"}]}`, "", "timeout", "invalid duration"},
		{"oversized", `{"description":"` + strings.Repeat("x", MaxDefinitionBytes) + `","nodes":[]}`, "", "", "limit"},
		{"too many nodes", tooMany(), "", "nodes", "limit"},
		{"expression too long", `{"nodes":[{"id":"a","type":"noop","if":"` + strings.Repeat("true && ", 600) + `true"}]}`, "a", "if", "does not compile"},
		{"yaml garbage", "nodes: [\n  - id: a\n  type", "", "", "not valid JSON or YAML"},
		{"priority out of range", `{"nodes":[{"id":"a","type":"noop","priority":3}]}`, "a", "priority", "between -2 and 2"},
		{"priority on a sleep", `{"nodes":[{"id":"a","type":"sleep","priority":1,"sleep":{"duration":"1s"}}]}`, "a", "priority", "do not run on a worker"},
		{"rate limit name", `{"nodes":[{"id":"a","type":"noop","rate_limit":{"name":"Partner API"}}]}`, "a", "rate_limit.name", "lowercase"},
		{"rate limit key does not compile", `{"nodes":[{"id":"a","type":"noop","rate_limit":{"name":"p","key":"input."}}]}`, "a", "rate_limit.key", "does not compile"},
		{"rate limit key reads non-upstream", `{"nodes":[{"id":"b","type":"noop"},{"id":"a","type":"noop","rate_limit":{"name":"p","key":"nodes.b.output.x"}}]}`, "a", "rate_limit.key", "not upstream"},
		{"rate limit on a wait", `{"nodes":[{"id":"a","type":"wait","wait":{"signal":"s"},"rate_limit":{"name":"p"}}]}`, "a", "rate_limit", "do not run on a worker"},
		{"rate limit with schedule-to-start", `{"nodes":[{"id":"a","type":"noop","schedule_to_start_timeout":"1m","rate_limit":{"name":"p"}}]}`, "a", "rate_limit", "schedule_to_start_timeout"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.def))
			require.Error(t, err)
			var ve *ValidationError
			require.True(t, errors.As(err, &ve), "want *ValidationError, got %T", err)
			for _, p := range ve.Problems {
				if p.Node == c.node && p.Field == c.field && strings.Contains(p.Message, c.message) {
					return
				}
			}
			t.Fatalf("no problem with node %q field %q message ~%q in %v", c.node, c.field, c.message, ve.Problems)
		})
	}
}

func tooMany() string {
	var b strings.Builder
	b.WriteString(`{"nodes":[`)
	for i := 0; i <= MaxNodes; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`{"id":"n` + itoa(i) + `","type":"noop"}`)
	}
	b.WriteString("]}")
	return b.String()
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

func TestCycleIsNamedInOrder(t *testing.T) {
	_, err := Parse([]byte(`{"nodes":[
		{"id":"start","type":"noop"},
		{"id":"a","type":"noop","depends_on":["start","c"]},
		{"id":"b","type":"noop","depends_on":["a"]},
		{"id":"c","type":"noop","depends_on":["b"]}]}`))
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
	require.Len(t, ve.Problems, 1)
	msg := ve.Problems[0].Message
	assert.Contains(t, []string{"cycle: a -> b -> c -> a", "cycle: b -> c -> a -> b", "cycle: c -> a -> b -> c"}, msg)
}

func TestEveryProblemIsReported(t *testing.T) {
	_, err := Parse([]byte(`{"nodes":[
		{"id":"a","type":"lambda"},
		{"id":"b","type":"noop","depends_on":["ghost"]},
		{"id":"c","type":"sleep","sleep":{"duration":"0s"}}]}`))
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
	assert.Len(t, ve.Problems, 3)
	assert.Contains(t, err.Error(), `node "a": type:`)
	assert.Contains(t, err.Error(), `node "b": depends_on:`)
	assert.Contains(t, err.Error(), `node "c": sleep.duration:`)
}

func TestRetryDelayIsExponentialCappedAndNeverOverflows(t *testing.T) {
	r := RetryPolicy{MaxAttempts: 100, Backoff: Duration(time.Second), MaxBackoff: Duration(time.Minute)}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, time.Minute, time.Minute}
	for i, w := range want {
		assert.Equal(t, w, r.Delay(i+1), "after attempt %d", i+1)
	}
	for _, n := range []int{63, 64, 65, 1000, math.MaxInt32, math.MaxInt} {
		assert.Equal(t, time.Minute, r.Delay(n), "attempt %d", n)
	}
	uncapped := RetryPolicy{Backoff: Duration(time.Hour)}
	assert.Equal(t, MaxDuration, uncapped.Delay(math.MaxInt), "no cap means the global limit, not overflow")
	assert.Zero(t, RetryPolicy{}.Delay(3), "no backoff means retry at once")
	assert.Zero(t, r.Delay(0))
}

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{"1d": 24 * time.Hour, "30s": 30 * time.Second, "1h30m": 90 * time.Minute, "366d": 366 * 24 * time.Hour} {
		got, err := ParseDuration(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "d", "1.5d", "-1d", "367d", "1dd", "tomorrow", "1 d"} {
		_, err := ParseDuration(in)
		assert.Error(t, err, in)
	}
}

func TestEvalIfInputAndOutput(t *testing.T) {
	w := MustParse(forkJoin)
	s := Scope{
		Input: json.RawMessage(`{"n": 41}`),
		Nodes: map[string]NodeResult{
			"a": {Status: "completed", Output: json.RawMessage(`{"ok": true}`)},
			"c": {Status: "completed", Output: json.RawMessage(`{"size": [1, 2.5, "x"]}`)},
		},
	}
	in, err := w.Node("a").EvalInput(s)
	require.NoError(t, err)
	assert.JSONEq(t, `{"n": 42}`, string(in), "integral JSON numbers are CEL ints")

	ok, err := w.Node("b").EvalIf(s)
	require.NoError(t, err)
	assert.True(t, ok)
	s.Nodes["a"] = NodeResult{Status: "completed", Output: json.RawMessage(`{"ok": false}`)}
	ok, err = w.Node("b").EvalIf(s)
	require.NoError(t, err)
	assert.False(t, ok)

	in, err = w.Node("d").EvalInput(s)
	require.NoError(t, err)
	assert.JSONEq(t, `{"from_c": {"size": [1, 2.5, "x"]}}`, string(in))

	in, err = w.Node("c").EvalInput(s)
	require.NoError(t, err)
	assert.JSONEq(t, `{"n": 41}`, string(in), "no mapping passes the run input through")

	s.Nodes["d"] = NodeResult{Status: "completed", Output: json.RawMessage(`{"done": 1}`)}
	out, err := w.EvalOutput(s)
	require.NoError(t, err)
	assert.JSONEq(t, `{"d": {"done": 1}}`, string(out), "default output is the sinks' outputs")
}

func TestEvalErrorsAreClear(t *testing.T) {
	w := MustParse(`{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"noop","depends_on":["a"],
		"input":{"x":"nodes.a.output.missing"},"if":"nodes.a.output.flag"}]}`)
	s := Scope{Nodes: map[string]NodeResult{"a": {Status: "completed", Output: json.RawMessage(`{"flag": "yes"}`)}}}
	_, err := w.Node("b").EvalInput(s)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "input.x")
	assert.Contains(t, err.Error(), "missing")
	_, err = w.Node("b").EvalIf(s)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not a boolean")
}

func TestCostLimitStopsRunawayExpressions(t *testing.T) {
	w := MustParse(`{"nodes":[{"id":"a","type":"noop","input":{"x":"input.l.map(a, input.l.map(b, input.l.map(c, a + b + c)))"}}]}`)
	big := make([]int, 200)
	in, _ := json.Marshal(map[string]any{"l": big})
	_, err := w.Node("a").EvalInput(Scope{Input: in})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cost")
}

func TestOutputMapping(t *testing.T) {
	w := MustParse(`{"output":{"total":"nodes.a.output.n * 2","src":"input.src"},"nodes":[{"id":"a","type":"noop"}]}`)
	out, err := w.EvalOutput(Scope{Input: json.RawMessage(`{"src":"x"}`), Nodes: map[string]NodeResult{"a": {Status: "completed", Output: json.RawMessage(`{"n": 21}`)}}})
	require.NoError(t, err)
	assert.JSONEq(t, `{"total": 42, "src": "x"}`, string(out))
}

// TestMappingsCannotAmplifyTheirInput: a mapping that copies a large input
// many times (as keys, in a list, through string functions) stops at
// MaxValueBytes with ErrValueTooLarge instead of building the value; a
// value under the bound passes.
func TestMappingsCannotAmplifyTheirInput(t *testing.T) {
	big, _ := json.Marshal(map[string]any{"s": strings.Repeat("x", 300<<10), "l": make([]int, 40_000)})
	keys := map[string]string{}
	for i := range 8 {
		keys[string(rune('a'+i))] = "input.s"
	}
	k, _ := json.Marshal(keys)
	for name, input := range map[string]string{
		"many keys":     string(k),
		"a list":        `{"x": "[input.s, input.s, input.s, input.s]"}`,
		"nested copies": `{"x": "{'a': input.l, 'b': input.l, 'c': [input.l, input.l, input.l, input.l, input.l, input.l, input.l, input.l, input.l, input.l, input.l, input.l, input.l, input.l, input.l, input.l, input.l, input.l, input.l, input.l, input.l, input.l, input.l, input.l, input.l, input.l, input.l, input.l, input.l, input.l, input.l, input.l, input.l]}"}`,
	} {
		w := MustParse(`{"nodes":[{"id":"a","type":"noop","input":` + input + `}]}`)
		_, err := w.Node("a").EvalInput(Scope{Input: big})
		assert.ErrorIs(t, err, ErrValueTooLarge, name)
	}
	w := MustParse(`{"nodes":[{"id":"a","type":"noop","input":{"x":"input.s","y":"input.s","z":"input.s"}}]}`)
	in, err := w.Node("a").EvalInput(Scope{Input: big})
	require.NoError(t, err, "900 KiB is under the bound")
	assert.Greater(t, len(in), 900<<10)

	// The default run output (the sinks' outputs) is bounded too.
	out := json.RawMessage(`"` + strings.Repeat("y", 600<<10) + `"`)
	w = MustParse(`{"nodes":[{"id":"a","type":"noop"},{"id":"b","type":"noop"}]}`)
	_, err = w.EvalOutput(Scope{Nodes: map[string]NodeResult{"a": {Status: "completed", Output: out}, "b": {Status: "completed", Output: out}}})
	assert.ErrorIs(t, err, ErrValueTooLarge)
}

func TestRateKeyIsAShortScalar(t *testing.T) {
	wf := MustParse(`{"nodes":[{"id":"a","type":"noop","rate_limit":{"name":"p","key":"input.k"}},{"id":"b","type":"noop","rate_limit":{"name":"p"}}]}`)
	a, b := wf.Node("a"), wf.Node("b")
	for in, want := range map[string]string{`{"k": "acct_1"}`: "acct_1", `{"k": 7}`: "7", `{"k": true}`: "true"} {
		got, err := a.RateKey(Scope{Input: json.RawMessage(in)})
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, in := range []string{`{"k": {"x": 1}}`, `{"k": [1]}`, `{"k": "` + strings.Repeat("x", MaxRateKeyChars+1) + `"}`, `{}`} {
		_, err := a.RateKey(Scope{Input: json.RawMessage(in)})
		assert.Error(t, err, in)
	}
	got, err := b.RateKey(Scope{Input: json.RawMessage(`{}`)})
	require.NoError(t, err)
	assert.Empty(t, got, "no key: one bucket")
}
