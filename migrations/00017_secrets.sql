-- Secrets: a tenant's named values that HTTP steps read as secrets.NAME
-- (package secrets). Values are write-only in the API.
--
-- secrets names each secret and points at its current version. Every set
-- (create or update) adds a secret_versions row and moves current_version
-- there; steps read the current version when they execute. The latest
-- versions are kept (package secrets prunes older ones), so version
-- numbers only grow.
--
-- secret_versions.sealed is the value sealed with AES-256-GCM under the
-- server's key (COMPOSER_WEBHOOK_SECRET_KEY), exactly as webhook signing
-- secrets are (webhooks.Keyring), with the tenant, secret and version ids
-- as additional data: a sealed value copied to another row does not open.
-- The app role may write sealed values but never read them; only the task
-- server, as composer_system, opens them for the lease that needs them.
--
-- secret_audit records every create, update and delete, in the
-- transaction that made it: who, when, what, which version. It has no
-- foreign key to secrets, so a deleted secret's history stays. The app
-- role may only add and read rows.

-- +goose Up
CREATE TABLE secrets (
    tenant_id       uuid NOT NULL REFERENCES tenants (id),
    id              uuid NOT NULL,
    name            text NOT NULL CHECK (name ~ '^[A-Za-z_][A-Za-z0-9_]{0,63}$'),
    current_version int NOT NULL CHECK (current_version >= 1),
    created_by      text NOT NULL CHECK (length(created_by) <= 255),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id),
    UNIQUE (tenant_id, name)
);

CREATE TABLE secret_versions (
    tenant_id  uuid NOT NULL,
    secret_id  uuid NOT NULL,
    version    int NOT NULL CHECK (version >= 1),
    -- The version's own id: part of the sealed value's additional data.
    id         uuid NOT NULL,
    -- version | key id | nonce | ciphertext and tag of at most 16 KiB.
    sealed     bytea NOT NULL CHECK (octet_length(sealed) BETWEEN 33 AND 16384 + 33),
    created_by text NOT NULL CHECK (length(created_by) <= 255),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, secret_id, version),
    FOREIGN KEY (tenant_id, secret_id) REFERENCES secrets (tenant_id, id) ON DELETE CASCADE
);

CREATE TABLE secret_audit (
    tenant_id   uuid NOT NULL REFERENCES tenants (id),
    id          uuid NOT NULL,
    at          timestamptz NOT NULL DEFAULT now(),
    principal   text NOT NULL CHECK (length(principal) BETWEEN 1 AND 255),
    action      text NOT NULL CHECK (action IN ('create', 'update', 'delete')),
    secret_name text NOT NULL CHECK (length(secret_name) BETWEEN 1 AND 64),
    -- The version created, or the last version of a deleted secret.
    version     int NOT NULL CHECK (version >= 1),
    PRIMARY KEY (tenant_id, id)
);

ALTER TABLE secrets ENABLE ROW LEVEL SECURITY;
ALTER TABLE secrets FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON secrets
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);
ALTER TABLE secret_versions ENABLE ROW LEVEL SECURITY;
ALTER TABLE secret_versions FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON secret_versions
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);
ALTER TABLE secret_audit ENABLE ROW LEVEL SECURITY;
ALTER TABLE secret_audit FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON secret_audit
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);

-- The app role manages secrets and writes (never reads) sealed values; the
-- audit log is append-only for it. The task server (composer_system) reads
-- the current sealed value of the secrets a leased task names.
GRANT SELECT, INSERT, DELETE ON secrets TO composer_app;
GRANT UPDATE (current_version, updated_at) ON secrets TO composer_app;
GRANT SELECT (tenant_id, secret_id, version, id, created_by, created_at),
      INSERT (tenant_id, secret_id, version, id, sealed, created_by),
      DELETE
   ON secret_versions TO composer_app;
GRANT SELECT, INSERT ON secret_audit TO composer_app;
GRANT SELECT ON secrets, secret_versions TO composer_system;

-- API keys may hold secrets:manage.
ALTER TABLE api_keys DROP CONSTRAINT api_keys_scopes_check;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_scopes_check CHECK (cardinality(scopes) > 0 AND scopes <@ ARRAY['runs:read', 'runs:write',
    'workflows:read', 'workflows:write', 'keys:manage', 'members:manage', 'webhooks:manage',
    'billing:read', 'worker', 'events:write', 'secrets:manage', 'admin']);

-- +goose Down
UPDATE api_keys SET scopes = array_remove(scopes, 'secrets:manage') WHERE 'secrets:manage' = ANY (scopes) AND cardinality(scopes) > 1;
ALTER TABLE api_keys DROP CONSTRAINT api_keys_scopes_check;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_scopes_check CHECK (cardinality(scopes) > 0 AND scopes <@ ARRAY['runs:read', 'runs:write',
    'workflows:read', 'workflows:write', 'keys:manage', 'members:manage', 'webhooks:manage',
    'billing:read', 'worker', 'events:write', 'admin']);
DROP TABLE secret_audit;
DROP TABLE secret_versions;
DROP TABLE secrets;
