-- Webhook callbacks on run completion (package webhooks/delivery).
--
-- webhook_endpoints are where a tenant wants to be called, and for which
-- events. webhook_secrets hold each endpoint's signing secrets, sealed with
-- AES-256-GCM under the server's key (COMPOSER_WEBHOOK_SECRET_KEY): the
-- current one (expires_at NULL) and, after a rotation, the previous one
-- until its grace period ends. The app role may write secrets but never
-- read the sealed bytes; only the relay (composer_system) reads them.
--
-- webhook_deliveries is the delivery queue and its history in one table:
-- the transaction that makes a run terminal inserts one row per subscribed
-- endpoint (payload fixed at enqueue: the exact bytes every attempt sends
-- and signs), so a delivery exists if and only if the terminal state
-- committed. The relay on every replica claims due rows (next_attempt_at
-- <= now()) with FOR UPDATE SKIP LOCKED and pushes next_attempt_at one
-- claim lease ahead: a relay that dies mid-delivery leaves a row that falls
-- due again when its lease ends, and the claim token fences the dead
-- relay's late outcome. next_attempt_at is NULL when nothing is to be sent:
-- succeeded, dead (the retry schedule was spent), or paused while its
-- endpoint is disabled (state still pending or failed; enabling the
-- endpoint resumes them). webhook_attempts logs every attempt.
--
-- Indexes not led by tenant_id serve the relay's cross-tenant loops and
-- end in _sweep.

-- +goose Up
CREATE TABLE webhook_endpoints (
    tenant_id       uuid NOT NULL REFERENCES tenants (id),
    id              uuid NOT NULL,
    url             text NOT NULL CHECK (length(url) BETWEEN 1 AND 2048),
    description     text NOT NULL DEFAULT '' CHECK (length(description) <= 500),
    event_types     text[] NOT NULL CHECK (cardinality(event_types) > 0
                        AND event_types <@ ARRAY['run.completed', 'run.failed', 'run.cancelled']),
    enabled         boolean NOT NULL DEFAULT true,
    -- Why it was disabled (410 Gone, failing too long, or by whom).
    disabled_reason text CHECK (length(disabled_reason) <= 1000),
    disabled_at     timestamptz,
    -- Since when attempts fail with no success in between; NULL after a
    -- success. The relay disables the endpoint when this gets too old.
    failing_since   timestamptz,
    last_success_at timestamptz,
    created_by      text NOT NULL CHECK (length(created_by) BETWEEN 1 AND 255),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id),
    CHECK ((enabled AND disabled_at IS NULL AND disabled_reason IS NULL)
        OR (NOT enabled AND disabled_at IS NOT NULL AND disabled_reason IS NOT NULL))
);

CREATE TABLE webhook_secrets (
    tenant_id   uuid NOT NULL,
    endpoint_id uuid NOT NULL,
    id          uuid NOT NULL,
    -- version(1) | key id(4) | nonce(12) | AES-256-GCM(secret) with the
    -- tenant, endpoint and secret ids as additional data.
    ciphertext  bytea NOT NULL CHECK (length(ciphertext) BETWEEN 34 AND 512),
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- NULL for the current secret; the end of the grace period of a
    -- rotated-out one (it signs alongside the current one until then).
    expires_at  timestamptz,
    PRIMARY KEY (tenant_id, endpoint_id, id),
    FOREIGN KEY (tenant_id, endpoint_id) REFERENCES webhook_endpoints (tenant_id, id) ON DELETE CASCADE
);
CREATE UNIQUE INDEX webhook_secrets_one_current ON webhook_secrets (tenant_id, endpoint_id) WHERE expires_at IS NULL;

CREATE TABLE webhook_deliveries (
    tenant_id       uuid NOT NULL,
    -- A UUIDv7: deliveries list newest first by id. The webhook-id header
    -- is "msg_" || id, the same for every attempt and redelivery.
    id              uuid NOT NULL,
    endpoint_id     uuid NOT NULL,
    event_type      text NOT NULL CHECK (event_type IN ('run.completed', 'run.failed', 'run.cancelled', 'webhook.test')),
    -- No foreign key: runs live in monthly partitions that retention drops.
    run_id          uuid,
    -- The request body, byte for byte (text, not jsonb, which would
    -- normalise it).
    payload         text NOT NULL,
    state           text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'failed', 'succeeded', 'dead')),
    -- Attempts started, including one a relay lost (the attempt log's key).
    attempts        int NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    -- Failed attempts since enqueue or the last redelivery: the position
    -- in the retry schedule.
    retry_step      int NOT NULL DEFAULT 0 CHECK (retry_step >= 0),
    next_attempt_at timestamptz DEFAULT now(),
    -- The claim of the relay attempt in flight (NULL when none).
    claim           uuid,
    last_status     int,
    last_error      text,
    last_attempt_at timestamptz,
    succeeded_at    timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, endpoint_id) REFERENCES webhook_endpoints (tenant_id, id) ON DELETE CASCADE,
    CHECK (state IN ('pending', 'failed') OR (next_attempt_at IS NULL AND claim IS NULL))
) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);
CREATE INDEX webhook_deliveries_due_sweep ON webhook_deliveries (next_attempt_at) WHERE next_attempt_at IS NOT NULL;
CREATE INDEX webhook_deliveries_retention_sweep ON webhook_deliveries (created_at);
CREATE INDEX webhook_deliveries_by_endpoint ON webhook_deliveries (tenant_id, endpoint_id, id);
CREATE INDEX webhook_deliveries_by_run ON webhook_deliveries (tenant_id, run_id, id) WHERE run_id IS NOT NULL;
CREATE INDEX webhook_deliveries_by_state ON webhook_deliveries (tenant_id, state, id);

CREATE TABLE webhook_attempts (
    tenant_id     uuid NOT NULL,
    delivery_id   uuid NOT NULL,
    attempt       int  NOT NULL CHECK (attempt > 0),
    started_at    timestamptz NOT NULL,
    latency_ms    int,
    -- NULL when no response came (refused, unreachable, timed out, lost).
    status_code   int,
    error         text,
    -- The start of the response body, for the tenant's debugging.
    response_body text,
    PRIMARY KEY (tenant_id, delivery_id, attempt),
    FOREIGN KEY (tenant_id, delivery_id) REFERENCES webhook_deliveries (tenant_id, id) ON DELETE CASCADE
);

ALTER TABLE webhook_endpoints ENABLE ROW LEVEL SECURITY;
ALTER TABLE webhook_endpoints FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON webhook_endpoints
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);
ALTER TABLE webhook_secrets ENABLE ROW LEVEL SECURITY;
ALTER TABLE webhook_secrets FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON webhook_secrets
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);
ALTER TABLE webhook_deliveries ENABLE ROW LEVEL SECURITY;
ALTER TABLE webhook_deliveries FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON webhook_deliveries
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);
ALTER TABLE webhook_attempts ENABLE ROW LEVEL SECURITY;
ALTER TABLE webhook_attempts FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON webhook_attempts
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);

-- The app role manages endpoints, writes (never reads) sealed secrets,
-- enqueues deliveries (in run transitions and test pings) and reschedules
-- them (redelivery, pause and resume with the endpoint); attempts are the
-- relay's to write.
GRANT SELECT, INSERT, DELETE ON webhook_endpoints TO composer_app;
GRANT UPDATE (url, description, event_types, enabled, disabled_reason, disabled_at, failing_since, updated_at)
   ON webhook_endpoints TO composer_app;
GRANT SELECT (tenant_id, endpoint_id, id, created_at, expires_at),
      INSERT (tenant_id, endpoint_id, id, ciphertext, expires_at),
      UPDATE (expires_at), DELETE
   ON webhook_secrets TO composer_app;
GRANT SELECT, INSERT ON webhook_deliveries TO composer_app;
GRANT UPDATE (state, next_attempt_at, retry_step, updated_at) ON webhook_deliveries TO composer_app;
GRANT SELECT ON webhook_attempts TO composer_app;
-- The relay (composer_system) claims and records deliveries, disables
-- failing endpoints, reads sealed secrets and applies retention.
GRANT SELECT, UPDATE ON webhook_endpoints TO composer_system;
GRANT SELECT ON webhook_secrets TO composer_system;
GRANT SELECT, UPDATE, DELETE ON webhook_deliveries TO composer_system;
GRANT SELECT, INSERT, UPDATE ON webhook_attempts TO composer_system;

-- +goose Down
DROP TABLE webhook_attempts;
DROP TABLE webhook_deliveries;
DROP TABLE webhook_secrets;
DROP TABLE webhook_endpoints;
