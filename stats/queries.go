package stats

// The statements of package stats: the fold (system role, across tenants)
// and the dashboard reads (a tenant's transaction, row-level security).
const (
	qLockState = `SELECT folded_to, census_from FROM run_rollup_state FOR UPDATE`
	qOldestRun = `SELECT date_trunc('minute', composer_uuid_time((SELECT id FROM workflow_runs ORDER BY id LIMIT 1)))`
	// The month of the oldest partition of the runs: runs created before it
	// are gone (retention), and so is their census.
	qOldestPartition = `SELECT min(to_date(right(c.relname, 6), 'YYYYMM'))::timestamp AT TIME ZONE 'UTC'
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
		WHERE p.relname = 'workflow_runs' AND c.relname ~ '^workflow_runs_[0-9]{6}$'`
	qClearCensus = `UPDATE run_rollups SET now_completed = 0, now_failed = 0, now_cancelled = 0
		WHERE bucket >= $1 AND bucket < $2 AND now_completed + now_failed + now_cancelled > 0`
	qAdvance = `UPDATE run_rollup_state SET folded_to = $1, census_from = $2`

	// Runs created (by id time) in [$1, $2), per tenant, workflow and minute.
	qFoldStarted = `SELECT tenant_id, workflow_id, date_trunc('minute', composer_uuid_time(id)), count(*)
		FROM workflow_runs WHERE id >= composer_uuid_floor($1) AND id < composer_uuid_floor($2)
		GROUP BY 1, 2, 3`
	// Runs finished in [$1, $2), per tenant, workflow, minute, outcome and
	// duration bucket.
	qFoldFinished = `SELECT tenant_id, workflow_id, date_trunc('minute', finished_at), status,
			composer_duration_bucket(extract(epoch FROM finished_at - created_at) * 1000), count(*)
		FROM workflow_runs WHERE finished_at >= $1 AND finished_at < $2 AND status IN ('completed', 'failed', 'cancelled')
		GROUP BY 1, 2, 3, 4, 5`
	// The creation minutes whose census changed in [$1, $2): those of the
	// runs finished or reopened then.
	qTouched = `SELECT DISTINCT tenant_id, date_trunc('minute', composer_uuid_time(id)) FROM workflow_runs
		WHERE (finished_at >= $1 AND finished_at < $2) OR (reopened_at >= $1 AND reopened_at < $2)`
	// The census of creation minutes ($1 tenants, $2 minutes): every
	// workflow with runs created in the minute, with how many of them are
	// now completed, failed or cancelled having finished before $3.
	qCensus = `SELECT t.tenant_id, r.workflow_id, t.m,
			count(*) FILTER (WHERE r.status = 'completed' AND r.finished_at < $3),
			count(*) FILTER (WHERE r.status = 'failed' AND r.finished_at < $3),
			count(*) FILTER (WHERE r.status = 'cancelled' AND r.finished_at < $3)
		FROM unnest($1::uuid[], $2::timestamptz[]) AS t(tenant_id, m)
		CROSS JOIN LATERAL (SELECT workflow_id, status, finished_at FROM workflow_runs r
			WHERE r.tenant_id = t.tenant_id AND r.id >= composer_uuid_floor(t.m)
			  AND r.id < composer_uuid_floor(t.m + interval '1 minute') OFFSET 0) r
		GROUP BY 1, 2, 3`
	qAddEvents = `INSERT INTO run_rollups AS r (tenant_id, workflow_id, width, bucket, started, completed, failed, cancelled, durations)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		ON CONFLICT (tenant_id, workflow_id, width, bucket) DO UPDATE SET
			started = r.started + EXCLUDED.started, completed = r.completed + EXCLUDED.completed,
			failed = r.failed + EXCLUDED.failed, cancelled = r.cancelled + EXCLUDED.cancelled,
			durations = composer_int_array_add(r.durations, EXCLUDED.durations)`
	qSetCensus = `INSERT INTO run_rollups AS r (tenant_id, workflow_id, width, bucket, now_completed, now_failed, now_cancelled)
		VALUES ($1, $2, 60, $3, $4, $5, $6)
		ON CONFLICT (tenant_id, workflow_id, width, bucket) DO UPDATE SET
			now_completed = EXCLUDED.now_completed, now_failed = EXCLUDED.now_failed, now_cancelled = EXCLUDED.now_cancelled`
	// A day's census is the sum of its minutes'.
	qSetDayCensus = `INSERT INTO run_rollups AS r (tenant_id, workflow_id, width, bucket, now_completed, now_failed, now_cancelled)
		SELECT $1, $2, 86400, $3, coalesce(sum(now_completed), 0), coalesce(sum(now_failed), 0), coalesce(sum(now_cancelled), 0)
		  FROM run_rollups WHERE tenant_id = $1 AND workflow_id = $2 AND width = 60 AND bucket >= $3 AND bucket < $3 + interval '1 day'
		ON CONFLICT (tenant_id, workflow_id, width, bucket) DO UPDATE SET
			now_completed = EXCLUDED.now_completed, now_failed = EXCLUDED.now_failed, now_cancelled = EXCLUDED.now_cancelled`

	// The watermark and the rollup rows of [$4, $5), in one snapshot (a fold
	// committing between two statements would count its minutes twice).
	qRollupRows = `WITH st AS (SELECT folded_to FROM run_rollup_state)
		SELECT st.folded_to, r.bucket, r.started, r.completed, r.failed, r.cancelled, r.durations
		  FROM st LEFT JOIN run_rollups r ON r.tenant_id = $1 AND r.workflow_id = $2 AND r.width = $3
		   AND r.bucket >= $4 AND r.bucket < $5`
	// The live tail since the watermark ($2) up to $3.
	qTailStarted = `SELECT date_trunc('minute', composer_uuid_time(id)), count(*) FROM workflow_runs
		WHERE tenant_id = $1 AND id >= composer_uuid_floor($2) AND id < composer_uuid_floor($3)
		  AND ($4::uuid IS NULL OR workflow_id = $4) GROUP BY 1`
	qTailFinished = `SELECT date_trunc('minute', finished_at), status,
			composer_duration_bucket(extract(epoch FROM finished_at - created_at) * 1000), count(*)
		FROM workflow_runs WHERE tenant_id = $1 AND finished_at >= $2 AND finished_at < $3
		  AND status IN ('completed', 'failed', 'cancelled') AND ($4::uuid IS NULL OR workflow_id = $4)
		GROUP BY 1, 2, 3`

	// The watermark and the census of runs created in the minutes [$3, $4)
	// and [$5, $6) and the days [$7, $8).
	qCensusSum = `WITH st AS (SELECT folded_to FROM run_rollup_state)
		SELECT st.folded_to, coalesce(sum(r.now_completed), 0), coalesce(sum(r.now_failed), 0), coalesce(sum(r.now_cancelled), 0)
		  FROM st LEFT JOIN run_rollups r ON r.tenant_id = $1 AND r.workflow_id = $2 AND (
		       (r.width = 60 AND ((r.bucket >= $3 AND r.bucket < $4) OR (r.bucket >= $5 AND r.bucket < $6)))
		    OR (r.width = 86400 AND r.bucket >= $7 AND r.bucket < $8))
		 GROUP BY st.folded_to`
	// What the census does not hold, live: runs queued or running created in
	// [$2, $3) (the status index, id bounds included); terminal runs created
	// in [$4, $5) that finished since the watermark $6 (the finish index:
	// the subquery keeps the id bounds out of its plan, since a generic plan
	// cannot tell a wide id range from a narrow one and would scan every
	// terminal run of the range); terminal runs created in the sub-minute
	// edges [$2, $4) and [$5, $3). (A variant without the workflow
	// condition, whose first part is an index-only scan, measured 5× slower
	// at 1M runs: 60 ms against 12 ms at the median.)
	qLiveCounts = `SELECT status, count(*) FROM workflow_runs
		WHERE tenant_id = $1 AND status IN ('queued', 'running') AND id >= composer_uuid_floor($2) AND id < composer_uuid_floor($3)
		  AND ($7::uuid IS NULL OR workflow_id = $7) GROUP BY status
		UNION ALL
		SELECT status, count(*) FROM (SELECT id, status FROM workflow_runs
			WHERE tenant_id = $1 AND finished_at >= $6 AND status IN ('completed', 'failed', 'cancelled')
			  AND ($7::uuid IS NULL OR workflow_id = $7) OFFSET 0) f
		WHERE id >= composer_uuid_floor($4) AND id < composer_uuid_floor($5) GROUP BY status
		UNION ALL
		SELECT status, count(*) FROM workflow_runs
		WHERE tenant_id = $1 AND status IN ('completed', 'failed', 'cancelled') AND ($7::uuid IS NULL OR workflow_id = $7)
		  AND id >= composer_uuid_floor($2) AND id < composer_uuid_floor($4) GROUP BY status
		UNION ALL
		SELECT status, count(*) FROM workflow_runs
		WHERE tenant_id = $1 AND status IN ('completed', 'failed', 'cancelled') AND ($7::uuid IS NULL OR workflow_id = $7)
		  AND id >= composer_uuid_floor($5) AND id < composer_uuid_floor($3) GROUP BY status`
)
