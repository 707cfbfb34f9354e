"""``python -m bench.compensation_drain``: how fast the workers drain the dead letters an outage left.

A logistics outage of ``--minutes`` minutes at ``--rate`` events/s of which every one needs a
waybill leaves that many dead letters (``effect_unavailable``); they are written as the
pipeline leaves them (the order confirmed, its ``mark_confirmed`` step done, its waybill step
pending with its token, the ledger row open, retriable and due), the logistics API is back (the
fake, at ``--latency-ms``), and ``--workers`` real ``faust -A app worker`` processes start with
the default settings. Reported per run: rows per minute from the first row settled to the last
(the steady rate, on the database's clock) and from the workers' start to the last (clocked),
and a check that every settled order has exactly one waybill (and the others none).
``--observe S`` stops after S seconds instead of waiting for the last row.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from app.adapters.kafka import ops as kafka_ops
from app.adapters.kafka.topics import topic_specs
from app.pipeline.events import decode
from app.pipeline.plan import step_keys
from app.settings import Settings
from harness.events import event, order_no, record
from harness.fakes import FakesProcess, every_fake
from harness.services import ScratchDatabase, Worker, connect, wait_for, worker_env

RESULTS = Path(__file__).with_name("results")


def prefill(db: ScratchDatabase, group: str, topic: str, rows: int) -> list[str]:
    """``rows`` CONFIRMs dead-lettered by a logistics outage, as the pipeline leaves them."""
    orders = [order_no(prefix="DRAIN") for _ in range(rows)]
    conn = connect(db.url)
    try:
        with conn.cursor() as cur:
            for start in range(0, rows, 1000):
                chunk = orders[start:start + 1000]
                docs = [event(o, "ORDER_CONFIRM") for o in chunk]
                events = [decode(*record(d), max_bytes=1 << 20) for d in docs]
                cur.executemany(
                    "INSERT INTO t_order (order_no, status, amount_cents, phone, address, paid_cents, gmt_create, "
                    "gmt_modified) VALUES (%s, 3, 12900, '+8613800000000', '1 Test Road', 12900, NOW(3), NOW(3))",
                    [(o,) for o in chunk])
                idem = []
                for e in events:
                    local, waybill = step_keys(e)
                    idem.append((local, e.part_date, "mark_confirmed", 2, None, None, e.payload_hash, "applied"))
                    idem.append((waybill, e.part_date, "issue_waybill", 1, "gone/main/x",
                                 uuid.uuid4().hex, e.payload_hash, "effect_unavailable"))
                cur.executemany(
                    "INSERT INTO t_idem (biz_key, part_date, step, status, attempt, owner, lease_until, idem_token, "
                    "payload_hash, outcome, gmt_create, gmt_modified) VALUES (%s, %s, %s, %s, 4, %s, "
                    "NOW(3) - INTERVAL 1 MINUTE, %s, %s, %s, NOW(3), NOW(3))", idem)
                cur.executemany(
                    "INSERT INTO t_compensation (src_topic, src_partition, src_offset, src_timestamp, consumer_group, "
                    "order_no, event_id, biz_key, status, reason, message, retriable, attempts, next_retry_at, "
                    "first_failure_at, record_key, record_value, record_headers, gmt_create, gmt_modified) VALUES "
                    "(%s, 0, %s, 1, %s, %s, %s, %s, 1, 'effect_unavailable', 'logistics answered 503', 1, 4, "
                    "NOW(3) - INTERVAL 1 SECOND, NOW(3) - INTERVAL 10 MINUTE, %s, %s, '[]', NOW(3), NOW(3))",
                    [(topic, start + i, group, e.order_no, e.event_id, step_keys(e)[0], *record(d))
                     for i, (d, e) in enumerate(zip(docs, events))])
    finally:
        conn.close()
    return orders


def run_once(settings: Settings, rows: int, workers: int, latency_ms: float, observe: float | None = None) -> dict:
    db = ScratchDatabase(settings.database.url, label=f"bench_drain_{uuid.uuid4().hex[:6]}").create()
    suffix = uuid.uuid4().hex[:8]
    events, dlq, group = f"bench-drain-{suffix}", f"bench-drain-dlq-{suffix}", f"bench-drain-{suffix}"
    asyncio.run(kafka_ops.create_topics(settings.kafka.bootstrap, topic_specs(settings, events=events, dlq=dlq)))
    fakes = FakesProcess(every_fake({"latency_ms": latency_ms}))
    procs: list[Worker] = []
    try:
        orders = prefill(db, group, events, rows)
        started = time.monotonic()
        for n in range(workers):
            env = worker_env(MYSQL_URL=db.url, ORDER_EVENT_TOPIC=events, DLQ_TOPIC=dlq, APP_ID=group,
                             WORKER_ID=f"drain-{suffix}-{n}", **fakes.env())
            procs.append(Worker(env, f"bench-drain-{suffix}-{n}").start())

        def left() -> int:
            return db.scalar("SELECT COUNT(*) FROM t_compensation WHERE consumer_group = %s AND status <> 3", group)

        if observe is None:
            wait_for(lambda: left() == 0, timeout=3600, interval=1.0, what=f"{rows} dead letters compensated",
                     workers=procs)
        else:                   # a fixed window: how many it settles in that time
            time.sleep(observe)
        clocked = time.monotonic() - started
        settled, first, last = db.query("SELECT COUNT(*) AS n, MIN(gmt_modified) AS a, MAX(gmt_modified) AS b "
                                        "FROM t_compensation WHERE consumer_group = %s AND status = 3",
                                        group)[0].values()
        steady = (last - first).total_seconds() if settled > 1 else 0
        ledger = fakes.ledger()
        done = {row["order_no"] for row in db.query("SELECT order_no FROM t_compensation WHERE consumer_group = %s "
                                                    "AND status = 3", group)}
        once = all(len(ledger["waybills"].get(o, [])) == (1 if o in done else 0) for o in orders)
        return {"rows": rows, "settled": settled, "workers": workers, "latency_ms": latency_ms,
                "steady_rows_per_minute": round(settled / steady * 60) if steady else None,
                "clocked_rows_per_minute": round(settled / clocked * 60), "clocked_seconds": round(clocked, 1),
                "one_waybill_each": once, "waybills": ledger["counts"]["waybills"]}
    finally:
        for proc in procs:
            proc.kill()
            proc.wait_exit(30)
        fakes.stop()
        asyncio.run(kafka_ops.delete_topics(settings.kafka.bootstrap, [events, dlq]))
        db.drop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.compensation_drain", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10, help="the outage's length (10)")
    parser.add_argument("--rate", type=float, default=50, help="events/s needing a waybill during it (50)")
    parser.add_argument("--workers", default="1,3", help="worker counts to run, comma-separated (1,3)")
    parser.add_argument("--latency-ms", type=float, default=5, help="the logistics API's latency (5)")
    parser.add_argument("--observe", type=float, help="stop after this many seconds and count what was settled "
                                                      "(default: wait until every row is)")
    args = parser.parse_args(argv)
    settings = Settings()
    rows = int(args.minutes * 60 * args.rate)
    results = []
    for workers in (int(n) for n in args.workers.split(",")):
        result = run_once(settings, rows, workers, args.latency_ms, args.observe)
        print(json.dumps(result), flush=True)
        results.append(result)
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    (RESULTS / f"drain-{stamp}.json").write_text(json.dumps({"args": vars(args), "runs": results}, indent=2))


if __name__ == "__main__":
    main()
