#!/usr/bin/env bash
# Local Apache Kafka (KRaft, from Maven Central jars) and MariaDB (from Debian),
# without Docker and without systemd.
#
#   ops/services.sh up      install what is missing, start what is not running, wait until ready
#   ops/services.sh down    stop what `up` started (by pid file), nothing else
#   ops/services.sh status  say what answers on the configured ports
#   ops/services.sh jars    fetch the Kafka jars only (the tests use its Java client even
#                           when a Kafka that is already running is reused)
#
# A service already listening on its port is reused as it is. State lives in
# .cache/ (ignored by git): the broker jars, its data and log, pid files.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="$ROOT/.cache"
KAFKA_VERSION="${KAFKA_VERSION:-4.4.0}"
KAFKA_HOME="$CACHE/kafka/$KAFKA_VERSION"
KAFKA_DATA="$CACHE/kafka/data"
KAFKA_LOG="$CACHE/kafka/kafka.log"
KAFKA_PID="$CACHE/kafka/kafka.pid"
KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xms256m -Xmx1g}"
MARIADB_PID="$CACHE/mariadb/mariadb.pid"
# The error log must be in a folder the mysql user can write, or mariadbd runs
# and silently logs nothing; the project folder may not be reachable for it.
MARIADB_LOG_DIR="${MARIADB_LOG_DIR:-/var/log/mysql}"
MARIADB_LOG="$MARIADB_LOG_DIR/order-event-processor.err"
READY_TIMEOUT="${READY_TIMEOUT:-90}"

KAFKA_BROKER="${KAFKA_BROKER:-kafka://127.0.0.1:9092}"
MYSQL_URL="${MYSQL_URL:-mysql+aiomysql://idem:idem@127.0.0.1:3306/idem}"

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

log() { printf '[services] %s\n' "$*" >&2; }
die() { printf '[services] ERROR: %s\n' "$*" >&2; exit 1; }

# host port of the first broker in KAFKA_BROKER
read -r KAFKA_HOST KAFKA_PORT < <(python3 - "$KAFKA_BROKER" <<'EOF'
import sys
first = sys.argv[1].split(";")[0].split(",")[0]
hostport = first.split("://", 1)[-1]
host, _, port = hostport.rpartition(":")
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

mariadb_ping() { $SUDO mariadb-admin --protocol=socket ping >/dev/null 2>&1; }

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
    $SUDO mkdir -p /run/mysqld "$MARIADB_LOG_DIR"
    $SUDO chown mysql:mysql /run/mysqld
    $SUDO chown mysql "$MARIADB_LOG_DIR"
    log "starting MariaDB on 127.0.0.1:$DB_PORT (error log: $MARIADB_LOG)"
    $SUDO start-stop-daemon --start --background --make-pidfile --pidfile "$MARIADB_PID" \
      --exec /usr/sbin/mariadbd -- --user=mysql --bind-address=127.0.0.1 --port="$DB_PORT" \
      --log-error="$MARIADB_LOG"
    wait_until "MariaDB" "$MARIADB_LOG" mariadb_ping
  fi
  mariadb_ping || die "MariaDB answers on port $DB_PORT but not on its local socket as root; create database '$DB_NAME' and user '$DB_USER' yourself"
  # Tests create scratch databases named ${DB_NAME}_*, hence the wildcard grant.
  $SUDO mariadb --protocol=socket <<SQL
CREATE DATABASE IF NOT EXISTS \`$DB_NAME\` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
CREATE USER IF NOT EXISTS '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL PRIVILEGES ON \`${DB_NAME}\`.* TO '$DB_USER'@'127.0.0.1', '$DB_USER'@'localhost';
GRANT ALL PRIVILEGES ON \`${DB_NAME}\\_%\`.* TO '$DB_USER'@'127.0.0.1', '$DB_USER'@'localhost';
SQL
  log "MariaDB ready: database '$DB_NAME', user '$DB_USER'"
}

mariadb_down() {
  if pid_alive "$MARIADB_PID"; then
    log "stopping MariaDB (pid $(cat "$MARIADB_PID"))"
    $SUDO start-stop-daemon --stop --pidfile "$MARIADB_PID" --retry TERM/30/KILL/5 >/dev/null || true
    $SUDO rm -f "$MARIADB_PID"
  else
    log "MariaDB: nothing started by this script is running"
  fi
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

kafka_config() {
  mkdir -p "$KAFKA_DATA"
  sed -e "s#@PORT@#$KAFKA_PORT#g" -e "s#@CONTROLLER_PORT@#$KAFKA_CONTROLLER_PORT#g" \
      -e "s#@DATA_DIR@#$KAFKA_DATA#g" "$ROOT/ops/kafka/server.properties.in" > "$CACHE/kafka/server.properties"
}

kafka_java() { java $KAFKA_HEAP_OPTS -Dlog4j2.configurationFile="$ROOT/ops/kafka/log4j2.properties" -cp "$KAFKA_HOME/libs/*" "$@"; }

kafka_started() { grep -q "Kafka Server started" "$KAFKA_LOG" 2>/dev/null && port_open 127.0.0.1 "$KAFKA_PORT"; }

kafka_up() {
  if ! is_local "$KAFKA_HOST"; then
    log "KAFKA_BROKER points at $KAFKA_HOST:$KAFKA_PORT: not managing it, waiting for it to answer"
    wait_until "Kafka at $KAFKA_HOST:$KAFKA_PORT" "that broker's own log" port_open "$KAFKA_HOST" "$KAFKA_PORT"
    return
  fi
  if port_open 127.0.0.1 "$KAFKA_PORT"; then
    log "Kafka already listening on 127.0.0.1:$KAFKA_PORT: reusing it"
    return
  fi
  kafka_jars
  kafka_config
  if [ ! -f "$KAFKA_DATA/meta.properties" ]; then
    log "formatting Kafka storage in $KAFKA_DATA"
    local cluster_id
    cluster_id="$(kafka_java kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)"
    kafka_java kafka.tools.StorageTool format -t "$cluster_id" -c "$CACHE/kafka/server.properties" \
      >"$CACHE/kafka/format.log" 2>&1 || die "formatting Kafka storage failed; read $CACHE/kafka/format.log"
  fi
  log "starting Kafka $KAFKA_VERSION (KRaft) on 127.0.0.1:$KAFKA_PORT (log: $KAFKA_LOG)"
  : >"$KAFKA_LOG"
  nohup java $KAFKA_HEAP_OPTS -Dlog4j2.configurationFile="$ROOT/ops/kafka/log4j2.properties" \
    -cp "$KAFKA_HOME/libs/*" kafka.Kafka "$CACHE/kafka/server.properties" >>"$KAFKA_LOG" 2>&1 &
  echo $! >"$KAFKA_PID"
  wait_until "Kafka" "$KAFKA_LOG" kafka_started
  log "Kafka ready"
}

kafka_down() {
  if pid_alive "$KAFKA_PID"; then
    local pid; pid="$(cat "$KAFKA_PID")"
    log "stopping Kafka (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$KAFKA_PID"
  else
    log "Kafka: nothing started by this script is running"
  fi
}

status() {
  if port_open "$KAFKA_HOST" "$KAFKA_PORT"; then echo "kafka:   up ($KAFKA_HOST:$KAFKA_PORT)"; else echo "kafka:   down"; fi
  if port_open "$DB_HOST" "$DB_PORT"; then echo "mariadb: up ($DB_HOST:$DB_PORT)"; else echo "mariadb: down"; fi
}

case "${1:-}" in
  up) mkdir -p "$CACHE/kafka" "$CACHE/mariadb"; mariadb_up; kafka_up ;;
  jars) mkdir -p "$CACHE/kafka"; kafka_jars ;;   # the Java client the tests write records with
  down) kafka_down; mariadb_down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status|jars" >&2; exit 2 ;;
esac
