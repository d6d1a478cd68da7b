-- The outbox fast path (see engine/outbox): a process that commits
-- dispatches publishes them itself right after the commit.
--
-- Every NOTIFY serialises commits on a cluster-wide lock. A server that runs
-- an outbox enqueuer wakes it in-process after its own commits, so its
-- transactions mark themselves with composer.local_outbox = on and the
-- trigger skips the NOTIFY for them. Other writers (sweeps, servers without
-- an enqueuer) still notify; enqueuers on other replicas also poll.

-- +goose Up
-- composer_guard enforces the coordinator's fencing in the database: a
-- guarded statement that changed no row raises CM409, which aborts the
-- pipelined transition (and its trailing COMMIT) and is reported as an
-- ignored event.
-- +goose StatementBegin
CREATE FUNCTION composer_guard(changed bigint, what text) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF changed <> 1 THEN
        RAISE EXCEPTION '% matched no row: the task changed concurrently', what USING ERRCODE = 'CM409';
    END IF;
END
$$;
-- +goose StatementEnd
GRANT EXECUTE ON FUNCTION composer_guard(bigint, text) TO composer_app, composer_system;

-- The fast path reads back the ids of the rows it will publish itself.
GRANT SELECT (id) ON outbox TO composer_app;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION composer_notify_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('composer.local_outbox', true) IS DISTINCT FROM 'on' THEN
        PERFORM pg_notify('composer_outbox', '');
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- Retention of idempotency keys moves to the system role (the sweeper):
-- the owner is bound by FORCE ROW LEVEL SECURITY, so the DELETE inside
-- composer_drop_partitions, run without a tenant, deleted nothing.
GRANT DELETE ON run_idempotency_keys TO composer_system;
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
    RETURN dropped;
END
$$;
-- +goose StatementEnd

-- +goose Down
REVOKE DELETE ON run_idempotency_keys FROM composer_system;
DROP FUNCTION composer_guard(bigint, text);
REVOKE SELECT (id) ON outbox FROM composer_app;
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION composer_notify_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('composer_outbox', '');
    RETURN NULL;
END
$$;
-- +goose StatementEnd
