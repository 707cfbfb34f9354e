"""The two reference points the pipeline is compared with.

(a) ``raw_ceiling``: an aiokafka consumer that does nothing but consume and
    commit (``getmany(max_records=500)``, one commit per ``getmany``). No
    design that reads the same topic the same way can be faster.
(b) ``naive``: the usual baseline design, one event at a time, one
    transaction per event::

        claim      INSERT INTO t_idem ... ON DUPLICATE KEY UPDATE      (1 round trip)
        work       INSERT / UPDATE t_order      (CONFIRM: SELECT address + UPDATE)
        effect     CONFIRM only: POST /v1/waybills inline, inside the transaction
        done       UPDATE t_idem SET status = done                      (1 round trip)
        COMMIT                                                          (1 round trip)

    A duplicate costs the claim and the commit. The claim learns whether the
    key existed without an extra read: on a duplicate key the ODKU assigns
    ``status = LAST_INSERT_ID(status)``, and the server returns that value as
    the statement's insert id (0 for a fresh insert: t_idem has no
    AUTO_INCREMENT). Offsets are committed after each ``getmany``, as in (a).

Both clocks start when the first records arrive (the group join is not
counted) and stop when the commit covering the last record returned.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

import aiohttp
from aiokafka import AIOKafkaConsumer, TopicPartition
from sqlalchemy.ext.asyncio import AsyncConnection

from app.adapters.kafka.connection import KafkaConnection, connection_of
from app.adapters.mysql.engine import create_engine
from app.pipeline.events import EventType, OrderEvent, decode
from app.settings import Settings

MAX_RECORDS = 500


@dataclass
class Measurement:
    name: str
    events: int
    seconds: float                     # first records received -> last commit returned
    seconds_with_join: float           # consumer started -> last commit returned
    db_round_trips: int | None = None
    extra: dict = field(default_factory=dict)

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


def _consumer(kafka: KafkaConnection | str, topic: str, group: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(topic, group_id=group, enable_auto_commit=False, auto_offset_reset="earliest",
                            **connection_of(kafka).client_options())


async def raw_ceiling(bootstrap: KafkaConnection | str, topic: str, total: int, group: str, *, timeout: float) -> Measurement:
    consumer = _consumer(bootstrap, topic, group)
    await consumer.start()
    started, first, seen = time.perf_counter(), None, 0
    try:
        while seen < total:
            _check_deadline(started, timeout, "raw consumer", seen, total)
            batches = await consumer.getmany(timeout_ms=1000, max_records=MAX_RECORDS)
            count = sum(len(records) for records in batches.values())
            if count:
                first = first or time.perf_counter()
                seen += count
                await consumer.commit()
    finally:
        await consumer.stop()
    end = time.perf_counter()
    return Measurement("a", seen, end - (first or end), end - started)


async def naive(bootstrap: KafkaConnection | str, topic: str, count: int, group: str, *, mysql_url: str, logistics_url: str,
                timeout: float) -> Measurement:
    """Run the first ``count`` records of ``topic`` through the one-transaction-per-event design."""
    engine = create_engine(Settings(mysql_url=mysql_url, db_pool_size=1), url=mysql_url)
    consumer = _consumer(bootstrap, topic, group)
    async with aiohttp.ClientSession() as http, engine.connect() as conn:
        handler = NaiveHandler(conn, http, logistics_url, owner=f"bench-naive-{uuid.uuid4().hex[:6]}")
        await consumer.start()
        started, first, seen = time.perf_counter(), None, 0
        try:
            while seen < count:
                _check_deadline(started, timeout, "naive consumer", seen, count)
                batches = await consumer.getmany(timeout_ms=1000, max_records=MAX_RECORDS)
                if batches:
                    first = first or time.perf_counter()
                done: dict[TopicPartition, int] = {}
                for tp, records in batches.items():
                    for record in records[:count - seen]:
                        await handler.handle(record.key, record.value)
                        done[tp] = record.offset + 1
                        seen += 1
                if done:
                    await consumer.commit(done)
        finally:
            await consumer.stop()
    await engine.dispose()
    end = time.perf_counter()
    return Measurement("b", seen, end - (first or end), end - started, handler.round_trips,
                       {"duplicates": handler.duplicates, "waybill_calls": handler.calls})


def _check_deadline(started: float, timeout: float, what: str, seen: int, total: int) -> None:
    if time.perf_counter() - started > timeout:
        raise TimeoutError(f"{what}: {seen} of {total} records after {timeout:.0f}s")


class NaiveHandler:
    """One event, one transaction; counts every statement and commit as a round trip."""

    CLAIM = ("INSERT INTO t_idem (biz_key, part_date, step, status, attempt, owner, lease_until, idem_token, "
             "payload_hash, gmt_create, gmt_modified) VALUES (%s, %s, %s, 1, 1, %s, NOW(3) + INTERVAL 30 SECOND, "
             "%s, %s, NOW(3), NOW(3)) ON DUPLICATE KEY UPDATE attempt = IF(status = 2, attempt, attempt + 1), "
             "status = LAST_INSERT_ID(status)")
    DONE = ("UPDATE t_idem SET status = 2, outcome = %s, lease_until = NULL, gmt_modified = NOW(3) "
            "WHERE biz_key = %s AND part_date = %s AND status = 1")

    def __init__(self, conn: AsyncConnection, http: aiohttp.ClientSession, logistics_url: str, *, owner: str):
        self.conn, self.http, self.owner = conn, http, owner
        self.waybills_url = f"{logistics_url.rstrip('/')}/v1/waybills"
        self.round_trips = self.duplicates = self.calls = 0

    async def _exec(self, sql: str, *params):
        self.round_trips += 1
        return await self.conn.exec_driver_sql(sql, params)

    async def handle(self, key: bytes | None, value: bytes | None) -> None:
        event = decode(key, value, max_bytes=1024 * 1024)
        biz_key, token = f"{event.order_no}:{event.type.value}", uuid.uuid4().hex
        claim = await self._exec(self.CLAIM, biz_key, event.part_date, event.type.value.lower()[:32],
                                 self.owner, token, event.payload_hash)
        if claim.lastrowid:            # the key existed: its status came back as the insert id
            self.duplicates += 1
        else:
            await self._work(event, token)
            await self._exec(self.DONE, "applied", biz_key, event.part_date)
        await self.conn.commit()
        self.round_trips += 1

    async def _work(self, event: OrderEvent, token: str) -> None:
        data = event.data
        if event.type is EventType.CREATED:
            await self._exec("INSERT INTO t_order (order_no, status, amount_cents, phone, address, gmt_create, "
                             "gmt_modified) VALUES (%s, 1, %s, %s, %s, NOW(3), NOW(3))",
                             event.order_no, data["amount_cents"], data["phone"], data["address"])
        elif event.type is EventType.PAID:
            await self._exec("UPDATE t_order SET status = 2, paid_cents = %s, gmt_modified = NOW(3) "
                             "WHERE order_no = %s AND status = 1", data["amount_cents"], event.order_no)
        elif event.type is EventType.CONFIRM:
            rows = await self._exec("SELECT address FROM t_order WHERE order_no = %s FOR UPDATE", event.order_no)
            address = rows.scalar_one()
            await self._exec("UPDATE t_order SET status = 3, gmt_modified = NOW(3) WHERE order_no = %s "
                             "AND status = 2", event.order_no)
            await self._issue_waybill(event.order_no, address, token)
        else:
            raise ValueError(f"the naive baseline does not handle {event.type.value}")

    async def _issue_waybill(self, order_no: str, address: str, token: str) -> None:
        self.calls += 1
        async with self.http.post(self.waybills_url, json={"order_no": order_no, "address": address},
                                  headers={"Idempotency-Key": token},
                                  timeout=aiohttp.ClientTimeout(total=3)) as resp:
            await resp.read()
            if resp.status not in (200, 201):
                raise RuntimeError(f"logistics answered {resp.status} for {order_no}")
