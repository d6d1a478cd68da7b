package audit

// The package's SQL, named. (The list filter is assembled in List from
// parameterised pieces.)
const (
	// qEnsureHead gives a tenant without records a placeholder head (seq
	// 0, the genesis hash) to lock: concurrent first appends then
	// serialise on it like any others. It rolls back with its transaction
	// when no record follows.
	qEnsureHead = `INSERT INTO audit_heads (tenant_id, seq, prev_hash, hash, at)
	VALUES ($1, 0, '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea,
		'\x0000000000000000000000000000000000000000000000000000000000000000'::bytea, now())
	ON CONFLICT (tenant_id) DO NOTHING`

	// qLockHead locks the tenant's head until the transaction ends and
	// reads its seq and hash and the next record's time: the
	// transaction's, never before the previous record's, so time order is
	// seq order.
	qLockHead = `SELECT seq, hash, greatest(at, now()) FROM audit_heads WHERE tenant_id = $1 FOR UPDATE`

	// qFailNoKey fails a transaction sealed without an audit key.
	qFailNoKey = `DO $$BEGIN RAISE EXCEPTION 'audit: no audit key configured (COMPOSER_AUDIT_KEY)'; END$$`

	// qAppend advances the locked head to the new record and inserts the
	// record: $1 tenant, $2 seq, $3 prev hash, $4 hash (the record's MAC),
	// $5 time, $6 key id, $7 the head's MAC, $8-$14 the fields. A head
	// that is not at $2 - 1 updates nothing, and the insert then fails on
	// its NULL tenant: never a record beside the chain.
	qAppend = `WITH head AS (
	UPDATE audit_heads SET seq = $2, prev_hash = $3, hash = $4, at = $5, key_id = $6, head_mac = $7
	WHERE tenant_id = $1 AND seq = $2 - 1
	RETURNING tenant_id
)
INSERT INTO audit_log (tenant_id, seq, at, principal_kind, principal_id, action, target_type, target_id, outcome, detail, prev_hash, hash, key_id)
VALUES ((SELECT tenant_id FROM head), $2, $5, $8, $9, $10, $11, $12, $13, $14, $3, $4, $6)`

	// qCoalesceRefusal counts a refusal into its window's row (creating
	// it for the window's first): $1 tenant, $2-$5 principal kind and id,
	// action and outcome, $6 the window in seconds. repeats is 0 for the
	// first, which the caller appends. The row stays locked until the
	// transaction ends.
	qCoalesceRefusal = `INSERT INTO audit_refusals AS r (tenant_id, principal_kind, principal_id, action, outcome, window_start, last_at)
	VALUES ($1, $2, $3, $4, $5, date_bin(make_interval(secs => $6), now(), timestamptz '2000-01-01 00:00:00+00'), now())
	ON CONFLICT (tenant_id, principal_kind, principal_id, action, outcome, window_start)
	DO UPDATE SET repeats = r.repeats + 1, last_at = greatest(r.last_at, EXCLUDED.last_at)
	RETURNING window_start, repeats`

	// qRefusalRecorded names the record a window's first refusal wrote.
	qRefusalRecorded = `UPDATE audit_refusals SET seq = $7
	WHERE tenant_id = $1 AND principal_kind = $2 AND principal_id = $3 AND action = $4 AND outcome = $5 AND window_start = $6`

	// qVerify reads the head and the kept records in one statement, so
	// that they come from one snapshot.
	qVerify = `SELECT h.seq, h.hash, h.key_id, h.head_mac, h.pruned_seq, h.pruned_key_id, h.pruned_mac,
		a.seq, a.at, a.principal_kind, a.principal_id, a.action, a.target_type, a.target_id, a.outcome, a.detail,
		a.prev_hash, a.hash, a.key_id
	FROM audit_heads h LEFT JOIN audit_log a ON a.tenant_id = h.tenant_id
	WHERE h.tenant_id = $1
	ORDER BY a.seq`

	qListColumns = `SELECT a.seq, a.at, a.principal_kind, a.principal_id, a.action, a.target_type, a.target_id, a.outcome, a.detail,
		coalesce(r.repeats, 0), CASE WHEN r.repeats > 0 THEN r.last_at END
	FROM audit_log a LEFT JOIN audit_refusals r ON r.tenant_id = a.tenant_id AND r.seq = a.seq
	WHERE a.tenant_id = $1`

	// qPrune deletes, for every tenant with a retention, its records
	// older than it — up to the newest such record's seq, so a tenant's
	// kept records are always a contiguous tail of its chain — and moves
	// the head's pruned_seq there. At most $1 records per tenant a call.
	// It returns each cut (tenant, seq, the hash of the record at it) for
	// its retention mark (qPrunedMark, in the same transaction); moving
	// pruned_mark_seq with pruned_seq is what the heads' CHECK demands.
	qPrune = `WITH cut AS (
	SELECT h.tenant_id, (SELECT max(a.seq) FROM audit_log a
		WHERE a.tenant_id = h.tenant_id AND a.seq <= h.pruned_seq + $1
		  AND a.at < now() - make_interval(days => composer_tenant_limit(h.tenant_id, 'audit_retention_days')::int)) AS seq
	FROM audit_heads h
	WHERE composer_tenant_limit(h.tenant_id, 'audit_retention_days') > 0
), del AS (
	DELETE FROM audit_log a USING cut
	WHERE a.tenant_id = cut.tenant_id AND cut.seq IS NOT NULL AND a.seq <= cut.seq
	RETURNING a.tenant_id, a.seq, a.hash
)
UPDATE audit_heads h SET pruned_seq = cut.seq, pruned_mark_seq = cut.seq
FROM cut WHERE h.tenant_id = cut.tenant_id AND cut.seq IS NOT NULL AND cut.seq > h.pruned_seq
RETURNING h.tenant_id, h.pruned_seq, (SELECT d.hash FROM del d WHERE d.tenant_id = h.tenant_id AND d.seq = h.pruned_seq)`

	// qPrunedMark stores a cut's retention mark: $1 tenant, $2 pruned
	// seq, $3 key id, $4 MAC.
	qPrunedMark = `UPDATE audit_heads SET pruned_key_id = $3, pruned_mac = $4 WHERE tenant_id = $1 AND pruned_seq = $2`
)
