package graph_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/auth"
	"github.com/composer-dev/composer/internal/apptest"
)

// TestAWaitingTaskSaysUntilWhen: a waiting task shows when its timer fires
// (a sleep's end, a wait's timeout); a wait without a timeout and a
// completed task show none.
func TestAWaitingTaskSaysUntilWhen(t *testing.T) {
	t.Parallel()
	sys := apptest.Start(t)
	sys.StartWorker(apptest.WorkerOptions{})
	owner := sys.Token(sys.Tenant, "owner@example.com", auth.RoleOwner)
	wf := sys.Workflow(`{"nodes": [{"id": "first", "type": "noop"},
		{"id": "nap", "type": "sleep", "depends_on": ["first"], "sleep": {"duration": "1h"}},
		{"id": "approval", "type": "wait", "depends_on": ["first"], "wait": {"signal": "go", "timeout": "2h"}},
		{"id": "forever", "type": "wait", "depends_on": ["first"], "wait": {"signal": "x"}}]}`)
	began := time.Now()
	run := sys.StartRun(wf, `{}`)
	type task struct {
		NodeID       string
		State        string
		WaitingUntil *time.Time
	}
	var got map[string]task
	apptest.Eventually(t, "the waits to begin", 20*time.Second, func() bool {
		var out struct {
			Run struct{ Tasks []task }
		}
		sys.GraphQL(owner, `query($id: ID!) { run(id: $id) { tasks { nodeId state waitingUntil } } }`, map[string]any{"id": run}).Decode(t, &out)
		got = map[string]task{}
		for _, tk := range out.Run.Tasks {
			got[tk.NodeID] = tk
		}
		return got["nap"].State == "WAITING" && got["approval"].State == "WAITING" && got["forever"].State == "WAITING"
	})
	require.NotNil(t, got["nap"].WaitingUntil)
	assert.WithinDuration(t, began.Add(time.Hour), *got["nap"].WaitingUntil, time.Minute, "the sleep's end")
	require.NotNil(t, got["approval"].WaitingUntil)
	assert.WithinDuration(t, began.Add(2*time.Hour), *got["approval"].WaitingUntil, time.Minute, "the wait's timeout")
	assert.Nil(t, got["forever"].WaitingUntil, "a wait without a timeout")
	assert.Equal(t, "COMPLETED", got["first"].State)
	assert.Nil(t, got["first"].WaitingUntil)
}
