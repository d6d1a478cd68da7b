-- Run metadata: business keys (customer id, order id) a run is started
-- with, shown with the run, carried by its webhooks and filterable.
-- workflow_runs.metadata holds the object as given; run_metadata holds one
-- row per key, indexed tenant-leading by (key, value, run id), so a filter
-- on a key's value is an index range in run-id order (newest first) however
-- many runs the tenant has. Both are written in the start's transaction and
-- never change. run_metadata is partitioned like the other run data and
-- dropped with it.

-- +goose Up
ALTER TABLE workflow_runs ADD COLUMN metadata jsonb NOT NULL DEFAULT '{}'::jsonb;

CREATE TABLE run_metadata (
    tenant_id uuid NOT NULL,
    run_id    uuid NOT NULL,
    key       text NOT NULL CHECK (length(key) BETWEEN 1 AND 64),
    value     text NOT NULL CHECK (length(value) <= 256),
    PRIMARY KEY (tenant_id, key, value, run_id),
    FOREIGN KEY (tenant_id, run_id) REFERENCES workflow_runs (tenant_id, id)
) PARTITION BY RANGE (run_id);
ALTER TABLE run_metadata ENABLE ROW LEVEL SECURITY;
ALTER TABLE run_metadata FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON run_metadata
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);
GRANT SELECT, INSERT ON run_metadata TO composer_app;
GRANT SELECT ON run_metadata TO composer_system;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION composer_ensure_partitions(ahead int DEFAULT 3) RETURNS int
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    month  date;
    tbl    text;
    part   text;
    made   int := 0;
BEGIN
    FOR i IN -1..ahead LOOP
        month := (date_trunc('month', now() AT TIME ZONE 'UTC') + make_interval(months => i))::date;
        FOREACH tbl IN ARRAY ARRAY['workflow_runs', 'task_instances', 'run_signals', 'run_events', 'run_metadata'] LOOP
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

CREATE OR REPLACE FUNCTION composer_drop_partitions(keep_months int) RETURNS int
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
    -- Children before parents: metadata, events, signals and tasks reference runs.
    FOREACH tbl IN ARRAY ARRAY['run_metadata', 'run_events', 'run_signals', 'task_instances', 'workflow_runs'] LOOP
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
    RETURN dropped;
END
$$;
-- +goose StatementEnd
SELECT composer_ensure_partitions(3);

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION composer_drop_partitions(keep_months int) RETURNS int
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
    RETURN dropped;
END
$$;
CREATE OR REPLACE FUNCTION composer_ensure_partitions(ahead int DEFAULT 3) RETURNS int
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
-- +goose StatementEnd
DROP TABLE run_metadata;
ALTER TABLE workflow_runs DROP COLUMN metadata;
