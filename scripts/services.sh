#!/usr/bin/env bash
# services.sh prepares the local services Composer needs: PostgreSQL 15+ and
# Redis 7. It installs them with apt-get when absent, starts them when down,
# and creates the roles and the development database. Safe to run any number
# of times; every step checks before it acts.
#
# Environment (all optional):
#   COMPOSER_PG_HOST / COMPOSER_PG_PORT      default 127.0.0.1 / 5432
#   COMPOSER_REDIS_PORT                      default 6379
#   COMPOSER_REDIS_CLUSTER_PORTS             ports of the local test Redis Cluster, three masters
#                                            then their three replicas (default 7101 ... 7106);
#                                            "none" starts no cluster
#   COMPOSER_REDIS_CLUSTER_DIR               its working directory (default /tmp/composer-redis-cluster)
#   COMPOSER_REDIS_SENTINEL_PORTS            a local Sentinel setup: master, replica, Sentinel
#                                            (default 7111 7112 7113, master name "composer"):
#                                            COMPOSER_REDIS_URL=redis+sentinel://127.0.0.1:7113?master_name=composer;
#                                            "none" starts none
#   COMPOSER_DB_NAME                         default composer
#   COMPOSER_ROLE_PASSWORD                   development password of the three roles (default composer)
set -euo pipefail

PG_HOST=${COMPOSER_PG_HOST:-127.0.0.1}
PG_PORT=${COMPOSER_PG_PORT:-5432}
REDIS_PORT=${COMPOSER_REDIS_PORT:-6379}
CLUSTER_PORTS=${COMPOSER_REDIS_CLUSTER_PORTS:-7101 7102 7103 7104 7105 7106}
CLUSTER_DIR=${COMPOSER_REDIS_CLUSTER_DIR:-/tmp/composer-redis-cluster}
SENTINEL_PORTS=${COMPOSER_REDIS_SENTINEL_PORTS:-7111 7112 7113}
SENTINEL_DIR=${COMPOSER_REDIS_SENTINEL_DIR:-/tmp/composer-redis-sentinel}
DB_NAME=${COMPOSER_DB_NAME:-composer}
ROLE_PASSWORD=${COMPOSER_ROLE_PASSWORD:-composer}

log() { printf 'services: %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else log "need root to run: $*"; return 1
  fi
}

apt_install() {
  log "installing $*"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# --- PostgreSQL -------------------------------------------------------------

pg_ready() { pg_isready -q -h "$PG_HOST" -p "$PG_PORT" 2>/dev/null; }

ensure_postgres() {
  if ! command -v pg_isready >/dev/null 2>&1 || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
    if pg_ready 2>/dev/null; then return 0; fi
    apt_install postgresql postgresql-client
  fi
  if pg_ready; then return 0; fi
  if command -v pg_lsclusters >/dev/null 2>&1; then
    if [ -z "$(pg_lsclusters -h 2>/dev/null)" ]; then
      ver=$(ls /usr/lib/postgresql | sort -n | tail -1)
      log "creating PostgreSQL $ver cluster"
      as_root pg_createcluster "$ver" main --port "$PG_PORT" >/dev/null
    fi
    pg_lsclusters -h | while read -r ver name port status _; do
      if [ "$port" = "$PG_PORT" ] && [ "$status" != "online" ]; then
        log "starting PostgreSQL $ver/$name"
        as_root pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" start
      fi
    done
  fi
  for _ in $(seq 1 60); do pg_ready && return 0; sleep 0.5; done
  log "PostgreSQL did not become ready on $PG_HOST:$PG_PORT"; return 1
}

# psql_super runs SQL as a superuser: over TCP as postgres when the server
# trusts it, else through the local socket as the postgres OS user.
psql_super() {
  if psql -X -q -h "$PG_HOST" -p "$PG_PORT" -U postgres -d postgres -w -c 'select 1' >/dev/null 2>&1; then
    psql -X -q -v ON_ERROR_STOP=1 -h "$PG_HOST" -p "$PG_PORT" -U postgres -d postgres -w "$@"
  else
    as_root runuser -u postgres -- psql -X -q -v ON_ERROR_STOP=1 -p "$PG_PORT" -d postgres "$@"
  fi
}

# The test suite runs many packages' tests at once, each test with its own
# server pools: 100 connections (the default) run out. A cluster this script
# manages gets PG_MAX_CONNECTIONS (default 400), with one restart, once.
PG_MAX_CONNECTIONS=${COMPOSER_PG_MAX_CONNECTIONS:-400}
ensure_max_connections() {
  local have
  have=$(psql_super -At -c 'show max_connections')
  [ "$have" -ge "$PG_MAX_CONNECTIONS" ] && return 0
  command -v pg_lsclusters >/dev/null 2>&1 || { log "max_connections is $have; raise it to $PG_MAX_CONNECTIONS for the test suite"; return 0; }
  log "raising PostgreSQL max_connections from $have to $PG_MAX_CONNECTIONS (restart)"
  psql_super -c "ALTER SYSTEM SET max_connections = $PG_MAX_CONNECTIONS" >/dev/null
  pg_lsclusters -h | while read -r ver name port status _; do
    if [ "$port" = "$PG_PORT" ]; then as_root pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" restart; fi
  done
  for _ in $(seq 1 60); do pg_ready && return 0; sleep 0.5; done
  log "PostgreSQL did not come back after the restart"; return 1
}

ensure_roles_and_db() {
  local major
  major=$(psql_super -At -c 'show server_version_num')
  if [ "$major" -lt 150000 ]; then log "PostgreSQL 15 or newer is required (found $major)"; return 1; fi
  # composer_owner owns every object and runs migrations (CREATEDB lets the
  # test harness clone databases); composer_app is the RLS-bound request
  # role; composer_system bypasses RLS for the cross-tenant loops only.
  psql_super -v pw="$ROLE_PASSWORD" <<'SQL'
SELECT format('CREATE ROLE %I LOGIN', r) FROM unnest(ARRAY['composer_owner','composer_app','composer_system']) r
 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) \gexec
ALTER ROLE composer_owner LOGIN CREATEDB NOSUPERUSER NOBYPASSRLS PASSWORD :'pw';
ALTER ROLE composer_app LOGIN NOCREATEDB NOSUPERUSER NOBYPASSRLS PASSWORD :'pw';
ALTER ROLE composer_system LOGIN NOCREATEDB NOSUPERUSER BYPASSRLS PASSWORD :'pw';
SQL
  psql_super -v db="$DB_NAME" <<'SQL'
SELECT format('CREATE DATABASE %I OWNER composer_owner', :'db')
 WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = :'db') \gexec
SQL
}

# --- Redis --------------------------------------------------------------------

redis_ready() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG; }

ensure_redis() {
  if command -v redis-cli >/dev/null 2>&1 && redis_ready; then return 0; fi
  if ! command -v redis-server >/dev/null 2>&1; then apt_install redis-server; fi
  if redis_ready; then return 0; fi
  log "starting Redis on 127.0.0.1:$REDIS_PORT"
  redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly no \
    --dir /tmp --logfile /tmp/composer-redis.log
  for _ in $(seq 1 40); do redis_ready && return 0; sleep 0.25; done
  log "Redis did not become ready"; return 1
}

# --- Redis Cluster (for `make test-cluster`) ------------------------------------
# Three masters and a replica each on spare ports, no persistence, a short
# node timeout so a dead master's replica takes over within seconds. A
# cluster already formed and healthy is left alone; nodes that are down are
# started (they rejoin from their nodes.conf); a cluster that does not
# become healthy is reset and created again (it only ever holds test data).

cli() { redis-cli -h 127.0.0.1 -p "$1" "${@:2}"; }

cluster_field() { cli "$1" cluster info 2>/dev/null | tr -d '\r' | sed -n "s/^$2://p"; }

cluster_ok() {
  local p
  for p in $CLUSTER_PORTS; do
    [ "$(cluster_field "$p" cluster_state)" = ok ] || return 1
    [ "$(cluster_field "$p" cluster_known_nodes)" = "$(wc -w <<<"$CLUSTER_PORTS")" ] || return 1
  done
}

wait_cluster_ok() {
  local tries=$1
  for _ in $(seq 1 "$tries"); do cluster_ok && return 0; sleep 0.25; done
  return 1
}

ensure_redis_cluster() {
  [ "$CLUSTER_PORTS" = none ] && return 0
  local p addrs=() fresh=1
  mkdir -p "$CLUSTER_DIR"
  for p in $CLUSTER_PORTS; do
    addrs+=("127.0.0.1:$p")
    if ! cli "$p" ping 2>/dev/null | grep -q PONG; then
      mkdir -p "$CLUSTER_DIR/$p"
      redis-server --daemonize yes --bind 127.0.0.1 --port "$p" --save "" --appendonly no \
        --cluster-enabled yes --cluster-config-file "$CLUSTER_DIR/$p/nodes.conf" --cluster-node-timeout 2000 \
        --dir "$CLUSTER_DIR/$p" --logfile "$CLUSTER_DIR/$p/redis.log" --pidfile "$CLUSTER_DIR/$p/redis.pid"
    fi
  done
  for p in $CLUSTER_PORTS; do
    for _ in $(seq 1 40); do cli "$p" ping 2>/dev/null | grep -q PONG && break; sleep 0.25; done
    if [ "$(cluster_field "$p" cluster_known_nodes)" != 1 ]; then fresh=0; fi
  done
  if [ "$fresh" = 0 ]; then
    # Formed before: healthy at once, or after its nodes meet again.
    wait_cluster_ok 40 && return 0
    log "Redis Cluster on ${addrs[*]} is not healthy; resetting it"
    for p in $CLUSTER_PORTS; do cli "$p" flushall >/dev/null 2>&1 || true; cli "$p" cluster reset hard >/dev/null; done
  fi
  log "creating Redis Cluster on ${addrs[*]}"
  redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes >"$CLUSTER_DIR/create.log" 2>&1 ||
    { cat "$CLUSTER_DIR/create.log" >&2; return 1; }
  wait_cluster_ok 120 && return 0
  log "Redis Cluster did not become healthy"; return 1
}

# --- Redis Sentinel (for trying a Sentinel-watched master locally) -----------
# A master, its replica and one Sentinel (quorum 1) watching it as
# "composer", no persistence. A Sentinel that already answers for the master
# is left alone (after a failover the replica is the master: that is fine).

ensure_redis_sentinel() {
  [ "$SENTINEL_PORTS" = none ] && return 0
  local master replica sentinel
  read -r master replica sentinel <<<"$SENTINEL_PORTS"
  if cli "$sentinel" sentinel get-master-addr-by-name composer 2>/dev/null | grep -q 127.0.0.1; then return 0; fi
  mkdir -p "$SENTINEL_DIR"
  local p
  for p in "$master" "$replica"; do
    if ! cli "$p" ping 2>/dev/null | grep -q PONG; then
      redis-server --daemonize yes --bind 127.0.0.1 --port "$p" --save "" --appendonly no \
        --dir "$SENTINEL_DIR" --logfile "$SENTINEL_DIR/$p.log" --pidfile "$SENTINEL_DIR/$p.pid"
    fi
    for _ in $(seq 1 40); do cli "$p" ping 2>/dev/null | grep -q PONG && break; sleep 0.25; done
  done
  cli "$replica" replicaof 127.0.0.1 "$master" >/dev/null
  if ! cli "$sentinel" ping 2>/dev/null | grep -q PONG; then
    # Sentinel rewrites its configuration file: it must be its own.
    cat >"$SENTINEL_DIR/sentinel.conf" <<CONF
port $sentinel
bind 127.0.0.1
daemonize yes
dir $SENTINEL_DIR
logfile $SENTINEL_DIR/sentinel.log
pidfile $SENTINEL_DIR/sentinel.pid
sentinel monitor composer 127.0.0.1 $master 1
sentinel down-after-milliseconds composer 1000
sentinel failover-timeout composer 5000
CONF
    redis-server "$SENTINEL_DIR/sentinel.conf" --sentinel
  fi
  for _ in $(seq 1 40); do
    cli "$sentinel" sentinel get-master-addr-by-name composer 2>/dev/null | grep -q 127.0.0.1 && return 0
    sleep 0.25
  done
  log "Redis Sentinel on 127.0.0.1:$sentinel did not come up"; return 1
}

# The race detector (`make test`) needs cgo, hence a C compiler.
ensure_toolchain() {
  if ! command -v gcc >/dev/null 2>&1; then apt_install gcc libc6-dev; fi
}

# The console's browser test (e2e) drives Debian's headless Chromium.
ensure_chromium() {
  if [ ! -x /usr/bin/chromium ]; then apt_install chromium; fi
}

ensure_toolchain
ensure_chromium
ensure_postgres
ensure_max_connections
ensure_roles_and_db
ensure_redis
ensure_redis_cluster
ensure_redis_sentinel
log "PostgreSQL on $PG_HOST:$PG_PORT (database $DB_NAME) and Redis on 127.0.0.1:$REDIS_PORT are ready"
[ "$CLUSTER_PORTS" = none ] || log "Redis Cluster on 127.0.0.1 ports $CLUSTER_PORTS is ready"
[ "$SENTINEL_PORTS" = none ] || log "Redis Sentinel (master \"composer\") on 127.0.0.1 ports $SENTINEL_PORTS is ready"
