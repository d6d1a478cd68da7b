package dag

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConcurrencyKeys(t *testing.T) {
	w := MustParse(`{"concurrency": {"key": "metadata.customer + '/' + string(input.region)", "limit": 2, "strategy": "cancel_newest"},
		"nodes": [{"id": "a", "type": "noop", "concurrency": {"key": "input.partner", "limit": 3}},
		          {"id": "m", "type": "map", "map": {"items": "input.list", "step": {"type": "noop", "concurrency": {"key": "item.p", "limit": 1}}}}]}`)
	key, err := w.ConcurrencyKey(json.RawMessage(`{"region": 7}`), map[string]string{"customer": "c1"})
	require.NoError(t, err)
	assert.Equal(t, "c1/7", key)
	assert.Equal(t, ConcurrencyCancelNewest, w.Concurrency.StrategyName())
	_, err = w.ConcurrencyKey(json.RawMessage(`{}`), nil)
	assert.ErrorContains(t, err, "concurrency.key")

	k, limit, err := w.Node("a").StepKey(Scope{Input: json.RawMessage(`{"partner": 12}`)})
	require.NoError(t, err)
	assert.Equal(t, "12", k)
	assert.Equal(t, 3, limit)
	k, limit, err = w.Node("m").ItemStepKey(Scope{Input: json.RawMessage(`{}`)}, map[string]any{"p": "x"}, 0)
	require.NoError(t, err)
	assert.Equal(t, "x", k)
	assert.Equal(t, 1, limit)
	_, _, err = w.Node("a").StepKey(Scope{Input: json.RawMessage(`{"partner": "` + strings.Repeat("p", MaxConcurrencyKeyChars+1) + `"}`)})
	assert.ErrorContains(t, err, "at most 256")
	assert.Equal(t, ConcurrencyQueue, MustParse(`{"concurrency": {"key": "input.k", "limit": 1}, "nodes": [{"id": "a", "type": "noop"}]}`).Concurrency.StrategyName())

	for def, want := range map[string]string{
		`{"concurrency": {"key": "input.k", "limit": 0}, "nodes": [{"id": "a", "type": "noop"}]}`:                                       "concurrency.limit: must be between 1 and 1000",
		`{"concurrency": {"key": "input.k", "limit": 1, "strategy": "lifo"}, "nodes": [{"id": "a", "type": "noop"}]}`:                   "concurrency.strategy",
		`{"concurrency": {"key": "nodes.a.output", "limit": 1}, "nodes": [{"id": "a", "type": "noop"}]}`:                                "concurrency.key: does not compile",
		`{"nodes": [{"id": "s", "type": "sleep", "sleep": {"duration": "1s"}, "concurrency": {"key": "input.k", "limit": 1}}]}`:         `node "s": concurrency: is for steps that run on a worker`,
		`{"nodes": [{"id": "a", "type": "noop", "concurrency": {"limit": 1}}]}`:                                                         `node "a": concurrency.key: is required`,
		`{"nodes": [{"id": "a", "type": "noop"}, {"id": "b", "type": "noop", "concurrency": {"key": "nodes.a.output.k", "limit": 1}}]}`: `node "b": concurrency.key: reads nodes.a, which is not upstream`,
	} {
		_, err := Parse([]byte(def))
		if assert.Error(t, err, def) {
			assert.Contains(t, err.Error(), want, def)
		}
	}
}
