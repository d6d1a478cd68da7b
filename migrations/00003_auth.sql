-- Identity and access: tenant memberships (who holds which role) and
-- per-tenant API keys, with the same tenancy rules as the core tables.
--
-- API keys are stored as a SHA-256 hash of their secret, never the secret.
-- A presented key names its key id but not its tenant, so the lookup is
-- global: composer_api_key_lookup (security definer, executable by
-- composer_app only) reads one row by key id through the global
-- api_keys_key_id_lookup index. FORCE ROW LEVEL SECURITY binds the owner
-- too and the owner is NOBYPASSRLS, so the api_keys policy admits the owner
-- for exactly the key id the function is looking up (a transaction-local
-- setting the function sets and restores); composer_app can set that
-- setting too, but is not the owner, so it gains nothing.
--
-- Authorization caches a tenant's role assignments in every replica;
-- tenants.membership_version is bumped by a trigger on every change of a
-- tenant's memberships, and each authorization compares it with the cached
-- version in its own transaction, so a change takes effect on the next
-- request everywhere.

-- +goose Up
ALTER TABLE tenants ADD COLUMN membership_version bigint NOT NULL DEFAULT 0;

CREATE TABLE memberships (
    tenant_id  uuid NOT NULL REFERENCES tenants (id),
    subject    text NOT NULL CHECK (length(subject) BETWEEN 1 AND 255),
    role       text NOT NULL CHECK (role IN ('owner', 'admin', 'developer', 'viewer')),
    email      text CHECK (length(email) BETWEEN 3 AND 320),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, subject)
);

CREATE TABLE api_keys (
    tenant_id    uuid NOT NULL REFERENCES tenants (id),
    id           uuid NOT NULL,
    key_id       text NOT NULL CHECK (key_id ~ '^[0-9A-Za-z]{12}$'),
    name         text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    scopes       text[] NOT NULL CHECK (cardinality(scopes) > 0 AND scopes <@ ARRAY['runs:read', 'runs:write',
                     'workflows:read', 'workflows:write', 'keys:manage', 'members:manage', 'webhooks:manage',
                     'billing:read', 'worker', 'admin']),
    secret_hash  bytea NOT NULL CHECK (length(secret_hash) = 32),
    created_by   text NOT NULL CHECK (length(created_by) BETWEEN 1 AND 255),
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz CHECK (expires_at > created_at),
    revoked_at   timestamptz,
    last_used_at timestamptz,
    PRIMARY KEY (tenant_id, id)
);
-- Global by nature: a presented key carries its key id, not its tenant.
-- Only composer_api_key_lookup and composer_api_key_touch use it.
CREATE UNIQUE INDEX api_keys_key_id_lookup ON api_keys (key_id);
CREATE INDEX api_keys_by_created ON api_keys (tenant_id, created_at);

ALTER TABLE memberships ENABLE ROW LEVEL SECURITY;
ALTER TABLE memberships FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON memberships
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid)
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);

ALTER TABLE api_keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE api_keys FORCE ROW LEVEL SECURITY;
-- The second branch is the key lookup: only code running as the owner
-- (composer_api_key_lookup) sees a row outside the tenant scope, and only
-- the one whose key id it is looking up; it names the owner role, so under
-- any other owner the lookup fails closed. Writes stay tenant-scoped.
CREATE POLICY tenant_isolation ON api_keys
    USING (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid
           OR (current_user = 'composer_owner'
               AND key_id = NULLIF(current_setting('composer.api_key_lookup', true), '')))
    WITH CHECK (tenant_id = NULLIF(current_setting('app.tenant_id', true), '')::uuid);

-- composer_bump_membership_version runs as the owner because composer_app
-- may not update tenants. It fails when no tenant row was bumped (a write
-- outside the row's tenant scope), so no membership change can skip the
-- invalidation.
-- +goose StatementBegin
CREATE FUNCTION composer_bump_membership_version() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    t uuid := CASE WHEN TG_OP = 'DELETE' THEN OLD.tenant_id ELSE NEW.tenant_id END;
BEGIN
    UPDATE tenants SET membership_version = membership_version + 1 WHERE id = t;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'membership change of tenant % outside its tenant scope', t
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER memberships_bump_version AFTER INSERT OR DELETE ON memberships
    FOR EACH ROW EXECUTE FUNCTION composer_bump_membership_version();
CREATE TRIGGER memberships_bump_version_on_update AFTER UPDATE ON memberships
    FOR EACH ROW WHEN (OLD.role IS DISTINCT FROM NEW.role OR OLD.subject IS DISTINCT FROM NEW.subject)
    EXECUTE FUNCTION composer_bump_membership_version();

-- composer_api_key_lookup returns the key with the given key id, whatever
-- its tenant, for the caller to check the secret hash in constant time.
-- The lookup setting is restored before returning (a function SET clause
-- would need a superuser for a custom setting); an error aborts the
-- transaction or subtransaction, which restores it as well.
-- +goose StatementBegin
CREATE FUNCTION composer_api_key_lookup(key_id text)
RETURNS TABLE (tenant_id uuid, id uuid, secret_hash bytea, scopes text[],
               expires_at timestamptz, revoked_at timestamptz, last_used_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    prev text := coalesce(current_setting('composer.api_key_lookup', true), '');
BEGIN
    PERFORM set_config('composer.api_key_lookup', composer_api_key_lookup.key_id, true);
    RETURN QUERY
        SELECT k.tenant_id, k.id, k.secret_hash, k.scopes, k.expires_at, k.revoked_at, k.last_used_at
          FROM api_keys k
         WHERE k.key_id = composer_api_key_lookup.key_id;
    PERFORM set_config('composer.api_key_lookup', prev, true);
END
$$;
-- +goose StatementEnd

-- composer_api_key_touch records a use of a key, at most once a minute so
-- that authentication does not write on every request. It runs scoped to
-- the key's tenant, like any tenant write, and restores the caller's scope.
-- +goose StatementBegin
CREATE FUNCTION composer_api_key_touch(tenant_id uuid, key_id text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    prev    text := coalesce(current_setting('app.tenant_id', true), '');
    touched boolean;
BEGIN
    PERFORM set_config('app.tenant_id', composer_api_key_touch.tenant_id::text, true);
    UPDATE api_keys k SET last_used_at = now()
     WHERE k.tenant_id = composer_api_key_touch.tenant_id
       AND k.key_id = composer_api_key_touch.key_id
       AND k.revoked_at IS NULL
       AND (k.last_used_at IS NULL OR k.last_used_at < now() - interval '1 minute');
    touched := FOUND;
    PERFORM set_config('app.tenant_id', prev, true);
    RETURN touched;
END
$$;
-- +goose StatementEnd

-- Privileges. The app role never reads secret hashes directly and changes a
-- key only to revoke it; lookups and use stamps go through the functions.
GRANT SELECT, INSERT, UPDATE, DELETE ON memberships TO composer_app;
GRANT SELECT (tenant_id, id, key_id, name, scopes, created_by, created_at, expires_at, revoked_at, last_used_at),
      INSERT (tenant_id, id, key_id, name, scopes, secret_hash, created_by, expires_at),
      UPDATE (revoked_at)
   ON api_keys TO composer_app;
REVOKE EXECUTE ON FUNCTION composer_api_key_lookup(text), composer_api_key_touch(uuid, text),
    composer_bump_membership_version() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION composer_api_key_lookup(text), composer_api_key_touch(uuid, text) TO composer_app;

-- +goose Down
DROP FUNCTION composer_api_key_touch(uuid, text);
DROP FUNCTION composer_api_key_lookup(text);
DROP TABLE api_keys, memberships;
DROP FUNCTION composer_bump_membership_version();
ALTER TABLE tenants DROP COLUMN membership_version;
