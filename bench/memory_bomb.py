"""``python -m bench.memory_bomb``: what one compressed record can cost a worker in memory.

Kafka's Java client writes one record of ``--gib`` GiB of zeros, gzip-compressed (about
1 MiB on the wire: the broker's ``max.message.bytes`` counts compressed bytes), between
good events. A worker consumes it twice: with the default ``MAX_BATCH_BYTES`` (64 MiB)
and with ``MAX_BATCH_BYTES`` above the record's size, which is what aiokafka alone does
(it inflates every batch whole). Printed per run: the worker's peak RSS (VmHWM), the
record's fate, and whether the partition was committed to its end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid

from app.adapters.kafka import ops as kafka_ops
from app.adapters.kafka.topics import topic_specs
from app.settings import Settings
from harness.events import event, order_no, record
from harness.java import java_produce, utf8, zeros
from harness.services import ScratchDatabase, Worker, caught_up, consume_all, produce, wait_for, worker_env


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return int(next(line for line in status if line.startswith("VmHWM")).split()[1]) / 1024


def run_once(settings: Settings, db: ScratchDatabase, gib: float, max_batch_bytes: int) -> dict:
    suffix = uuid.uuid4().hex[:8]
    events, dlq, group = f"bench-bomb-{suffix}", f"bench-bomb-dlq-{suffix}", f"bench-bomb-{suffix}"
    single = settings.model_copy(update={"order_event_partitions": 1, "dlq_partitions": 1})
    asyncio.run(kafka_ops.create_topics(settings.kafka.bootstrap, topic_specs(single, events=events, dlq=dlq)))
    good = [record(event(order_no(prefix="BOMB"), "ORDER_CREATED")) for _ in range(4)]
    asyncio.run(produce(settings, events, good[:2]))
    java_produce(settings.kafka.bootstrap, events, [{"partition": 0, "key": utf8("ORD-20261129-BOMB1"),
                                     "value": zeros(int(gib * (1 << 30)))}], compression="gzip")
    asyncio.run(produce(settings, events, good[2:]))
    worker = Worker(worker_env(MYSQL_URL=db.url, ORDER_EVENT_TOPIC=events, DLQ_TOPIC=dlq, APP_ID=group,
                               WORKER_ID=f"bench-bomb-{suffix}", MAX_BATCH_BYTES=str(max_batch_bytes)),
                    f"bench-bomb-{suffix}").start()
    started = time.monotonic()
    try:
        wait_for(lambda: caught_up(settings, events, group, 1), timeout=300, what="the partition committed",
                 workers=[worker])
        [letter] = asyncio.run(consume_all(settings, dlq, expect=1, timeout=60))
        headers = {k: v.decode() for k, v in letter.headers if k.startswith("dlq.")}
        return {"max_batch_bytes": max_batch_bytes, "peak_rss_mb": round(peak_rss_mb(worker.proc.pid)),
                "seconds": round(time.monotonic() - started, 1), "committed_to_end": True,
                "dead_letter": headers["dlq.error.type"], "message": headers["dlq.error.message"][:160]}
    finally:
        worker.kill()
        worker.wait_exit(30)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.memory_bomb", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the zeros record in GiB (default 1)")
    args = parser.parse_args(argv)
    settings = Settings()
    db = ScratchDatabase(settings.database.url, label=f"bench_bomb_{uuid.uuid4().hex[:6]}").create()
    try:
        for limit in (settings.batches.max_batch_bytes, int(args.gib * (1 << 30)) + (64 << 20)):
            print(json.dumps(run_once(settings, db, args.gib, limit)), flush=True)
    finally:
        db.drop()


if __name__ == "__main__":
    main()
