#!/usr/bin/env bash
# Local Apache Kafka (KRaft, from Maven Central jars) and MariaDB (from Debian),
# without Docker and without systemd.
#
#   ops/services.sh up      install what is missing, start what is not running, wait until ready
#   ops/services.sh down    stop what `up` started (by pid file), nothing else
#   ops/services.sh status  say what answers on the configured ports
#   ops/services.sh jars    fetch the Kafka jars only (the tests use its Java client even
#                           when a Kafka that is already running is reused)
#   ops/services.sh jaeger  build Jaeger's all-in-one program once (the tracing test runs it)
#   ops/services.sh helm    build Helm once (the chart's tests lint and render with it)
#   ops/services.sh k8s-checker  build the chart's manifest checker once per change of its
#                           sources (deploy/helm/checker), and print its path
#
# A service already listening on its port is reused as it is. State lives in
# .cache/ (ignored by git): the broker jars, its data and log, pid files.
#
# Kafka layouts (environment variables; the default is one PLAINTEXT node on 9092):
#   KAFKA_NODES=3    three combined KRaft nodes (broker+controller) on 127.0.0.1:
#                    PLAINTEXT 9092, 9094, 9096 and controllers 9093, 9095, 9097;
#                    internal topics at replication 3, min.insync.replicas=2,
#                    unclean leader election off
#   KAFKA_SECURE=1   every node also has a SASL_SSL listener (SCRAM-SHA-512, SCRAM-SHA-256,
#                    PLAIN; user `app`) on 9192 (+2 per node) and an mTLS listener
#                    (ssl.client.auth=required) on 9193 (+2 per node); certificates from a
#                    throwaway CA in .cache/kafka/certs (made if absent); the SCRAM user is
#                    created when the storage is formatted, with KAFKA_SASL_PASSWORD or a
#                    random password kept in the layout's folder. `up` writes the worker's
#                    settings for each listener to .cache/kafka/<layout>/{sasl,mtls}.env.
# Each layout other than the default keeps its nodes in .cache/kafka/<layout>/node-<n>/.
#
# MariaDB (environment variables; the default is the Debian server on MYSQL_URL's port, 3306):
#   MARIADB_REPLICA=1   also a GTID replica of it on 127.0.0.1:MARIADB_REPLICA_PORT (3307), in
#                       .cache/mariadb/replica/ (data, socket, pid file, error log), read-only,
#                       following the primary with MASTER_USE_GTID=slave_pos (seeded with a dump
#                       of the primary's databases). The primary needs a binary log: one this
#                       script starts with MARIADB_REPLICA=1 (or while a replica of its own is
#                       configured) gets log_bin, server_id=1, binlog_format=ROW,
#                       log_slave_updates; otherwise it starts as before (no binary log: nothing
#                       changes for anyone else), and a running primary without one is refused,
#                       never restarted. `down` stops the replica too.
#   MARIADB_SEMISYNC=1  (with MARIADB_REPLICA=1; the default) semi-synchronous replication, wait
#                       point AFTER_SYNC: a commit returns once the replica has it; 0: asynchronous.
#                       Set at every `up`, on both servers, without a restart.
#   MARIADB_HOME=<dir>  a primary of its own in <dir> (data/, mariadbd.sock, mariadbd.pid,
#                       error.log; initialised on first start) instead of the server's own data
#                       directory and socket: a second primary beside the shared one, on another
#                       MYSQL_URL port. SERVICES_CACHE moves .cache/ (pid files, the replica).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SERVICES_CACHE:-$ROOT/.cache}"
KAFKA_VERSION="${KAFKA_VERSION:-4.4.0}"
KAFKA_HOME="$CACHE/kafka/$KAFKA_VERSION"
KAFKA_NODES="${KAFKA_NODES:-1}"
KAFKA_SECURE="${KAFKA_SECURE:-0}"
case "$KAFKA_NODES" in 1|3) ;; *) printf '[services] ERROR: KAFKA_NODES must be 1 or 3\n' >&2; exit 2 ;; esac
case "$KAFKA_SECURE" in 0|1) ;; *) printf '[services] ERROR: KAFKA_SECURE must be 0 or 1\n' >&2; exit 2 ;; esac
if [ "$KAFKA_NODES" -gt 1 ]; then   # three JVMs on a small machine
  KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xms128m -Xmx384m}"
else
  KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xms256m -Xmx1g}"
fi
KAFKA_SASL_PORT="${KAFKA_SASL_PORT:-9192}"
KAFKA_MTLS_PORT="${KAFKA_MTLS_PORT:-9193}"
KAFKA_SASL_USERNAME="${KAFKA_SASL_USERNAME:-app}"
KAFKA_CERTS="$CACHE/kafka/certs"
# The layout's folder: the default layout keeps today's paths (.cache/kafka/data, ...).
KAFKA_LAYOUT=""
if [ "$KAFKA_NODES" -gt 1 ]; then KAFKA_LAYOUT="nodes$KAFKA_NODES"; fi
if [ "$KAFKA_SECURE" = 1 ]; then KAFKA_LAYOUT="${KAFKA_LAYOUT:+$KAFKA_LAYOUT-}secure"; fi
MARIADB_PID="$CACHE/mariadb/mariadb.pid"
# The error log must be in a folder the mysql user can write, or mariadbd runs
# and silently logs nothing; the project folder may not be reachable for it.
MARIADB_LOG_DIR="${MARIADB_LOG_DIR:-/var/log/mysql}"
MARIADB_LOG="$MARIADB_LOG_DIR/order-event-processor.err"
MARIADB_HOME="${MARIADB_HOME:-}"
MARIADB_REPLICA="${MARIADB_REPLICA:-0}"
MARIADB_SEMISYNC="${MARIADB_SEMISYNC:-1}"
MARIADB_REPLICA_PORT="${MARIADB_REPLICA_PORT:-3307}"
MARIADB_REPLICA_HOME="$CACHE/mariadb/replica"
MARIADB_REPLICA_PID="$CACHE/mariadb/replica.pid"
MARIADB_REPL_USER="${MARIADB_REPL_USER:-repl}"
MARIADB_REPL_PASSWORD="${MARIADB_REPL_PASSWORD:-repl}"
case "$MARIADB_REPLICA" in 0|1) ;; *) printf '[services] ERROR: MARIADB_REPLICA must be 0 or 1\n' >&2; exit 2 ;; esac
case "$MARIADB_SEMISYNC" in 0|1) ;; *) printf '[services] ERROR: MARIADB_SEMISYNC must be 0 or 1\n' >&2; exit 2 ;; esac
# root's way in to the primary: the client's default socket (the Debian server's), or MARIADB_HOME's
PRIMARY_SOCKET=()
if [ -n "$MARIADB_HOME" ]; then
  MARIADB_LOG="$MARIADB_HOME/error.log"
  PRIMARY_SOCKET=(--socket="$MARIADB_HOME/mariadbd.sock")
fi
REPLICA_SOCKET=(--socket="$MARIADB_REPLICA_HOME/mariadbd.sock")
READY_TIMEOUT="${READY_TIMEOUT:-90}"

KAFKA_BROKER="${KAFKA_BROKER:-kafka://127.0.0.1:9092}"
MYSQL_URL="${MYSQL_URL:-mysql+aiomysql://idem:idem@127.0.0.1:3306/idem}"

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

log() { printf '[services] %s\n' "$*" >&2; }
die() { printf '[services] ERROR: %s\n' "$*" >&2; exit 1; }

# host port of the first broker in KAFKA_BROKER; a KAFKA_BROKER of a secure listener
# (KAFKA_SECURITY_PROTOCOL other than PLAINTEXT) names no PLAINTEXT port: 9092 then
read -r KAFKA_HOST KAFKA_PORT < <(python3 - "$KAFKA_BROKER" "${KAFKA_SECURITY_PROTOCOL:-PLAINTEXT}" <<'EOF'
import sys
first = sys.argv[1].split(";")[0].split(",")[0]
hostport = first.split("://", 1)[-1]
host, _, port = hostport.rpartition(":")
if sys.argv[2].upper() != "PLAINTEXT":
    port = "9092"
print(host or "127.0.0.1", port or "9092")
EOF
)
KAFKA_CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-$((KAFKA_PORT + 1))}"

# host port user password database of MYSQL_URL
read -r DB_HOST DB_PORT DB_USER DB_PASS DB_NAME < <(python3 - "$MYSQL_URL" <<'EOF'
import sys
from urllib.parse import unquote, urlsplit
u = urlsplit(sys.argv[1])
print(u.hostname or "127.0.0.1", u.port or 3306, unquote(u.username or "idem"),
      unquote(u.password or ""), (u.path or "/idem").lstrip("/") or "idem")
EOF
)

is_local() { case "$1" in 127.0.0.1|localhost|::1) return 0 ;; *) return 1 ;; esac; }

port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

wait_until() {  # wait_until <what> <log file> <command...>
  local what="$1" logf="$2"; shift 2
  local deadline=$((SECONDS + READY_TIMEOUT))
  until "$@"; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      die "$what was not ready after ${READY_TIMEOUT}s; read $logf"
    fi
    sleep 0.3
  done
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# ---------------------------------------------------------------- MariaDB --

mariadb_installed() { [ -x /usr/sbin/mariadbd ] && command -v mariadb >/dev/null; }

mariadb_install() {
  log "installing mariadb-server from Debian (apt-get)"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server mariadb-client >/dev/null
}

primary_sql() { $SUDO mariadb --protocol=socket "${PRIMARY_SOCKET[@]}" "$@"; }
replica_sql() { $SUDO mariadb --protocol=socket "${REPLICA_SOCKET[@]}" "$@"; }
mariadb_ping() { $SUDO mariadb-admin --protocol=socket "${PRIMARY_SOCKET[@]}" ping >/dev/null 2>&1; }
replica_ping() { $SUDO mariadb-admin --protocol=socket "${REPLICA_SOCKET[@]}" ping >/dev/null 2>&1; }

as_mysql() { if [ "$(id -u)" -eq 0 ]; then runuser -u mysql -- "$@"; else sudo -u mysql "$@"; fi; }

# A folder of mariadbd's own (data/ and its socket, pid file and error log): the mysql user must
# reach it (a project cloned into a 0700 folder is not reachable), and a unix socket's path is at
# most 107 bytes.
mariadb_home() {  # mariadb_home <dir>
  $SUDO mkdir -p "$1/data"
  $SUDO chown mysql:mysql "$1" "$1/data"
  as_mysql test -w "$1/data" || die "the mysql user cannot write $1 (a parent folder closed to it?); move it (SERVICES_CACHE, MARIADB_HOME)"
  [ "${#1}" -le 90 ] || die "$1 is too long a path for mariadbd's socket in it; move it (SERVICES_CACHE, MARIADB_HOME)"
  if [ ! -d "$1/data/mysql" ]; then
    log "initialising a MariaDB data directory in $1/data"
    $SUDO mariadb-install-db --user=mysql --datadir="$1/data" --skip-test-db >"$1/install.log" 2>&1 \
      || die "mariadb-install-db failed; read $1/install.log"
  fi
}

# What a replica needs of the primary (ROW: the workers' READ COMMITTED needs row-based logging).
BINLOG_OPTIONS=(--server-id=1 --log-bin=mariadb-bin --binlog-format=ROW --log-slave-updates)

mariadb_up() {
  if ! is_local "$DB_HOST"; then
    log "MYSQL_URL points at $DB_HOST:$DB_PORT: not managing it, waiting for it to answer"
    wait_until "MariaDB at $DB_HOST:$DB_PORT" "that server's own log" port_open "$DB_HOST" "$DB_PORT"
    return
  fi
  if port_open 127.0.0.1 "$DB_PORT"; then
    log "MariaDB already listening on 127.0.0.1:$DB_PORT: reusing it"
  else
    mariadb_installed || mariadb_install
    mkdir -p "$CACHE/mariadb"
    local own=() replication=()
    if [ -n "$MARIADB_HOME" ]; then
      mariadb_home "$MARIADB_HOME"
      own=(--datadir="$MARIADB_HOME/data" "${PRIMARY_SOCKET[@]}" --pid-file="$MARIADB_HOME/mariadbd.pid")
    else
      $SUDO mkdir -p /run/mysqld "$MARIADB_LOG_DIR"
      $SUDO chown mysql:mysql /run/mysqld
      $SUDO chown mysql "$MARIADB_LOG_DIR"
    fi
    # With a replica of this script's configured, even when not asked for: writes it never sees
    # would part the two for good.
    if [ "$MARIADB_REPLICA" = 1 ] || [ -f "$MARIADB_REPLICA_HOME/data/master.info" ]; then
      replication=("${BINLOG_OPTIONS[@]}")
    fi
    log "starting MariaDB on 127.0.0.1:$DB_PORT$([ "${#replication[@]}" -eq 0 ] || echo ' with a binary log') (error log: $MARIADB_LOG)"
    $SUDO start-stop-daemon --start --background --make-pidfile --pidfile "$MARIADB_PID" \
      --exec /usr/sbin/mariadbd -- --user=mysql --bind-address=127.0.0.1 --port="$DB_PORT" \
      --log-error="$MARIADB_LOG" "${own[@]}" "${replication[@]}"
    wait_until "MariaDB" "$MARIADB_LOG" mariadb_ping
  fi
  mariadb_ping || die "MariaDB answers on port $DB_PORT but not on its local socket as root; create database '$DB_NAME' and user '$DB_USER' yourself"
  app_grants | primary_sql
  log "MariaDB ready: database '$DB_NAME', user '$DB_USER'"
}

# Tests create scratch databases named ${DB_NAME}_*, hence the wildcard grant.
app_grants() {
  cat <<SQL
CREATE DATABASE IF NOT EXISTS \`$DB_NAME\` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
CREATE USER IF NOT EXISTS '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL PRIVILEGES ON \`${DB_NAME}\`.* TO '$DB_USER'@'127.0.0.1', '$DB_USER'@'localhost';
GRANT ALL PRIVILEGES ON \`${DB_NAME}\\_%\`.* TO '$DB_USER'@'127.0.0.1', '$DB_USER'@'localhost';
SQL
}

mariadb_down() {
  replica_down
  if pid_alive "$MARIADB_PID"; then
    log "stopping MariaDB (pid $(cat "$MARIADB_PID"))"
    $SUDO start-stop-daemon --stop --pidfile "$MARIADB_PID" --retry TERM/30/KILL/5 >/dev/null || true
    $SUDO rm -f "$MARIADB_PID"
  else
    log "MariaDB: nothing started by this script is running"
  fi
}

# ---------------------------------------------------------- MariaDB replica --

replica_up() {
  is_local "$DB_HOST" || die "MARIADB_REPLICA=1 needs the primary on this machine; MYSQL_URL points at $DB_HOST"
  [ "$(primary_sql -N -e 'SELECT @@log_bin')" = 1 ] || die "the primary on 127.0.0.1:$DB_PORT has no binary log, which a replica follows; it was started without MARIADB_REPLICA=1 (ops/services.sh down, then MARIADB_REPLICA=1 ops/services.sh up; or give it log_bin, server_id=1, binlog_format=ROW, log_slave_updates yourself)"
  primary_sql <<SQL
CREATE USER IF NOT EXISTS '$MARIADB_REPL_USER'@'127.0.0.1' IDENTIFIED BY '$MARIADB_REPL_PASSWORD';
GRANT REPLICATION SLAVE ON *.* TO '$MARIADB_REPL_USER'@'127.0.0.1';
SQL
  if port_open 127.0.0.1 "$MARIADB_REPLICA_PORT"; then
    pid_alive "$MARIADB_REPLICA_PID" || die "something else listens on 127.0.0.1:$MARIADB_REPLICA_PORT; choose another MARIADB_REPLICA_PORT"
    log "MariaDB replica already listening on 127.0.0.1:$MARIADB_REPLICA_PORT: reusing it"
  else
    mariadb_home "$MARIADB_REPLICA_HOME"
    local seeded=1
    [ -f "$MARIADB_REPLICA_HOME/data/master.info" ] || seeded=0
    log "starting the MariaDB replica on 127.0.0.1:$MARIADB_REPLICA_PORT (error log: $MARIADB_REPLICA_HOME/error.log)"
    # Its own paths override any of the server's configuration; read-only for all but root.
    $SUDO start-stop-daemon --start --background --make-pidfile --pidfile "$MARIADB_REPLICA_PID" \
      --exec /usr/sbin/mariadbd -- --user=mysql --bind-address=127.0.0.1 --port="$MARIADB_REPLICA_PORT" \
      --datadir="$MARIADB_REPLICA_HOME/data" "${REPLICA_SOCKET[@]}" --pid-file="$MARIADB_REPLICA_HOME/mariadbd.pid" \
      --log-error="$MARIADB_REPLICA_HOME/error.log" --server-id=2 --log-bin=mariadb-bin --relay-log=relay-bin \
      --binlog-format=ROW --log-slave-updates --read-only=ON
    wait_until "MariaDB replica" "$MARIADB_REPLICA_HOME/error.log" replica_ping
    if [ "$seeded" = 0 ]; then replica_seed; fi
  fi
  semisync
  wait_until "the replica's IO and SQL threads" "$MARIADB_REPLICA_HOME/error.log" replica_running
  log "MariaDB replica ready: 127.0.0.1:$MARIADB_REPLICA_PORT follows 127.0.0.1:$DB_PORT ($(semisync_word))"
}

# A fresh replica: the primary's databases as of one GTID position, then replication from there.
replica_seed() {
  local dbs dump="$MARIADB_REPLICA_HOME/seed.sql" gtid
  dbs="$(primary_sql -N -e "SELECT schema_name FROM information_schema.schemata WHERE schema_name NOT IN
        ('mysql', 'information_schema', 'performance_schema', 'sys')" | tr '\n' ' ')"
  # (mariadb_up made $DB_NAME: there is always one.) --master-data takes a global read lock
  # for a moment, to read the position the dump matches.
  $SUDO mariadb-dump --protocol=socket "${PRIMARY_SOCKET[@]}" --single-transaction --gtid --master-data=2 \
    --routines --events --triggers --databases $dbs >"$dump" 2>"$dump.err" \
    || die "dumping the primary's databases failed; read $dump.err"
  gtid="$(sed -n "s/^-- SET GLOBAL gtid_slave_pos='\(.*\)';$/\1/p" "$dump" | head -n 1)"
  log "seeding the replica with the primary's databases ($dbs) up to GTID ${gtid:-(none)}"
  # Not in the replica's own binary log: its GTID history is the primary's.
  { echo "SET SESSION sql_log_bin = 0;"; cat "$dump"; app_grants; } | replica_sql \
    || die "loading the primary's databases into the replica failed"
  rm -f "$dump" "$dump.err"
  replica_sql <<SQL
SET GLOBAL gtid_slave_pos = '$gtid';
CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=$DB_PORT, MASTER_USER='$MARIADB_REPL_USER',
  MASTER_PASSWORD='$MARIADB_REPL_PASSWORD', MASTER_CONNECT_RETRY=5, MASTER_USE_GTID=slave_pos;
START SLAVE;
SQL
}

# MARIADB_SEMISYNC on both sides, without a restart: on, the replica first (its IO thread
# reconnects to announce it), then the primary; off, the other way round.
semisync() {
  local on=OFF; [ "$MARIADB_SEMISYNC" = 1 ] && on=ON
  local replica="SET GLOBAL rpl_semi_sync_slave_enabled = $on; STOP SLAVE IO_THREAD; START SLAVE IO_THREAD;"
  local primary="SET GLOBAL rpl_semi_sync_master_wait_point = AFTER_SYNC; SET GLOBAL rpl_semi_sync_master_enabled = $on;"
  if [ "$on" = ON ]; then replica_sql -e "$replica"; primary_sql -e "$primary"
  else primary_sql -e "$primary"; replica_sql -e "$replica"; fi
}

semisync_word() {
  if [ "$(primary_sql -N -e 'SELECT @@rpl_semi_sync_master_enabled')" = 1 ]; then echo "semi-sync AFTER_SYNC"; else echo "async"; fi
}

slave_field() {  # slave_field <name>: one field of SHOW SLAVE STATUS on the replica
  replica_sql -e 'SHOW SLAVE STATUS\G' 2>/dev/null | sed -n "s/^ *$1: //p"
}

replica_running() { [ "$(slave_field Slave_IO_Running)" = Yes ] && [ "$(slave_field Slave_SQL_Running)" = Yes ]; }

replica_down() {
  if pid_alive "$MARIADB_REPLICA_PID"; then
    # A semi-sync primary left alone would hold its next commit for rpl_semi_sync_master_timeout.
    if mariadb_ping; then primary_sql -e "SET GLOBAL rpl_semi_sync_master_enabled = OFF" || true; fi
    log "stopping the MariaDB replica (pid $(cat "$MARIADB_REPLICA_PID"))"
    $SUDO start-stop-daemon --stop --pidfile "$MARIADB_REPLICA_PID" --retry TERM/30/KILL/5 >/dev/null || true
    $SUDO rm -f "$MARIADB_REPLICA_PID"
  fi
}

replica_status() {
  if ! port_open 127.0.0.1 "$MARIADB_REPLICA_PORT"; then
    if [ -d "$MARIADB_REPLICA_HOME/data" ]; then echo "replica: down (127.0.0.1:$MARIADB_REPLICA_PORT)"; fi
    return 0
  fi
  if ! replica_ping; then echo "replica: up (127.0.0.1:$MARIADB_REPLICA_PORT), not one of this script's"; return 0; fi
  local io sql
  io="$(slave_field Slave_IO_Running)"; sql="$(slave_field Slave_SQL_Running)"
  if [ -z "$io" ]; then
    echo "replica: up (127.0.0.1:$MARIADB_REPLICA_PORT), replicating from nobody (promoted?), read_only=$(replica_sql -N -e 'SELECT @@read_only')"
    return 0
  fi
  echo "replica: up (127.0.0.1:$MARIADB_REPLICA_PORT) of $(slave_field Master_Host):$(slave_field Master_Port), IO $io, SQL $sql," \
       "$(slave_field Seconds_Behind_Master) s behind, GTID received $(slave_field Gtid_IO_Pos)," \
       "applied $(replica_sql -N -e 'SELECT @@gtid_slave_pos'), semi-sync $(replica_sql -N -e "SHOW STATUS LIKE 'Rpl_semi_sync_slave_status'" | cut -f2)"
  local error; error="$(slave_field Last_Error)$(slave_field Last_IO_Error)"
  if [ -n "$error" ]; then echo "replica: last error: $error"; fi
}

# ------------------------------------------------------------------ Kafka --

kafka_jars() {
  if [ -f "$KAFKA_HOME/.complete" ]; then return; fi
  command -v mvn >/dev/null || die "Maven (mvn) is needed once to fetch the Kafka $KAFKA_VERSION jars"
  command -v java >/dev/null || die "Java 17+ is needed to run Kafka"
  log "fetching Kafka $KAFKA_VERSION jars from Maven Central (once; cached in $KAFKA_HOME)"
  rm -rf "$KAFKA_HOME" && mkdir -p "$KAFKA_HOME/libs"
  mvn -q -B -f "$ROOT/ops/kafka/pom.xml" -Dkafka.version="$KAFKA_VERSION" \
    dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$KAFKA_HOME/libs" \
    >"$CACHE/kafka/mvn.log" 2>&1 || die "mvn could not fetch the Kafka jars; read $CACHE/kafka/mvn.log"
  touch "$KAFKA_HOME/.complete"
}

# A Kafka Connect worker and the Debezium MySQL connector plugin (ops/connect/pom.xml), for the
# outbox relay of the tests (harness/outbox_relay.py), in .cache/connect/<CONNECT_VERSION>/:
# libs/ (the worker's class path) and plugins/debezium-connector-mysql/ (its plugin.path).
# Fetched once: .complete names what the folder holds; fetched into a scratch folder first, so
# that a fetch that failed or was cut leaves nothing that looks finished.
connect_jars() {
  local version="${CONNECT_VERSION:-4.3.2}" debezium="${DEBEZIUM_VERSION:-3.6.1.Final}"
  local home="$CACHE/connect/$version" want scratch
  want="connect-runtime $version, debezium-connector-mysql $debezium"
  if [ -f "$home/.complete" ] && [ "$(cat "$home/.complete")" = "$want" ]; then return; fi
  command -v mvn >/dev/null || die "Maven (mvn) is needed once to fetch Kafka Connect $version and Debezium $debezium"
  log "fetching Kafka Connect $version and Debezium $debezium (MySQL connector) from Maven Central (once; cached in $home)"
  mkdir -p "$CACHE/connect"
  scratch="$(mktemp -d "$CACHE/connect/.fetch-XXXXXX")" && chmod 755 "$scratch"
  mvn -q -B -f "$ROOT/ops/connect/pom.xml" -P runtime -Dconnect.version="$version" \
    dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$scratch/libs" \
    >"$CACHE/connect/mvn.log" 2>&1 \
    || { rm -rf "$scratch"; die "mvn could not fetch the Kafka Connect jars; read $CACHE/connect/mvn.log"; }
  mvn -q -B -f "$ROOT/ops/connect/pom.xml" -P plugin -Ddebezium.version="$debezium" \
    dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$scratch/plugins/debezium-connector-mysql" \
    >>"$CACHE/connect/mvn.log" 2>&1 \
    || { rm -rf "$scratch"; die "mvn could not fetch the Debezium MySQL connector; read $CACHE/connect/mvn.log"; }
  printf '%s\n' "$want" >"$scratch/.complete"
  rm -rf "$home" && mv "$scratch" "$home"
}

# Jaeger's all-in-one program (collector with OTLP receivers, query API, in-memory storage), for
# the tracing test (tests/integration/test_tracing_jaeger.py), built once from its Go module with
# the Go toolchain into .cache/jaeger/<JAEGER_VERSION>/jaeger: in a scratch module, `go get -tool`
# pins every dependency of that version, then `go build` (minutes the first time: the Go module
# and build caches make a rebuild quick). Built into a scratch folder first, so that a build that
# failed or was cut leaves nothing that looks finished.
jaeger_program() {
  local version="${JAEGER_VERSION:-1.75.0}" home scratch
  home="$CACHE/jaeger/$version"
  if [ -x "$home/jaeger" ] && [ -f "$home/.complete" ]; then return; fi
  command -v go >/dev/null || die "the Go toolchain (go) is needed once to build Jaeger $version"
  log "building Jaeger $version from its Go module (once, a few minutes; cached in $home)"
  mkdir -p "$CACHE/jaeger"
  scratch="$(mktemp -d "$CACHE/jaeger/.build-XXXXXX")"
  ( cd "$scratch" && go mod init jaeger-build >/dev/null 2>&1 \
      && go get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@v$version" \
      && nice go build -trimpath -ldflags "-s -w" -o jaeger github.com/jaegertracing/jaeger/cmd/jaeger ) \
    >"$CACHE/jaeger/build.log" 2>&1 \
    || { rm -rf "$scratch"; die "go could not build Jaeger $version; read $CACHE/jaeger/build.log"; }
  mkdir -p "$home" && mv "$scratch/jaeger" "$home/jaeger" && rm -rf "$scratch"
  echo "jaeger $version" >"$home/.complete"
}

# Helm, for the chart's tests (tests/unit/test_helm_chart.py: `helm lint --strict`, `helm template`),
# built once from its Go module like Jaeger into .cache/helm/<HELM_VERSION>/helm. No cluster is
# needed or reached: lint and template run offline.
helm_program() {
  local version="${HELM_VERSION:-4.3.2}" home scratch
  home="$CACHE/helm/$version"
  if [ -x "$home/helm" ] && [ "$(cat "$home/.complete" 2>/dev/null)" = "helm $version" ]; then return; fi
  command -v go >/dev/null || die "the Go toolchain (go) is needed once to build Helm $version"
  log "building Helm $version from its Go module (once, a few minutes; cached in $home)"
  mkdir -p "$CACHE/helm"
  scratch="$(mktemp -d "$CACHE/helm/.build-XXXXXX")"
  ( cd "$scratch" && go mod init helm-build >/dev/null 2>&1 \
      && go get -tool "helm.sh/helm/v4/cmd/helm@v$version" \
      && nice go build -trimpath -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=v$version" \
           -o helm helm.sh/helm/v4/cmd/helm ) \
    >"$CACHE/helm/build.log" 2>&1 \
    || { rm -rf "$scratch"; die "go could not build Helm $version; read $CACHE/helm/build.log"; }
  mkdir -p "$home" && mv "$scratch/helm" "$home/helm" && rm -rf "$scratch"
  echo "helm $version" >"$home/.complete"   # written last: a build cut short leaves none
}

# The manifest checker (deploy/helm/checker/: every rendered object decoded strictly into the
# upstream API types), built from its own go.mod into .cache/helm/checker/<hash of its sources>/:
# a changed checker is built again, an unchanged one once per machine. Prints the program's path.
k8s_checker_program() {
  local src="$ROOT/deploy/helm/checker" hash home scratch
  hash="$(cd "$src" && cat go.mod go.sum $(ls *.go | sort) | sha256sum | cut -c1-16)"
  home="$CACHE/helm/checker/$hash"
  if [ -x "$home/k8s-checker" ] && [ -f "$home/.complete" ]; then echo "$home/k8s-checker"; return; fi
  command -v go >/dev/null || die "the Go toolchain (go) is needed once to build the manifest checker"
  log "building the manifest checker from deploy/helm/checker (once per change; cached in $home)"
  mkdir -p "$CACHE/helm/checker"
  scratch="$(mktemp -d "$CACHE/helm/checker/.build-XXXXXX")"
  ( cd "$src" && nice go build -mod=readonly -buildvcs=false -trimpath -ldflags "-s -w" -o "$scratch/k8s-checker" . ) \
    >"$CACHE/helm/checker/build.log" 2>&1 \
    || { rm -rf "$scratch"; die "go could not build the manifest checker; read $CACHE/helm/checker/build.log"; }
  mkdir -p "$home" && mv "$scratch/k8s-checker" "$home/k8s-checker" && rm -rf "$scratch"
  echo "k8s-checker $hash" >"$home/.complete"
  echo "$home/k8s-checker"
}

# Node n (1-based) of the layout: its folder and ports.
node_home() { if [ -z "$KAFKA_LAYOUT" ]; then echo "$CACHE/kafka"; else echo "$CACHE/kafka/$KAFKA_LAYOUT/node-$1"; fi; }
node_port() { echo $((KAFKA_PORT + 2 * ($1 - 1))); }
node_controller_port() {
  if [ "$KAFKA_NODES" -eq 1 ]; then echo "$KAFKA_CONTROLLER_PORT"; else echo $((KAFKA_PORT + 1 + 2 * ($1 - 1))); fi
}
node_sasl_port() { echo $((KAFKA_SASL_PORT + 2 * ($1 - 1))); }
node_mtls_port() { echo $((KAFKA_MTLS_PORT + 2 * ($1 - 1))); }
layout_home() { if [ -z "$KAFKA_LAYOUT" ]; then echo "$CACHE/kafka"; else echo "$CACHE/kafka/$KAFKA_LAYOUT"; fi; }

kafka_config() {  # kafka_config <n>: render node n's server.properties
  local n="$1" home port cport voters="" i
  home="$(node_home "$n")"; port="$(node_port "$n")"; cport="$(node_controller_port "$n")"
  mkdir -p "$home/data"
  sed -e "s#@PORT@#$port#g" -e "s#@CONTROLLER_PORT@#$cport#g" \
      -e "s#@DATA_DIR@#$home/data#g" "$ROOT/ops/kafka/server.properties.in" > "$home/server.properties"
  if [ -z "$KAFKA_LAYOUT" ]; then return; fi
  # java.util.Properties keeps the last value of a key: these lines win over the template's.
  {
    echo ""
    echo "# ops/services.sh: layout $KAFKA_LAYOUT, node $n"
    echo "node.id=$n"
    if [ "$KAFKA_NODES" -gt 1 ]; then
      for i in $(seq 1 "$KAFKA_NODES"); do voters="${voters:+$voters,}$i@127.0.0.1:$(node_controller_port "$i")"; done
      echo "controller.quorum.voters=$voters"
      echo "offsets.topic.replication.factor=3"
      echo "transaction.state.log.replication.factor=3"
      echo "transaction.state.log.min.isr=2"
      echo "share.coordinator.state.topic.replication.factor=3"
      echo "share.coordinator.state.topic.min.isr=2"
      echo "default.replication.factor=3"
      echo "min.insync.replicas=2"
      echo "unclean.leader.election.enable=false"
    fi
    if [ "$KAFKA_SECURE" = 1 ]; then
      local sport mport password
      sport="$(node_sasl_port "$n")"; mport="$(node_mtls_port "$n")"; password="$(sasl_password)"
      echo "listeners=PLAINTEXT://127.0.0.1:$port,SASL_SSL://127.0.0.1:$sport,MTLS://127.0.0.1:$mport,CONTROLLER://127.0.0.1:$cport"
      echo "advertised.listeners=PLAINTEXT://127.0.0.1:$port,SASL_SSL://127.0.0.1:$sport,MTLS://127.0.0.1:$mport"
      echo "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,MTLS:SSL,CONTROLLER:PLAINTEXT"
      echo "ssl.keystore.type=PEM"
      echo "ssl.keystore.location=$KAFKA_CERTS/broker-keystore.pem"
      echo "ssl.truststore.type=PEM"
      echo "ssl.truststore.location=$KAFKA_CERTS/ca.pem"
      echo "sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256,PLAIN"
      echo "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;"
      echo "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;"
      echo "listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$KAFKA_SASL_USERNAME=\"$password\";"
      echo "listener.name.mtls.ssl.client.auth=required"
    fi
  } >>"$home/server.properties"
  chmod 600 "$home/server.properties"   # it holds the PLAIN password
}

# The SCRAM/PLAIN password of the secure layout: fixed when its storage is first formatted.
sasl_password() {
  local f; f="$(layout_home)/sasl-password"
  if [ ! -f "$f" ]; then
    mkdir -p "$(layout_home)"
    (umask 077; printf '%s' "${KAFKA_SASL_PASSWORD:-$(openssl rand -hex 16)}" >"$f")
  elif [ -n "${KAFKA_SASL_PASSWORD:-}" ] && [ "$KAFKA_SASL_PASSWORD" != "$(cat "$f")" ]; then
    die "KAFKA_SASL_PASSWORD differs from the password user '$KAFKA_SASL_USERNAME' was created with ($f); to change it: ops/services.sh down, then remove $(layout_home)"
  fi
  cat "$f"
}

kafka_java() { java $KAFKA_HEAP_OPTS -Dlog4j2.configurationFile="$ROOT/ops/kafka/log4j2.properties" -cp "$KAFKA_HOME/libs/*" "$@"; }

kafka_started() {  # kafka_started <n>
  grep -q "Kafka Server started" "$(node_home "$1")/kafka.log" 2>/dev/null && port_open 127.0.0.1 "$(node_port "$1")"
}

kafka_format() {  # kafka_format <n> <cluster id>
  local home; home="$(node_home "$1")"
  local scram=()
  if [ "$KAFKA_SECURE" = 1 ]; then
    local password; password="$(sasl_password)"
    scram=(--add-scram "SCRAM-SHA-512=[name=$KAFKA_SASL_USERNAME,password=$password]"
           --add-scram "SCRAM-SHA-256=[name=$KAFKA_SASL_USERNAME,password=$password]")
  fi
  log "formatting Kafka storage in $home/data"
  kafka_java kafka.tools.StorageTool format -t "$2" -c "$home/server.properties" "${scram[@]}" \
    >"$home/format.log" 2>&1 || die "formatting Kafka storage failed; read $home/format.log"
}

new_cluster_id() {  # one in 64 random ids starts with '-', which the storage tool takes for an option
  local id
  while :; do
    id="$(kafka_java kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)"
    case "$id" in -*) ;; *) echo "$id"; return ;; esac
  done
}

kafka_spawn() {  # kafka_spawn <n>
  local home; home="$(node_home "$1")"
  log "starting Kafka $KAFKA_VERSION (KRaft) node $1 on 127.0.0.1:$(node_port "$1") (log: $home/kafka.log)"
  : >"$home/kafka.log"
  nohup java $KAFKA_HEAP_OPTS -Dlog4j2.configurationFile="$ROOT/ops/kafka/log4j2.properties" \
    -cp "$KAFKA_HOME/libs/*" kafka.Kafka "$home/server.properties" >>"$home/kafka.log" 2>&1 &
  echo $! >"$home/kafka.pid"
}

kafka_up() {
  if ! is_local "$KAFKA_HOST"; then
    log "KAFKA_BROKER points at $KAFKA_HOST:$KAFKA_PORT: not managing it, waiting for it to answer"
    wait_until "Kafka at $KAFKA_HOST:$KAFKA_PORT" "that broker's own log" port_open "$KAFKA_HOST" "$KAFKA_PORT"
    return
  fi
  local n open=() closed=()
  for n in $(seq 1 "$KAFKA_NODES"); do
    if port_open 127.0.0.1 "$(node_port "$n")"; then open+=("$n"); else closed+=("$n"); fi
  done
  local other; other="$(other_layout_running)"
  if [ "${#open[@]}" -gt 0 ] && [ -n "$other" ]; then
    die "the ${other} layout of this script runs on these ports, not ${KAFKA_LAYOUT:-the default one}; ops/services.sh down first"
  fi
  if [ "${#closed[@]}" -eq 0 ]; then
    if [ "$KAFKA_SECURE" = 1 ] && ! port_open 127.0.0.1 "$(node_sasl_port 1)"; then
      die "a Kafka without a SASL_SSL listener already listens on 127.0.0.1:$(node_port 1); stop it first (ops/services.sh down stops the ones this script started)"
    fi
    log "Kafka already listening on 127.0.0.1:$(node_port 1)${KAFKA_LAYOUT:+ ($KAFKA_LAYOUT)}: reusing it"
    if pid_alive "$(node_home 1)/kafka.pid"; then kafka_env_files; fi   # a broker of somebody else: its password is theirs
    return
  fi
  if [ "${#open[@]}" -gt 0 ]; then
    local busy="" own=1
    for n in "${open[@]}"; do
      busy="$busy 127.0.0.1:$(node_port "$n")"
      pid_alive "$(node_home "$n")/kafka.pid" || own=0
    done
    if [ "$own" = 0 ]; then
      die "ports of the $KAFKA_NODES-node layout are taken by something else:$busy (a single-node Kafka on $(node_port 1)? stop it first: ops/services.sh down)"
    fi
  fi
  kafka_jars
  if [ "$KAFKA_SECURE" = 1 ]; then
    bash "$ROOT/ops/kafka/certs.sh" "$KAFKA_CERTS" || die "making certificates in $KAFKA_CERTS failed"
  fi
  local cluster_id=""
  for n in "${closed[@]}"; do
    kafka_config "$n"
    if [ ! -f "$(node_home "$n")/data/meta.properties" ]; then
      # Every node of a layout shares one cluster id; a node formatted before keeps its own.
      if [ -z "$cluster_id" ]; then
        cluster_id="$(sed -n 's/^cluster.id=//p' "$(node_home 1)/data/meta.properties" 2>/dev/null || true)"
        [ -n "$cluster_id" ] || cluster_id="$(new_cluster_id)"
      fi
      kafka_format "$n" "$cluster_id"
    fi
  done
  # A quorum of three elects no controller until two run: start every node, then wait.
  for n in "${closed[@]}"; do kafka_spawn "$n"; done
  for n in "${closed[@]}"; do
    wait_until "Kafka node $n" "$(node_home "$n")/kafka.log" kafka_started "$n"
  done
  kafka_env_files
  log "Kafka ready${KAFKA_LAYOUT:+ ($KAFKA_LAYOUT: $KAFKA_NODES node(s))}"
}

# The worker's settings for the secure listeners, ready to `set -a; . <file>; set +a`.
kafka_env_files() {
  [ "$KAFKA_SECURE" = 1 ] || return 0
  local n sasl="" mtls="" home; home="$(layout_home)"
  for n in $(seq 1 "$KAFKA_NODES"); do
    sasl="${sasl:+$sasl;}kafka://127.0.0.1:$(node_sasl_port "$n")"
    mtls="${mtls:+$mtls;}kafka://127.0.0.1:$(node_mtls_port "$n")"
  done
  (umask 077
   printf '%s\n' "KAFKA_BROKER='$sasl'" "KAFKA_SECURITY_PROTOCOL=SASL_SSL" "KAFKA_SASL_MECHANISM=SCRAM-SHA-512" \
     "KAFKA_SASL_USERNAME='$KAFKA_SASL_USERNAME'" "KAFKA_SASL_PASSWORD='$(sasl_password)'" \
     "KAFKA_SSL_CAFILE='$KAFKA_CERTS/ca.pem'" >"$home/sasl.env"
   printf '%s\n' "KAFKA_BROKER='$mtls'" "KAFKA_SECURITY_PROTOCOL=SSL" "KAFKA_SSL_CAFILE='$KAFKA_CERTS/ca.pem'" \
     "KAFKA_SSL_CERTFILE='$KAFKA_CERTS/client.pem'" "KAFKA_SSL_KEYFILE='$KAFKA_CERTS/client.key'" >"$home/mtls.env")
  log "worker settings: $home/sasl.env (SCRAM-SHA-512 over TLS), $home/mtls.env (mTLS)"
}

# The layout (or "default") whose node this script started runs, if not the one asked for.
other_layout_running() {
  local f name
  while read -r f; do
    [ -n "$f" ] && pid_alive "$f" || continue
    if [ "$f" = "$CACHE/kafka/kafka.pid" ]; then name=""; else name="${f#"$CACHE/kafka/"}"; name="${name%%/*}"; fi
    if [ "$name" != "$KAFKA_LAYOUT" ]; then echo "${name:-default}"; return; fi
  done < <(kafka_pid_files)
}

# Every node any layout of this script started: the default one and .cache/kafka/*/node-*.
kafka_pid_files() {
  local f
  for f in "$CACHE/kafka/kafka.pid" "$CACHE"/kafka/*/node-*/kafka.pid; do
    [ -f "$f" ] && echo "$f"
  done
  return 0
}

kafka_down() {
  local f pid pids=() stopped=0
  while read -r f; do
    [ -n "$f" ] || continue
    if pid_alive "$f"; then
      pid="$(cat "$f")"
      log "stopping Kafka (pid $pid, $(dirname "$f"))"
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid"); stopped=1
    fi
    rm -f "$f"
  done < <(kafka_pid_files)
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  [ "$stopped" = 1 ] || log "Kafka: nothing started by this script is running"
}

kafka_status() {
  local n line
  if [ -z "$KAFKA_LAYOUT" ]; then
    if port_open "$KAFKA_HOST" "$KAFKA_PORT"; then echo "kafka:   up ($KAFKA_HOST:$KAFKA_PORT)"; else echo "kafka:   down"; fi
  else
    for n in $(seq 1 "$KAFKA_NODES"); do
      line="kafka:   node $n ($KAFKA_LAYOUT):"
      if port_open 127.0.0.1 "$(node_port "$n")"; then line="$line PLAINTEXT up (127.0.0.1:$(node_port "$n"))"
      else line="$line PLAINTEXT down (127.0.0.1:$(node_port "$n"))"; fi
      if [ "$KAFKA_SECURE" = 1 ]; then
        if port_open 127.0.0.1 "$(node_sasl_port "$n")"; then line="$line, SASL_SSL up (:$(node_sasl_port "$n"))"
        else line="$line, SASL_SSL down (:$(node_sasl_port "$n"))"; fi
        if port_open 127.0.0.1 "$(node_mtls_port "$n")"; then line="$line, mTLS up (:$(node_mtls_port "$n"))"
        else line="$line, mTLS down (:$(node_mtls_port "$n"))"; fi
      fi
      echo "$line"
    done
  fi
  local f
  while read -r f; do
    [ -n "$f" ] || continue
    if pid_alive "$f"; then echo "kafka:   started by this script: pid $(cat "$f") (${f#"$CACHE/kafka/"})"; fi
  done < <(kafka_pid_files)
}

status() {
  kafka_status
  if port_open "$DB_HOST" "$DB_PORT"; then echo "mariadb: up ($DB_HOST:$DB_PORT)"; else echo "mariadb: down"; fi
  replica_status
}

case "${1:-}" in
  up) mkdir -p "$CACHE/kafka" "$CACHE/mariadb"; mariadb_up; if [ "$MARIADB_REPLICA" = 1 ]; then replica_up; fi; kafka_up ;;
  jars) mkdir -p "$CACHE/kafka"; kafka_jars ;;   # the Java client the tests write records with
  connect-jars) connect_jars ;;   # Kafka Connect + Debezium MySQL, for harness/outbox_relay.py
  jaeger) jaeger_program ;;   # Jaeger all-in-one, for the tracing test
  helm) helm_program ;;   # Helm, for the chart's tests
  k8s-checker) k8s_checker_program ;;   # the chart's manifest checker (prints its path)
  down) kafka_down; mariadb_down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status|jars|connect-jars|jaeger|helm|k8s-checker" >&2; exit 2 ;;
esac
