-- Tenant workers (engine/taskpoll): a task node is dispatched to the stream
-- of its handler on its queue, which only the tenant's own workers read,
-- through the public poll API. The outbox row names the handler so the
-- enqueuer can route it; other node types leave it NULL.

-- +goose Up
ALTER TABLE outbox ADD COLUMN handler text CHECK (length(handler) <= 64);
ALTER TABLE outbox_dead_letters ADD COLUMN handler text;

-- +goose Down
ALTER TABLE outbox_dead_letters DROP COLUMN handler;
ALTER TABLE outbox DROP COLUMN handler;
