-- Baseline: checks the three roles exist with the right attributes, locks
-- down the public schema and adds the helper functions every later
-- migration uses.
--
-- The roles are cluster objects and BYPASSRLS can only be granted by a
-- superuser, so they are created by the operator (scripts/services.sh for
-- local machines, docker/initdb for compose), not here.

-- +goose Up
-- +goose StatementBegin
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT * FROM (VALUES ('composer_app', false), ('composer_system', true)) AS v(name, bypass) LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r.name) THEN
            RAISE EXCEPTION 'role % does not exist: run scripts/services.sh (or create it) before migrating', r.name;
        END IF;
        IF (SELECT rolbypassrls OR rolsuper FROM pg_roles WHERE rolname = r.name) IS DISTINCT FROM r.bypass THEN
            RAISE EXCEPTION 'role % must have BYPASSRLS=% and not be a superuser', r.name, r.bypass;
        END IF;
    END LOOP;
    IF (SELECT rolbypassrls OR rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        RAISE WARNING 'migrating as %, which bypasses row-level security; composer_owner is expected', current_user;
    END IF;
END
$$;
-- +goose StatementEnd

REVOKE ALL ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO composer_app, composer_system;

-- composer_uuidv7 returns a time-ordered UUID (RFC 9562 version 7) for rows
-- the database creates itself; application code makes its own in Go.
CREATE FUNCTION composer_uuidv7(ts timestamptz DEFAULT clock_timestamp()) RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT encode(set_bit(set_bit(
        overlay(uuid_send(gen_random_uuid())
                PLACING substring(int8send(floor(extract(epoch FROM ts) * 1000)::bigint) FROM 3)
                FROM 1 FOR 6),
        52, 1), 53, 1), 'hex')::uuid
$$;

-- composer_uuid_floor returns the smallest UUIDv7 of the millisecond ts: the
-- partition bounds of tables partitioned by a UUIDv7 column, and the id range
-- that stands for a creation-time range.
CREATE FUNCTION composer_uuid_floor(ts timestamptz) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT encode(substring(int8send(floor(extract(epoch FROM ts) * 1000)::bigint) FROM 3)
                  || '\x00000000000000000000'::bytea, 'hex')::uuid
$$;

GRANT EXECUTE ON FUNCTION composer_uuidv7(timestamptz), composer_uuid_floor(timestamptz) TO composer_app, composer_system;

-- +goose Down
DROP FUNCTION composer_uuid_floor(timestamptz);
DROP FUNCTION composer_uuidv7(timestamptz);
