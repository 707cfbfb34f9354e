"""A network cut between a worker and its brokers: connections that hang, not refused.

The broker advertises a proxy the test owns (harness.kafka_cluster, ``proxied=True``), so
every connection of the client goes through it; ``blackhole()`` stops forwarding on every open
connection for good and on every connection opened while the cut lasts.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime

import pytest

from app.adapters.kafka import ops as kafka_ops
from app.adapters.kafka.dlq import KafkaDeadLetterSink
from app.adapters.kafka.topics import TopicSpec, topic_specs
from app.pipeline.ports import DeadLetter, SourceRecord
from app.settings import Settings
from harness.events import event, order_no, record
from harness.kafka_cluster import KafkaCluster
from harness.services import Worker, wait_for, worker_env

SEND_BOUND = 15.0         # the sink's bound (DLQ_SEND_TIMEOUT_SECONDS is 30 by default)
CUT = 7.0                 # shorter than the bound, longer than a third of it


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    cluster = KafkaCluster(tmp_path_factory.mktemp("cuts") / "kafka", nodes=1, proxied=True).start()
    yield cluster
    cluster.stop()


def letter(serial: int) -> DeadLetter:
    source = SourceRecord(topic="order-event", partition=0, offset=serial, timestamp_ms=int(time.time() * 1000),
                          key=f"ORD-CUT-{serial}".encode(), value=b'{"cut": true}')
    return DeadLetter(record=source, reason="effect_rejected", message="sent across a network cut", retriable=False,
                      attempts=1, first_failure_at=datetime.now(UTC), worker_id="cut")


def test_a_dead_letter_sent_into_a_cut_is_sent_again_on_a_fresh_connection_within_its_bound(broker):
    """The connection the letter went out on stays hung after the cut ends; the producer must give
    that request up and send again on a new connection before the send's bound runs out."""
    topic = f"cut-dlq-{uuid.uuid4().hex[:8]}"
    bootstrap = broker.bootstrap()
    asyncio.run(kafka_ops.create_topics(bootstrap, [TopicSpec(topic, 1, 1, {})]))

    async def scenario() -> tuple[float, str | None]:
        sink = KafkaDeadLetterSink(bootstrap, topic, "cut", timeout_seconds=SEND_BOUND)
        await sink.start()
        try:
            await sink.publish([letter(0)])              # connected, metadata known
            broker.blackhole(1)
            started = time.monotonic()
            sending = asyncio.ensure_future(sink.publish([letter(1)]))
            await asyncio.sleep(0)                       # the request is on the wire before the cut ends
            while time.monotonic() - started < CUT and not sending.done():
                await asyncio.sleep(0.2)
            broker.restore(1)                            # new connections pass; the cut ones stay hung
            try:
                await sending
                return time.monotonic() - started, None
            except Exception as exc:
                return time.monotonic() - started, repr(exc)
        finally:
            await sink.stop()

    took, error = asyncio.run(scenario())
    assert error is None, f"the letter was not acknowledged within its bound ({took:.1f} s): {error}"
    assert CUT <= took < SEND_BOUND
    found = asyncio.run(kafka_ops.end_offsets(bootstrap, topic, 1))
    assert found == {0: 2}, f"one record per letter, written once: {found}"


def test_a_worker_whose_connections_a_cut_left_hung_rejoins_on_fresh_ones_without_exiting(broker, scratch_db):
    """After the cut, every connection the worker had stays hung (a firewall that dropped them);
    aiokafka would wait out Faust's 90 s request timeout on each. The watchdog's rejoin closes
    them, so the worker heals in place: it consumes again, and never exits."""
    suffix = uuid.uuid4().hex[:8]
    topic, dlq = f"cut-events-{suffix}", f"cut-dlq-{suffix}"
    settings = Settings().model_copy(update={"order_event_partitions": 2, "dlq_partitions": 1})
    asyncio.run(kafka_ops.create_topics(broker.bootstrap(), topic_specs(settings, events=topic, dlq=dlq)))
    env = worker_env(**broker.env(), MYSQL_URL=scratch_db.url, ORDER_EVENT_TOPIC=topic, DLQ_TOPIC=dlq,
                     APP_ID=f"cut-{suffix}", WORKER_ID=f"cut-{suffix}", ORDER_EVENT_PARTITIONS="2",
                     DLQ_PARTITIONS="1", BROKER_SESSION_TIMEOUT_SECONDS="6", BROKER_HEARTBEAT_INTERVAL_SECONDS="1",
                     BATCH_DEADLINE_SECONDS="5", WATCHDOG_STALL_SECONDS="10", WATCHDOG_REJOIN_GRACE_SECONDS="5")
    orders: list[str] = []

    def produce(count: int = 5) -> None:
        docs = [event(order_no(prefix="CUT"), "ORDER_CREATED") for _ in range(count)]
        orders.extend(d["order_no"] for d in docs)
        asyncio.run(kafka_ops.produce(broker.direct_bootstrap(), topic, [record(d) for d in docs]))

    def recorded() -> int:
        marks = ", ".join(["%s"] * len(orders))
        return scratch_db.scalar(f"SELECT COUNT(*) FROM t_order WHERE order_no IN ({marks})", *orders)

    worker = Worker(env, f"cut-{suffix}").start()
    try:
        produce()
        wait_for(lambda: recorded() == len(orders), timeout=120, what="consuming before the cut", workers=[worker])
        broker.blackhole(1)
        cut_at = time.monotonic()
        # Shorter than the watchdog's stall and grace: a cut the worker must ride out.
        wait_for(lambda: time.monotonic() - cut_at >= CUT, timeout=60, what="the cut's length", workers=[worker])
        broker.restore(1)                                # the connections it hung stay hung
        produce()
        wait_for(lambda: recorded() == len(orders), timeout=120, what="consuming again after the cut",
                 workers=[worker])
        assert worker.alive, f"the worker exited ({worker.proc.returncode}); log {worker.log_path}"
        assert "forcing a rejoin" in worker.logs(), "the cut did not leave the worker stuck: the test proves nothing"
    finally:
        worker.kill()
