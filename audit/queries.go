package audit

// The package's SQL, named. (The list filter is assembled in List from
// parameterised pieces.)
const (
	// qAppend locks the tenant's chain head (creating it with the first
	// record), advances it to the new record and inserts the record, in one
	// statement: $1 tenant, $2 principal kind, $3 principal id, $4 action,
	// $5 target type, $6 target id, $7 outcome, $8 detail, $9 body (the
	// encoding of $2-$8, see Body). The record's time is the transaction's,
	// never before the previous record's, so time order is seq order.
	qAppend = `WITH head AS (
	INSERT INTO audit_heads AS h (tenant_id, seq, prev_hash, hash, at)
	VALUES ($1, 1, '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea,
		sha256('\x0000000000000000000000000000000000000000000000000000000000000000'::bytea
			|| int8send(1::bigint) || int8send((extract(epoch FROM now()) * 1000000)::bigint) || $9::bytea),
		now())
	ON CONFLICT (tenant_id) DO UPDATE SET
		seq = h.seq + 1,
		prev_hash = h.hash,
		at = greatest(h.at, EXCLUDED.at),
		hash = sha256(h.hash || int8send(h.seq + 1)
			|| int8send((extract(epoch FROM greatest(h.at, EXCLUDED.at)) * 1000000)::bigint) || $9::bytea)
	RETURNING tenant_id, seq, prev_hash, hash, at
)
INSERT INTO audit_log (tenant_id, seq, at, principal_kind, principal_id, action, target_type, target_id, outcome, detail, prev_hash, hash)
SELECT tenant_id, seq, at, $2, $3, $4, $5, $6, $7, $8, prev_hash, hash FROM head`

	// qHead and the kept rows, read in one statement so that they come
	// from one snapshot.
	qVerify = `SELECT h.seq, h.hash, h.pruned_seq, a.seq, a.at, a.principal_kind, a.principal_id, a.action,
		a.target_type, a.target_id, a.outcome, a.detail, a.prev_hash, a.hash
	FROM audit_heads h LEFT JOIN audit_log a ON a.tenant_id = h.tenant_id
	WHERE h.tenant_id = $1
	ORDER BY a.seq`

	qListColumns = `SELECT seq, at, principal_kind, principal_id, action, target_type, target_id, outcome, detail
	FROM audit_log WHERE tenant_id = $1`

	// qPrune deletes, for every tenant with a retention, its records
	// older than it — up to the newest such record's seq, so a tenant's
	// kept records are always a contiguous tail of its chain — and moves
	// the head's pruned_seq there. At most $1 records per tenant a call.
	qPrune = `WITH cut AS (
	SELECT h.tenant_id, (SELECT max(a.seq) FROM audit_log a
		WHERE a.tenant_id = h.tenant_id AND a.seq <= h.pruned_seq + $1
		  AND a.at < now() - make_interval(days => composer_tenant_limit(h.tenant_id, 'audit_retention_days')::int)) AS seq
	FROM audit_heads h
	WHERE composer_tenant_limit(h.tenant_id, 'audit_retention_days') > 0
), del AS (
	DELETE FROM audit_log a USING cut
	WHERE a.tenant_id = cut.tenant_id AND cut.seq IS NOT NULL AND a.seq <= cut.seq
	RETURNING a.tenant_id
)
UPDATE audit_heads h SET pruned_seq = cut.seq
FROM cut WHERE h.tenant_id = cut.tenant_id AND cut.seq IS NOT NULL AND cut.seq > h.pruned_seq`
)
