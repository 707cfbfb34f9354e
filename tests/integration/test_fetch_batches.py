"""The order agent taking whole fetches (app.adapters.kafka.batches) with real workers: nothing is
committed past a record whose dead letter is not written, a rebalance waits for the batch in flight,
and Faust's own stream path (FETCH_BATCHES=false) still works."""

from __future__ import annotations

import asyncio
import re
import urllib.request

import pytest
from aiokafka import AIOKafkaProducer

from app.adapters.kafka import ops as kafka_ops
from app.pipeline.states import OrderStatus
from harness.events import event, order_no, record
from harness.fakes import FakesProcess
from harness.services import caught_up, committed_offsets, produce, wait_for

FAST = {"RETRY_BACKOFF_MS": "50,100,200", "BATCH_WITHIN_SECONDS": "0.5", "BROKER_SESSION_TIMEOUT_SECONDS": "6",
        "BROKER_HEARTBEAT_INTERVAL_SECONDS": "1", "BATCH_DEADLINE_SECONDS": "5"}


@pytest.fixture
def fakes():
    process = FakesProcess()
    yield process
    process.stop()


def outcomes(worker) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{worker.web_port}/metrics", timeout=10).read().decode()


def batches(worker) -> float:
    found = re.search(r"^order_batches_total (\S+)$", outcomes(worker), re.M)
    return float(found.group(1)) if found else 0.0


def test_nothing_is_committed_past_a_record_that_waits_for_its_dead_letter(settings, topics, spawn_worker):
    # The dead letter cannot be sent (its topic does not exist): its record waits for it for 6 s,
    # twelve commit intervals, then the worker stops without acking it. The records of other
    # orders before and after it in the partition are finished and acked meanwhile: the commit
    # goes up to the waiting record, never past it.
    pair = topics(partitions=1)
    good = [record(event(order_no(prefix="ACK"), "ORDER_CREATED")) for _ in range(10)]
    asyncio.run(produce(settings, pair.events, good[:5] + [(b"ORD-BAD", b"\xff")] + good[5:]))
    worker = spawn_worker(pair, "w", DLQ_TOPIC=f"{pair.dlq}-missing", DLQ_SEND_TIMEOUT_SECONDS="6",
                          BROKER_COMMIT_INTERVAL_SECONDS="0.5", **FAST)
    assert worker.wait_exit(90) == 70, f"expected exit 70; log {worker.log_path}"
    assert "stopping the worker without committing" in worker.logs()
    assert asyncio.run(committed_offsets(settings, pair.group, pair.events, 1)) == {0: 5}


def test_a_rebalance_waits_for_the_batch_in_flight_and_nothing_runs_twice(settings, topics, spawn_worker, fakes):
    pair = topics(partitions=4)
    orders = [order_no(prefix="REBAL") for _ in range(160)]
    docs = [event(o, t) for o in orders for t in ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM")]
    asyncio.run(produce(settings, pair.events, [record(d) for d in docs]))
    fakes.configure({"waybill": {"latency_ms": 150}})
    # A grace long enough for the batch in flight: the rebalance waits for it (past the grace, its records
    # would be given up and read again by the next owner, as duplicates).
    env = dict(FAST, BATCH_SIZE="60", EFFECT_CONCURRENCY="4", EFFECT_TIMEOUT_SECONDS="1", LEASE_SECONDS="100",
               KAFKA_REVOKE_GRACE_SECONDS="60",
               LOGISTICS_URL=fakes.url)

    first = spawn_worker(pair, "first", **env)
    wait_for(lambda: len(fakes.ledger()["calls"]) >= 10, timeout=90, what="some waybills", workers=[first])
    second = spawn_worker(pair, "second", **env)          # joins: the group rebalances mid-batch
    # Once it has partitions, more orders on every partition: the first worker may have finished
    # the ones it gave up before the rebalance, and the second must have work of its own.
    second.wait_log("Worker ready", timeout=90)
    later = [order_no(prefix="REBAL") for _ in range(40)]
    asyncio.run(produce(settings, pair.events, [record(event(o, "ORDER_CREATED")) for o in later]))
    wait_for(lambda: caught_up(settings, pair.events, pair.group, 4), timeout=240, what="all processed",
             workers=[first, second])
    calls = [c for c in fakes.ledger()["calls"] if c["service"] == "waybill"]
    assert len(calls) == len(orders), "a waybill was asked for twice: a batch ran again after the rebalance"
    for worker in (first, second):
        assert 'order_events_total{outcome="duplicate"}' not in outcomes(worker), "events were processed twice"
    assert batches(second) > 0, "the second worker never got a partition: no rebalance was tested"


def test_faust_stream_path_still_works(settings, topics, spawn_worker, scratch_db):
    pair = topics(partitions=2)
    docs = [event(order_no(prefix="STRM"), t) for _ in range(100) for t in ("ORDER_CREATED",)]
    asyncio.run(produce(settings, pair.events, [record(d) for d in docs]))
    worker = spawn_worker(pair, "w", FETCH_BATCHES="false", **FAST)
    wait_for(lambda: caught_up(settings, pair.events, pair.group, 2), timeout=90, what="all processed",
             workers=[worker])
    assert scratch_db.scalar("SELECT COUNT(*) FROM t_order WHERE order_no LIKE %s", "%STRM%") == 100
    assert "Faust's stream, record by record" in worker.logs()


def test_an_order_in_two_partitions_is_never_in_two_batches_in_flight_at_once(settings, topics, spawn_worker,
                                                                             fakes, scratch_db):
    # A topic given more partitions, or a producer with a partitioner of its own, puts an order's
    # events in two partitions. Two batches of one worker, in flight at once, share its owner: the
    # later one would take the earlier one's pending claim for its own (attempt 2) and call again
    # while the first call is still on its way, and the first call's outcome would be fenced out.
    pair = topics(partitions=2)
    target = order_no(prefix="SPLIT")
    asyncio.run(produce(settings, pair.events, [record(event(target, t)) for t in ("ORDER_CREATED", "ORDER_PAID")]))
    env = dict(FAST, **fakes.env(), BATCHES_IN_FLIGHT="2")
    first = spawn_worker(pair, "first", **env)
    wait_for(lambda: caught_up(settings, pair.events, pair.group, 2), timeout=90, what="the order paid",
             workers=[first])
    assert first.stop() == 0

    # The same CONFIRM (same event, same waybill key) last in a full batch of partition 0 and alone
    # in partition 1: a batch each, the first one's call slow enough for the second to start meanwhile.
    confirm = record(event(target, "ORDER_CONFIRM"))
    fillers = [record(event(order_no(prefix="FILL"), "ORDER_CREATED")) for _ in range(499)]
    asyncio.run(produce_to(settings, pair.events, [(0, r) for r in fillers + [confirm]] + [(1, confirm)]))
    fakes.configure({"waybill": {"latency_ms": 1500}})
    second = spawn_worker(pair, "second", **env)
    wait_for(lambda: caught_up(settings, pair.events, pair.group, 2), timeout=90, what="all processed",
             workers=[second])
    calls = [c for c in fakes.ledger()["calls"] if c["service"] == "waybill"]
    assert len(calls) == 1, f"the waybill was asked for {len(calls)} times: two batches in flight had the order"
    metrics = outcomes(second)
    assert re.search(r'^order_events_total\{outcome="duplicate"\} 1\.0$', metrics, re.M), "the second was not a duplicate"
    assert 'order_events_total{outcome="dead_letter"}' not in metrics
    assert scratch_db.scalar("SELECT status FROM t_order WHERE order_no = %s", target) == OrderStatus.CONFIRMED
    assert scratch_db.scalar("SELECT COUNT(*) FROM t_idem WHERE biz_key LIKE %s AND attempt > 1",
                             f"%{target}%") == 0, "a claim was taken over"


async def produce_to(settings, topic: str, records) -> None:
    """``(partition, (key, value))``: each record to the partition given, not the key's."""
    producer = AIOKafkaProducer(acks="all", enable_idempotence=True,
                                **kafka_ops.connection_of(settings.kafka.bootstrap).client_options())
    await producer.start()
    try:
        sent = [await producer.send(topic, value=value, key=key, partition=partition)
                for partition, (key, value) in records]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()
