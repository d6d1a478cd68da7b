package auth

// Every query of the package, named. Tenant-scoped ones run in a
// pg.Tx and repeat the tenant in their WHERE clause so the primary
// key serves them; the policy would hide other tenants' rows anyway.
const (
	qKeyInsert = `INSERT INTO api_keys (tenant_id, id, key_id, name, scopes, secret_hash, created_by, expires_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING created_at`
	qKeyList = `SELECT id, key_id, name, scopes, created_by, created_at, expires_at, revoked_at, last_used_at
		FROM api_keys WHERE tenant_id = $1 AND ($3::uuid IS NULL OR id > $3) ORDER BY id LIMIT $2`
	qKeyCreateLock = `SELECT pg_advisory_xact_lock(hashtextextended('api_keys:' || $1::uuid::text, 0))`
	qKeyCountLive  = `SELECT count(*) FROM api_keys WHERE tenant_id = $1 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())`
	qKeyGet        = `SELECT id, key_id, name, scopes, created_by, created_at, expires_at, revoked_at, last_used_at
		FROM api_keys WHERE tenant_id = $1 AND id = $2`
	// Revoking twice keeps the first revocation time.
	qKeyRevoke = `UPDATE api_keys SET revoked_at = coalesce(revoked_at, now()) WHERE tenant_id = $1 AND id = $2`
	qKeyLookup = `SELECT tenant_id, id, secret_hash, scopes, expires_at, revoked_at, last_used_at
		FROM composer_api_key_lookup($1)`
	qKeyTouch = `SELECT composer_api_key_touch($1, $2)`

	qMemberInsert = `INSERT INTO memberships (tenant_id, subject, role, email) VALUES ($1, $2, $3, NULLIF($4, ''))
		RETURNING created_at, updated_at`
	qMemberGet = `SELECT subject, role, coalesce(email, ''), created_at, updated_at
		FROM memberships WHERE tenant_id = $1 AND subject = $2`
	qMemberList = `SELECT subject, role, coalesce(email, ''), created_at, updated_at
		FROM memberships WHERE tenant_id = $1 ORDER BY subject`
	// qOwnersLock locks every owner row, in a fixed order, so two
	// transactions that each demote or remove a different owner serialize
	// and the second sees the first's change.
	qOwnersLock    = `SELECT subject FROM memberships WHERE tenant_id = $1 AND role = 'owner' ORDER BY subject FOR UPDATE`
	qMemberSetRole = `UPDATE memberships SET role = $3, updated_at = now() WHERE tenant_id = $1 AND subject = $2
		RETURNING subject, role, coalesce(email, ''), created_at, updated_at`
	qMemberDelete = `DELETE FROM memberships WHERE tenant_id = $1 AND subject = $2`

	qMembershipVersion = `SELECT membership_version FROM tenants WHERE id = $1`
	// qTenantRoles reads the version and the assignments in one statement,
	// so the rules cached under a version are exactly that version's.
	qTenantRoles = `SELECT t.membership_version, m.subject, m.role
		FROM tenants t LEFT JOIN memberships m ON m.tenant_id = t.id
		WHERE t.id = $1`
)
