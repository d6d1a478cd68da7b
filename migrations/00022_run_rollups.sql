-- Dashboard statistics (package stats): per (tenant, workflow, bucket)
-- rollups of runs, folded asynchronously from the runs table by the stats
-- folder, never written by a run's own transitions (a counter row updated
-- by every completion would serialise a workflow's completions on one row
-- lock).
--
-- run_rollups holds, for buckets of 60, 3,600 and 86,400 seconds (UTC):
--   * events of the bucket: runs started (by id time, the run's creation),
--     runs finished by outcome (by finished_at) and a histogram of the
--     finished runs' durations (created_at to finished_at) in 128 fixed
--     log-spaced buckets: durations[1] is under 1 ms, durations[i+1] for
--     i >= 1 counts [2^((i-1)/4), 2^(i/4)) ms, durations[128] is open-ended;
--     these only grow, once per folded minute.
--   * a census of the runs created in the bucket that are now completed,
--     failed or cancelled with finished_at before the watermark (now_*),
--     recomputed whenever one of them finishes or is reopened; it is kept
--     at 60 and 86,400 seconds only, and zeroed for months whose partitions
--     were dropped (the event counts stay: they describe the past).
-- workflow_id 00000000-0000-0000-0000-000000000000 is the tenant's total.
--
-- run_rollup_state.folded_to is the watermark: every minute before it is
-- folded. It moves in the fold's own transaction, under the row's lock, so
-- replicas fold one at a time and each minute's events are added once.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION composer_uuid_time(id uuid) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT to_timestamp((('x' || encode(substring(uuid_send(id) FROM 1 FOR 6), 'hex'))::bit(48)::bigint) / 1000.0)
$$;

CREATE FUNCTION composer_duration_bucket(ms double precision) RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN ms < 1 THEN 0 ELSE least(127, 1 + floor(4 * ln(ms) / ln(2))::int) END
$$;

CREATE FUNCTION composer_int_array_add(a int[], b int[]) RETURNS int[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT array_agg(x + y ORDER BY i) FROM unnest(a, b) WITH ORDINALITY AS t(x, y, i)
$$;
-- +goose StatementEnd
GRANT EXECUTE ON FUNCTION composer_uuid_time(uuid), composer_duration_bucket(double precision),
    composer_int_array_add(int[], int[]) TO composer_app, composer_system;

-- A reopened run (a rerun in place) tells the census that its old outcome
-- is gone.
ALTER TABLE workflow_runs ADD COLUMN reopened_at timestamptz;
-- The fold's cross-tenant reads: runs created, finished and reopened in a
-- minute range.
CREATE INDEX workflow_runs_created_sweep ON workflow_runs (id);
CREATE INDEX workflow_runs_finished_sweep ON workflow_runs (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX workflow_runs_reopened_sweep ON workflow_runs (reopened_at) WHERE reopened_at IS NOT NULL;
-- The request path's live tail: a tenant's runs finished since the watermark.
CREATE INDEX workflow_runs_by_finished ON workflow_runs (tenant_id, finished_at) WHERE finished_at IS NOT NULL;

CREATE TABLE run_rollups (
    tenant_id     uuid        NOT NULL REFERENCES tenants (id),
    workflow_id   uuid        NOT NULL,
    width         int         NOT NULL CHECK (width IN (60, 3600, 86400)),
    bucket        timestamptz NOT NULL,
    started       bigint      NOT NULL DEFAULT 0,
    completed     bigint      NOT NULL DEFAULT 0,
    failed        bigint      NOT NULL DEFAULT 0,
    cancelled     bigint      NOT NULL DEFAULT 0,
    durations     int[]       NOT NULL DEFAULT array_fill(0, ARRAY[128]) CHECK (cardinality(durations) = 128),
    now_completed bigint      NOT NULL DEFAULT 0,
    now_failed    bigint      NOT NULL DEFAULT 0,
    now_cancelled bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, workflow_id, width, bucket)
);
ALTER TABLE run_rollups ENABLE ROW LEVEL SECURITY;
ALTER TABLE run_rollups FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON run_rollups
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);

CREATE TABLE run_rollup_state (
    singleton   bool PRIMARY KEY DEFAULT true CHECK (singleton),
    -- NULL until the first fold, which starts at the oldest run.
    folded_to   timestamptz,
    -- The census counts runs created from here on (the oldest partition).
    census_from timestamptz
);
INSERT INTO run_rollup_state DEFAULT VALUES;

GRANT SELECT ON run_rollups, run_rollup_state TO composer_app;
GRANT SELECT, INSERT, UPDATE ON run_rollups TO composer_system;
GRANT SELECT, UPDATE ON run_rollup_state TO composer_system;

-- +goose Down
DROP TABLE run_rollup_state, run_rollups;
DROP INDEX workflow_runs_by_finished;
DROP INDEX workflow_runs_reopened_sweep;
DROP INDEX workflow_runs_finished_sweep;
DROP INDEX workflow_runs_created_sweep;
ALTER TABLE workflow_runs DROP COLUMN reopened_at;
DROP FUNCTION composer_int_array_add(int[], int[]);
DROP FUNCTION composer_duration_bucket(double precision);
DROP FUNCTION composer_uuid_time(uuid);
