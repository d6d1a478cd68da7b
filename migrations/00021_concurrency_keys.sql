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

-- +goose Up
ALTER TABLE workflow_runs ADD COLUMN concurrency_key text CHECK (length(concurrency_key) BETWEEN 1 AND 256);
CREATE INDEX workflow_runs_by_concurrency_key ON workflow_runs (tenant_id, workflow_id, concurrency_key, status, id)
    WHERE concurrency_key IS NOT NULL;

ALTER TABLE timers DROP CONSTRAINT timers_kind_check;
ALTER TABLE timers ADD CONSTRAINT timers_kind_check
    CHECK (kind IN ('sleep', 'wait_timeout', 'schedule_to_start', 'run_timeout', 'child_finished', 'parent_cancelled',
                    'concurrency_release', 'cancel'));

-- +goose Down
DELETE FROM timers WHERE kind IN ('concurrency_release', 'cancel');
ALTER TABLE timers DROP CONSTRAINT timers_kind_check;
ALTER TABLE timers ADD CONSTRAINT timers_kind_check
    CHECK (kind IN ('sleep', 'wait_timeout', 'schedule_to_start', 'run_timeout', 'child_finished', 'parent_cancelled'));
DROP INDEX workflow_runs_by_concurrency_key;
ALTER TABLE workflow_runs DROP COLUMN concurrency_key;
