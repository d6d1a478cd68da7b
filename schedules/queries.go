package schedules

const (
	scheduleColumns = `id, workflow_id, workflow_version, cron, interval_seconds, time_zone, input, metadata, external_id,
		description, overlap, catchup_window_seconds, paused, next_fire_at, buffered_fire_at, last_fire_at, last_run_id,
		last_outcome, last_error, started_count, skipped_count, refused_count, missed_count, created_by, created_at, updated_at, priority`

	qNow                 = `SELECT now()`
	qLockTenantSchedules = `SELECT pg_advisory_xact_lock(hashtextextended('schedules:' || $1::uuid::text, 0))`
	qCountSchedules      = `SELECT count(*) FROM schedules WHERE tenant_id = $1`
	qResolveWorkflow     = `SELECT id, latest_version FROM workflow_definitions
		WHERE tenant_id = $1 AND (id = $2 OR ($2 IS NULL AND name = $3))`
	qInsertSchedule = `INSERT INTO schedules (tenant_id, id, workflow_id, workflow_version, cron, interval_seconds, time_zone,
		input, metadata, external_id, description, overlap, catchup_window_seconds, paused, next_fire_at, created_by, priority)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)`
	qGetSchedule       = `SELECT ` + scheduleColumns + ` FROM schedules WHERE tenant_id = $1 AND id = $2`
	qGetScheduleLocked = `SELECT ` + scheduleColumns + ` FROM schedules WHERE tenant_id = $1 AND id = $2 FOR UPDATE`
	qListSchedules     = `SELECT ` + scheduleColumns + ` FROM schedules
		WHERE tenant_id = $1 AND ($2::uuid IS NULL OR id > $2) AND ($3::uuid IS NULL OR workflow_id = $3)
		ORDER BY id LIMIT $4`
	qUpdateSchedule = `UPDATE schedules SET workflow_version = $3, cron = $4, interval_seconds = $5, time_zone = $6, input = $7,
		metadata = $8, external_id = $9, description = $10, overlap = $11, catchup_window_seconds = $12, paused = $13,
		next_fire_at = $14, buffered_fire_at = $15, priority = $16, claimed_until = NULL, updated_at = now()
		WHERE tenant_id = $1 AND id = $2`
	qDeleteSchedule = `DELETE FROM schedules WHERE tenant_id = $1 AND id = $2`
	qRecentFires    = `SELECT fire_at, run_id, outcome, backfill, error_code, error_message, created_at FROM schedule_fires
		WHERE tenant_id = $1 AND schedule_id = $2 ORDER BY fire_at DESC LIMIT $3`

	// The firing loop. The claim is the system role's only statement on
	// schedules; everything else runs in the schedule's tenant transaction.
	qClaimDue = `UPDATE schedules SET claimed_until = now() + make_interval(secs => $2)
		 WHERE (tenant_id, id) IN (
		       SELECT tenant_id, id FROM schedules
		        WHERE NOT paused AND (next_fire_at <= now() OR buffered_fire_at IS NOT NULL)
		          AND (claimed_until IS NULL OR claimed_until < now())
		        ORDER BY next_fire_at NULLS LAST LIMIT $1 FOR UPDATE SKIP LOCKED)
		RETURNING tenant_id, id`
	qNextDue = `SELECT min(greatest(next_fire_at, coalesce(claimed_until, next_fire_at))) FROM schedules
		 WHERE NOT paused AND next_fire_at IS NOT NULL`
	// The runs of the schedule's recent fires that are still going.
	qActiveRuns = `SELECT f.run_id FROM (
		       SELECT run_id FROM schedule_fires
		        WHERE tenant_id = $1 AND schedule_id = $2 AND run_id IS NOT NULL
		        ORDER BY fire_at DESC LIMIT 100) f
		  JOIN workflow_runs r ON r.tenant_id = $1 AND r.id = f.run_id
		 WHERE r.status = 'running'`
	// Records a fire's outcome and moves the schedule on, fenced by the
	// state it was decided from ($3, $4): a schedule changed meanwhile (an
	// update, a pause, another replica) is left as it is now.
	qAdvance = `UPDATE schedules SET next_fire_at = $5, buffered_fire_at = $6,
		last_fire_at = coalesce($7, last_fire_at), last_run_id = coalesce($8, last_run_id),
		last_outcome = coalesce($9, last_outcome), last_error = CASE WHEN $9::text IS NULL THEN last_error ELSE $10 END,
		started_count = started_count + $11, skipped_count = skipped_count + $12,
		refused_count = refused_count + $13, missed_count = missed_count + $14
		WHERE tenant_id = $1 AND id = $2 AND NOT paused
		  AND next_fire_at IS NOT DISTINCT FROM $3 AND buffered_fire_at IS NOT DISTINCT FROM $4`
	qRecordFire = `INSERT INTO schedule_fires (tenant_id, schedule_id, fire_at, run_id, outcome, backfill, error_code, error_message)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		ON CONFLICT (tenant_id, schedule_id, fire_at) DO UPDATE
		  SET run_id = EXCLUDED.run_id, outcome = EXCLUDED.outcome, error_code = EXCLUDED.error_code,
		      error_message = EXCLUDED.error_message, created_at = now()`
	// Keeps the latest 100 fires of a schedule.
	qTrimFires = `DELETE FROM schedule_fires WHERE tenant_id = $1 AND schedule_id = $2 AND fire_at < (
		SELECT fire_at FROM schedule_fires WHERE tenant_id = $1 AND schedule_id = $2 ORDER BY fire_at DESC OFFSET 99 LIMIT 1)`
	qCountBackfill = `UPDATE schedules SET started_count = started_count + $3, refused_count = refused_count + $4
		WHERE tenant_id = $1 AND id = $2`
	qReleaseClaim = `UPDATE schedules SET claimed_until = $3 WHERE tenant_id = $1 AND id = $2`
)
