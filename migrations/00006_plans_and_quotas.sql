-- Plans and per-tenant limits. A plan carries default limits (and, later,
-- pricing); a tenant's own limits override them key by key, read with
-- composer_tenant_limit. The running-task quota itself is a Redis semaphore
-- taken before the lease (tenants.Slots); the two indexes below answer the
-- queued-task limit at admission and a tenant's running count for its
-- dashboard without touching other tenants' rows.

-- +goose Up
CREATE TABLE plans (
    name   text PRIMARY KEY CHECK (name ~ '^[a-z][a-z0-9_-]{0,31}$'),
    limits jsonb NOT NULL
);
INSERT INTO plans (name, limits) VALUES
    ('free',       '{"max_running_tasks": 10,   "starts_per_second": 5,   "start_burst": 20,   "max_queued_tasks": 1000,    "weight": 1}'),
    ('pro',        '{"max_running_tasks": 100,  "starts_per_second": 50,  "start_burst": 200,  "max_queued_tasks": 100000,  "weight": 4}'),
    ('enterprise', '{"max_running_tasks": 1000, "starts_per_second": 500, "start_burst": 2000, "max_queued_tasks": 1000000, "weight": 16}');
ALTER TABLE tenants ADD CONSTRAINT tenants_plan_fkey FOREIGN KEY (plan) REFERENCES plans (name);
GRANT SELECT ON plans TO composer_app, composer_system;

-- composer_tenant_limit returns a tenant's effective limit: its own value
-- for key, else its plan's. Row-level security applies: the app role reads
-- only its own tenant.
CREATE FUNCTION composer_tenant_limit(tenant uuid, key text) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce((t.limits ->> key)::bigint, (p.limits ->> key)::bigint)
      FROM tenants t JOIN plans p ON p.name = t.plan
     WHERE t.id = tenant
$$;
GRANT EXECUTE ON FUNCTION composer_tenant_limit(uuid, text) TO composer_app, composer_system;

CREATE INDEX task_instances_running_by_tenant ON task_instances (tenant_id, lease_expires_at) WHERE state = 'running';
CREATE INDEX task_instances_pending_by_tenant ON task_instances (tenant_id) WHERE state = 'pending';

-- +goose Down
DROP INDEX task_instances_pending_by_tenant;
DROP INDEX task_instances_running_by_tenant;
DROP FUNCTION composer_tenant_limit(uuid, text);
ALTER TABLE tenants DROP CONSTRAINT tenants_plan_fkey;
DROP TABLE plans;
