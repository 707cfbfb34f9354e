"""``python -m bench.reconcile_cost``: what the reconcile costs, and what the timer adds at the seeds' volume.

A topic of ``--partitions`` partitions (48, the seeds' count) gets ``--events`` events (60 % CREATED
and PAID, 20 % CONFIRM with the fake logistics API, 10 % CANCEL with the fake SMS gateway, 10 % exact
duplicates), one real ``faust -A app worker`` with the defaults works them all, and the reconcile
(the product's own code, ``Runtime.reconciler()``, in this process) runs ``--runs`` times over the
whole range. Reported per run: records per second on its wall clock and the CPU time of this
process per record; then the extrapolation to the seeds' 45 million events a day with the timer's
defaults (every 10 minutes, a window of an hour: each record is reconciled six times): the records
per run, the seconds each run takes at the measured rate, the share of the interval it busies one
worker, and the CPU it adds, in cores. The database's share is three indexed reads per chunk.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from app.adapters.kafka import ops as kafka_ops
from app.adapters.kafka.topics import topic_specs
from app.bootstrap import Runtime
from app.settings import Settings
from harness.events import event, order_no, record
from harness.fakes import FakesProcess, every_fake
from harness.services import ScratchDatabase, Worker, caught_up, wait_for, worker_env

RESULTS = Path(__file__).with_name("results")
SEED_EVENTS_PER_DAY = 45_000_000
TIMER_EVERY, TIMER_WINDOW = 600.0, 3600.0


def workload(events: int, rng: random.Random) -> list[tuple[bytes, bytes]]:
    records: list[tuple[bytes, bytes]] = []
    while len(records) < events:
        order = order_no(prefix="RCB")
        end = rng.random()
        docs = [event(order, "ORDER_CREATED"), event(order, "ORDER_PAID")]
        if end < 0.4:
            docs.append(event(order, "ORDER_CONFIRM"))
        elif end < 0.6:
            docs.append(event(order, "ORDER_CANCEL"))
        for doc in docs:
            records.append(record(doc))
            if rng.random() < 0.1:
                records.append(record(doc))
    return records[:events]


async def reconcile(settings: Settings, since: datetime, until: datetime) -> dict:
    rt = await Runtime(settings).start(kafka=False)
    try:
        cpu, clock = time.process_time(), time.monotonic()
        report = await rt.reconciler().run(since, until, started_by="cli:bench", store=False)
        wall, cpu = time.monotonic() - clock, time.process_time() - cpu
    finally:
        await rt.stop()
    return {"records": report.tally.records, "status": report.status, "findings": report.findings,
            "seconds": round(wall, 2), "records_per_second": round(report.tally.records / wall),
            "cpu_us_per_record": round(cpu / report.tally.records * 1e6, 1),
            "waited_seconds": {k: round(v, 2) for k, v in report.waited.items()}}


def run(settings: Settings, events: int, partitions: int, runs: int) -> dict:
    db = ScratchDatabase(settings.database.url, label=f"bench_rec_{uuid.uuid4().hex[:6]}").create()
    suffix = uuid.uuid4().hex[:8]
    topic, dlq, group = f"bench-rec-{suffix}", f"bench-rec-dlq-{suffix}", f"bench-rec-{suffix}"
    specs = topic_specs(Settings(order_event_partitions=partitions), events=topic, dlq=dlq)
    asyncio.run(kafka_ops.create_topics(settings.kafka.bootstrap, specs))
    fakes = FakesProcess(every_fake({"latency_ms": 5}))
    env = dict(MYSQL_URL=db.url, ORDER_EVENT_TOPIC=topic, DLQ_TOPIC=dlq, APP_ID=group, WORKER_ID=f"rec-{suffix}",
               ORDER_EVENT_PARTITIONS=str(partitions), RECONCILE_EVERY_SECONDS="0", **fakes.env())
    worker = Worker(worker_env(**env), f"bench-rec-{suffix}").start()
    try:
        began = datetime.now(UTC)
        asyncio.run(kafka_ops.produce(settings.kafka.bootstrap, topic, workload(events, random.Random(7))))
        wait_for(lambda: caught_up(settings, topic, group, partitions), timeout=3600, interval=1.0,
                 what=f"{events:,} events worked and committed", workers=[worker])
        worker.stop()
        target = Settings(mysql_url=db.url, order_event_topic=topic, dlq_topic=dlq, app_id=group,
                          order_event_partitions=partitions)
        until = datetime.now(UTC) + timedelta(minutes=1)
        measured = [asyncio.run(reconcile(target, began - timedelta(minutes=1), until)) for _ in range(runs)]
    finally:
        if worker.alive:
            worker.kill()
            worker.wait_exit(30)
        fakes.stop()
        asyncio.run(kafka_ops.delete_topics(settings.kafka.bootstrap, [topic, dlq]))
        db.drop()
    rate = sorted(m["records_per_second"] for m in measured)[len(measured) // 2]
    cpu = sorted(m["cpu_us_per_record"] for m in measured)[len(measured) // 2]
    per_run = SEED_EVENTS_PER_DAY / 86400 * TIMER_WINDOW
    per_second = SEED_EVENTS_PER_DAY / 86400 * TIMER_WINDOW / TIMER_EVERY
    return {"events": events, "partitions": partitions, "runs": measured,
            "median_records_per_second": rate, "median_cpu_us_per_record": cpu,
            "at_the_seeds_volume": {"events_per_day": SEED_EVENTS_PER_DAY, "records_per_run": round(per_run),
                                    "seconds_per_run": round(per_run / rate), "share_of_interval":
                                        round(per_run / rate / TIMER_EVERY, 2),
                                    "cpu_cores": round(per_second * cpu / 1e6, 2)}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.reconcile_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000, help="events on the topic (200,000)")
    parser.add_argument("--partitions", type=int, default=48, help="its partitions (48)")
    parser.add_argument("--runs", type=int, default=3, help="reconcile runs over it (3)")
    args = parser.parse_args(argv)
    result = run(Settings(), args.events, args.partitions, args.runs)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-reconcile.json"
    path.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
