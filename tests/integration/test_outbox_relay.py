"""The outbox relay fixture (``harness/outbox_relay.py``) delivers what the order service committed,
through a crash of the Kafka Connect worker, and nothing it rolled back.

For each mode (exactly once: Kafka transactions; at least once): orders written in transactions (some
rolled back, two left open across the crash), the Connect JVM SIGKILLed while a writer is still
writing, restarted, more orders; then the topic is read with ``isolation_level="read_committed"``
until every committed outbox row arrived and up to the end of the topic. Every record must be a
committed row, byte for byte: key = the order number, header ``id`` = the row's id, header
``eventType`` = its type, value = its payload, timestamp = its ``created_at``."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from harness.outbox_relay import OutboxEvent, OutboxRelay

pytestmark = pytest.mark.timeout(240)

ARRIVAL_TIMEOUT = 90.0


def payload(order: int, step: int) -> str:
    """JSON text as an application writes it: not canonical (spacing, an escape, non-ASCII), so that
    any re-serialisation on the way would show; every fifth order's first event is large."""
    if order % 5 == 0 and step == 0:
        return json.dumps({"order": order, "note": "é" * 20_000}, ensure_ascii=False)
    return (f'{{"order": {order},  "step":{step}, "customer": "Zoë Ølsen ✓ 🚚", '
            f'"escaped": "caf\\u00e9\\n", "lines": [ {{"sku": "A-{order}", "qty": 2, "price": 12.50}} ]}}')


def is_rolled_back(order: int) -> bool:
    return order % 4 == 3


class Ledger:
    """What the order service committed and rolled back, by event id."""

    def __init__(self, relay: OutboxRelay) -> None:
        self.relay = relay
        self.committed: dict[str, OutboxEvent] = {}
        self.rolled_back: dict[str, OutboxEvent] = {}

    def order(self, n: int) -> None:
        events = [("OrderPlaced", payload(n, 0))] + ([("OrderPaid", payload(n, 1))] if n % 2 else [])
        commit = not is_rolled_back(n)
        written = self.relay.write_order(f"order-{n:04d}", events, commit=commit)
        (self.committed if commit else self.rolled_back).update({event.id: event for event in written})

    def orders(self, numbers) -> None:
        for n in numbers:
            self.order(n)

    def write_through(self, first: int, killed: threading.Event, after: int = 3, most: int = 40) -> int:
        """Orders from ``first`` on, one every 50 ms, until ``after`` of them were written once
        ``killed`` is set; returns the next order number."""
        n, since_kill = first, 0
        while since_kill < after and n < first + most:
            self.order(n)
            n += 1
            since_kill += killed.is_set()
            time.sleep(0.05)
        return n


class Collector:
    """Reads the topic from the beginning, in the background, as it fills."""

    def __init__(self, bootstrap: str, topic: str, isolation_level: str) -> None:
        self.consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None,
                                         auto_offset_reset="earliest", enable_auto_commit=False,
                                         isolation_level=isolation_level)
        self.records: list = []
        self.task: asyncio.Task | None = None

    async def start(self) -> Collector:
        await self.consumer.start()
        self.task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        while True:
            batch = await self.consumer.getmany(timeout_ms=200)
            for records in batch.values():
                self.records.extend(records)

    def ids(self) -> set[str]:
        return {dict(record.headers).get("id", b"").decode() for record in self.records}

    async def wait_for(self, predicate, what: str, timeout: float = ARRIVAL_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.task.done():
                self.task.result()
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout:.0f}s ({len(self.records)} records read)")
            await asyncio.sleep(0.1)

    async def drain(self, timeout: float = 30.0) -> None:
        """Up to the end of every partition (the last stable offset under read_committed)."""
        [topic] = self.consumer.subscription()
        partitions = [TopicPartition(topic, p) for p in sorted(self.consumer.partitions_for_topic(topic))]
        ends = await self.consumer.end_offsets(partitions)
        deadline = time.monotonic() + timeout
        while True:
            positions = {tp: await self.consumer.position(tp) for tp in partitions}
            if all(positions[tp] >= end for tp, end in ends.items()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the consumer not at the end of {topic} within {timeout:.0f}s: "
                                     f"{positions} < {ends}")
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass
        await self.consumer.stop()


@pytest.fixture
def pair(topics):
    """A fresh event topic (3 partitions), made outside the test's event loop."""
    return topics(partitions=3)


@pytest.mark.parametrize("exactly_once", [True, False], ids=["exactly-once", "at-least-once"])
async def test_outbox_relay_survives_a_connect_crash(settings, pair, exactly_once):
    relay = OutboxRelay(bootstrap=settings.kafka.bootstrap, topic=pair.events, exactly_once=exactly_once)
    ledger = Ledger(relay)
    committed_reader = Collector(settings.kafka.bootstrap, pair.events, "read_committed")
    everything_reader = Collector(settings.kafka.bootstrap, pair.events, "read_uncommitted")
    try:
        await asyncio.to_thread(relay.start_upstream)
        # Before the connector ever ran: its snapshot must relay these.
        await asyncio.to_thread(ledger.orders, range(1, 4))
        await asyncio.to_thread(relay.start)
        await committed_reader.start()
        await everything_reader.start()

        await asyncio.to_thread(ledger.orders, range(4, 9))
        # Two transactions open across the crash: one commits after it, one rolls back.
        span_commit, span_rollback = relay.connect(), relay.connect()
        with span_commit.cursor() as cur:
            cur.execute("INSERT INTO orders (order_no, status) VALUES ('order-span-1', 'OrderPlaced')")
            span_event = relay.insert_event(cur, "order-span-1", "OrderPlaced", payload(100, 0))
        with span_rollback.cursor() as cur:
            cur.execute("INSERT INTO orders (order_no, status) VALUES ('order-span-2', 'OrderPlaced')")
            doomed = relay.insert_event(cur, "order-span-2", "OrderPlaced", payload(101, 0))
            ledger.rolled_back[doomed.id] = doomed
        # SIGKILL mid-stream: once the writer's first orders are being relayed, while it goes on writing.
        killed = threading.Event()
        writer = asyncio.create_task(asyncio.to_thread(ledger.write_through, 9, killed))

        def writer_relayed() -> bool:
            return writer.done() or any(record.key.startswith(b"order-0") and int(record.key[6:]) >= 9
                                        for record in committed_reader.records)
        await committed_reader.wait_for(writer_relayed, "the writer's first records relayed")
        await asyncio.to_thread(relay.kill_connect)
        killed.set()
        following = await writer
        await asyncio.to_thread(ledger.orders, range(following, following + 3))     # while the relay is down
        following += 3
        span_commit.commit()
        ledger.committed[span_event.id] = span_event
        span_rollback.rollback()
        span_commit.close()
        span_rollback.close()
        restart = await asyncio.to_thread(relay.restart_connect)
        await asyncio.to_thread(ledger.orders, range(following, following + 5))

        rows = await asyncio.to_thread(relay.outbox)
        assert set(rows) == set(ledger.committed), "the upstream holds exactly the committed outbox rows"
        await committed_reader.wait_for(lambda: set(rows) <= committed_reader.ids(),
                                        f"all {len(rows)} committed outbox rows relayed")
        await committed_reader.drain()
        await everything_reader.drain()

        for record in committed_reader.records:
            headers = dict(record.headers)
            assert set(headers) == {"id", "eventType"}, record
            event_id = headers["id"].decode()
            assert event_id not in ledger.rolled_back, f"a rolled-back outbox row was relayed: {record}"
            row = rows.get(event_id)
            assert row is not None, f"a record that is no committed outbox row: {record}"
            assert record.key == row["aggregateid"].encode()
            assert headers["eventType"] == row["type"].encode()
            assert record.value == row["payload"].encode("utf-8"), f"payload of {event_id} changed on the way"
            assert record.timestamp == row["created_at_ms"]
        # Not even in an aborted Kafka transaction.
        assert not (everything_reader.ids() & set(ledger.rolled_back))

        copies = Counter(dict(record.headers)["id"] for record in committed_reader.records)
        resent = sum(count - 1 for count in copies.values())
        aborted = len(everything_reader.records) - len(committed_reader.records)
        print(f"\n[outbox relay, exactly_once={exactly_once}] upstream {relay.timings['upstream'][0]:.1f}s, "
              f"start {relay.timings['start'][0]:.1f}s, "
              f"restart after SIGKILL {restart:.1f}s; {len(rows)} committed rows, "
              f"{len(ledger.rolled_back)} rolled back; {len(committed_reader.records)} records read committed "
              f"({resent} sent again), {aborted} more in aborted transactions or not yet committed")
        if exactly_once:
            assert resent == 0, f"exactly once, yet {resent} records arrived twice: {copies.most_common(3)}"
    finally:
        await committed_reader.stop()
        await everything_reader.stop()
        await asyncio.to_thread(relay.stop)
