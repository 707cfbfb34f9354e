"""What the chaos checker reads, straight from the sources: the events and dead-letter topics
and the group's offsets (aiokafka), the tables (PyMySQL), the fake services' ledger (urllib).

Nothing here imports the pipeline. Every read is in bulk and bounded: the topics are read
once from the beginning to the end offsets seen at the start, the tables by chunks of keys
(primary keys and ``uk_source``'s prefix), the ledger in one GET.

The brokers are reached the way the manifest's ``kafka`` says (PLAINTEXT when it says nothing;
SASL_SSL with the run's CA and user on the three-node cluster): the checker builds its own
TLS context and SASL options, from aiokafka alone.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
import urllib.request
from collections.abc import Iterable, Sequence
from contextlib import closing
from dataclasses import dataclass, field

import pymysql
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.helpers import create_ssl_context

CHUNK = 2000                 # keys per IN list
READ_TIMEOUT = 180.0         # seconds to read one topic to its end
ORDER_DATE = re.compile(r"ORD-([0-9]{4})([0-9]{2})([0-9]{2})-")


def client_options(manifest: dict) -> dict:
    """aiokafka's connection keyword arguments for the run's brokers, from the manifest."""
    kafka = manifest.get("kafka") or {}
    options = {"bootstrap_servers": kafka.get("bootstrap") or manifest["bootstrap"],
               "security_protocol": kafka.get("security_protocol", "PLAINTEXT")}
    if options["security_protocol"] in ("SSL", "SASL_SSL"):
        context = create_ssl_context(cafile=kafka.get("ssl_cafile"), certfile=kafka.get("ssl_certfile"),
                                     keyfile=kafka.get("ssl_keyfile"))
        context.check_hostname = bool(kafka.get("ssl_check_hostname", True))
        options["ssl_context"] = context
    if options["security_protocol"] in ("SASL_PLAINTEXT", "SASL_SSL"):
        options.update(sasl_mechanism=kafka["sasl_mechanism"], sasl_plain_username=kafka["sasl_username"],
                       sasl_plain_password=kafka["sasl_password"])
    return options


def record_digest(key: bytes | None, value: bytes | None) -> str:
    """What the producer sent, in 16 hex digits: the checker finds the same bytes at the record's
    acknowledged offset, or the log lost or replaced it. A missing key or value is not an empty one."""
    digest = hashlib.sha256()
    for part in (key, value):
        digest.update(b"\xff" if part is None else len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class TopicRecord:
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name and value is not None:
                return value.decode("utf-8", "replace")
        return None


@dataclass
class TopicRead:
    """A topic read to the end offsets it had when the read began."""

    records: list[TopicRecord] = field(default_factory=list)
    ends: dict[int, int] = field(default_factory=dict)
    committed: dict[int, int] = field(default_factory=dict)     # the group's; absent: nothing committed
    error: str | None = None


async def read_topic(kafka: dict, topic: str, group: str, *, timeout: float = READ_TIMEOUT,
                     isolation_level: str = "read_committed") -> TopicRead:
    """Every record of ``topic`` and ``group``'s committed offsets on it, without joining the group.
    ``kafka``: :func:`client_options`. ``read_committed`` as the workers read: an upstream's aborted
    transactions are not its records."""
    read = TopicRead()
    consumer = AIOKafkaConsumer(**kafka, group_id=None, enable_auto_commit=False, isolation_level=isolation_level,
                                auto_offset_reset="earliest", fetch_max_bytes=32 * 1024 * 1024,
                                max_partition_fetch_bytes=16 * 1024 * 1024, request_timeout_ms=30_000)
    try:
        await consumer.start()
        partitions, read.committed = await group_view(kafka, group, topic)
        if not partitions:
            read.error = f"topic {topic} not found"
            return read
        tps = [TopicPartition(topic, p) for p in partitions]
        read.ends = {tp.partition: offset for tp, offset in (await consumer.end_offsets(tps)).items()}
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + timeout
        left = {tp for tp in tps if read.ends[tp.partition] > 0}
        while left:
            if time.monotonic() > deadline:
                read.error = f"{topic}: not read to its end within {timeout:g}s"
                break
            batch = await consumer.getmany(*left, timeout_ms=500)
            for tp, items in batch.items():
                read.records += [TopicRecord(m.partition, m.offset, m.timestamp, m.key, m.value,
                                             tuple(m.headers or ())) for m in items
                                 if m.offset < read.ends[tp.partition]]
            for tp in list(left):
                if await consumer.position(tp) >= read.ends[tp.partition]:
                    left.discard(tp)
    except Exception as exc:        # a topic the checker cannot read is a finding, not a crash
        read.error = f"{topic}: {exc!r}"
    finally:
        await consumer.stop()
    return read


async def group_view(kafka: dict, group: str, topic: str) -> tuple[list[int], dict[int, int]]:
    """The topic's partitions, and the group's committed offsets on them (an OffsetFetch: the
    group is not joined, so the run's consumers are not disturbed)."""
    admin = AIOKafkaAdminClient(**kafka, request_timeout_ms=30_000)
    await admin.start()
    try:
        [described] = await admin.describe_topics([topic])
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    partitions = sorted(p["partition"] for p in described.get("partitions") or ()) if not described.get(
        "error_code") else []
    return partitions, {tp.partition: meta.offset for tp, meta in offsets.items()
                        if tp.topic == topic and meta.offset >= 0}


def read_topics(kafka: dict, events: str, dlq: str, group: str) -> tuple[TopicRead, TopicRead]:
    async def both():
        return await asyncio.gather(read_topic(kafka, events, group), read_topic(kafka, dlq, group))
    return tuple(asyncio.run(both()))


# ---------------------------------------------------------------- the tables --

IDEM_COLUMNS = ("biz_key, step, status, attempt, owner, idem_token, outcome, last_err, gmt_create, "
                "gmt_modified")
LEDGER_COLUMNS = ("id, src_topic, src_partition, src_offset, src_timestamp, order_no, event_id, biz_key, status, "
                  "reason, LEFT(message, 300) AS message, retriable, attempts, redrives, may_be_superseded, worker_id")


@dataclass
class Tables:
    idem: dict[str, dict]              # biz_key -> row
    orders: dict[str, dict]            # order_no -> row
    receipts: dict[str, dict]          # order_no -> row
    ledger: list[dict]                 # the group's t_compensation rows of the two topics
    pending_anywhere: int              # pending t_idem rows in the whole database (capped)


def connect(mysql: dict) -> pymysql.connections.Connection:
    return pymysql.connect(host=mysql["host"], port=int(mysql["port"]), user=mysql["user"],
                           password=mysql.get("password") or "", database=mysql["database"], charset="utf8mb4",
                           autocommit=True, cursorclass=pymysql.cursors.DictCursor, connect_timeout=10,
                           read_timeout=120, write_timeout=120)


def _chunked(cur, sql: str, values: Sequence, *extra) -> list[dict]:
    """``sql`` with one ``{in}`` placeholder for an IN list, run over ``values`` in chunks."""
    rows: list[dict] = []
    for start in range(0, len(values), CHUNK):
        part = values[start:start + CHUNK]
        cur.execute(sql.format(marks=", ".join(["%s"] * len(part))), [*part, *extra])
        rows += cur.fetchall()
    return rows


def part_date(biz_key: str) -> str | None:
    """The partition date ``t_idem`` keeps a key under: the date inside its order number."""
    match = ORDER_DATE.match(biz_key)
    return f"{match[1]}-{match[2]}-{match[3]}" if match else None


def _idem_rows(cur, keys: Sequence[str]) -> list[dict]:
    """By primary key, the partition date named so each probe stays in its month's partition."""
    rows: list[dict] = []
    for start in range(0, len(keys), CHUNK):
        part = keys[start:start + CHUNK]
        dates = [part_date(k) for k in part]
        dates = sorted(set(dates)) if all(dates) else []      # a key without a date: look in every month
        by_date = f" AND part_date IN ({', '.join(['%s'] * len(dates))})" if dates else ""
        cur.execute(f"SELECT {IDEM_COLUMNS} FROM t_idem WHERE biz_key IN ({', '.join(['%s'] * len(part))})"
                    f"{by_date}", [*part, *dates])
        rows += cur.fetchall()
    return rows


def read_tables(mysql: dict, keys: Iterable[str], order_nos: Iterable[str], group: str,
                topics: Sequence[str]) -> Tables:
    keys, order_nos = sorted(set(keys)), sorted(set(order_nos))
    with closing(connect(mysql)) as conn, conn.cursor() as cur:
        idem = _idem_rows(cur, keys)
        orders = _chunked(cur, "SELECT order_no, status, amount_cents, phone, address, paid_cents, cancel_reason "
                               "FROM t_order WHERE order_no IN ({marks})", order_nos)
        receipts = _chunked(cur, "SELECT order_no, waybill_no, idem_token, biz_key, attempt "
                                 "FROM t_waybill_receipt WHERE order_no IN ({marks})", order_nos)
        cur.execute(f"SELECT {LEDGER_COLUMNS} FROM t_compensation WHERE consumer_group = %s "
                    f"AND src_topic IN ({', '.join(['%s'] * len(topics))}) ORDER BY id", [group, *topics])
        ledger = list(cur.fetchall())
        cur.execute("SELECT COUNT(*) AS n FROM (SELECT 1 FROM t_idem WHERE status = %s LIMIT 100000) AS p", [1])
        pending = cur.fetchone()["n"]
    return Tables({r["biz_key"]: r for r in idem}, {r["order_no"]: r for r in orders},
                  {r["order_no"]: r for r in receipts}, ledger, pending)


def read_windows(mysql: dict) -> list[dict]:
    """Every recovery window, oldest first."""
    with closing(connect(mysql)) as conn, conn.cursor() as cur:
        cur.execute("SELECT id, opened_at, ends_at, opened_by, reason, ended_at FROM t_recovery_window ORDER BY id")
        return list(cur.fetchall())


# ---------------------------------------------------------- the fake services --

def read_fakes_ledger(url: str, *, timeout: float = 120.0) -> dict:
    """``GET /__ledger``: every call, what each fake did per effect and order, the faults they injected."""
    with urllib.request.urlopen(f"{url.rstrip('/')}/__ledger", timeout=timeout) as answer:
        return json.loads(answer.read())
