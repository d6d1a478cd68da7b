-- Flow control: pausing a workflow or a queue, and bulk operations on runs
-- (package engine, pause.go and bulk.go).
--
-- A paused workflow (workflow_definitions.paused_at) keeps accepting
-- starts, but each new run is recorded with status 'queued' and starts
-- nothing until the workflow is resumed; resuming creates a bulk
-- operation of action 'resume' that starts the queued runs oldest first,
-- in bounded batches, from a keyset cursor (so a crash mid-resume carries
-- on where it stopped).
--
-- queue_pauses holds the paused queues of a tenant: a task of a paused
-- queue is not leased to any worker and its outbox row is held; resuming
-- deletes the row and dispatches again the queue's pending tasks that have
-- no outbox row.
--
-- bulk_operations is a job that applies one action (cancel, rerun, resume)
-- to every run matching a filter, in batches, each run through the
-- coordinator's own transition; bulk_operation_runs marks each run the
-- job changed, inserted in that transition's transaction, so a run is
-- changed at most once per job however often a batch is retried or two
-- replicas race.

-- +goose Up
ALTER TABLE workflow_runs DROP CONSTRAINT workflow_runs_status_check;
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_status_check
    CHECK (status IN ('queued', 'running', 'completed', 'failed', 'cancelled'));

ALTER TABLE workflow_definitions ADD COLUMN paused_at timestamptz;
ALTER TABLE workflow_definitions ADD COLUMN pause_reason text CHECK (length(pause_reason) <= 500);

CREATE TABLE queue_pauses (
    tenant_id uuid NOT NULL REFERENCES tenants (id),
    queue     text NOT NULL CHECK (length(queue) BETWEEN 1 AND 64),
    reason    text CHECK (length(reason) <= 500),
    paused_by text CHECK (length(paused_by) <= 255),
    paused_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, queue)
);

CREATE TABLE bulk_operations (
    tenant_id       uuid NOT NULL REFERENCES tenants (id),
    id              uuid NOT NULL,
    action          text NOT NULL CHECK (action IN ('cancel', 'rerun', 'resume')),
    status          text NOT NULL CHECK (status IN ('running', 'completed', 'cancelled')),
    -- The runs filter (engine.RunFilter as JSON), with created_before
    -- bounded by the job's creation.
    filter          jsonb NOT NULL CHECK (octet_length(filter::text) <= 4096),
    reason          text CHECK (length(reason) <= 1000),
    idempotency_key text CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    request_hash    bytea,
    created_by      text CHECK (length(created_by) <= 255),
    -- Keyset cursor: the last run id handled (runs are visited in id order).
    cursor_run      uuid,
    matched         bigint NOT NULL DEFAULT 0,
    done            bigint NOT NULL DEFAULT 0,
    failed          bigint NOT NULL DEFAULT 0,
    skipped         bigint NOT NULL DEFAULT 0,
    last_error      text CHECK (length(last_error) <= 1000),
    -- The replica working the job, until lease_expires_at.
    lease_owner     text CHECK (length(lease_owner) <= 200),
    lease_expires_at timestamptz,
    next_batch_at   timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    PRIMARY KEY (tenant_id, id),
    UNIQUE (tenant_id, idempotency_key)
);
CREATE INDEX bulk_operations_due_sweep ON bulk_operations (next_batch_at) WHERE status = 'running';
CREATE INDEX bulk_operations_finished_sweep ON bulk_operations (finished_at) WHERE status <> 'running';

CREATE TABLE bulk_operation_runs (
    tenant_id    uuid NOT NULL,
    operation_id uuid NOT NULL,
    run_id       uuid NOT NULL,
    PRIMARY KEY (tenant_id, operation_id, run_id),
    FOREIGN KEY (tenant_id, operation_id) REFERENCES bulk_operations (tenant_id, id) ON DELETE CASCADE
);

ALTER TABLE queue_pauses ENABLE ROW LEVEL SECURITY;
ALTER TABLE queue_pauses FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON queue_pauses
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);
ALTER TABLE bulk_operations ENABLE ROW LEVEL SECURITY;
ALTER TABLE bulk_operations FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON bulk_operations
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);
ALTER TABLE bulk_operation_runs ENABLE ROW LEVEL SECURITY;
ALTER TABLE bulk_operation_runs FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON bulk_operation_runs
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);

GRANT SELECT, INSERT, DELETE ON queue_pauses TO composer_app;
GRANT SELECT, INSERT, UPDATE ON bulk_operations TO composer_app;
GRANT SELECT, INSERT ON bulk_operation_runs TO composer_app;
-- The system role finds due jobs across tenants and claims them (a lease),
-- and deletes finished jobs past their retention; the outbox enqueuer
-- (system role) holds rows of paused queues.
GRANT SELECT ON queue_pauses TO composer_system;
GRANT SELECT, UPDATE, DELETE ON bulk_operations TO composer_system;
GRANT SELECT ON bulk_operation_runs TO composer_system;
-- Resuming a queue dispatches again its pending tasks that have no outbox
-- row: it reads which tasks have one.
GRANT SELECT (tenant_id, task_id) ON outbox TO composer_app;

-- +goose Down
REVOKE SELECT (tenant_id, task_id) ON outbox FROM composer_app;
DROP TABLE bulk_operation_runs;
DROP TABLE bulk_operations;
DROP TABLE queue_pauses;
ALTER TABLE workflow_definitions DROP COLUMN pause_reason;
ALTER TABLE workflow_definitions DROP COLUMN paused_at;
UPDATE workflow_runs SET status = 'cancelled', finished_at = now() WHERE status = 'queued';
ALTER TABLE workflow_runs DROP CONSTRAINT workflow_runs_status_check;
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_status_check
    CHECK (status IN ('running', 'completed', 'failed', 'cancelled'));
