-- The audit chain keyed (package audit): a record's hash becomes an
-- HMAC-SHA256 under an operator key (COMPOSER_AUDIT_KEY) that never reaches
-- the database, so whoever can write these tables but lacks the key can no
-- longer rewrite a chain consistently; and refusals coalesce per principal.
--
-- audit_log.key_id names the key a record's hash is a MAC under (audit.Keyring);
-- '' marks a record written before this migration, whose hash stays the
-- plain sha256 of migration 00023. Such records are verified as the chain's
-- prefix only: the first keyed record's MAC covers the last of them.
--
-- audit_heads.head_mac (under key_id) vouches for the head's seq and hash,
-- so cutting the newest records off needs a head the server once wrote;
-- pruned_mac (under pruned_key_id) is retention's mark of its cut, so
-- records deleted from the front by anyone else are found. pruned_mark_seq
-- is the cut the mark is for and must equal pruned_seq: retention moves
-- both in one statement, while a binary from before this migration (a
-- rolling upgrade's old pods, a rollback) moves pruned_seq alone and so
-- fails instead of cutting a chain without a mark. (Its appends still
-- work: they write unkeyed records, vouched for by the next keyed one.)
-- A head's seq may
-- be 0 inside the transaction of a tenant's first record: the placeholder
-- that concurrent first appends lock (it never commits without a record).
--
-- audit_refusals coalesces refused and failed actions: one row per
-- principal, action and outcome in each fixed window (audit.RefusalWindow);
-- the window's first refusal is appended to the chain (seq) and the rest
-- only counted (repeats, last_at), not chained. Rows go with their record
-- (retention deletes the record, the cascade the row).

-- +goose Up
ALTER TABLE audit_log ADD COLUMN key_id text NOT NULL DEFAULT '' CHECK (key_id ~ '^([0-9a-f]{8})?$');

ALTER TABLE audit_heads DROP CONSTRAINT audit_heads_seq_check;
ALTER TABLE audit_heads ADD CONSTRAINT audit_heads_seq_check CHECK (seq >= 0);
ALTER TABLE audit_heads
    ADD COLUMN key_id        text NOT NULL DEFAULT '' CHECK (key_id ~ '^([0-9a-f]{8})?$'),
    ADD COLUMN head_mac      bytea CHECK (octet_length(head_mac) = 32),
    ADD COLUMN pruned_key_id text NOT NULL DEFAULT '' CHECK (pruned_key_id ~ '^([0-9a-f]{8})?$'),
    ADD COLUMN pruned_mac    bytea CHECK (octet_length(pruned_mac) = 32),
    ADD COLUMN pruned_mark_seq bigint NOT NULL DEFAULT 0;
UPDATE audit_heads SET pruned_mark_seq = pruned_seq;
ALTER TABLE audit_heads ADD CONSTRAINT audit_heads_cut_marked CHECK (pruned_mark_seq = pruned_seq);

CREATE TABLE audit_refusals (
    tenant_id      uuid NOT NULL REFERENCES tenants (id),
    principal_kind text NOT NULL CHECK (principal_kind IN ('user', 'api_key')),
    principal_id   text NOT NULL CHECK (length(principal_id) BETWEEN 1 AND 255),
    action         text NOT NULL CHECK (action ~ '^[a-zA-Z][a-zA-Z0-9]{0,63}$'),
    outcome        text NOT NULL CHECK (outcome ~ '^[A-Za-z_]{1,64}$'),
    window_start   timestamptz NOT NULL,
    -- The record of the window's first refusal (set in its transaction).
    seq            bigint,
    -- The refusals after it in the window, and the newest one's time.
    repeats        bigint NOT NULL DEFAULT 0 CHECK (repeats >= 0),
    last_at        timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, principal_kind, principal_id, action, outcome, window_start),
    FOREIGN KEY (tenant_id, seq) REFERENCES audit_log (tenant_id, seq) ON DELETE CASCADE
);
CREATE UNIQUE INDEX audit_refusals_by_seq ON audit_refusals (tenant_id, seq);

ALTER TABLE audit_refusals ENABLE ROW LEVEL SECURITY;
ALTER TABLE audit_refusals FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON audit_refusals
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);

GRANT UPDATE (key_id, head_mac) ON audit_heads TO composer_app;
GRANT UPDATE (pruned_key_id, pruned_mac, pruned_mark_seq) ON audit_heads TO composer_system;
GRANT SELECT, INSERT, UPDATE (seq, repeats, last_at) ON audit_refusals TO composer_app;

-- +goose Down
DROP TABLE audit_refusals;
ALTER TABLE audit_heads DROP COLUMN key_id, DROP COLUMN head_mac, DROP COLUMN pruned_key_id, DROP COLUMN pruned_mac,
    DROP COLUMN pruned_mark_seq;
ALTER TABLE audit_heads DROP CONSTRAINT audit_heads_seq_check;
ALTER TABLE audit_heads ADD CONSTRAINT audit_heads_seq_check CHECK (seq >= 1);
ALTER TABLE audit_log DROP COLUMN key_id;
