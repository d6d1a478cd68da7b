package tenants

// The package's SQL, named. (Statements that are assembled from
// parameterised pieces — filters — are built next to their const parts.)
const (
	// limits
	qEffectiveLimits = `SELECT t.limits, p.limits FROM tenants t JOIN plans p ON p.name = t.plan WHERE t.id = $1`
	qUpdateTenant    = `UPDATE tenants SET plan = coalesce(NULLIF($2, ''), plan),
		limits = coalesce($3::jsonb, limits), stream_shards = coalesce(NULLIF($4, 0), stream_shards),
		updated_at = now() WHERE id = $1`
	// tenants
	qInsertTenant = `INSERT INTO tenants (id, name, plan, stream_shards) VALUES ($1, $2, $3, $4)
			RETURNING created_at`
	qGetTenant = `SELECT id, name, plan, stream_shards, created_at FROM tenants WHERE id = $1`
	qRoutes    = `SELECT id, stream_shards, coalesce(composer_tenant_limit(id, 'weight'), 1)
		FROM tenants WHERE id = ANY($1)`
)
