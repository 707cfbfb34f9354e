"""Records of an upstream that writes ``order-event`` in transactions (an outbox relay, Kafka
Streams or Spring with exactly-once): aiokafka's transactional producer and Kafka's Java
client, compressed and not, committed and aborted transactions interleaved with plain
records across partitions, one left open for a while.

What must hold: nothing of an aborted (or still open) transaction is acted on; everything
of a committed one is, exactly once; the group's committed offsets reach the end of every
partition, transaction markers included, so the lag gauge reads 0 and no alert fires on a
lag that is not there."""

from __future__ import annotations

import asyncio
import re
import urllib.request
import uuid

from aiokafka import AIOKafkaProducer

from app.adapters.kafka import ops as kafka_ops
from app.pipeline.events import decode
from app.pipeline.plan import step_keys
from harness.events import event, order_no, record
from harness.fakes import FakesProcess
from harness.java import java_produce, utf8
from harness.services import committed_offsets, end_offsets, wait_for

ENV = {"BATCH_WITHIN_SECONDS": "0.3", "METRICS_REFRESH_SECONDS": "1", "BROKER_COMMIT_INTERVAL_SECONDS": "0.5"}


class Upstream:
    """A transactional producer of aiokafka's; ``write`` sends one transaction."""

    def __init__(self, settings, topic: str, compression: str | None) -> None:
        self.settings, self.topic = settings, topic
        self.producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap, compression_type=compression,
                                         transactional_id=f"test-upstream-{uuid.uuid4().hex[:8]}",
                                         enable_idempotence=True, linger_ms=5)

    async def __aenter__(self) -> Upstream:
        await self.producer.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.producer.stop()

    async def transaction(self, docs: list[dict], *, commit: bool) -> None:
        async with self.producer.transaction() if commit else _aborting(self.producer):
            for doc in docs:
                key, value = record(doc)
                await self.producer.send(self.topic, value=value, key=key)

    async def plain(self, docs: list[dict]) -> None:
        await kafka_ops.produce(self.settings.kafka.bootstrap, self.topic, [record(d) for d in docs])


class _aborting:
    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.producer = producer

    async def __aenter__(self) -> None:
        await self.producer.begin_transaction()

    async def __aexit__(self, *exc) -> None:
        await self.producer.flush()             # written to the log first, then aborted
        await self.producer.abort_transaction()


def java_lines(docs: list[dict]) -> list[dict]:
    return [{"key": utf8(d["order_no"]), "value": utf8(record(d)[1].decode())} for d in docs]


def metric_values(worker, name: str) -> list[float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{worker.web_port}/metrics", timeout=10).read().decode()
    return [float(v) for v in re.findall(rf"^{name}{{[^}}]*}} (\S+)$", text, re.M)]


def keys_of(docs: list[dict]) -> list[str]:
    return [key for d in docs for key in step_keys(decode(*record(d), max_bytes=1 << 20))]


def test_only_committed_transactions_are_acted_on_and_commits_reach_the_end(settings, topics, spawn_worker,
                                                                            scratch_db):
    pair = topics(partitions=3)
    kept = [order_no(prefix="TXOK") for _ in range(24)]          # created and paid in committed transactions
    confirmed, cancelled = kept[::2], kept[1::2]
    plain = [order_no(prefix="TXPL") for _ in range(9)]         # plain records between the transactions
    ghosts = [order_no(prefix="TXAB") for _ in range(9)]        # exist only in aborted transactions
    held = kept[0]                                              # a cancel in a transaction left open a while

    async def write() -> None:
        async with Upstream(settings, pair.events, "gzip") as gz, Upstream(settings, pair.events, None) as raw:
            await gz.transaction([event(o, "ORDER_CREATED") for o in kept[:12]], commit=True)
            await raw.plain([event(o, "ORDER_CREATED") for o in plain])
            await raw.transaction([event(o, "ORDER_CREATED") for o in ghosts[:5]], commit=False)
            await raw.transaction([event(o, "ORDER_CREATED") for o in kept[12:]], commit=True)
            await gz.transaction([event(o, "ORDER_CANCEL") for o in confirmed], commit=False)
            await gz.transaction([event(o, "ORDER_PAID") for o in kept], commit=True)
            await raw.plain([event(o, "ORDER_PAID") for o in plain])
            await gz.transaction([event(o, "ORDER_CREATED") for o in ghosts[5:]]
                                 + [event(o, "ORDER_PAID") for o in ghosts], commit=False)
        # Kafka's Java client, as Kafka Streams or Spring writes: zstd, one committed, one aborted.
        java_produce(settings.kafka.bootstrap, pair.events,
                     [{"txn": "begin"}, *java_lines([event(o, "ORDER_CONFIRM") for o in confirmed]), {"txn": "commit"},
                      {"txn": "begin"}, *java_lines([event(o, "ORDER_CANCEL") for o in kept]), {"txn": "abort"},
                      {"txn": "begin"}, *java_lines([event(o, "ORDER_CANCEL") for o in cancelled]), {"txn": "commit"}],
                     compression="zstd", transactional_id=f"test-java-{uuid.uuid4().hex[:8]}")
        # A dead letter that only an aborted transaction wrote: the compensator must never see it.
        async with Upstream(settings, pair.dlq, None) as dlq:
            await dlq.producer.begin_transaction()
            await dlq.producer.send(pair.dlq, key=b"k", value=b"{}", headers=[
                ("dlq.consumer.group", pair.group.encode()), ("dlq.original.topic", pair.events.encode()),
                ("dlq.original.partition", b"0"), ("dlq.original.offset", b"999999"),
                ("dlq.original.timestamp", b"1")])
            await dlq.producer.flush()
            await dlq.producer.abort_transaction()

    asyncio.run(write())
    fakes = FakesProcess()
    try:
        worker = spawn_worker(pair, **fakes.env(), **ENV)
        expected = keys_of([event(o, t) for o in kept for t in ("ORDER_CREATED", "ORDER_PAID")]
                           + [event(o, "ORDER_CONFIRM") for o in confirmed]
                           + [event(o, "ORDER_CANCEL") for o in cancelled]
                           + [event(o, t) for o in plain for t in ("ORDER_CREATED", "ORDER_PAID")])

        def at_the_end(isolation_level: str = "read_uncommitted") -> bool:
            ends = asyncio.run(end_offsets(settings, pair.events, 3, isolation_level=isolation_level))
            return asyncio.run(committed_offsets(settings, pair.group, pair.events, 3)) == ends

        def acted_on_committed_only() -> None:
            statuses = {row["order_no"]: row["status"] for row in scratch_db.query(
                "SELECT order_no, status FROM t_order WHERE order_no LIKE %s OR order_no LIKE %s OR order_no LIKE %s",
                "%TXOK%", "%TXPL%", "%TXAB%")}
            assert statuses == {**{o: 3 for o in confirmed}, **{o: 4 for o in cancelled}, **{o: 2 for o in plain}}
            assert not scratch_db.query("SELECT biz_key FROM t_idem WHERE biz_key LIKE %s", "%TXAB%")
            rows = scratch_db.query("SELECT biz_key, status FROM t_idem WHERE biz_key LIKE %s OR biz_key LIKE %s",
                                    "%TXOK%", "%TXPL%")
            assert sorted((r["biz_key"], r["status"]) for r in rows) == sorted((k, 2) for k in expected)
            ledger = fakes.ledger()
            assert {o: len(n) for o, n in ledger["waybills"].items()} == {o: 1 for o in confirmed}
            assert {o: len(m) for o, m in ledger["sms"].items()} == {o: 1 for o in cancelled}
            assert not scratch_db.query("SELECT id FROM t_compensation WHERE consumer_group = %s", pair.group)

        wait_for(at_the_end, timeout=120, what="committed offsets at the end of every partition, markers included",
                 workers=[worker])
        acted_on_committed_only()

        # An upstream transaction left open: the worker reads up to it (the last stable offset) and
        # no further; nothing of it is acted on, before or after it is aborted.
        async def open_then_abort() -> None:
            async with Upstream(settings, pair.events, "gzip") as late:
                await late.producer.begin_transaction()
                key, value = record(event(held, "ORDER_CANCEL"))
                await late.producer.send(pair.events, key=key, value=value)
                await late.producer.flush()
                assert not await asyncio.to_thread(at_the_end)       # the open transaction is not consumed...
                await asyncio.to_thread(wait_for, lambda: at_the_end("read_committed"), timeout=60,
                                        what="committed offsets at the last stable offset", workers=[worker])
                acted_on_committed_only()                            # ...and nothing of it is acted on
                await late.producer.abort_transaction()

        asyncio.run(open_then_abort())
        wait_for(at_the_end, timeout=60, what="committed offsets at the end, past the aborted transaction",
                 workers=[worker])
        wait_for(lambda: (lambda lag: len(lag) == 3 and not any(lag))(metric_values(worker, "order_kafka_consumer_lag")),
                 timeout=30, what="the lag gauge at 0 on every partition", workers=[worker])
        acted_on_committed_only()
        assert worker.alive
    finally:
        fakes.stop()
