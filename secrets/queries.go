package secrets

// The package's SQL, named.
const (
	qLockTenantSecrets = `SELECT pg_advisory_xact_lock(hashtextextended('secrets:' || $1::uuid::text, 0))`
	qCountSecrets      = `SELECT count(*) FROM secrets WHERE tenant_id = $1`
	qInsertSecret      = `INSERT INTO secrets (tenant_id, id, name, current_version, created_by) VALUES ($1, $2, $3, 1, $4)
		ON CONFLICT (tenant_id, name) DO NOTHING`
	qLockSecret  = `SELECT id, current_version FROM secrets WHERE tenant_id = $1 AND name = $2 FOR UPDATE`
	qBumpSecret  = `UPDATE secrets SET current_version = $3, updated_at = now() WHERE tenant_id = $1 AND id = $2`
	qInsertValue = `INSERT INTO secret_versions (tenant_id, secret_id, version, id, sealed, created_by) VALUES ($1, $2, $3, $4, $5, $6)`
	// Older versions than the kept ones go, sealed values with them.
	qPruneVersions = `DELETE FROM secret_versions WHERE tenant_id = $1 AND secret_id = $2 AND version <= $3`
	qDeleteSecret  = `DELETE FROM secrets WHERE tenant_id = $1 AND name = $2 RETURNING current_version`
	qInsertAudit   = `INSERT INTO secret_audit (tenant_id, id, principal, action, secret_name, version) VALUES ($1, $2, $3, $4, $5, $6)`

	secretColumns = `s.id, s.name, s.current_version, s.created_by, s.created_at, s.updated_at,
		coalesce((SELECT array_agg(v.version ORDER BY v.version DESC) FROM secret_versions v WHERE v.tenant_id = s.tenant_id AND v.secret_id = s.id), '{}'),
		coalesce((SELECT array_agg(v.created_by ORDER BY v.version DESC) FROM secret_versions v WHERE v.tenant_id = s.tenant_id AND v.secret_id = s.id), '{}'),
		coalesce((SELECT array_agg(v.created_at ORDER BY v.version DESC) FROM secret_versions v WHERE v.tenant_id = s.tenant_id AND v.secret_id = s.id), '{}')`
	qGetSecret   = `SELECT ` + secretColumns + ` FROM secrets s WHERE s.tenant_id = $1 AND s.name = $2`
	qListSecrets = `SELECT ` + secretColumns + ` FROM secrets s WHERE s.tenant_id = $1 ORDER BY s.name`
	qAudit       = `SELECT id, at, principal, action, secret_name, version FROM secret_audit
		WHERE tenant_id = $1 AND ($2::text IS NULL OR secret_name = $2) AND ($3::uuid IS NULL OR id < $3)
		ORDER BY id DESC LIMIT $4`

	// qForLease (system role) reads the current sealed value of every
	// secret the task's stored request names, only while the task is
	// running on the given attempt under the given worker's live lease.
	// The task row comes back (with a NULL name) when it names none, and
	// with a NULL secret id for a name that does not exist.
	qForLease = `SELECT n.name, s.id, v.id, v.sealed
		FROM task_instances t
		LEFT JOIN LATERAL jsonb_array_elements_text(CASE WHEN jsonb_typeof(t.config->'http'->'secrets') = 'array'
			THEN t.config->'http'->'secrets' ELSE '[]' END) AS n(name) ON true
		LEFT JOIN secrets s ON s.tenant_id = t.tenant_id AND s.name = n.name
		LEFT JOIN secret_versions v ON v.tenant_id = s.tenant_id AND v.secret_id = s.id AND v.version = s.current_version
		WHERE t.tenant_id = $1 AND t.run_id = $2 AND t.id = $3 AND t.attempt = $4
		  AND t.state = 'running' AND t.lease_owner = $5 AND t.lease_expires_at > now()`
)
