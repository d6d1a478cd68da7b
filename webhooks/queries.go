package webhooks

// The package's SQL, named. (Statements that are assembled from
// parameterised pieces — filters — are built next to their const parts.)
const (
	// deliveries
	qDeliveries = `SELECT ` + deliveryColumns + ` FROM webhook_deliveries d
		WHERE d.tenant_id = $1 AND ($2::uuid IS NULL OR d.endpoint_id = $2) AND ($3::uuid IS NULL OR d.run_id = $3)
		  AND ($4::text IS NULL OR d.state = $4) AND ($5::uuid IS NULL OR d.id < $5)
		ORDER BY d.id DESC LIMIT $6`
	qAttemptsOf = `SELECT delivery_id, attempt, started_at, latency_ms, status_code, error, response_body
		FROM webhook_attempts WHERE tenant_id = $1 AND delivery_id = ANY($2) ORDER BY delivery_id, attempt`
	qDelivery           = `SELECT ` + deliveryColumns + ` FROM webhook_deliveries d WHERE d.tenant_id = $1 AND d.id = $2`
	qEndpointOfDelivery = `SELECT e.enabled FROM webhook_deliveries d JOIN webhook_endpoints e
		ON e.tenant_id = d.tenant_id AND e.id = d.endpoint_id WHERE d.tenant_id = $1 AND d.id = $2`
	qRedeliver = `UPDATE webhook_deliveries SET state = CASE WHEN state IN ('succeeded', 'dead') THEN 'pending' ELSE state END,
		retry_step = 0, next_attempt_at = ` + dueNowUnlessClaimed + `, updated_at = now() WHERE tenant_id = $1 AND id = $2`
	qRecentPings = `SELECT count(*) FROM webhook_deliveries WHERE tenant_id = $1 AND endpoint_id = $2 AND event_type = $3
		AND id >= composer_uuid_floor(now() - interval '1 hour')`
	qInsertPing = `INSERT INTO webhook_deliveries (tenant_id, id, endpoint_id, event_type, payload)
		VALUES ($1, $2, $3, $4, $5)`
	// endpoints
	qLockTenantEndpoints = `SELECT pg_advisory_xact_lock(hashtextextended('webhook_endpoints:' || $1::uuid::text, 0))`
	qCountEndpoints      = `SELECT count(*) FROM webhook_endpoints WHERE tenant_id = $1`
	qInsertEndpoint      = `INSERT INTO webhook_endpoints (tenant_id, id, url, description, event_types, created_by)
		VALUES ($1, $2, $3, $4, $5, $6)`
	qInsertSecret       = `INSERT INTO webhook_secrets (tenant_id, endpoint_id, id, ciphertext) VALUES ($1, $2, $3, $4)`
	qDropExpiredSecrets = `DELETE FROM webhook_secrets WHERE tenant_id = $1 AND endpoint_id = $2 AND expires_at IS NOT NULL`
	qExpireSecrets      = `UPDATE webhook_secrets SET expires_at = now() + make_interval(secs => $3)
		WHERE tenant_id = $1 AND endpoint_id = $2 AND expires_at IS NULL`
	qLockEndpoint   = `SELECT 1 FROM webhook_endpoints WHERE tenant_id = $1 AND id = $2 FOR UPDATE`
	qUpdateEndpoint = `UPDATE webhook_endpoints SET url = coalesce($3, url), description = coalesce($4, description),
		event_types = coalesce($5, event_types), updated_at = now() WHERE tenant_id = $1 AND id = $2`
	qEnableEndpoint = `UPDATE webhook_endpoints SET enabled = true, disabled_at = NULL, disabled_reason = NULL,
			failing_since = NULL, updated_at = now() WHERE tenant_id = $1 AND id = $2 AND NOT enabled`
	qResumeDeliveries = `UPDATE webhook_deliveries SET next_attempt_at = now(), updated_at = now()
			WHERE tenant_id = $1 AND endpoint_id = $2 AND state IN ('pending', 'failed') AND next_attempt_at IS NULL AND claim IS NULL`
	qDisableEndpoint = `UPDATE webhook_endpoints SET enabled = false, disabled_at = now(), disabled_reason = $3,
		updated_at = now() WHERE tenant_id = $1 AND id = $2 AND enabled`
	qPauseDeliveries = `UPDATE webhook_deliveries SET next_attempt_at = NULL, updated_at = now()
		WHERE tenant_id = $1 AND endpoint_id = $2 AND state IN ('pending', 'failed') AND next_attempt_at IS NOT NULL
		  AND claim IS NULL AND event_type <> 'webhook.test'`
	qDeleteEndpoint = `DELETE FROM webhook_endpoints WHERE tenant_id = $1 AND id = $2`
	qGetEndpoint    = `SELECT ` + endpointColumns + ` FROM webhook_endpoints e WHERE e.tenant_id = $1 AND e.id = $2`
	qListEndpoints  = `SELECT ` + endpointColumns + ` FROM webhook_endpoints e WHERE e.tenant_id = $1 ORDER BY e.id`
	// relay
	qClaimDeliveries = `WITH cand AS (
			SELECT tenant_id, id FROM (
			    SELECT d.tenant_id, d.id, d.next_attempt_at,
			           row_number() OVER (PARTITION BY d.tenant_id ORDER BY d.next_attempt_at) AS rank
			      FROM webhook_deliveries d
			      JOIN webhook_endpoints e ON e.tenant_id = d.tenant_id AND e.id = d.endpoint_id
			     WHERE d.next_attempt_at <= now() AND (e.enabled OR d.event_type = 'webhook.test')
			     ORDER BY d.next_attempt_at LIMIT $1 * 4) c
			  LEFT JOIN unnest($4::uuid[], $5::int[]) AS f (tenant_id, n) USING (tenant_id)
			 WHERE rank <= $3 - coalesce(f.n, 0) ORDER BY next_attempt_at LIMIT $1),
		due AS (
			SELECT d.tenant_id, d.id FROM webhook_deliveries d JOIN cand USING (tenant_id, id)
			 WHERE d.next_attempt_at <= now() FOR UPDATE OF d SKIP LOCKED)
			UPDATE webhook_deliveries d SET claim = gen_random_uuid(), attempts = d.attempts + 1,
			       next_attempt_at = now() + make_interval(secs => $2), last_attempt_at = now(), updated_at = now()
			  FROM due WHERE d.tenant_id = due.tenant_id AND d.id = due.id
			RETURNING d.tenant_id, d.id, d.endpoint_id, d.event_type, d.payload, d.attempts, d.claim,
			          (SELECT url FROM webhook_endpoints e WHERE e.tenant_id = d.tenant_id AND e.id = d.endpoint_id),
			          coalesce((SELECT r.traceparent FROM workflow_runs r WHERE r.tenant_id = d.tenant_id AND r.id = d.run_id), '')`
	qInsertAttempt = `INSERT INTO webhook_attempts (tenant_id, delivery_id, attempt, started_at, error)
			SELECT t, d, a, now(), 'no outcome: the relay stopped during the attempt'
			  FROM unnest($1::uuid[], $2::uuid[], $3::int[]) AS x (t, d, a)
			ON CONFLICT DO NOTHING`
	qSecretsOf = `SELECT s.tenant_id, s.endpoint_id, s.id, s.ciphertext FROM webhook_secrets s
			 WHERE (s.tenant_id, s.endpoint_id) IN (SELECT * FROM unnest($1::uuid[], $2::uuid[]))
			   AND (s.expires_at IS NULL OR s.expires_at > now())
			 ORDER BY s.id DESC`
	qRecordAttempt = `UPDATE webhook_attempts SET latency_ms = $4, status_code = $5, error = $6, response_body = $7
			WHERE tenant_id = $1 AND delivery_id = $2 AND attempt = $3`
	qRetryStep      = `SELECT retry_step FROM webhook_deliveries WHERE tenant_id = $1 AND id = $2 AND claim = $3 FOR UPDATE`
	qSettleDelivery = `UPDATE webhook_deliveries d SET state = $4, claim = NULL,
			retry_step = CASE WHEN $4 = 'succeeded' THEN d.retry_step ELSE d.retry_step + 1 END,
			next_attempt_at = CASE WHEN $4 = 'failed' AND (SELECT enabled FROM webhook_endpoints e
			    WHERE e.tenant_id = d.tenant_id AND e.id = d.endpoint_id) THEN now() + make_interval(secs => $5) END,
			last_status = $6, last_error = $7, succeeded_at = CASE WHEN $4 = 'succeeded' THEN now() ELSE d.succeeded_at END,
			updated_at = now()
			WHERE d.tenant_id = $1 AND d.id = $2 AND d.claim = $3`
	qEndpointSucceeded = `UPDATE webhook_endpoints SET failing_since = NULL, last_success_at = now()
				WHERE tenant_id = $1 AND id = $2`
	qEndpointFailing = `UPDATE webhook_endpoints SET failing_since = coalesce(failing_since, now())
			WHERE tenant_id = $1 AND id = $2
			RETURNING enabled, failing_since, failing_since < now() - make_interval(secs => $3)`
	qDeliveryRetention = `DELETE FROM webhook_deliveries WHERE ctid = ANY(ARRAY(
				SELECT ctid FROM webhook_deliveries WHERE created_at < now() - make_interval(secs => $1)
				   AND state IN ('succeeded', 'dead') LIMIT 10000))`
)

// enqueue inserts one delivery per enabled endpoint subscribed to the
// event, in the transition's transaction. The payload is built here, once
// per endpoint row, and stored as text: every attempt sends these bytes.
const enqueue = `INSERT INTO webhook_deliveries (tenant_id, id, endpoint_id, event_type, run_id, payload)
SELECT e.tenant_id, composer_uuidv7(), e.id, $2, $3, json_build_object(
    'type', $2::text,
    'timestamp', $7::timestamptz,
    'data', json_build_object(
        'run_id', $3::uuid, 'workflow', w.name, 'workflow_id', $4::uuid, 'workflow_version', $5::int,
        'status', $6::text, 'output', $8::jsonb, 'output_truncated', $9::bool, 'error', $10::jsonb,
        'started_at', r.created_at, 'finished_at', $7::timestamptz, 'metadata', r.metadata))::text
  FROM webhook_endpoints e
  LEFT JOIN workflow_runs r ON r.tenant_id = $1 AND r.id = $3
  LEFT JOIN workflow_definitions w ON w.tenant_id = $1 AND w.id = $4
 WHERE e.tenant_id = $1 AND e.enabled AND $2 = ANY (e.event_types)`

// enqueueWait inserts the deliveries of a run that started waiting at a
// wait node: which node, for which signal or event, until when.
const enqueueWait = `INSERT INTO webhook_deliveries (tenant_id, id, endpoint_id, event_type, run_id, payload)
SELECT e.tenant_id, composer_uuidv7(), e.id, $2, $3, json_build_object(
    'type', $2::text,
    'timestamp', $6::timestamptz,
    'data', json_build_object(
        'run_id', $3::uuid, 'workflow', w.name, 'workflow_id', $4::uuid, 'workflow_version', $5::int,
        'status', 'running', 'node', $7::text, 'signal', $8::text, 'event', $10::text, 'timeout_at', $9::timestamptz,
        'started_at', r.created_at, 'metadata', r.metadata))::text
  FROM webhook_endpoints e
  LEFT JOIN workflow_runs r ON r.tenant_id = $1 AND r.id = $3
  LEFT JOIN workflow_definitions w ON w.tenant_id = $1 AND w.id = $4
 WHERE e.tenant_id = $1 AND e.enabled AND $2 = ANY (e.event_types)`

const deliveryColumns = `d.id, d.endpoint_id, d.event_type, d.run_id, d.payload, d.state, d.next_attempt_at,
	d.last_status, d.last_error, d.succeeded_at, d.created_at`

const endpointColumns = `e.id, e.url, e.description, e.event_types, e.enabled, e.disabled_reason, e.disabled_at,
	e.failing_since, e.last_success_at, e.created_by, e.created_at, e.updated_at,
	coalesce((SELECT array_agg(s.id ORDER BY s.id) FROM webhook_secrets s
	  WHERE s.tenant_id = e.tenant_id AND s.endpoint_id = e.id AND (s.expires_at IS NULL OR s.expires_at > now())), '{}'),
	coalesce((SELECT array_agg(s.created_at ORDER BY s.id) FROM webhook_secrets s
	  WHERE s.tenant_id = e.tenant_id AND s.endpoint_id = e.id AND (s.expires_at IS NULL OR s.expires_at > now())), '{}'),
	coalesce((SELECT array_agg(s.expires_at ORDER BY s.id) FROM webhook_secrets s
	  WHERE s.tenant_id = e.tenant_id AND s.endpoint_id = e.id AND (s.expires_at IS NULL OR s.expires_at > now())), '{}')`
