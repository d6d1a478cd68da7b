-- The lost-dispatch sweep asks, for each waiting task it checks, whether
-- an outbox row still announces it; without this index that was a scan
-- of the tenant's whole outbox (dead rows included) per task.

-- +goose Up
CREATE INDEX outbox_by_task ON outbox (tenant_id, task_id);

-- +goose Down
DROP INDEX outbox_by_task;
