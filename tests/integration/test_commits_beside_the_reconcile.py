"""The group's commits and the reconcile's read of the same topic, in one worker process.

The reconcile timer reads ``order-event`` over the trailing window with an aiokafka consumer of
its own, outside the group, in the worker's process. After an outage the group is behind that
window: the reader then meets the upstream's transaction markers further on than the group has
fetched. Those markers are the reader's; the group must commit past its own, however far on the
reader has been, and wherever the reader began.

The scene: a transactional upstream writes one partition in two halves, the reconcile's window
(a few seconds, so that the test need not wait an hour) holding the second half and not the
first. The worker's first batch waits on the fake logistics API (the first order's waybill is
held), so the group fetches no further than a batch and its buffer into the first half. The
reconcile timer reads the window meanwhile, ahead of the group; then the waybill is let through,
and the group's committed offset must reach the end of the partition, markers included.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from aiokafka import AIOKafkaProducer

from harness.events import DATA, event, order_no, record
from harness.fakes import FakesProcess
from harness.services import committed_offsets, end_offsets, wait_for

# Transactions of 3 records and a marker each: the first part far longer than what the group fetches
# while its first batch waits (a fetch is at most KAFKA_MAX_PARTITION_FETCH_BYTES, 64 KiB: about 60 of
# these records), the second part in the reconcile's window.
HALF, TRANSACTIONS = 300, 320
PADDING = "x" * 900         # about 1 KiB a record
WINDOW_SECONDS = 10         # the reconcile's window: the records (and markers) of the last 10 s
ENV = {
    # A batch of 10 and one in flight, fetches of 64 KiB: the group fetches a few hundred records at most
    # while the first batch waits.
    "BATCH_SIZE": "10", "BATCHES_IN_FLIGHT": "1", "BROKER_MAX_POLL_RECORDS": "10",
    "KAFKA_MAX_PARTITION_FETCH_BYTES": str(64 * 1024),
    "BATCH_WITHIN_SECONDS": "0.2", "BROKER_COMMIT_INTERVAL_SECONDS": "0.5",
    # The held call must outwait the reconcile's run, not be given up and retried meanwhile.
    "EFFECT_TIMEOUT_SECONDS": "20", "WORKER_DEAD_AFTER_SECONDS": "30", "BATCH_DEADLINE_SECONDS": "25",
    # The reconcile reads the window that ends now, every second.
    "RECONCILE_EVERY_SECONDS": "1", "RECONCILE_WINDOW_SECONDS": str(WINDOW_SECONDS), "RECONCILE_LAG_SECONDS": "0",
}


async def write_upstream(settings, topic: str, transactions: list[list[dict]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap, enable_idempotence=True,
                                transactional_id=f"test-upstream-{uuid.uuid4().hex[:8]}")
    await producer.start()
    try:
        for docs in transactions:
            async with producer.transaction():
                for doc in docs:
                    key, value = record(doc)
                    await producer.send(topic, key=key, value=value)
    finally:
        await producer.stop()


def created(n: int) -> list[list[dict]]:
    return [[event(order_no(prefix="HOLE"), "ORDER_CREATED", data={**DATA["ORDER_CREATED"](), "note": PADDING})
             for _ in range(3)] for _ in range(n)]


def test_the_reconcile_reading_ahead_of_a_lagging_group_does_not_freeze_its_commits(settings, topics, spawn_worker,
                                                                                   scratch_db):
    pair = topics(partitions=1)
    held = order_no(prefix="HELD")
    # The first batch's waybill is held at the provider until the test lets it go.
    first = [[event(held, "ORDER_CREATED"), event(held, "ORDER_PAID"), event(held, "ORDER_CONFIRM")]]
    asyncio.run(write_upstream(settings, pair.events, first + created(HALF - 1)))
    first_half_written = time.monotonic()
    fakes = FakesProcess({"waybill": {"held_orders": [held]}})
    try:
        worker = spawn_worker(pair, **fakes.env(), **ENV)
        # The first half (its markers stamped by the broker as they were written) leaves the window.
        time.sleep(max(0.0, first_half_written + WINDOW_SECONDS + 2 - time.monotonic()))
        asyncio.run(write_upstream(settings, pair.events, created(TRANSACTIONS - HALF)))
        end = asyncio.run(end_offsets(settings, pair.events, 1))
        assert end == {0: TRANSACTIONS * 4}

        def read_ahead():
            """A reconcile run that read the second half alone, while the group was in the first."""
            for row in scratch_db.query("SELECT id, status, report FROM t_reconcile_run WHERE consumer_group = %s "
                                        "AND status <> 'running' ORDER BY id DESC LIMIT 5", pair.group):
                assert row["status"] != "failed", row["report"]
                [span] = json.loads(row["report"])["partitions"]
                if (span["start"], span["end"]) == (HALF * 4, TRANSACTIONS * 4):
                    return span
            return None

        span = wait_for(read_ahead, timeout=60, what="a reconcile run over the second half alone", workers=[worker])
        committed = asyncio.run(committed_offsets(settings, pair.group, pair.events, 1))
        assert committed.get(0) is None or committed[0] < HALF * 4, (committed, span)

        fakes.configure({"waybill": {"held_orders": []}})
        wait_for(lambda: asyncio.run(committed_offsets(settings, pair.group, pair.events, 1)) == end, timeout=120,
                 what="the group's committed offset at the end of the partition, past every marker", workers=[worker])
        assert len(fakes.ledger()["waybills"].get(held, [])) == 1
        made = scratch_db.query("SELECT COUNT(*) AS n FROM t_order WHERE order_no LIKE %s", "%HOLE%")[0]["n"]
        assert made == (TRANSACTIONS - 1) * 3
    finally:
        fakes.stop()
