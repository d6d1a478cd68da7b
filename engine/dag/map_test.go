package dag

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestMapAndWorkflowNodeProblems(t *testing.T) {
	for def, want := range map[string]string{
		`{"nodes": [{"id": "c", "type": "workflow", "workflow": {"name": "bad name"}}]}`:                                                            `node "c": workflow.name: must name a workflow`,
		`{"nodes": [{"id": "c", "type": "workflow"}]}`:                                                                                              `node "c": workflow: is required for a node of type workflow`,
		`{"nodes": [{"id": "m", "type": "map", "map": {"items": "", "step": {"type": "noop"}}}]}`:                                                   `node "m": map.items: is required`,
		`{"nodes": [{"id": "m", "type": "map", "map": {"items": "input.x"}}]}`:                                                                      `node "m": map.step: is required`,
		`{"nodes": [{"id": "m", "type": "map", "map": {"items": "input.x", "step": {"type": "sleep", "sleep": {"duration": "1s"}}}}]}`:              `node "m": map.step.type: must be http, task, noop or workflow`,
		`{"nodes": [{"id": "m", "type": "map", "map": {"items": "input.x", "step": {"id": "s", "type": "noop"}}}]}`:                                 `node "m": map.step: takes no id`,
		`{"nodes": [{"id": "m", "type": "map", "map": {"items": "input.x", "max_parallelism": 5000, "step": {"type": "noop"}}}]}`:                   `node "m": map.max_parallelism: must be between 1 and 1000`,
		`{"nodes": [{"id": "m", "type": "map", "map": {"items": "input.x", "step": {"type": "task", "task": {"handler": "bad-name"}}}}]}`:           `node "m": map.step.task.handler`,
		`{"nodes": [{"id": "m", "type": "map", "map": {"items": "input.x", "step": {"type": "noop", "input": {"v": "item +"}}}}]}`:                  `node "m": map.step.input.v: does not compile`,
		`{"nodes": [{"id": "a", "type": "noop"}, {"id": "m", "type": "map", "map": {"items": "nodes.a.output.list", "step": {"type": "noop"}}}]}`:   `node "m": map.items: reads nodes.a, which is not upstream`,
		`{"nodes": [{"id": "m", "type": "map", "map": {"items": "input.x", "step": {"type": "noop", "input": {"v": "item.id + string(index)"}}}}]}`: "",
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
	w := MustParse(`{"nodes": [{"id": "m", "type": "map", "map": {"items": "input.x", "step": {"type": "task", "task": {"handler": "h"}, "queue": "q"}}}]}`)
	assert.Equal(t, "q", w.Node("m[7]").QueueName(), "an element's id names the map's step")
	assert.Equal(t, "h", w.Node("m[7]").HandlerName())
	assert.Nil(t, w.Node("m[x]"))
	assert.Nil(t, w.Node("m[07]"))
	base, i, ok := ParseItemID(ItemID("m", 12))
	assert.True(t, ok && base == "m" && i == 12)
	assert.Len(t, MustParse(string(w.Canonical())).Nodes, 1, "the canonical form round-trips")
}
