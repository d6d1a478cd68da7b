package dag

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEventWaitMatchIsKeyedByItsEquality(t *testing.T) {
	w, err := Parse([]byte(`{"nodes": [
		{"id": "a", "type": "noop"},
		{"id": "paid", "type": "wait", "depends_on": ["a"], "wait": {"event": "order.paid",
			"match": "nodes.a.output.order == event.payload.order_id && event.payload.amount > 0", "timeout": "1h"}},
		{"id": "any", "type": "wait", "wait": {"event": "order.paid"}},
		{"id": "loose", "type": "wait", "wait": {"event": "order.paid", "match": "event.payload.order_id.startsWith(input.prefix)"}}
	]}`))
	require.NoError(t, err)
	scope := Scope{Input: json.RawMessage(`{"prefix": "A-"}`), Nodes: map[string]NodeResult{"a": {Status: "completed", Output: json.RawMessage(`{"order": "A-17"}`)}}}

	expr, key, err := w.Node("paid").EventKey(scope)
	require.NoError(t, err)
	assert.Equal(t, "event.payload.order_id", expr, "the event side of the equality")
	assert.Equal(t, `"A-17"`, key, "the run side's value as canonical JSON")
	for _, id := range []string{"any", "loose"} {
		expr, key, err := w.Node(id).EventKey(scope)
		require.NoError(t, err)
		assert.Empty(t, expr+key, "%s is unkeyed", id)
	}

	ev := EventData{ID: "e1", Name: "order.paid", Payload: json.RawMessage(`{"order_id": "A-17", "amount": 5}`)}
	got, err := EventKeyValue(expr, ev)
	require.NoError(t, err)
	assert.Equal(t, key, got, "the event gives the key the wait holds")
	ok, err := w.Node("paid").MatchesEvent(scope, ev)
	require.NoError(t, err)
	assert.True(t, ok)

	zero := EventData{ID: "e2", Name: "order.paid", Payload: json.RawMessage(`{"order_id": "A-17", "amount": 0}`)}
	ok, _ = w.Node("paid").MatchesEvent(scope, zero)
	assert.False(t, ok, "the other term of the && still decides")
	other := EventData{ID: "e3", Name: "order.shipped", Payload: ev.Payload}
	ok, _ = w.Node("any").MatchesEvent(scope, other)
	assert.False(t, ok, "another name never matches")
	ok, _ = w.Node("loose").MatchesEvent(scope, ev)
	assert.True(t, ok)
	_, err = EventKeyValue(expr, EventData{Name: "order.paid", Payload: json.RawMessage(`{}`)})
	assert.Error(t, err, "an event without the field gives no key")

	out := ev.Output()
	assert.JSONEq(t, `{"id": "e1", "name": "order.paid", "payload": {"order_id": "A-17", "amount": 5}}`, string(out))
}

func TestMatchKeysAreCanonical(t *testing.T) {
	w := MustParse(`{"nodes": [{"id": "w", "type": "wait", "wait": {"event": "e", "match": "event.payload.k == input.k"}}]}`)
	for _, c := range []struct{ input, payload string }{
		{`{"k": 5}`, `{"k": 5.0}`},
		{`{"k": {"b": 1, "a": [true, null]}}`, `{"k": {"a": [true, null], "b": 1}}`},
		{`{"k": "x"}`, `{"k": "x"}`},
	} {
		_, key, err := w.Node("w").EventKey(Scope{Input: json.RawMessage(c.input)})
		require.NoError(t, err)
		got, err := EventKeyValue("event.payload.k", EventData{Name: "e", Payload: json.RawMessage(c.payload)})
		require.NoError(t, err)
		assert.Equal(t, key, got, "%s vs %s", c.input, c.payload)
	}
	_, big, err := w.Node("w").EventKey(Scope{Input: json.RawMessage(`{"k": "` + strings.Repeat("x", MaxMatchKeyBytes) + `"}`)})
	assert.Error(t, err, "a key larger than the bound is an error, not a truncation")
	assert.Empty(t, big)
	_, _, err = w.Node("w").EventKey(Scope{Input: json.RawMessage(`{}`)})
	assert.ErrorContains(t, err, "wait.match", "a key the input cannot give names the field")
}

func TestCancelOn(t *testing.T) {
	w := MustParse(`{"cancel_on": [{"event": "order.cancelled", "match": "event.payload.order_id == input.order_id"}, {"event": "tenant.closed"}],
		"nodes": [{"id": "a", "type": "noop"}]}`)
	require.True(t, w.HasEventWaits())
	in := json.RawMessage(`{"order_id": 7}`)
	expr, key, err := w.CancelOn[0].Key(in)
	require.NoError(t, err)
	assert.Equal(t, "event.payload.order_id", expr)
	assert.Equal(t, "7", key)
	ok, err := w.CancelOn[0].Matches(in, EventData{Name: "order.cancelled", Payload: json.RawMessage(`{"order_id": 7}`)})
	assert.True(t, ok && err == nil)
	ok, _ = w.CancelOn[0].Matches(in, EventData{Name: "order.cancelled", Payload: json.RawMessage(`{"order_id": 8}`)})
	assert.False(t, ok)
	ok, _ = w.CancelOn[1].Matches(in, EventData{Name: "tenant.closed"})
	assert.True(t, ok, "no match: every event of the name")
	assert.Len(t, MustParse(string(w.Canonical())).CancelOn, 2, "the canonical form keeps cancel_on")
	assert.False(t, MustParse(`{"nodes": [{"id": "a", "type": "noop"}]}`).HasEventWaits())
}

func TestEventWaitProblems(t *testing.T) {
	for def, want := range map[string]string{
		`{"nodes": [{"id": "w", "type": "wait", "wait": {"signal": "s", "event": "e"}}]}`:                                                                         "node \"w\": wait: give a signal or an event, not both",
		`{"nodes": [{"id": "w", "type": "wait", "wait": {"event": "bad name"}}]}`:                                                                                 "node \"w\": wait.event: must be dot-separated",
		`{"nodes": [{"id": "w", "type": "wait", "wait": {"event": "e", "approval": true}}]}`:                                                                      "node \"w\": wait.approval: is for signals",
		`{"nodes": [{"id": "w", "type": "wait", "wait": {"signal": "s", "match": "true"}}]}`:                                                                      "node \"w\": wait.match: is for event waits",
		`{"nodes": [{"id": "w", "type": "wait", "wait": {"event": "e", "match": "event.payload.x +"}}]}`:                                                          "node \"w\": wait.match: does not compile",
		`{"nodes": [{"id": "w", "type": "wait", "wait": {"event": "e", "match": "event.payload.x"}}]}`:                                                            "",
		`{"nodes": [{"id": "w", "type": "wait", "wait": {"event": "e", "match": "1 + 1"}}]}`:                                                                      "node \"w\": wait.match: must be a boolean expression",
		`{"nodes": [{"id": "a", "type": "noop"}, {"id": "w", "type": "wait", "wait": {"event": "e", "match": "nodes.a.output.x == event.payload.x"}}]}`:           "node \"w\": wait.match: reads nodes.a, which is not upstream of w",
		`{"cancel_on": [{"event": "e", "match": "nodes.a.output.x == event.payload.x"}], "nodes": [{"id": "a", "type": "noop"}]}`:                                 "cancel_on[0].match: reads nodes.a: cancel_on is matched against the run input only",
		`{"cancel_on": [{"event": "*"}], "nodes": [{"id": "a", "type": "noop"}]}`:                                                                                 "cancel_on[0].event: must be dot-separated",
		`{"cancel_on": [{"event": "a"}, {"event": "b"}, {"event": "c"}, {"event": "d"}, {"event": "e"}, {"event": "f"}], "nodes": [{"id": "a", "type": "noop"}]}`: "cancel_on: 6 entries; at most 5",
	} {
		_, err := Parse([]byte(def))
		if want == "" {
			assert.NoError(t, err, def)
			continue
		}
		if assert.Error(t, err, def) {
			assert.Contains(t, err.Error(), want, def)
		}
	}
}
