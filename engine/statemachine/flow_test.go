package statemachine

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/engine/dag"
)

// TestTasksCarryTheirPriorityAndRateKey: a task's priority is its node's,
// else the run's; its rate-limit key is evaluated where its input is,
// over the input and upstream outputs, again for each new task (retries
// keep the task and its key); a key that does not evaluate fails the
// node as an expression error, with no dispatch.
func TestTasksCarryTheirPriorityAndRateKey(t *testing.T) {
	wf := dag.MustParse(`{"nodes":[
		{"id":"a","type":"noop","rate_limit":{"name":"partner-api","key":"input.partner"}},
		{"id":"b","type":"http","depends_on":["a"],"priority":-2,"http":{"url":"https://x.example/"},
		 "rate_limit":{"name":"partner-api","key":"nodes.a.output.account"}},
		{"id":"c","type":"noop","depends_on":["a"],"rate_limit":{"name":"partner-api"}}]}`)
	s := newSim(t, wf, `{"partner": 42}`)
	s.run.Priority = 1
	tr := s.step(RunStarted{})
	require.Equal(t, []string{"create_task", "dispatch"}, kinds(tr))
	a := tr.Actions[0].(CreateTask)
	assert.Equal(t, 1, a.Priority, "the run's")
	assert.Equal(t, "42", a.RateKey, "a number, as JSON writes it")

	tr = s.complete("a", `{"account": "acct_7"}`)
	created := map[string]CreateTask{}
	for _, x := range tr.Actions {
		if c, ok := x.(CreateTask); ok {
			created[c.NodeID] = c
		}
	}
	assert.Equal(t, -2, created["b"].Priority, "the node's own")
	assert.Equal(t, "acct_7", created["b"].RateKey)
	assert.Equal(t, "", created["c"].RateKey, "no key: one bucket")
	assert.Equal(t, 1, created["c"].Priority)

	bad := newSim(t, dag.MustParse(`{"nodes":[{"id":"a","type":"noop","rate_limit":{"name":"p","key":"input.m"}}]}`), `{"m": {"x": 1}}`)
	tr = bad.step(RunStarted{})
	assert.NotContains(t, kinds(tr), "dispatch")
	require.Equal(t, RunFailed, tr.Status)
	assert.Equal(t, CodeExpression, bad.task("a").Error.Code)
}
