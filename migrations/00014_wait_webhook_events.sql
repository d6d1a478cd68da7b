-- Webhook endpoints may also subscribe to a run starting to wait for a
-- signal (run.waiting) or an approval (approval.requested).

-- +goose Up
ALTER TABLE webhook_endpoints DROP CONSTRAINT webhook_endpoints_event_types_check;
ALTER TABLE webhook_endpoints ADD CONSTRAINT webhook_endpoints_event_types_check CHECK (cardinality(event_types) > 0
    AND event_types <@ ARRAY['run.completed', 'run.failed', 'run.cancelled', 'run.waiting', 'approval.requested']);
ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_event_type_check;
ALTER TABLE webhook_deliveries ADD CONSTRAINT webhook_deliveries_event_type_check
    CHECK (event_type IN ('run.completed', 'run.failed', 'run.cancelled', 'run.waiting', 'approval.requested', 'webhook.test'));

-- +goose Down
DELETE FROM webhook_deliveries WHERE event_type IN ('run.waiting', 'approval.requested');
ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_event_type_check;
ALTER TABLE webhook_deliveries ADD CONSTRAINT webhook_deliveries_event_type_check
    CHECK (event_type IN ('run.completed', 'run.failed', 'run.cancelled', 'webhook.test'));
UPDATE webhook_endpoints SET event_types = array_remove(array_remove(event_types, 'run.waiting'), 'approval.requested');
DELETE FROM webhook_endpoints WHERE cardinality(event_types) = 0;
ALTER TABLE webhook_endpoints DROP CONSTRAINT webhook_endpoints_event_types_check;
ALTER TABLE webhook_endpoints ADD CONSTRAINT webhook_endpoints_event_types_check CHECK (cardinality(event_types) > 0
    AND event_types <@ ARRAY['run.completed', 'run.failed', 'run.cancelled']);
