-- Provisioning a tenant (`composer tenants create`) creates the tenant and
-- its first owner API key in one transaction as the system role, so a
-- failure leaves neither. The key insert returns its creation time.

-- +goose Up
GRANT INSERT (tenant_id, id, key_id, name, scopes, secret_hash, created_by, expires_at),
      SELECT (tenant_id, id, key_id, name, scopes, created_by, created_at, expires_at, revoked_at, last_used_at)
   ON api_keys TO composer_system;

-- +goose Down
REVOKE INSERT, SELECT ON api_keys FROM composer_system;
