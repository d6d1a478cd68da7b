package app

// The package's SQL, named. (Statements that are assembled from
// parameterised pieces — filters — are built next to their const parts.)
const (
	// dev
	qDemoTenant       = `SELECT id FROM tenants WHERE name = $1 ORDER BY created_at LIMIT 1`
	qWorkflowIDByName = `SELECT id FROM workflow_definitions WHERE tenant_id = $1 AND name = $2`
)
