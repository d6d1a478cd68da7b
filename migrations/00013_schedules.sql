-- Schedules: a tenant's cron expressions (in an IANA time zone) or fixed
-- intervals that start runs of a workflow (package schedules; the fire
-- times are engine/schedule's).
--
-- schedules holds each schedule and its firing state. next_fire_at is the
-- next fire time not yet handled (NULL while paused, or when the
-- expression never fires again); the firing loop on every replica claims
-- due rows across tenants with FOR UPDATE SKIP LOCKED as composer_system,
-- stamping claimed_until, and fires them through the coordinator as
-- idempotent starts whose key is derived from the schedule id and the fire
-- time, so any number of replicas start each fire once. buffered_fire_at
-- is the one fire a buffer_one schedule keeps while its previous run is
-- still going.
--
-- schedule_fires is each schedule's recent fire history (the loop keeps
-- the latest 100 per schedule): the run a fire started, or why it did not
-- (skipped for overlap, buffered, refused by admission), and the runs the
-- overlap policy looks at.
--
-- Per-plan limits: max_schedules and min_schedule_interval_seconds (the
-- shortest interval, or gap between a cron expression's minutes).

-- +goose Up
CREATE TABLE schedules (
    tenant_id        uuid NOT NULL REFERENCES tenants (id),
    id               uuid NOT NULL,
    workflow_id      uuid NOT NULL,
    -- 0: the workflow's latest version when each fire starts.
    workflow_version int NOT NULL DEFAULT 0 CHECK (workflow_version >= 0),
    cron             text CHECK (length(cron) BETWEEN 1 AND 200),
    interval_seconds bigint CHECK (interval_seconds BETWEEN 1 AND 31622400),
    time_zone        text NOT NULL DEFAULT 'UTC' CHECK (length(time_zone) BETWEEN 1 AND 64),
    input            jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(input) = 'object' AND octet_length(input::text) <= 65536),
    -- Key/value strings given to every run it starts.
    metadata         jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object' AND octet_length(metadata::text) <= 8192),
    -- The tenant's own id for it (one schedule per customer); unique when set.
    external_id      text CHECK (length(external_id) BETWEEN 1 AND 255),
    description      text NOT NULL DEFAULT '' CHECK (length(description) <= 500),
    overlap          text NOT NULL DEFAULT 'skip' CHECK (overlap IN ('skip', 'buffer_one', 'allow_all', 'cancel_previous')),
    -- After downtime, fires older than now - this window are not started.
    catchup_window_seconds bigint NOT NULL DEFAULT 60 CHECK (catchup_window_seconds BETWEEN 0 AND 31622400),
    paused           boolean NOT NULL DEFAULT false,
    next_fire_at     timestamptz,
    claimed_until    timestamptz,
    buffered_fire_at timestamptz,
    last_fire_at     timestamptz,
    last_run_id      uuid,
    last_outcome     text CHECK (last_outcome IN ('started', 'skipped', 'buffered', 'refused', 'missed')),
    last_error       text CHECK (length(last_error) <= 1000),
    -- Counters: fires that started a run, were skipped by the overlap
    -- policy, were refused by admission, fell out of the catch-up window.
    started_count    bigint NOT NULL DEFAULT 0,
    skipped_count    bigint NOT NULL DEFAULT 0,
    refused_count    bigint NOT NULL DEFAULT 0,
    missed_count     bigint NOT NULL DEFAULT 0,
    created_by       text NOT NULL CHECK (length(created_by) BETWEEN 1 AND 255),
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, workflow_id) REFERENCES workflow_definitions (tenant_id, id) ON DELETE CASCADE,
    CHECK ((cron IS NULL) <> (interval_seconds IS NULL))
);
CREATE UNIQUE INDEX schedules_external_id ON schedules (tenant_id, external_id) WHERE external_id IS NOT NULL;
CREATE INDEX schedules_by_workflow ON schedules (tenant_id, workflow_id);
CREATE INDEX schedules_due_sweep ON schedules (next_fire_at) WHERE next_fire_at IS NOT NULL AND NOT paused;
CREATE INDEX schedules_buffered_sweep ON schedules (buffered_fire_at) WHERE buffered_fire_at IS NOT NULL AND NOT paused;

CREATE TABLE schedule_fires (
    tenant_id     uuid NOT NULL,
    schedule_id   uuid NOT NULL,
    fire_at       timestamptz NOT NULL,
    -- The run it started (or that an earlier attempt of the same fire had).
    run_id        uuid,
    outcome       text NOT NULL CHECK (outcome IN ('started', 'skipped', 'buffered', 'refused')),
    backfill      boolean NOT NULL DEFAULT false,
    error_code    text CHECK (length(error_code) <= 64),
    error_message text CHECK (length(error_message) <= 1000),
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, schedule_id, fire_at),
    FOREIGN KEY (tenant_id, schedule_id) REFERENCES schedules (tenant_id, id) ON DELETE CASCADE,
    CHECK ((outcome = 'started') = (run_id IS NOT NULL))
);

ALTER TABLE schedules ENABLE ROW LEVEL SECURITY;
ALTER TABLE schedules FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON schedules
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);
ALTER TABLE schedule_fires ENABLE ROW LEVEL SECURITY;
ALTER TABLE schedule_fires FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON schedule_fires
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);

-- The app role manages schedules and, in the tenant's own transactions the
-- firing loop opens for each claimed schedule, records fires; the system
-- role only claims due schedules and releases claims.
GRANT SELECT, INSERT, UPDATE, DELETE ON schedules TO composer_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON schedule_fires TO composer_app;
GRANT SELECT ON schedules TO composer_system;
GRANT UPDATE (claimed_until) ON schedules TO composer_system;
GRANT SELECT ON schedule_fires TO composer_system;

UPDATE plans SET limits = limits || '{"max_schedules": 10, "min_schedule_interval_seconds": 60}'::jsonb WHERE name = 'free';
UPDATE plans SET limits = limits || '{"max_schedules": 200, "min_schedule_interval_seconds": 10}'::jsonb WHERE name = 'pro';
UPDATE plans SET limits = limits || '{"max_schedules": 5000, "min_schedule_interval_seconds": 1}'::jsonb WHERE name = 'enterprise';

-- +goose Down
UPDATE plans SET limits = limits - 'max_schedules' - 'min_schedule_interval_seconds';
DROP TABLE schedule_fires;
DROP TABLE schedules;
