package billing

// The package's SQL, named. (Statements that are assembled from
// parameterised pieces — filters — are built next to their const parts.)
const (
	// export
	qClaimExport = `WITH c AS (
				SELECT tenant_id, key FROM usage_records
				 WHERE export_state = 'pending' AND export_next_at <= now()
				 ORDER BY export_next_at LIMIT $1 FOR UPDATE SKIP LOCKED)
			UPDATE usage_records u SET export_next_at = now() + make_interval(secs => $2), export_attempts = u.export_attempts + 1
			  FROM c WHERE u.tenant_id = c.tenant_id AND u.key = c.key
			RETURNING u.tenant_id, u.key, u.meter, u.quantity, u.recorded_at, u.export_attempts`
	qExportSent = `UPDATE usage_records SET export_state = 'sent', export_next_at = NULL, export_error = NULL
					WHERE tenant_id = $1 AND key = $2 AND export_state = 'pending'`
	qExportRetry = `UPDATE usage_records SET export_next_at = now() + make_interval(secs => $3), export_error = $4
					WHERE tenant_id = $1 AND key = $2 AND export_state = 'pending'`
	qExportDead = `UPDATE usage_records SET export_state = 'dead', export_next_at = NULL, export_error = $3
					WHERE tenant_id = $1 AND key = $2 AND export_state = 'pending'`
	// rollup
	qLockRollup   = `SELECT through FROM usage_rollup_state WHERE id = 1 FOR UPDATE`
	qRollupHourly = `INSERT INTO usage_hourly (tenant_id, meter, hour, quantity)
			SELECT tenant_id, meter, date_trunc('hour', recorded_at, 'UTC'), sum(quantity)
			  FROM usage_records WHERE recorded_at >= $1 GROUP BY 1, 2, 3
			ON CONFLICT (tenant_id, meter, hour) DO UPDATE SET quantity = EXCLUDED.quantity, updated_at = now()
			 WHERE usage_hourly.quantity <> EXCLUDED.quantity`
	qRollupDaily = `INSERT INTO usage_daily (tenant_id, meter, day, quantity)
			SELECT tenant_id, meter, (hour AT TIME ZONE 'UTC')::date, sum(quantity)
			  FROM usage_hourly WHERE hour >= date_trunc('day', $1::timestamptz AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' GROUP BY 1, 2, 3
			ON CONFLICT (tenant_id, meter, day) DO UPDATE SET quantity = EXCLUDED.quantity, updated_at = now()
			 WHERE usage_daily.quantity <> EXCLUDED.quantity`
	qDeleteRolledUp = `DELETE FROM usage_records WHERE ctid = ANY(ARRAY(
					SELECT ctid FROM usage_records WHERE recorded_at < least($1::timestamptz, now() - make_interval(secs => $2))
					   AND export_state IN ('none', 'sent') LIMIT $3))`
	qAdvanceRollup = `UPDATE usage_rollup_state SET through = now() WHERE id = 1 RETURNING through`
	// store
	qPricedPlan = `SELECT p.name, p.currency, p.base_fee_cents, coalesce(composer_tenant_limit(t.id, 'spend_cap_cents'), 0)
		FROM tenants t JOIN plans p ON p.name = t.plan WHERE t.id = $1`
	qPlanPrices = `SELECT pp.meter, pp.included, pp.unit_price_micros, coalesce(pp.hard_cap, 0)
		FROM plan_prices pp JOIN tenants t ON t.plan = pp.plan WHERE t.id = $1 ORDER BY pp.meter`
	qRollupThrough = `SELECT through FROM usage_rollup_state WHERE id = 1`
	qDailyUsage    = `SELECT meter, sum(quantity)::bigint FROM usage_daily
		WHERE tenant_id = $1 AND day >= $2::date AND day < $3::date GROUP BY meter`
)

const insertUsage = `INSERT INTO usage_records (tenant_id, key, meter, quantity, export_state, export_next_at)
	VALUES ($1, $2, $3, $4, $5, CASE WHEN $5 = 'pending' THEN now() END) ON CONFLICT (tenant_id, key) DO NOTHING`

// insertAttempt records an attempt's two meters in one statement.
const insertAttempt = `INSERT INTO usage_records (tenant_id, key, meter, quantity, export_state, export_next_at)
	VALUES ($1, $2, $6, 1, $4, CASE WHEN $4 = 'pending' THEN now() END),
	       ($1, $3, $7, $5, $4, CASE WHEN $4 = 'pending' THEN now() END)
	ON CONFLICT (tenant_id, key) DO NOTHING`
