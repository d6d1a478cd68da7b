-- Roles for docker compose (the postgres image runs this once, as superuser,
-- when the data volume is new). Mirrors scripts/services.sh.
CREATE ROLE composer_owner LOGIN CREATEDB PASSWORD 'composer';
CREATE ROLE composer_app LOGIN NOBYPASSRLS PASSWORD 'composer';
CREATE ROLE composer_system LOGIN BYPASSRLS PASSWORD 'composer';
CREATE DATABASE composer OWNER composer_owner;
