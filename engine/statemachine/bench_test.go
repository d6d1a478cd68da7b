package statemachine

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/composer-dev/composer/engine/dag"
)

// BenchmarkDecideChainStep measures one completion in the middle of a
// 20-step chain with input mappings: the decision the coordinator makes
// for every step.
func BenchmarkDecideChainStep(b *testing.B) {
	var nodes []string
	for i := 0; i < 20; i++ {
		dep, in := "", ""
		if i > 0 {
			dep = fmt.Sprintf(`,"depends_on":["n%d"]`, i-1)
			in = fmt.Sprintf(`,"input":{"v":"nodes.n%d.output.v + 1"}`, i-1)
		}
		nodes = append(nodes, fmt.Sprintf(`{"id":"n%d","type":"noop"%s%s}`, i, dep, in))
	}
	wf := dag.MustParse(`{"nodes":[` + strings.Join(nodes, ",") + `]}`)
	run := &Run{ID: "r", Status: RunRunning, Input: json.RawMessage(`{}`), Tasks: map[string]*Task{}}
	for i := 0; i < 10; i++ {
		run.Tasks[fmt.Sprintf("n%d", i)] = &Task{ID: fmt.Sprint("t", i), NodeID: fmt.Sprintf("n%d", i), State: TaskCompleted, Attempt: 1, Output: json.RawMessage(`{"v": 1}`)}
	}
	run.Tasks["n10"] = &Task{ID: "t10", NodeID: "n10", State: TaskRunning, Attempt: 1}
	ev := NodeCompleted{NodeID: "n10", TaskID: "t10", Attempt: 1, Output: json.RawMessage(`{"v": 2}`)}
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		if tr := Decide(wf, run, ev, now); tr.Ignored || len(tr.Actions) != 3 {
			b.Fatalf("unexpected transition %+v", tr)
		}
	}
}

// BenchmarkDecideFanOut measures the completion of the root of a 100-way
// fan-out: 100 tasks created and dispatched in one decision.
func BenchmarkDecideFanOut(b *testing.B) {
	nodes := []string{`{"id":"root","type":"noop"}`}
	for i := 0; i < 100; i++ {
		nodes = append(nodes, fmt.Sprintf(`{"id":"f%d","type":"noop","depends_on":["root"]}`, i))
	}
	wf := dag.MustParse(`{"nodes":[` + strings.Join(nodes, ",") + `]}`)
	run := &Run{ID: "r", Status: RunRunning, Input: json.RawMessage(`{}`),
		Tasks: map[string]*Task{"root": {ID: "t", NodeID: "root", State: TaskRunning, Attempt: 1}}}
	ev := NodeCompleted{NodeID: "root", TaskID: "t", Attempt: 1}
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		Decide(wf, run, ev, now)
	}
}
