#!/bin/bash
# Roles for the production compose file (deploy/docker-compose.prod.yml):
# the postgres image runs this once, as superuser, when the data volume is
# new. The passwords come from the environment (deploy/composer.env).
set -euo pipefail
: "${COMPOSER_OWNER_PASSWORD:?set it in deploy/composer.env}"
: "${COMPOSER_APP_PASSWORD:?set it in deploy/composer.env}"
: "${COMPOSER_SYSTEM_PASSWORD:?set it in deploy/composer.env}"
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" \
  -v owner="$COMPOSER_OWNER_PASSWORD" -v app="$COMPOSER_APP_PASSWORD" -v system="$COMPOSER_SYSTEM_PASSWORD" <<'SQL'
CREATE ROLE composer_owner LOGIN CREATEDB PASSWORD :'owner';
CREATE ROLE composer_app LOGIN NOBYPASSRLS PASSWORD :'app';
CREATE ROLE composer_system LOGIN BYPASSRLS PASSWORD :'system';
CREATE DATABASE composer OWNER composer_owner;
SQL
