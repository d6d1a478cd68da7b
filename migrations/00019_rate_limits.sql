-- Flow control: rate limits per key for steps, and priorities.
--
-- rate_limits holds a tenant's named limits (createRateLimit): a sustained
-- rate per second and a burst. A step names one in its definition
-- ("rate_limit": {"name": ..., "key": <CEL>}); the key is evaluated when
-- the step's task is created and kept in the task's config, and the lease
-- path takes a token from the Redis bucket of (tenant, limit, key) before
-- the step runs (engine/ratelimit.go). How many a tenant may declare is
-- the plan's max_rate_limits.
--
-- workflow_runs.priority is the run's priority (startRun(priority:)),
-- -2..2, 0 by default; a task's own priority (the node's, else the run's)
-- is kept in its config, and outbox.priority says which of the tenant's
-- priority streams the enqueuer publishes a dispatch to.

-- +goose Up
CREATE TABLE rate_limits (
    tenant_id   uuid NOT NULL REFERENCES tenants (id),
    name        text NOT NULL CHECK (name ~ '^[a-z][a-z0-9_-]{0,63}$'),
    per_second  double precision NOT NULL CHECK (per_second > 0 AND per_second <= 10000),
    burst       int NOT NULL CHECK (burst BETWEEN 1 AND 100000),
    description text NOT NULL DEFAULT '' CHECK (length(description) <= 1000),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, name)
);
ALTER TABLE rate_limits ENABLE ROW LEVEL SECURITY;
ALTER TABLE rate_limits FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON rate_limits
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);
GRANT SELECT, INSERT, UPDATE, DELETE ON rate_limits TO composer_app;
GRANT SELECT ON rate_limits TO composer_system;

UPDATE plans SET limits = limits || '{"max_rate_limits": 10}'::jsonb WHERE name = 'free';
UPDATE plans SET limits = limits || '{"max_rate_limits": 100}'::jsonb WHERE name = 'pro';
UPDATE plans SET limits = limits || '{"max_rate_limits": 1000}'::jsonb WHERE name = 'enterprise';

ALTER TABLE workflow_runs ADD COLUMN priority smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN -2 AND 2);
ALTER TABLE outbox ADD COLUMN priority smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN -2 AND 2);

-- +goose Down
ALTER TABLE outbox DROP COLUMN priority;
ALTER TABLE workflow_runs DROP COLUMN priority;
UPDATE plans SET limits = limits - 'max_rate_limits';
DROP TABLE rate_limits;
