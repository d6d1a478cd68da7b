-- The audit log (package audit): every administrative and run-changing
-- action of a principal, written in the action's own transaction, as a
-- hash chain per tenant.
--
-- audit_log holds the records. Each row's hash is
--   sha256(prev_hash || int8(seq) || int8(at in microseconds) || body)
-- where body is the length-prefixed encoding of the other fields
-- (audit.Body); prev_hash is the previous row's hash (32 zero bytes before
-- the first). A modified, deleted or reordered row breaks the chain
-- (audit.Verify).
--
-- audit_heads is each tenant's chain head: the last seq and hash, and how
-- far retention pruned (pruned_seq: rows up to it were deleted on
-- purpose, so the oldest kept row must be pruned_seq + 1). Appending locks
-- the tenant's head row, as the last statement before COMMIT, so the
-- appends of one tenant are serialised for the shortest time and nothing a
-- run transition locks is involved.
--
-- The app role may add and read records, never change or delete them;
-- only the system role's retention sweep deletes (oldest first).

-- +goose Up
CREATE TABLE audit_heads (
    tenant_id  uuid NOT NULL REFERENCES tenants (id),
    seq        bigint NOT NULL CHECK (seq >= 1),
    prev_hash  bytea NOT NULL CHECK (octet_length(prev_hash) = 32),
    hash       bytea NOT NULL CHECK (octet_length(hash) = 32),
    at         timestamptz NOT NULL,
    pruned_seq bigint NOT NULL DEFAULT 0 CHECK (pruned_seq >= 0 AND pruned_seq <= seq),
    PRIMARY KEY (tenant_id)
);

CREATE TABLE audit_log (
    tenant_id      uuid NOT NULL REFERENCES tenants (id),
    seq            bigint NOT NULL CHECK (seq >= 1),
    at             timestamptz NOT NULL,
    principal_kind text NOT NULL CHECK (principal_kind IN ('user', 'api_key')),
    principal_id   text NOT NULL CHECK (length(principal_id) BETWEEN 1 AND 255),
    action         text NOT NULL CHECK (action ~ '^[a-zA-Z][a-zA-Z0-9]{0,63}$'),
    target_type    text NOT NULL CHECK (length(target_type) <= 64),
    target_id      text NOT NULL CHECK (length(target_id) <= 255),
    -- "ok", "unchanged" or the error code the action ended with.
    outcome        text NOT NULL CHECK (outcome ~ '^[A-Za-z_]{1,64}$'),
    -- A small JSON object (never a secret value), exactly as hashed.
    detail         text NOT NULL CHECK (octet_length(detail) <= 2048),
    prev_hash      bytea NOT NULL CHECK (octet_length(prev_hash) = 32),
    hash           bytea NOT NULL CHECK (octet_length(hash) = 32),
    PRIMARY KEY (tenant_id, seq)
);
CREATE INDEX audit_log_by_time ON audit_log (tenant_id, at);

ALTER TABLE audit_heads ENABLE ROW LEVEL SECURITY;
ALTER TABLE audit_heads FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON audit_heads
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);
ALTER TABLE audit_log ENABLE ROW LEVEL SECURITY;
ALTER TABLE audit_log FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON audit_log
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);

GRANT SELECT, INSERT ON audit_log TO composer_app;
GRANT SELECT, INSERT, UPDATE (seq, prev_hash, hash, at) ON audit_heads TO composer_app;
GRANT SELECT, DELETE ON audit_log TO composer_system;
GRANT SELECT, UPDATE (pruned_seq) ON audit_heads TO composer_system;

-- Retention per plan, in days (tenants.Limits.AuditRetentionDays).
UPDATE plans SET limits = limits || '{"audit_retention_days": 30}'::jsonb WHERE name = 'free';
UPDATE plans SET limits = limits || '{"audit_retention_days": 90}'::jsonb WHERE name = 'pro';
UPDATE plans SET limits = limits || '{"audit_retention_days": 365}'::jsonb WHERE name = 'enterprise';

-- +goose Down
UPDATE plans SET limits = limits - 'audit_retention_days';
DROP TABLE audit_log;
DROP TABLE audit_heads;
