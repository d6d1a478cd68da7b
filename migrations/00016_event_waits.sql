-- Events resume and cancel runs: a wait node may wait for a published event
-- matched to its run by a CEL expression, and a workflow may name events
-- that cancel its runs (cancel_on). Both register in event_waits, the
-- index a publish looks up (package engine, events.go).
--
-- A row is written by the transition that starts the wait (a wait node
-- becoming ready, a run starting or being re-run for cancel_on) and
-- deleted by the one that ends it (the node resolved, failed or was
-- cancelled; the run finished). name is the event waited for; key_expr is
-- the event side of the match's equality (`event.payload.order_id`) and
-- match_key the canonical JSON of the run side's value when the wait began
-- (`input.order_id` gave "A-17"), so a publish evaluates each distinct
-- key_expr of its name once over the event and reads the waits holding the
-- value it gives; both are '' for a match with no such equality (tried
-- against every waiting run of the name). run_id carries no foreign key:
-- runs are partitioned by month; a run's rows go when it finishes.
--
-- event_runs also records the runs an event resumed or cancelled: one row
-- per run (a start or refusal stays one row per workflow).

-- +goose Up
CREATE TABLE event_waits (
    tenant_id  uuid NOT NULL REFERENCES tenants (id),
    id         bigint GENERATED ALWAYS AS IDENTITY,
    run_id     uuid NOT NULL,
    -- The waiting task; NULL for a cancel_on entry (position cancel_on).
    task_id    uuid,
    node_id    text CHECK (length(node_id) <= 64),
    cancel_on  int CHECK (cancel_on BETWEEN 0 AND 4),
    name       text NOT NULL CHECK (length(name) BETWEEN 1 AND 128),
    key_expr   text NOT NULL CHECK (length(key_expr) <= 1000),
    match_key  text NOT NULL CHECK (length(match_key) <= 512),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id),
    CHECK ((task_id IS NULL) = (cancel_on IS NOT NULL) AND (task_id IS NULL) = (node_id IS NULL))
);
CREATE INDEX event_waits_lookup ON event_waits (tenant_id, name, key_expr, match_key);
CREATE INDEX event_waits_by_run ON event_waits (tenant_id, run_id);
CREATE INDEX event_waits_by_task ON event_waits (tenant_id, task_id) WHERE task_id IS NOT NULL;

ALTER TABLE event_waits ENABLE ROW LEVEL SECURITY;
ALTER TABLE event_waits FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON event_waits
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);
GRANT SELECT, INSERT, DELETE ON event_waits TO composer_app;
GRANT SELECT ON event_waits TO composer_system;

ALTER TABLE event_runs DROP CONSTRAINT event_runs_pkey;
ALTER TABLE event_runs DROP CONSTRAINT event_runs_outcome_check;
ALTER TABLE event_runs ADD CONSTRAINT event_runs_outcome_check CHECK (outcome IN ('started', 'refused', 'resumed', 'cancelled'));
ALTER TABLE event_runs DROP CONSTRAINT event_runs_check;
ALTER TABLE event_runs ADD CONSTRAINT event_runs_check CHECK ((outcome = 'refused') = (run_id IS NULL));
CREATE UNIQUE INDEX event_runs_started ON event_runs (tenant_id, event, workflow_id) WHERE outcome IN ('started', 'refused');
CREATE UNIQUE INDEX event_runs_delivered ON event_runs (tenant_id, event, run_id) WHERE outcome IN ('resumed', 'cancelled');
CREATE INDEX event_runs_by_event ON event_runs (tenant_id, event);

-- Events older than the run retention window go with the months of runs
-- they started (the sweeper, as the system role).
GRANT DELETE ON events, event_runs TO composer_system;

-- +goose Down
REVOKE DELETE ON events, event_runs FROM composer_system;
DELETE FROM event_runs WHERE outcome IN ('resumed', 'cancelled');
DROP INDEX event_runs_by_event;
DROP INDEX event_runs_delivered;
DROP INDEX event_runs_started;
ALTER TABLE event_runs DROP CONSTRAINT event_runs_check;
ALTER TABLE event_runs ADD CONSTRAINT event_runs_check CHECK ((outcome = 'started') = (run_id IS NOT NULL));
ALTER TABLE event_runs DROP CONSTRAINT event_runs_outcome_check;
ALTER TABLE event_runs ADD CONSTRAINT event_runs_outcome_check CHECK (outcome IN ('started', 'refused'));
ALTER TABLE event_runs ADD PRIMARY KEY (tenant_id, event, workflow_id);
DROP TABLE event_waits;
