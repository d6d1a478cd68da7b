package model

import "time"

// TenantUsage is what a tenant uses: its current queue and running counts,
// and the billing period whose meters its field resolvers read.
type TenantUsage struct {
	RunningRuns  int
	QueuedTasks  int
	RunningTasks int
	// Start is the first instant of the billing period.
	Start time.Time
}
