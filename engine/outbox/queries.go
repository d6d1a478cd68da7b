package outbox

// The package's SQL, named. (Statements that are assembled from
// parameterised pieces — filters — are built next to their const parts.)
const (
	// enqueuer
	// Rows of a paused queue (queue_pauses, see engine/pause.go) are held:
	// neither due nor claimed until the queue is resumed.
	qNextDue  = `SELECT min(next_attempt_at) FROM outbox o WHERE NOT EXISTS (` + pausedQueue + `)`
	qClaimDue = `SELECT tenant_id, id, topic, queue, coalesce(run_id, '00000000-0000-0000-0000-000000000000'),
				coalesce(task_id, '00000000-0000-0000-0000-000000000000'), coalesce(node_id, ''), coalesce(node_type, ''),
				coalesce(handler, ''), coalesce(attempt, 0), coalesce(traceparent, ''), attempts
			  FROM outbox o WHERE next_attempt_at <= now() AND NOT EXISTS (` + pausedQueue + `)
			 ORDER BY next_attempt_at LIMIT $1 FOR UPDATE OF o SKIP LOCKED`
	pausedQueue = `SELECT 1 FROM queue_pauses p WHERE p.tenant_id = o.tenant_id AND p.queue = o.queue`
	qDeadLetter = `WITH gone AS (DELETE FROM outbox WHERE tenant_id = $1 AND id = $2 RETURNING *)
				INSERT INTO outbox_dead_letters (tenant_id, id, topic, queue, run_id, task_id, node_id, node_type, handler, attempt, payload, attempts, last_error, created_at)
				SELECT tenant_id, id, topic, queue, run_id, task_id, node_id, node_type, handler, attempt, payload, attempts + 1, $3, created_at FROM gone`
	qRetryLater = `UPDATE outbox SET attempts = attempts + 1, last_error = $3, next_attempt_at = now() + make_interval(secs => $4)
			WHERE tenant_id = $1 AND id = $2`
	qDeletePublished = `DELETE FROM outbox o USING unnest($1::uuid[], $2::bigint[]) AS d(tenant_id, id)
			WHERE o.tenant_id = d.tenant_id AND o.id = d.id`
)
