-- Child workflows: a workflow node (or a map element of a workflow step)
-- starts a child run in its transition's transaction; the child records
-- its parent (the run, the waiting task and its node id) and its depth
-- (its parent's plus one, at most 8), so its end can come back to the
-- parent and a parent's cancellation reach it (package engine, child.go).
--
-- The two crossings between a parent and a child travel as timers, never
-- as one transaction locking both runs (which could deadlock against the
-- other direction): the child's terminal transition inserts a
-- child_finished timer for the parent's task; a parent's transition that
-- cancels the waiting task inserts a parent_cancelled timer for the child.
-- The timer loop fires them at once (it is woken after the commit).
-- detail carries a refused child start's error to the parent.

-- +goose Up
ALTER TABLE workflow_runs
    ADD COLUMN parent_run_id  uuid,
    ADD COLUMN parent_task_id uuid,
    ADD COLUMN parent_node    text CHECK (length(parent_node) <= 80),
    ADD COLUMN depth          int NOT NULL DEFAULT 0 CHECK (depth BETWEEN 0 AND 8),
    ADD CONSTRAINT workflow_runs_parent_check CHECK ((parent_run_id IS NULL) = (parent_task_id IS NULL)
        AND (parent_run_id IS NULL) = (parent_node IS NULL) AND (parent_run_id IS NULL) = (depth = 0));
CREATE INDEX workflow_runs_children ON workflow_runs (tenant_id, parent_run_id, parent_task_id) WHERE parent_run_id IS NOT NULL;

ALTER TABLE timers DROP CONSTRAINT timers_kind_check;
ALTER TABLE timers ADD CONSTRAINT timers_kind_check
    CHECK (kind IN ('sleep', 'wait_timeout', 'schedule_to_start', 'run_timeout', 'child_finished', 'parent_cancelled'));
ALTER TABLE timers ADD COLUMN detail jsonb CHECK (octet_length(detail::text) <= 4096);

-- +goose Down
DELETE FROM timers WHERE kind IN ('child_finished', 'parent_cancelled');
ALTER TABLE timers DROP COLUMN detail;
ALTER TABLE timers DROP CONSTRAINT timers_kind_check;
ALTER TABLE timers ADD CONSTRAINT timers_kind_check CHECK (kind IN ('sleep', 'wait_timeout', 'schedule_to_start', 'run_timeout'));
DROP INDEX workflow_runs_children;
ALTER TABLE workflow_runs DROP CONSTRAINT workflow_runs_parent_check,
    DROP COLUMN depth, DROP COLUMN parent_node, DROP COLUMN parent_task_id, DROP COLUMN parent_run_id;
