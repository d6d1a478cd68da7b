-- Concurrency keys: a workflow may limit how many of its runs run at once
-- per key (a CEL expression over the run's input and metadata), queueing,
-- cancelling the oldest, or cancelling the newest beyond the limit
-- (package engine, concurrency.go).
--
-- A run records its key (concurrency_key). A start counts the key's
-- running runs under a transaction-scoped advisory lock of the key, so
-- concurrent starts of one key serialise; with the queue strategy a run
-- beyond the limit (or behind other queued runs of its key: FIFO) is
-- written 'queued'. A queued-strategy run that ends inserts a due
-- concurrency_release timer (detail: its workflow and key); firing it
-- starts the key's oldest queued runs while the key has room, each in its
-- own transaction (the queued run's lock, then the key's lock: the one
-- order every path takes). A 'cancel' timer cancels a run superseded by a
-- newer one (cancel_in_progress) without locking it from the start's
-- transaction.
--
-- A step may have a concurrency key too (a node's concurrency: {key,
-- limit}): its task records the key (scoped "<workflow>/<node>/<value>"),
-- the limit and whether it holds one of the key's slots. A task is
-- dispatched with its outbox row due only when it takes a slot (under the
-- key's advisory lock, FIFO behind the key's waiting tasks); otherwise its
-- row is held (next_attempt_at 'infinity', which the enqueuer never claims
-- and the lost-dispatch sweep sees as present). A slot is kept through
-- retries and given back when the task ends: the ending transition grants
-- the freed slots to the key's oldest waiting tasks, making their rows due.

-- +goose Up
ALTER TABLE workflow_runs ADD COLUMN concurrency_key text CHECK (length(concurrency_key) BETWEEN 1 AND 256);
CREATE INDEX workflow_runs_by_concurrency_key ON workflow_runs (tenant_id, workflow_id, concurrency_key, status, id)
    WHERE concurrency_key IS NOT NULL;

ALTER TABLE task_instances
    ADD COLUMN concurrency_key   text CHECK (length(concurrency_key) BETWEEN 1 AND 400),
    ADD COLUMN concurrency_limit int CHECK (concurrency_limit BETWEEN 1 AND 1000),
    ADD COLUMN concurrency_slot  boolean NOT NULL DEFAULT false;
CREATE INDEX task_instances_by_concurrency_key ON task_instances (tenant_id, concurrency_key, state, concurrency_slot, created_at, id)
    WHERE concurrency_key IS NOT NULL;

-- A step's transition makes a waiting task's held row due, or drops it.
GRANT SELECT (tenant_id, task_id, next_attempt_at), UPDATE (next_attempt_at), DELETE ON outbox TO composer_app;

ALTER TABLE timers DROP CONSTRAINT timers_kind_check;
ALTER TABLE timers ADD CONSTRAINT timers_kind_check
    CHECK (kind IN ('sleep', 'wait_timeout', 'schedule_to_start', 'run_timeout', 'child_finished', 'parent_cancelled',
                    'concurrency_release', 'cancel'));

-- +goose Down
REVOKE UPDATE (next_attempt_at), DELETE ON outbox FROM composer_app;
REVOKE SELECT (next_attempt_at) ON outbox FROM composer_app;
DELETE FROM timers WHERE kind IN ('concurrency_release', 'cancel');
ALTER TABLE timers DROP CONSTRAINT timers_kind_check;
ALTER TABLE timers ADD CONSTRAINT timers_kind_check
    CHECK (kind IN ('sleep', 'wait_timeout', 'schedule_to_start', 'run_timeout', 'child_finished', 'parent_cancelled'));
DROP INDEX task_instances_by_concurrency_key;
ALTER TABLE task_instances DROP COLUMN concurrency_slot, DROP COLUMN concurrency_limit, DROP COLUMN concurrency_key;
DROP INDEX workflow_runs_by_concurrency_key;
ALTER TABLE workflow_runs DROP COLUMN concurrency_key;
