-- Events: a tenant publishes named events (publishEvent, POST /v1/events);
-- workflows declare triggers (an event name or a pattern with "*"
-- segments, and an optional CEL condition over the event) and each
-- published event starts every matching workflow once, in the transaction
-- that records the event (package engine, events.go).
--
-- events holds each published event. event_id is the publisher's id, the
-- dedupe key: unique per tenant, so publishing it again answers the event
-- already recorded and starts nothing again. There is no retention sweep
-- yet: events are kept until the tenant is removed.
--
-- event_runs is what an event did to each workflow whose trigger matched:
-- the run it started, or that the start was refused by admission (and
-- why). run_id carries no foreign key: runs are partitioned by month and
-- dropped with their partition, the record of the event stays.
--
-- workflow_triggers is the triggers of each workflow's latest version,
-- rewritten when a version is created, so a publish finds the workflows
-- its name matches through a tenant-leading index: exact names by
-- (tenant_id, pattern), patterns with "*" by (tenant_id, segments, prefix).

-- +goose Up
CREATE TABLE events (
    tenant_id   uuid NOT NULL REFERENCES tenants (id),
    id          uuid NOT NULL,
    event_id    text NOT NULL CHECK (length(event_id) BETWEEN 1 AND 255),
    name        text NOT NULL CHECK (length(name) BETWEEN 1 AND 128),
    payload     jsonb NOT NULL CHECK (jsonb_typeof(payload) = 'object' AND octet_length(payload::text) <= 262144),
    -- sha-256 of the canonical name and payload: a repeat with another
    -- name or payload is a conflict.
    request_hash bytea NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id),
    UNIQUE (tenant_id, event_id)
);
CREATE INDEX events_by_name ON events (tenant_id, name, id);

CREATE TABLE event_runs (
    tenant_id     uuid NOT NULL,
    event         uuid NOT NULL,
    workflow_id   uuid NOT NULL,
    run_id        uuid,
    outcome       text NOT NULL CHECK (outcome IN ('started', 'refused')),
    error_code    text CHECK (length(error_code) <= 64),
    error_message text CHECK (length(error_message) <= 1000),
    PRIMARY KEY (tenant_id, event, workflow_id),
    FOREIGN KEY (tenant_id, event) REFERENCES events (tenant_id, id) ON DELETE CASCADE,
    CHECK ((outcome = 'started') = (run_id IS NOT NULL))
);
CREATE INDEX event_runs_by_run ON event_runs (tenant_id, run_id) WHERE run_id IS NOT NULL;

CREATE TABLE workflow_triggers (
    tenant_id   uuid NOT NULL,
    workflow_id uuid NOT NULL,
    position    int NOT NULL CHECK (position BETWEEN 0 AND 9),
    version     int NOT NULL CHECK (version >= 1),
    pattern     text NOT NULL CHECK (length(pattern) BETWEEN 1 AND 128),
    wildcard    boolean NOT NULL,
    segments    int NOT NULL CHECK (segments >= 1),
    -- The literal part of the pattern before its first "*" segment.
    prefix      text NOT NULL,
    PRIMARY KEY (tenant_id, workflow_id, position),
    FOREIGN KEY (tenant_id, workflow_id) REFERENCES workflow_definitions (tenant_id, id) ON DELETE CASCADE
);
CREATE INDEX workflow_triggers_exact ON workflow_triggers (tenant_id, pattern) WHERE NOT wildcard;
CREATE INDEX workflow_triggers_wildcard ON workflow_triggers (tenant_id, segments, prefix) WHERE wildcard;

ALTER TABLE events ENABLE ROW LEVEL SECURITY;
ALTER TABLE events FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON events
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);
ALTER TABLE event_runs ENABLE ROW LEVEL SECURITY;
ALTER TABLE event_runs FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON event_runs
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);
ALTER TABLE workflow_triggers ENABLE ROW LEVEL SECURITY;
ALTER TABLE workflow_triggers FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON workflow_triggers
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);

-- Events and their runs are written once and never changed by the app;
-- triggers are replaced with each new version.
GRANT SELECT, INSERT ON events TO composer_app;
GRANT SELECT, INSERT ON event_runs TO composer_app;
GRANT SELECT, INSERT, DELETE ON workflow_triggers TO composer_app;
GRANT SELECT ON events, event_runs, workflow_triggers TO composer_system;

-- API keys may hold events:write (publishEvent, POST /v1/events).
ALTER TABLE api_keys DROP CONSTRAINT api_keys_scopes_check;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_scopes_check CHECK (cardinality(scopes) > 0 AND scopes <@ ARRAY['runs:read', 'runs:write',
    'workflows:read', 'workflows:write', 'keys:manage', 'members:manage', 'webhooks:manage',
    'billing:read', 'worker', 'events:write', 'admin']);

-- +goose Down
UPDATE api_keys SET scopes = array_remove(scopes, 'events:write') WHERE 'events:write' = ANY (scopes) AND cardinality(scopes) > 1;
ALTER TABLE api_keys DROP CONSTRAINT api_keys_scopes_check;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_scopes_check CHECK (cardinality(scopes) > 0 AND scopes <@ ARRAY['runs:read', 'runs:write',
    'workflows:read', 'workflows:write', 'keys:manage', 'members:manage', 'webhooks:manage',
    'billing:read', 'worker', 'admin']);
DROP TABLE workflow_triggers;
DROP TABLE event_runs;
DROP TABLE events;
