-- The durable core: tenants, workflow definitions and versions, runs, tasks,
-- timers, signals, the run timeline and the transactional outbox.
--
-- Tenancy is in the schema: every tenant-owned table has tenant_id leading
-- its primary key and indexes, composite (tenant_id, id) foreign keys
-- (foreign-key checks bypass row-level security), ENABLE and FORCE ROW
-- LEVEL SECURITY, and a policy that fails closed when no tenant is set.
-- The only indexes not led by tenant_id end in _sweep: they serve the
-- cross-tenant loops of composer_system (outbox claims, timers, lease and
-- dispatch sweeps) and no tenant-scoped query uses them.
--
-- Run data (runs, tasks, signals, events) is range-partitioned by month on
-- the run id, a UUIDv7, so a month is dropped whole when it leaves the
-- retention window.

-- +goose Up
CREATE TABLE tenants (
    id            uuid PRIMARY KEY,
    name          text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    plan          text NOT NULL DEFAULT 'free',
    stream_shards int  NOT NULL DEFAULT 4 CHECK (stream_shards BETWEEN 1 AND 256),
    limits        jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE workflow_definitions (
    tenant_id      uuid NOT NULL REFERENCES tenants (id),
    id             uuid NOT NULL,
    name           text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$'),
    description    text NOT NULL DEFAULT '',
    latest_version int  NOT NULL DEFAULT 0,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id),
    UNIQUE (tenant_id, name)
);

-- Versions are immutable: the app role may only insert them, and a trigger
-- stops even the owner from changing one.
CREATE TABLE workflow_versions (
    tenant_id   uuid NOT NULL,
    workflow_id uuid NOT NULL,
    version     int  NOT NULL CHECK (version > 0),
    definition  jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, workflow_id, version),
    FOREIGN KEY (tenant_id, workflow_id) REFERENCES workflow_definitions (tenant_id, id)
);

-- +goose StatementBegin
CREATE FUNCTION composer_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% rows are immutable', TG_TABLE_NAME USING ERRCODE = 'check_violation';
END
$$;
-- +goose StatementEnd
CREATE TRIGGER workflow_versions_immutable BEFORE UPDATE ON workflow_versions
    FOR EACH ROW EXECUTE FUNCTION composer_immutable();

CREATE TABLE workflow_runs (
    tenant_id        uuid NOT NULL,
    id               uuid NOT NULL,
    workflow_id      uuid NOT NULL,
    workflow_version int  NOT NULL,
    status           text NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'cancelled')),
    input            jsonb NOT NULL DEFAULT '{}'::jsonb,
    output           jsonb,
    error            jsonb,
    idempotency_key  text,
    rerun_of         uuid,
    traceparent      text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, workflow_id, workflow_version)
        REFERENCES workflow_versions (tenant_id, workflow_id, version)
) PARTITION BY RANGE (id);
-- Listing: runs come newest first by id (UUIDv7 is time-ordered, so a
-- created-at range is an id range).
CREATE INDEX workflow_runs_by_status ON workflow_runs (tenant_id, status, id);
CREATE INDEX workflow_runs_by_workflow ON workflow_runs (tenant_id, workflow_id, id);

-- The idempotency key of a run start. Kept apart from the partitioned runs
-- table because a unique index there would have to include the run id.
CREATE TABLE run_idempotency_keys (
    tenant_id    uuid NOT NULL REFERENCES tenants (id),
    key          text NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    run_id       uuid NOT NULL,
    request_hash bytea NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, key)
);

CREATE TABLE task_instances (
    tenant_id        uuid NOT NULL,
    run_id           uuid NOT NULL,
    id               uuid NOT NULL,
    node_id          text NOT NULL,
    node_type        text NOT NULL,
    queue            text,
    state            text NOT NULL CHECK (state IN ('pending', 'running', 'waiting', 'completed', 'failed', 'skipped', 'cancelled')),
    attempt          int  NOT NULL DEFAULT 1 CHECK (attempt > 0),
    max_attempts     int  NOT NULL DEFAULT 1 CHECK (max_attempts > 0),
    input            jsonb,
    config           jsonb,
    output           jsonb,
    last_error       jsonb,
    skip_reason      text,
    lease_owner      text,
    lease_expires_at timestamptz,
    dispatch_at      timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    PRIMARY KEY (tenant_id, run_id, id),
    UNIQUE (tenant_id, run_id, node_id),
    FOREIGN KEY (tenant_id, run_id) REFERENCES workflow_runs (tenant_id, id)
) PARTITION BY RANGE (run_id);
CREATE INDEX task_instances_lease_sweep ON task_instances (lease_expires_at) WHERE state = 'running';
CREATE INDEX task_instances_dispatch_sweep ON task_instances (dispatch_at) WHERE state = 'pending';

CREATE TABLE run_signals (
    tenant_id   uuid NOT NULL,
    run_id      uuid NOT NULL,
    id          text NOT NULL CHECK (length(id) BETWEEN 1 AND 255),
    name        text NOT NULL,
    payload     jsonb NOT NULL DEFAULT '{}'::jsonb,
    consumed_by text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, run_id, id),
    FOREIGN KEY (tenant_id, run_id) REFERENCES workflow_runs (tenant_id, id)
) PARTITION BY RANGE (run_id);

-- The timeline: every applied event with the transition it caused.
CREATE SEQUENCE run_events_id_seq AS bigint;
CREATE TABLE run_events (
    tenant_id  uuid   NOT NULL,
    run_id     uuid   NOT NULL,
    id         bigint NOT NULL DEFAULT nextval('run_events_id_seq'),
    kind       text   NOT NULL,
    node_id    text,
    task_id    uuid,
    attempt    int,
    detail     jsonb  NOT NULL DEFAULT '{}'::jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, run_id, id),
    FOREIGN KEY (tenant_id, run_id) REFERENCES workflow_runs (tenant_id, id)
) PARTITION BY RANGE (run_id);
ALTER SEQUENCE run_events_id_seq OWNED BY run_events.id;

-- Durable timers: sleeps, wait and schedule-to-start timeouts, run
-- timeouts. A replica claims due timers for a while (claimed_until) and
-- fires each through the coordinator, which deletes it in the transition's
-- transaction.
CREATE TABLE timers (
    tenant_id     uuid   NOT NULL REFERENCES tenants (id),
    id            bigint GENERATED ALWAYS AS IDENTITY,
    run_id        uuid   NOT NULL,
    kind          text   NOT NULL CHECK (kind IN ('sleep', 'wait_timeout', 'schedule_to_start', 'run_timeout')),
    node_id       text,
    task_id       uuid,
    attempt       int,
    fire_at       timestamptz NOT NULL,
    claimed_until timestamptz,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX timers_by_run ON timers (tenant_id, run_id);
CREATE INDEX timers_due_sweep ON timers (fire_at);

-- The transactional outbox. A row is a message that must reach a stream
-- if and only if the transaction that inserted it commits. Rows carry
-- references only; workers get a task's input and settings with its lease.
-- Kept small and vacuumed eagerly: rows live for milliseconds.
CREATE TABLE outbox (
    tenant_id       uuid   NOT NULL,
    id              bigint GENERATED ALWAYS AS IDENTITY,
    topic           text   NOT NULL DEFAULT 'task',
    queue           text   NOT NULL,
    run_id          uuid,
    task_id         uuid,
    node_id         text,
    node_type       text,
    attempt         int,
    payload         jsonb,
    traceparent     text,
    attempts        int    NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id)
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000,
        autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 2000);
CREATE INDEX outbox_due_sweep ON outbox (next_attempt_at);

CREATE TABLE outbox_dead_letters (
    tenant_id   uuid   NOT NULL,
    id          bigint NOT NULL,
    topic       text   NOT NULL,
    queue       text   NOT NULL,
    run_id      uuid,
    task_id     uuid,
    node_id     text,
    node_type   text,
    attempt     int,
    payload     jsonb,
    attempts    int    NOT NULL,
    last_error  text,
    created_at  timestamptz NOT NULL,
    failed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id)
);

-- One NOTIFY per inserting statement, not per row, with an empty payload:
-- every NOTIFY serialises commits on a cluster-wide lock.
-- +goose StatementBegin
CREATE FUNCTION composer_notify_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('composer_outbox', '');
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION composer_notify_outbox();

-- Row-level security on every tenant-owned table (and tenants itself).
-- +goose StatementBegin
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['workflow_definitions', 'workflow_versions', 'workflow_runs',
        'run_idempotency_keys', 'task_instances', 'run_signals', 'run_events', 'timers',
        'outbox', 'outbox_dead_letters']
    LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
        EXECUTE format($p$CREATE POLICY tenant_isolation ON %I
            USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
            WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)$p$, t);
    END LOOP;
END
$$;
-- +goose StatementEnd
ALTER TABLE tenants ENABLE ROW LEVEL SECURITY;
ALTER TABLE tenants FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tenants
    USING (id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);

-- Partitions: composer_ensure_partitions creates the monthly partitions of
-- run data from last month to `ahead` months out; each partition gets the
-- same row-level security, and the app role gets no access to partitions
-- directly (policies on the parent do not guard a partition queried by
-- name). composer_drop_partitions detaches and drops whole months older
-- than `keep_months`. Both run as the owner for the system role.
-- +goose StatementBegin
CREATE FUNCTION composer_ensure_partitions(ahead int DEFAULT 3) RETURNS int
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    month  date;
    tbl    text;
    part   text;
    made   int := 0;
BEGIN
    FOR i IN -1..ahead LOOP
        month := (date_trunc('month', now() AT TIME ZONE 'UTC') + make_interval(months => i))::date;
        FOREACH tbl IN ARRAY ARRAY['workflow_runs', 'task_instances', 'run_signals', 'run_events'] LOOP
            part := format('%s_%s', tbl, to_char(month, 'YYYYMM'));
            CONTINUE WHEN to_regclass(part) IS NOT NULL;
            EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)', part, tbl,
                composer_uuid_floor(month::timestamp AT TIME ZONE 'UTC'),
                composer_uuid_floor((month + interval '1 month')::timestamp AT TIME ZONE 'UTC'));
            EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', part);
            EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', part);
            EXECUTE format($p$CREATE POLICY tenant_isolation ON %I
                USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
                WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)$p$, part);
            EXECUTE format('REVOKE ALL ON %I FROM PUBLIC, composer_app, composer_system', part);
            made := made + 1;
        END LOOP;
    END LOOP;
    RETURN made;
END
$$;

CREATE FUNCTION composer_drop_partitions(keep_months int) RETURNS int
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    cutoff  date := (date_trunc('month', now() AT TIME ZONE 'UTC') - make_interval(months => keep_months))::date;
    tbl     text;
    part    record;
    dropped int := 0;
BEGIN
    IF keep_months < 1 THEN
        RAISE EXCEPTION 'keep_months must be at least 1';
    END IF;
    -- Children before parents: events, signals and tasks reference runs.
    FOREACH tbl IN ARRAY ARRAY['run_events', 'run_signals', 'task_instances', 'workflow_runs'] LOOP
        FOR part IN
            SELECT c.relname
              FROM pg_inherits i
              JOIN pg_class c ON c.oid = i.inhrelid
              JOIN pg_class p ON p.oid = i.inhparent
             WHERE p.relname = tbl
               AND c.relname ~ ('^' || tbl || '_[0-9]{6}$')
               AND to_date(right(c.relname, 6), 'YYYYMM') < cutoff
        LOOP
            EXECUTE format('ALTER TABLE %I DETACH PARTITION %I', tbl, part.relname);
            EXECUTE format('DROP TABLE %I', part.relname);
            dropped := dropped + 1;
        END LOOP;
    END LOOP;
    DELETE FROM run_idempotency_keys WHERE created_at < cutoff;
    RETURN dropped;
END
$$;
-- +goose StatementEnd
SELECT composer_ensure_partitions(3);

-- Privileges. The app role reaches tenant data only through the policies
-- above; the system role bypasses them, for the cross-tenant loops only.
GRANT SELECT ON tenants TO composer_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON workflow_definitions TO composer_app;
GRANT SELECT, INSERT ON workflow_versions TO composer_app;
GRANT SELECT, INSERT, UPDATE ON workflow_runs TO composer_app;
GRANT SELECT, INSERT, DELETE ON run_idempotency_keys TO composer_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON task_instances TO composer_app;
GRANT SELECT, INSERT, UPDATE ON run_signals TO composer_app;
GRANT SELECT, INSERT ON run_events TO composer_app;
GRANT USAGE ON SEQUENCE run_events_id_seq TO composer_app, composer_system;
GRANT SELECT, INSERT, DELETE ON timers TO composer_app;
GRANT INSERT ON outbox TO composer_app;
GRANT SELECT ON outbox_dead_letters TO composer_app;

GRANT SELECT, INSERT, UPDATE ON tenants TO composer_system;
GRANT SELECT ON workflow_definitions, workflow_versions TO composer_system;
GRANT SELECT ON workflow_runs TO composer_system;
GRANT SELECT, UPDATE ON task_instances TO composer_system;
GRANT SELECT, INSERT ON run_events TO composer_system;
GRANT SELECT ON run_signals, run_idempotency_keys TO composer_system;
GRANT SELECT, UPDATE ON timers TO composer_system;
GRANT SELECT, INSERT, UPDATE, DELETE ON outbox TO composer_system;
GRANT SELECT, INSERT ON outbox_dead_letters TO composer_system;
GRANT EXECUTE ON FUNCTION composer_ensure_partitions(int), composer_drop_partitions(int) TO composer_system;
REVOKE EXECUTE ON FUNCTION composer_ensure_partitions(int), composer_drop_partitions(int) FROM PUBLIC;

-- +goose Down
DROP FUNCTION composer_drop_partitions(int);
DROP FUNCTION composer_ensure_partitions(int);
DROP TABLE outbox_dead_letters, outbox, timers, run_events, run_signals, task_instances,
    run_idempotency_keys, workflow_runs, workflow_versions, workflow_definitions, tenants;
DROP FUNCTION composer_notify_outbox();
DROP FUNCTION composer_immutable();
