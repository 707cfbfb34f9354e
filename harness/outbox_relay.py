"""An "order service" upstream whose transactional outbox Debezium relays into a Kafka topic:

    relay = OutboxRelay(bootstrap="127.0.0.1:9092", topic="order-event-x", exactly_once=True).start()
    events = relay.write_order("o-1", [("OrderPlaced", '{"amount": 12}')])   # one transaction, committed
    relay.write_order("o-2", [("OrderPlaced", "{}")], commit=False)           # rolled back: never relayed
    with relay.connect() as conn, conn.cursor() as cur:     # a transaction of your own (pymysql)
        relay.insert_event(cur, "o-3", "OrderPlaced", "{}"); conn.commit()   # or conn.rollback()
    relay.execute("UPDATE orders SET status = %s WHERE order_no = %s", ("paid", "o-1"))   # autocommit
    relay.outbox()                               # the committed outbox rows, by id
    relay.kill_connect()                         # SIGKILL of the Connect JVM: a crash
    relay.restart_connect()                      # again, until the connector and its task are RUNNING
    relay.stop()

What runs, all of it started and stopped here:

* The upstream: ``mariadbd --no-defaults`` in a temporary folder of its own, on a free port
  (``harness.mariadb_pair.Server``; the shared server on 3306 is never touched), with a binary log
  (``log_bin``, ``binlog_format=ROW``, ``binlog_row_image=FULL``, ``server_id=1``) and
  ``--version=5.7.19-log``: Debezium's MySQL connector 3.6.1 asks a server whose version is not
  5.x for ``SHOW BINARY LOG STATUS``, which MariaDB 10.11 does not have; reporting 5.7 makes it ask
  ``SHOW MASTER STATUS``, and the binary log is streamed correctly. Database ``shop``: ``orders`` and
  ``outbox`` (Debezium's default outbox shape, plus ``created_at``), user ``shop`` (all of ``shop``)
  and user ``debezium`` (the replication grants the connector needs). The server's clock is UTC.
* One Kafka Connect worker in distributed mode (Connect :data:`CONNECT_VERSION`, ``-Xmx384m``),
  REST on a free port, its own ``group.id`` and config/offset/status topics (names unique to this
  instance), String key and value converters (the payload column is written byte for byte). With
  ``exactly_once`` the worker has ``exactly.once.source.support=enabled`` and the connector
  ``exactly.once.support=required`` (each poll's records and their source offsets commit in one
  Kafka transaction: read with ``isolation_level="read_committed"``); without, the relay is at least
  once (source offsets flushed every second: what was sent after the last flush is sent again after a
  crash).
* The connector: ``io.debezium.connector.mysql.MySqlConnector`` over ``shop.outbox`` only, snapshot
  mode ``initial`` (rows committed before it first started are relayed too, then the binary log from
  where the snapshot stood), schema history in a topic of its own, and the outbox ``EventRouter``: every
  record goes to ``topic``; key = ``aggregateid`` (the order number), value = ``payload``, header ``id``
  = the row's ``id`` (the event id), header ``eventType`` = its ``type``; the record's timestamp is the
  row's ``created_at`` (milliseconds, UTC), the same on every copy of a record sent again. With
  ``event_time=None``: the EventRouter's default, the Debezium change event's ``ts_ms``, i.e. when the
  connector read the change (a copy sent again after a crash gets a later one).

Debezium 3.6.1 is built against kafka-clients 4.3.0; a Connect 4.4 worker lacks classes it uses
(``NoClassDefFoundError: org/apache/kafka/common/utils/Sanitizer``), so the worker is Connect 4.3.x
against the 4.4 broker. Its jars: ``ops/services.sh connect-jars`` (fetched once, into
``.cache/connect/<version>``; :meth:`OutboxRelay.start` runs it when they are missing).

Processes an earlier run left behind (its Python process died) are SIGKILLed at the next start, their
folders removed and their topics deleted: the folder's ``owner.pid`` names its process, pid files
name the servers, and a server's command line must name the folder. This class knows nothing of pytest.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import pymysql

from harness.mariadb_pair import Server, _claim, _give_to_mysql, _install, reap
from harness.mariadb_pair import reap_leftovers as reap_pair_leftovers
from harness.services import LOGS, ROOT, free_port

CONNECT_VERSION = os.environ.get("CONNECT_VERSION", "4.3.2")
DEBEZIUM_VERSION = os.environ.get("DEBEZIUM_VERSION", "3.6.1.Final")
CACHE = Path(os.environ.get("SERVICES_CACHE", ROOT / ".cache"))
CONNECT_HEAP = ("-Xms64m", "-Xmx384m")
LOG4J_CONFIG = ROOT / "ops" / "connect" / "log4j2.properties"
SCRATCH_PREFIX = "outbox-relay-"
# What the upstream reports itself as (see the module's docstring).
UPSTREAM_VERSION = "5.7.19-log"
DATABASE = "shop"
SHOP_USER, SHOP_PASSWORD = "shop", "shop"
DEBEZIUM_USER, DEBEZIUM_PASSWORD = "debezium", "debezium"
CONNECTOR = "outbox"
START_TIMEOUT = 120.0

SCHEMA = (
    f"CREATE DATABASE `{DATABASE}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
    f"""CREATE TABLE `{DATABASE}`.orders (
          order_no   VARCHAR(64) NOT NULL PRIMARY KEY,
          status     VARCHAR(64) NOT NULL,
          updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3)
        ) ENGINE=InnoDB""",
    # Debezium's default outbox columns; created_at is the record's timestamp (event_time).
    f"""CREATE TABLE `{DATABASE}`.outbox (
          id            VARCHAR(64)  NOT NULL PRIMARY KEY,
          aggregatetype VARCHAR(255) NOT NULL,
          aggregateid   VARCHAR(255) NOT NULL,
          type          VARCHAR(255) NOT NULL,
          payload       LONGTEXT,
          created_at    DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
        ) ENGINE=InnoDB""",
    f"CREATE USER '{SHOP_USER}'@'127.0.0.1' IDENTIFIED BY '{SHOP_PASSWORD}'",
    f"GRANT ALL PRIVILEGES ON `{DATABASE}`.* TO '{SHOP_USER}'@'127.0.0.1'",
    f"CREATE USER '{DEBEZIUM_USER}'@'127.0.0.1' IDENTIFIED BY '{DEBEZIUM_PASSWORD}'",
    # What Debezium's MySQL connector documents: the snapshot (SELECT, RELOAD for FLUSH TABLES WITH
    # READ LOCK, LOCK TABLES, SHOW DATABASES) and the binary log (REPLICATION SLAVE to read it,
    # REPLICATION CLIENT for SHOW MASTER STATUS / SHOW BINARY LOGS).
    f"GRANT SELECT, RELOAD, SHOW DATABASES, LOCK TABLES, REPLICATION SLAVE, REPLICATION CLIENT "
    f"ON *.* TO '{DEBEZIUM_USER}'@'127.0.0.1'",
)


class RelayError(AssertionError):
    """A part of the relay did not come up or did not reach the state asked for."""


@dataclass(frozen=True)
class OutboxEvent:
    """One outbox row as the order service wrote it: what the relay must deliver."""

    id: str
    aggregateid: str
    type: str
    payload: str
    aggregatetype: str = "order"


def connect_home(version: str = CONNECT_VERSION) -> Path:
    """The Connect jars (``libs/``) and the Debezium plugin (``plugins/``), fetched if missing."""
    home = CACHE / "connect" / version
    marker = home / ".complete"
    want = f"connect-runtime {version}, debezium-connector-mysql {DEBEZIUM_VERSION}"
    if not marker.exists() or marker.read_text().strip() != want:
        done = subprocess.run(["bash", str(ROOT / "ops" / "services.sh"), "connect-jars"], capture_output=True,
                              text=True, timeout=900,
                              env={**os.environ, "CONNECT_VERSION": version, "DEBEZIUM_VERSION": DEBEZIUM_VERSION})
        if done.returncode != 0 or not marker.exists():
            raise RelayError(f"`ops/services.sh connect-jars` failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return home


class OutboxRelay:
    """The upstream, the worker and the connector of one relay (see the module's docstring).

    ``bootstrap``: the brokers, ``host:port,...`` (PLAINTEXT). ``topic``: where every outbox row goes;
    it must exist (nothing creates it). ``exactly_once``: Kafka transactions (read them with
    ``read_committed``), or at least once. ``event_time``: the outbox column that is the record's
    timestamp, or None for the EventRouter's default (when Debezium read the change).
    ``offset_flush_ms``: how often the worker commits source offsets when not exactly once (what a
    crash makes it send again). ``transaction_interval_ms``: exactly once, one transaction per interval
    (``transaction.boundary=interval``) instead of one per poll, so that a crash aborts a transaction
    that holds records."""

    def __init__(self, *, bootstrap: str, topic: str, exactly_once: bool, event_time: str | None = "created_at",
                 offset_flush_ms: int = 1000, transaction_interval_ms: int | None = None) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.exactly_once = exactly_once
        self.event_time = event_time
        self.offset_flush_ms = offset_flush_ms
        self.transaction_interval_ms = transaction_interval_ms
        self.suffix = uuid.uuid4().hex[:10]
        self.replica_id = random.randint(10_000, 2**31 - 1)     # the connector's server id (the upstream's: 1)
        self.name = f"{SCRATCH_PREFIX}{self.suffix}"       # group.id, topic prefix
        self.internal_topics = [f"{self.name}-configs", f"{self.name}-offsets", f"{self.name}-status",
                                f"{self.name}-schema-history"]
        self.home: Path | None = None
        self.db: Server | None = None
        self.connect_dir: Path | None = None
        self.connect_proc: subprocess.Popen | None = None
        self.rest_port: int | None = None
        self._log_file = None
        self._log_offset = 0          # where the worker's latest start begins in its log
        self._libs: Path | None = None
        # seconds: start_upstream(), start() (the upstream's part excluded), each restart_connect()
        self.timings: dict[str, list[float]] = {"upstream": [], "start": [], "restart_connect": []}

    # -- life ----------------------------------------------------------------------
    def start(self, timeout: float = START_TIMEOUT) -> OutboxRelay:
        """The upstream, the worker and the connector; returns ``self`` once the connector and its
        task are RUNNING."""
        if self.connect_proc is not None:
            raise RelayError("this relay was started already (restart_connect() starts the worker again)")
        if self.topic not in _topics(self.bootstrap):
            raise RelayError(f"topic {self.topic!r} does not exist at {self.bootstrap}: create it first "
                             "(the broker creates no topic by itself, and neither does the relay)")
        self.start_upstream()
        started = time.monotonic()
        try:
            self._libs = connect_home()
            self.connect_dir = self.home / "connect"
            self.connect_dir.mkdir()
            self._spawn_connect()
            self._wait_ready(timeout - (time.monotonic() - started))
            self._put_connector()
            self._wait_running(timeout - (time.monotonic() - started))
        except BaseException:
            self.stop()
            raise
        self.timings["start"].append(time.monotonic() - started)
        return self

    def start_upstream(self) -> OutboxRelay:
        """The upstream alone (:meth:`start` does it too): to write rows before the connector first
        starts (its snapshot relays them). Returns ``self``."""
        if self.db is not None:
            return self
        started = time.monotonic()
        reap_leftovers()
        self.home = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
        atexit.register(self.stop)
        try:
            _claim(self.home)
            (self.home / "relay.json").write_text(json.dumps({"bootstrap": self.bootstrap,
                                                              "topics": self.internal_topics}))
            self._start_upstream()
        except BaseException:
            self.stop()
            raise
        self.timings["upstream"].append(time.monotonic() - started)
        return self

    def stop(self, *, delete_topics: bool = True) -> None:
        """Stop the worker and the upstream, delete this instance's internal topics (not ``topic``)
        and remove its folder; the worker's log is kept as ``.cache/test-logs/<name>-connect.log``.
        Safe to call twice."""
        atexit.unregister(self.stop)
        self.stop_connect()
        if self.db is not None:
            self.db.stop()
            self.db = None
        if delete_topics and self.home is not None:
            _delete_topics(self.bootstrap, self.internal_topics, timeout=10.0)
        if self.home is not None:
            if self.connect_dir is not None and self.connect_log.exists():
                LOGS.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self.connect_log, LOGS / f"{self.name}-connect.log")
            shutil.rmtree(self.home, ignore_errors=True)
            self.home = None

    def __enter__(self) -> OutboxRelay:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- the worker ----------------------------------------------------------------
    @property
    def connect_alive(self) -> bool:
        return self.connect_proc is not None and self.connect_proc.poll() is None

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def worker_id(self) -> str:
        return f"127.0.0.1:{self.rest_port}"

    @property
    def connect_log(self) -> Path:
        return self.connect_dir / "connect.log"

    def kill_connect(self) -> None:
        """SIGKILL the Connect JVM: a crash; what it had not flushed or committed, it never will."""
        if self.connect_alive:
            self.connect_proc.send_signal(signal.SIGKILL)
        if self.connect_proc is not None:
            self.connect_proc.wait(30)
        self._close_log()

    def stop_connect(self, timeout: float = 30.0) -> None:
        """SIGTERM: a graceful stop of the worker (SIGKILL after ``timeout``)."""
        if self.connect_alive:
            self.connect_proc.terminate()
            try:
                self.connect_proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.connect_proc.kill()
                self.connect_proc.wait(30)
        self._close_log()

    def restart_connect(self, timeout: float = START_TIMEOUT) -> float:
        """Start the worker again (its earlier process must be gone: :meth:`kill_connect` or
        :meth:`stop_connect`); return once the connector and its task run in it (how long that took).
        It gets a new REST port, hence a new worker id: a status topic that still says RUNNING for the
        worker that was killed is not taken for this one's."""
        if self.connect_alive:
            raise RelayError("the Connect worker still runs: kill_connect() or stop_connect() first")
        if self.connect_proc is None or self.home is None:
            raise RelayError("the relay was not started (start()), or was stopped")
        started = time.monotonic()
        self._spawn_connect()
        self._wait_ready(timeout)
        self._wait_running(timeout - (time.monotonic() - started))
        took = time.monotonic() - started
        self.timings["restart_connect"].append(took)
        return took

    def status(self) -> dict:
        """The connector's status as the worker's REST API says it (``GET /connectors/<name>/status``)."""
        return self._rest("GET", f"/connectors/{CONNECTOR}/status")[1]

    def connector_config(self) -> dict[str, str]:
        config = {
            "connector.class": "io.debezium.connector.mysql.MySqlConnector",
            "tasks.max": "1",
            "database.hostname": "127.0.0.1",
            "database.port": str(self.db.port),
            "database.user": DEBEZIUM_USER,
            "database.password": DEBEZIUM_PASSWORD,
            "database.server.id": str(self.replica_id),
            "database.ssl.mode": "disabled",
            "topic.prefix": self.name,
            "database.include.list": DATABASE,
            "table.include.list": f"{DATABASE}.outbox",
            "include.schema.changes": "false",
            "tombstones.on.delete": "false",
            # no __debezium.context.* headers: the records carry the two headers asked for, nothing else
            "extended.headers.enabled": "false",
            "snapshot.mode": "initial",
            "schema.history.internal.kafka.bootstrap.servers": self.bootstrap,
            "schema.history.internal.kafka.topic": f"{self.name}-schema-history",
            "schema.history.internal.store.only.captured.tables.ddl": "true",
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "value.converter": "org.apache.kafka.connect.storage.StringConverter",
            "transforms": "outbox",
            "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
            "transforms.outbox.route.topic.replacement": self.topic,
            "transforms.outbox.table.field.event.id": "id",
            "transforms.outbox.table.field.event.key": "aggregateid",
            "transforms.outbox.table.field.event.payload": "payload",
            "transforms.outbox.table.fields.additional.placement": "type:header:eventType",
        }
        if self.event_time:
            config["transforms.outbox.table.field.event.timestamp"] = self.event_time
        if self.exactly_once:
            config["exactly.once.support"] = "required"
            if self.transaction_interval_ms:        # one transaction per interval, not per poll: a crash
                config["transaction.boundary"] = "interval"     # aborts the interval's records
                config["transaction.boundary.interval.ms"] = str(self.transaction_interval_ms)
        return config

    def _worker_properties(self) -> str:
        props = {
            "bootstrap.servers": self.bootstrap,
            "group.id": self.name,
            "config.storage.topic": self.internal_topics[0],
            "offset.storage.topic": self.internal_topics[1],
            "status.storage.topic": self.internal_topics[2],
            # -1: the broker's default.replication.factor
            "config.storage.replication.factor": "-1",
            "offset.storage.replication.factor": "-1",
            "status.storage.replication.factor": "-1",
            "offset.storage.partitions": "1",
            "status.storage.partitions": "1",
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "value.converter": "org.apache.kafka.connect.storage.StringConverter",
            "listeners": f"http://127.0.0.1:{self.rest_port}",
            "rest.advertised.host.name": "127.0.0.1",
            "rest.advertised.port": str(self.rest_port),
            "plugin.path": str(self._libs / "plugins"),
            # Every plugin used has a ServiceLoader manifest: no scan of every jar at each start.
            "plugin.discovery": "service_load",
            "offset.flush.interval.ms": str(self.offset_flush_ms),
            # A worker that was killed leaves the group after this (the broker's minimum), and its
            # tasks go to the new one at once instead of after scheduled.rebalance.max.delay.ms (5 min).
            "session.timeout.ms": "6000",
            "heartbeat.interval.ms": "1500",
            "scheduled.rebalance.max.delay.ms": "0",
            "task.shutdown.graceful.timeout.ms": "5000",
            "exactly.once.source.support": "enabled" if self.exactly_once else "disabled",
        }
        return "".join(f"{key}={value}\n" for key, value in props.items())

    def _spawn_connect(self) -> None:
        self.rest_port = free_port()
        properties = self.connect_dir / "worker.properties"
        properties.write_text(self._worker_properties())
        self._log_file = open(self.connect_log, "ab")
        self._log_file.write(f"\n===== [outbox-relay] worker starting, REST {self.rest_url}, "
                             f"{time.strftime('%H:%M:%S')} =====\n".encode())
        self._log_file.flush()
        self._log_offset = self.connect_log.stat().st_size
        command = ["java", *CONNECT_HEAP, "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                   f"-Dlog4j2.configurationFile={LOG4J_CONFIG}", "-cp", f"{self._libs / 'libs'}/*",
                   "org.apache.kafka.connect.cli.ConnectDistributed", str(properties)]
        self.connect_proc = subprocess.Popen(command, cwd=self.connect_dir, stdin=subprocess.DEVNULL,
                                             stdout=self._log_file, stderr=subprocess.STDOUT, start_new_session=True)
        (self.connect_dir / "connect.pid").write_text(str(self.connect_proc.pid))

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def _wait_ready(self, timeout: float) -> None:
        """The worker's REST API answers and it has joined its group (``GET /health`` says 200)."""
        def healthy():
            code, body = self._rest("GET", "/health", quiet=True)
            return code == 200 and body
        self._wait(healthy, timeout, "the Connect worker's REST API healthy")

    def _put_connector(self) -> None:
        last: list = []

        def put():
            code, body = self._rest("PUT", f"/connectors/{CONNECTOR}/config", self.connector_config(), quiet=True)
            if code in (200, 201):
                return True
            last[:] = [code, body]
            message = body.get("message", "") if isinstance(body, dict) else str(body)
            # 409: a rebalance under way, try again. Anything else will not change: a configuration the
            # connector's validation refused (the database unreachable, a bad setting) comes back from
            # Connect 4.3 as a 500 with a NullPointerException (AbstractHerder.maybeAddConfigErrors);
            # the cause is in the log's ERROR lines.
            if code is None or code == 409:
                return False
            raise RelayError(f"the worker refused the connector ({code}): {message}\n"
                             f"--- Connect log ({self.connect_log}):\n{self.log_tail()}")
        try:
            self._wait(put, 60.0, "the connector's configuration accepted")
        except RelayError as exc:
            if last and "refused" not in str(exc):
                raise RelayError(f"{exc}\n--- last answer of the REST API: {last}") from None
            raise

    def _wait_running(self, timeout: float) -> dict:
        """The connector and task 0 RUNNING in this worker (its worker id: a status record of a
        killed predecessor does not count)."""
        def running():
            code, status = self._rest("GET", f"/connectors/{CONNECTOR}/status", quiet=True)
            if code != 200:
                return None
            tasks = status.get("tasks") or []
            mine = [part for part in [status.get("connector", {}), *tasks] if part.get("worker_id") == self.worker_id]
            failed = [part for part in mine if part.get("state") == "FAILED"]
            if failed:
                raise RelayError(f"the connector or its task FAILED: {failed[0].get('trace', '')[:3000]}\n"
                                 f"--- Connect log:\n{self.log_tail()}")
            if (status.get("connector", {}).get("state") == "RUNNING" and tasks
                    and all(t.get("state") == "RUNNING" and t.get("worker_id") == self.worker_id for t in tasks)
                    and status["connector"].get("worker_id") == self.worker_id):
                return status
            return None
        return self._wait(running, timeout, "the connector and its task RUNNING in this worker")

    def _wait(self, predicate, timeout: float, what: str):
        deadline = time.monotonic() + max(timeout, 1.0)
        last = None
        while time.monotonic() < deadline:
            if not self.connect_alive:
                raise RelayError(f"the Connect worker exited ({self.connect_proc.returncode}) while waiting for "
                                 f"{what}\n--- Connect log ({self.connect_log}):\n{self.log_tail()}")
            last = predicate()
            if last:
                return last
            time.sleep(0.2)
        raise RelayError(f"{what}: not reached within {timeout:.0f}s\n--- Connect log ({self.connect_log}):\n"
                         f"{self.log_tail()}")

    def _rest(self, method: str, path: str, body: dict | None = None, *, quiet: bool = False
              ) -> tuple[int | None, dict | list | str | None]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.rest_url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, _json(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, _json(exc.read())
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            if quiet:
                return None, None
            raise

    def log_tail(self, lines: int = 60) -> str:
        """The end of this worker's log: of its latest start only, its ERROR lines first."""
        if self.connect_dir is None or not self.connect_log.exists():
            return "(no Connect log)"
        with open(self.connect_log, "rb") as log:
            log.seek(self._log_offset)
            text = log.read().decode(errors="replace").splitlines()
        # (every start logs one harmless ERROR: Debezium's CloudEventsConverter, unused here, does not
        # load in this worker: "Failed to discover Converter")
        errors: dict[str, None] = {}     # each ERROR line (without its time) and the line after it, once
        for i, line in enumerate(text):
            if " ERROR " in line and "Failed to discover" not in line:
                after = text[i + 1] if i + 1 < len(text) and not text[i + 1].startswith("[") else ""
                errors.setdefault(f"{line.split('] ', 1)[-1][:400]}\n    {after[:400]}".rstrip(), None)
        shown = list(errors)[:8]
        head = ("ERROR lines:\n" + "\n".join(shown) + "\n--- last lines:\n") if shown else ""
        return head + "\n".join(text[-lines:])

    # -- the upstream --------------------------------------------------------------
    def _start_upstream(self) -> None:
        self.db = Server(self.home, "upstream", 1)
        self.db.home.mkdir()
        _give_to_mysql(self.db.home)
        _install(self.db.datadir)
        self.db.start([f"--version={UPSTREAM_VERSION}", "--binlog-row-image=FULL", "--default-time-zone=+00:00"])
        self.db.execute(*SCHEMA)

    def connect(self, *, autocommit: bool = False) -> pymysql.connections.Connection:
        """A connection of the order service to ``shop`` (autocommit off: commit or roll back)."""
        return pymysql.connect(host="127.0.0.1", port=self.db.port, user=SHOP_USER, password=SHOP_PASSWORD,
                               database=DATABASE, charset="utf8mb4", autocommit=autocommit, connect_timeout=5,
                               cursorclass=pymysql.cursors.DictCursor)

    def execute(self, sql: str, params: Iterable | dict | None = None) -> list[dict]:
        """One statement in a transaction of its own (autocommit); returns its rows."""
        with closing(self.connect(autocommit=True)) as conn, conn.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())

    @staticmethod
    def insert_event(cursor, aggregateid: str, type: str, payload: str, *, event_id: str | None = None,
                     aggregatetype: str = "order") -> OutboxEvent:
        """An outbox row in the cursor's transaction."""
        event = OutboxEvent(event_id or str(uuid.uuid4()), aggregateid, type, payload, aggregatetype)
        cursor.execute("INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (%s, %s, %s, %s, %s)",
                       (event.id, event.aggregatetype, event.aggregateid, event.type, event.payload))
        return event

    def write_order(self, order_no: str, events: Iterable[tuple[str, str]], *, status: str | None = None,
                    commit: bool = True) -> list[OutboxEvent]:
        """One transaction of the order service: the order (inserted, or its status updated) and an
        outbox row per ``(type, payload)``; committed, or rolled back with ``commit=False``."""
        events = list(events)
        with closing(self.connect()) as conn, conn.cursor() as cur:
            cur.execute("INSERT INTO orders (order_no, status) VALUES (%s, %s) "
                        "ON DUPLICATE KEY UPDATE status = VALUES(status)",
                        (order_no, status or (events[-1][0] if events else "new")))
            written = [self.insert_event(cur, order_no, type_, payload) for type_, payload in events]
            if commit:
                conn.commit()
            else:
                conn.rollback()
        return written

    def outbox(self) -> dict[str, dict]:
        """The committed outbox rows by id, ``created_at_ms`` (what the record's timestamp is) added."""
        rows = self.execute("SELECT id, aggregatetype, aggregateid, type, payload, "
                            "CAST(UNIX_TIMESTAMP(created_at) * 1000 AS UNSIGNED) AS created_at_ms FROM outbox")
        return {row["id"]: row for row in rows}


def _json(raw: bytes):
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return raw.decode(errors="replace")


def _with_admin(bootstrap: str, work, timeout: float = 30.0):
    """``await work(admin)`` with an aiokafka admin client, in a thread and event loop of its own
    (the caller may be inside a running event loop); returns its result or raises its error."""
    async def run():
        from aiokafka.admin import AIOKafkaAdminClient
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout * 1000))
        await admin.start()
        try:
            return await work(admin)
        finally:
            await admin.close()

    outcome: dict[str, object] = {}

    def thread_main():
        try:
            outcome["result"] = asyncio.run(asyncio.wait_for(run(), timeout))
        except BaseException as exc:     # handed to the caller
            outcome["error"] = exc

    thread = threading.Thread(target=thread_main, name="outbox-relay-admin", daemon=True)
    thread.start()
    thread.join(timeout + 5)
    if "error" in outcome:
        raise outcome["error"]
    if "result" not in outcome:
        raise TimeoutError(f"Kafka at {bootstrap} did not answer within {timeout:.0f}s")
    return outcome["result"]


def _topics(bootstrap: str) -> set[str]:
    async def work(admin):
        return set(await admin.list_topics())
    return _with_admin(bootstrap, work)


def _delete_topics(bootstrap: str, names: list[str], timeout: float = 30.0) -> None:
    """Delete those of ``names`` that exist (best effort: a broker that is gone is no reason to fail a
    stop)."""
    async def work(admin):
        existing = set(await admin.list_topics()) & set(names)
        if existing:
            await admin.delete_topics(sorted(existing))
    try:
        _with_admin(bootstrap, work, timeout)
    except Exception:     # best effort
        pass


def reap_leftovers() -> None:
    """SIGKILL the upstreams and workers of relays whose process died before stopping them, delete
    their internal topics and remove their folders (a folder's ``owner.pid`` names its process; a
    server's command line must name the folder)."""
    reap_pair_leftovers()     # the MariaDB data directory template (_install) of a dead process
    reap(SCRATCH_PREFIX, lambda home: (*home.glob("*/mariadbd.pid"), home / "connect" / "connect.pid"),
         then=_delete_relay_topics)


def _delete_relay_topics(home: Path) -> None:
    try:
        relay = json.loads((home / "relay.json").read_text())
        _delete_topics(relay["bootstrap"], relay["topics"], timeout=10.0)
    except (OSError, ValueError, KeyError):
        pass
