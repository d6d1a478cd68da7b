package dag

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestTriggersParseAndMatch(t *testing.T) {
	w, err := Parse([]byte(`{"triggers": [
		{"event": "order.created", "if": "event.payload.total > 100"},
		{"event": "order.*"},
		{"event": "*.shipped.eu"}
	], "nodes": [{"id": "a", "type": "noop"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	tr := w.Triggers
	if tr[0].Wildcard() || !tr[1].Wildcard() || !tr[2].Wildcard() {
		t.Fatal("wildcards")
	}
	if tr[1].Prefix() != "order." || tr[2].Prefix() != "" || tr[0].Prefix() != "order.created" {
		t.Fatalf("prefixes %q %q %q", tr[0].Prefix(), tr[1].Prefix(), tr[2].Prefix())
	}
	for _, c := range []struct {
		i    int
		name string
		want bool
	}{
		{0, "order.created", true}, {0, "order.created.x", false},
		{1, "order.created", true}, {1, "order", false}, {1, "order.item.added", false}, {1, "orders.created", false},
		{2, "x.shipped.eu", true}, {2, "x.shipped.us", false},
	} {
		if got := tr[c.i].MatchesName(c.name); got != c.want {
			t.Errorf("%s matches %s: %v", tr[c.i].Event, c.name, got)
		}
	}
	for payload, want := range map[string]bool{`{"total": 150}`: true, `{"total": 50}`: false} {
		got, err := tr[0].Matches("e1", "order.created", json.RawMessage(payload))
		if err != nil || got != want {
			t.Errorf("%s: %v %v", payload, got, err)
		}
	}
	if _, err := tr[0].Matches("e1", "order.created", json.RawMessage(`{}`)); err == nil {
		t.Error("a missing field should be an evaluation error")
	}
	// The canonical form keeps the triggers.
	w2, err := Parse(w.Canonical())
	if err != nil || len(w2.Triggers) != 3 || w2.Triggers[0].If != tr[0].If {
		t.Fatalf("round trip: %v %+v", err, w2)
	}
}

func TestTriggerProblems(t *testing.T) {
	many := make([]string, MaxTriggers+1)
	for i := range many {
		many[i] = fmt.Sprintf(`{"event": "e%d"}`, i)
	}
	for _, c := range []struct{ triggers, field, msg string }{
		{`[{"event": ""}]`, "triggers[0].event", "is required"},
		{`[{"event": "order..created"}]`, "triggers[0].event", "segments"},
		{`[{"event": "order.cr*"}]`, "triggers[0].event", "segments"},
		{`[{"event": "` + strings.Repeat("a", 129) + `"}]`, "triggers[0].event", "longer than"},
		{`[{"event": "a"}, {"event": "b", "if": "event.payload.x +"}]`, "triggers[1].if", "does not compile"},
		{`[{"event": "a", "if": "'s'"}]`, "triggers[0].if", "boolean"},
		{`[{"event": "a", "if": "input.x == 1"}]`, "triggers[0].if", "does not compile"},
		{`[{"event": "a"}, {"event": "a"}]`, "triggers[1]", "repeats"},
		{"[" + strings.Join(many, ",") + "]", "triggers", "at most 10"},
	} {
		_, err := Parse([]byte(`{"triggers": ` + c.triggers + `, "nodes": [{"id": "a", "type": "noop"}]}`))
		var ve *ValidationError
		if !errors.As(err, &ve) {
			t.Errorf("%s: %v", c.triggers, err)
			continue
		}
		found := false
		for _, p := range ve.Problems {
			if p.Field == c.field && strings.Contains(p.Message, c.msg) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: want %s %q, got %+v", c.triggers, c.field, c.msg, ve.Problems)
		}
	}
	_, err := Parse([]byte(`{"triggers": [{"event": "a", "when": "x"}], "nodes": [{"id": "a", "type": "noop"}]}`))
	if err == nil || !strings.Contains(err.Error(), "when") {
		t.Errorf("unknown trigger field: %v", err)
	}
}
