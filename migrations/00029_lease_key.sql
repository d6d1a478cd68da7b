-- The API key a tenant's own worker took a lease with (engine.Holder.Key;
-- NULL for the platform's workers). A worker id is a string the client
-- names: renewals, reports, repeated polls and releases by a tenant's key
-- are fenced on the key recorded here as well as on lease_owner, so
-- another key of the tenant naming the same worker id holds nothing of
-- the lease. Written with each lease; only read while the lease runs.
-- Nullable without a default: the previous release, which never writes
-- it, keeps working on this schema (rolling upgrade, rollback).

-- +goose Up
ALTER TABLE task_instances ADD COLUMN lease_key_id text CHECK (length(lease_key_id) <= 64);

-- +goose Down
ALTER TABLE task_instances DROP COLUMN lease_key_id;
