"""Real MariaDB scratch databases, real Kafka topics, real worker processes."""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterable
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import pymysql
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from alembic import command

from app.adapters.kafka import ops as kafka_ops
from app.adapters.kafka.topics import TopicSpec
from app.adapters.mysql.engine import session_sql_mode, ssl_context
from app.adapters.mysql.schema import alembic_config
from app.settings import Settings, get_settings
from harness import preload

if TYPE_CHECKING:
    from harness.releases import Release

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / ".cache" / "test-logs"


_EPHEMERAL = (32768, 60999)          # Linux's default ip_local_port_range
_LOWEST = 10000
_given: set[int] = set()
_ports = random.Random(os.getpid() ^ time.time_ns())


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return _EPHEMERAL


def _share(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """This test process's share of ``ranges`` when the suite runs in several (pytest-xdist's
    ``PYTEST_XDIST_WORKER=gw<n>`` of ``PYTEST_XDIST_WORKER_COUNT``): a slice of each range of its own,
    so two processes never hand out the same port between a test's pick and its server's bind."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count <= 1:
        return ranges
    n = int(worker[2:])
    shared = []
    for lo, hi in ranges:
        step = (hi - lo + 1) // count
        shared.append((lo + n * step, lo + (n + 1) * step - 1))
    return shared


def free_port() -> int:
    """A port of 127.0.0.1 nobody listens on, for a server a test starts, outside the kernel's
    ephemeral range: a port the kernel picked (``bind(0)``) is one it may hand to an outgoing
    connection (a worker's to Kafka or MariaDB) before the server binds it, which failed the
    chaos run's worker with "address already in use". Never the same port twice in a process, nor
    in two test processes of one run (:func:`_share`)."""
    low, high = _ephemeral_range()
    ranges = _share([(lo, hi) for lo, hi in ((_LOWEST, low - 1), (high + 1, 65535)) if hi - lo > 1000])
    for _ in range(1000):
        lo, hi = _ports.choice(ranges) if ranges else (_LOWEST, 65535)
        port = _ports.randint(lo, hi)
        if port in _given:
            continue
        with closing(socket.socket()) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError("no free port outside the ephemeral range")


# ---------------------------------------------------------------- MariaDB --

def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def connect(url: str, *, database: bool = True, tls: ssl.SSLContext | None | bool = True,
            sql_mode: str | None = None) -> pymysql.connections.Connection:
    """A PyMySQL connection for the tests and the benchmarks; ``tls=True``: TLS as ``MYSQL_SSL_*``
    of this process's environment says (``app.adapters.mysql.engine.ssl_context``), like every connection of the app;
    its sql_mode set as the app's sessions set theirs."""
    parts = urlsplit(url)
    context = ssl_context(get_settings()) if tls is True else tls or None
    return pymysql.connect(host=parts.hostname, port=parts.port or 3306, user=parts.username,
                           password=parts.password or "", database=parts.path.lstrip("/") if database else None,
                           autocommit=True, cursorclass=pymysql.cursors.DictCursor, ssl=context,
                           init_command=f"SET SESSION {session_sql_mode(sql_mode)}")


def migrate(url: str, revision: str = "head", *, down: bool = False, sql_mode: str | None = None) -> None:
    """What ``python -m app.admin migrate`` runs: this code's migrations, without an ``alembic.ini``."""
    config = alembic_config(url, sql_mode)
    (command.downgrade if down else command.upgrade)(config, revision)


class ScratchDatabase:
    """A database of its own for one test session, migrated to head. With ``sql_mode``, the
    migrations and the test's own queries run in sessions of that mode (the app's engines
    take it from ``settings.database.sql_mode``)."""

    def __init__(self, base_url: str, label: str | None = None, *, sql_mode: str | None = None) -> None:
        base_name = urlsplit(base_url).path.lstrip("/")
        self.name = f"{base_name}_{label or 'test_' + uuid.uuid4().hex[:8]}"
        self.url = with_database(base_url, self.name)
        self.sql_mode = sql_mode or None

    def create(self, *, migrated: bool = True) -> ScratchDatabase:
        with closing(connect(self.url, database=False)) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{self.name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        if migrated:
            self.migrate()
        return self

    def migrate(self, revision: str = "head", *, down: bool = False) -> None:
        migrate(self.url, revision, down=down, sql_mode=self.sql_mode)

    def connect(self) -> pymysql.connections.Connection:
        return connect(self.url, sql_mode=self.sql_mode)

    def drop(self) -> None:
        with closing(connect(self.url, database=False)) as conn, conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{self.name}`")

    def query(self, sql: str, *args) -> list[dict]:
        with closing(self.connect()) as conn, conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())

    def scalar(self, sql: str, *args):
        rows = self.query(sql, *args)
        return next(iter(rows[0].values())) if rows else None


class ScratchDatabases:
    """Scratch databases made on first use, one per server and sql_mode, for the whole session:
    every module that runs its tests under each sql_mode shares them."""

    def __init__(self) -> None:
        self._made: dict[tuple[str, str | None], ScratchDatabase] = {}

    def get(self, settings: Settings) -> ScratchDatabase:
        key = (settings.database.url, settings.database.sql_mode or None)
        if key not in self._made:
            self._made[key] = ScratchDatabase(settings.database.url, sql_mode=settings.database.sql_mode).create()
        return self._made[key]

    def drop(self) -> None:
        for db in self._made.values():
            db.drop()


# ------------------------------------------------------------------ Kafka --
# The app's own Kafka operations (app.adapters.kafka.ops), with the test settings.

async def create_topics(settings: Settings, specs: list[TopicSpec]) -> None:
    """Create topics the way ``python -m app.admin create-topics`` does (same configs)."""
    await kafka_ops.create_topics(settings.kafka.bootstrap, specs)


async def delete_topics(settings: Settings, names: Iterable[str]) -> None:
    await kafka_ops.delete_topics(settings.kafka.bootstrap, names)


async def produce(settings: Settings, topic: str, records: Iterable[tuple[bytes | None, bytes | None]],
                  headers: list[tuple[str, bytes]] | None = None) -> int:
    return len(await kafka_ops.produce(settings.kafka.bootstrap, topic, records, headers=headers))


async def consume_all(settings: Settings, topic: str, *, expect: int, timeout: float = 60.0) -> list:
    """Read ``topic`` from the beginning until ``expect`` records arrived (or ``timeout``)."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=settings.kafka.bootstrap, group_id=None,
                                auto_offset_reset="earliest", enable_auto_commit=False,
                                fetch_max_bytes=16 * 1024 * 1024, max_partition_fetch_bytes=8 * 1024 * 1024)
    await consumer.start()
    records: list = []
    deadline = time.monotonic() + timeout
    try:
        while len(records) < expect and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for items in batch.values():
                records.extend(items)
    finally:
        await consumer.stop()
    return records


async def committed_offsets(settings: Settings, group: str, topic: str, partitions: int) -> dict[int, int]:
    return await kafka_ops.committed_offsets(settings.kafka.bootstrap, group, topic, partitions)


async def end_offsets(settings: Settings, topic: str, partitions: int, *,
                      isolation_level: str = "read_uncommitted") -> dict[int, int]:
    return await kafka_ops.end_offsets(settings.kafka.bootstrap, topic, partitions, isolation_level=isolation_level)


async def rewind_group(settings: Settings, group: str, topic: str, partitions: int) -> None:
    """What ``kafka-consumer-groups --reset-offsets --to-earliest --execute`` does for a group
    with no member: its committed offsets on ``topic`` go back to 0."""
    await commit_group(settings, group, topic, {p: 0 for p in range(partitions)})


async def commit_group(settings: Settings, group: str, topic: str, offsets: dict[int, int]) -> None:
    """What ``kafka-consumer-groups --reset-offsets --to-offset --execute`` does for a group with no
    member: its committed offsets on ``topic``'s partitions become ``offsets``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka.bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = {TopicPartition(topic, p): offset for p, offset in offsets.items()}
        consumer.assign(list(tps))
        await consumer.commit(tps)
    finally:
        await consumer.stop()


async def group_state(settings: Settings, group: str) -> tuple[str, int]:
    """The consumer group's state as the broker sees it ("Stable", "PreparingRebalance", ...) and how
    many members it has."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        [described] = await admin.describe_consumer_groups([group])
        _, _, state, _, _, members = described.groups[0][:6]
        return state, len(members)
    finally:
        await admin.close()


def caught_up(settings: Settings, topic: str, group: str, partitions: int) -> bool:
    """True once ``group`` has committed every record of ``topic``."""
    ends = asyncio.run(end_offsets(settings, topic, partitions))
    return asyncio.run(committed_offsets(settings, group, topic, partitions)) == ends


# ---------------------------------------------------------------- workers --

class Worker:
    """One ``faust -A app worker`` process with its own environment: of the current code, or with
    ``release`` of an earlier release (``harness.releases``: its own virtualenv and source tree, run
    from there with its source first on the path), so that a test can run both in one group."""

    def __init__(self, env: dict[str, str], name: str, release: Release | None = None) -> None:
        self.env = env
        self.name = name
        self.release = release
        self.web_port = int(env["WEB_PORT"])
        LOGS.mkdir(parents=True, exist_ok=True)
        self.log_path = LOGS / f"{name}-{uuid.uuid4().hex[:6]}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def version(self) -> str:
        """The release it runs, or "current" (the code of this checkout)."""
        return self.release.version if self.release is not None else "current"

    def start(self) -> Worker:
        args = ["-A", "app", "worker", "-l", "info"]
        if self.release is None:        # with the modules of a test's own its env names installed first
            argv, cwd, env = preload.command("faust", args, self.env, script=True), ROOT, self.env
        else:
            argv, cwd, env = [str(self.release.faust), *args], self.release.src, self.release.env(self.env)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, needle: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.logs():
                return
            if not self.alive:
                raise AssertionError(f"worker {self.name} exited ({self.proc.returncode}); log {self.log_path}")
            time.sleep(0.2)
        raise AssertionError(f"{needle!r} not in worker {self.name} log after {timeout}s; see {self.log_path}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive:
            self.proc.send_signal(sig)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait: a graceful stop."""
        if self.proc is None:
            return 0
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"worker {self.name} ignored SIGTERM for {timeout}s; see {self.log_path}") from None

    def wait_exit(self, timeout: float = 60.0) -> int:
        return self.proc.wait(timeout)


# The tests' deployment secret (IDEM_TOKEN_SECRET): fixed, so that a restarted worker derives
# the tokens its predecessor did, as one deployment's workers do.
TEST_TOKEN_SECRET = "tests-only-not-a-production-secret"


def worker_metric(worker: Worker, name: str, labels: str = "") -> float | None:
    """One sample of a worker's ``/metrics`` (``labels`` as written there, ``{effect="waybill"}``);
    None while it does not serve yet or has no such sample."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{worker.web_port}/metrics", timeout=10).read().decode()
    except OSError:                  # not serving yet
        return None
    found = re.search(rf"^{name}{re.escape(labels)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else None


def worker_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()}
    env.update({"WEB_PORT": str(free_port()), "PYTHONUNBUFFERED": "1"})
    env.setdefault("IDEM_TOKEN_SECRET", TEST_TOKEN_SECRET)
    env.update({k.upper(): str(v) for k, v in overrides.items()})
    return env


def wait_for(predicate, *, timeout: float = 60.0, interval: float = 0.25, what: str = "condition",
             workers: Iterable[Worker] = ()):
    """Poll ``predicate`` until it returns something truthy; a bound, not a timing goal.

    Fails at once if one of ``workers`` has exited."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        for worker in workers:
            if not worker.alive:
                raise AssertionError(f"worker {worker.name} exited ({worker.proc.returncode}) while waiting "
                                     f"for {what}; log {worker.log_path}")
        time.sleep(interval)
    raise AssertionError(f"{what} not reached within {timeout}s (last value: {last!r})")


class Topics:
    """A fresh ``order-event`` / ``order-event-dlq`` pair and consumer group for one test."""

    def __init__(self, settings: Settings, partitions: int = 4, dlq_partitions: int = 3) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.settings = settings
        self.events = f"test-order-event-{suffix}"
        self.dlq = f"test-order-event-dlq-{suffix}"
        self.group = f"test-group-{suffix}"
        self.partitions = partitions
        self.dlq_partitions = dlq_partitions

    def env(self) -> dict[str, str]:
        return {"ORDER_EVENT_TOPIC": self.events, "DLQ_TOPIC": self.dlq, "APP_ID": self.group,
                "ORDER_EVENT_PARTITIONS": str(self.partitions), "DLQ_PARTITIONS": str(self.dlq_partitions)}
