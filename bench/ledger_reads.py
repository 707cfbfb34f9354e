"""``python -m bench.ledger_reads``: what the reads that run on their own cost with a big queue.

A flood of malformed records leaves ``--rows`` (1,000,000) dead letters for a person
(``manual``, ``malformed_event``) in one consumer group, and a producer that kept re-publishing
one bad event leaves ``--one-order`` (20,000) of them on a single order; a few hundred rows are
open and retrying. On that ledger, in a scratch database, with the app's own code, each read is
timed ``--repeat`` (30) times (p50, p95, max in ms) and ``ANALYZE``d (the rows MariaDB read):

* ``Watch.gauges``: what every worker reads every ``GAUGE_SECONDS``;
* ``Queries.dead_letters_of_order`` and ``..._count``: what ``GET /orders/{order_no}`` shows of
  the order's dead letters, and the count beside them.

The fill (``INSERT ... SELECT`` from MariaDB's SEQUENCE engine) takes about a minute; the
database is dropped at the end. Results: ``bench/results/ledger-reads-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.growth.plans import explain
from bench.growth.prefill import run_sql, sequence_engine
from bench.growth.recording import statements_of

RESULTS = Path(__file__).with_name("results")
GROUP = "bench-ledger-reads"
LOOPING_ORDER = "ORD-20261201-LOOP0001"
CHUNK = 250_000


def flood_statement(first: int, last: int, one_order: int, *, group: str = GROUP, order: str = LOOPING_ORDER) -> str:
    """Rows ``first..last``: manual, malformed; the first ``one_order`` of them of one order."""
    order_no = f"IF(seq <= {one_order}, '{order}', NULL)"
    return (
        "INSERT INTO t_compensation (src_topic, src_partition, src_offset, src_timestamp, consumer_group, order_no, "
        "status, reason, message, retriable, attempts, next_retry_at, may_be_superseded, truncated, worker_id, "
        "first_failure_at, record_key, record_value, record_headers, redrives, fingerprint, gmt_create, gmt_modified) "
        f"SELECT 'order-event', seq MOD 8, seq, 1764000000000 + seq, '{group}', {order_no}, 4, 'malformed_event', "
        "'the value is not a JSON object', 0, 1, NULL, 0, 0, 'worker-1', "
        "UTC_TIMESTAMP(3) - INTERVAL (2000000 - seq) SECOND, "
        f"{order_no}, '{{\"broken', '[]', 0, 'f00df00df00df00d', "
        "UTC_TIMESTAMP(3) - INTERVAL (2000000 - seq) SECOND, UTC_TIMESTAMP(3) - INTERVAL (2000000 - seq) SECOND "
        f"FROM seq_{first}_to_{last}")


def unsettled_statement(base: int, *, group: str = GROUP) -> str:
    """300 open rows (due in a minute) and 20 retrying ones, of other orders, the newest."""
    return (
        "INSERT INTO t_compensation (src_topic, src_partition, src_offset, src_timestamp, consumer_group, order_no, "
        "status, reason, message, retriable, attempts, next_retry_at, may_be_superseded, truncated, worker_id, "
        "first_failure_at, owner, lease_until, redrives, gmt_create, gmt_modified) "
        f"SELECT 'order-event', seq MOD 8, {base} + seq, 1764000000000 + {base} + seq, '{group}', "
        "CONCAT('ORD-20261201-OPEN', LPAD(seq, 5, '0')), IF(seq <= 20, 2, 1), 'effect_unavailable', "
        "'POST /v1/waybills answered 503', 1, 1, UTC_TIMESTAMP(3) + INTERVAL 60 SECOND, 0, 0, 'worker-1', "
        "UTC_TIMESTAMP(3) - INTERVAL seq SECOND, IF(seq <= 20, 'worker-2/compensator/0b1c2d3e4f50#1', NULL), "
        "IF(seq <= 20, UTC_TIMESTAMP(3) + INTERVAL 30 SECOND, NULL), 0, UTC_TIMESTAMP(3), UTC_TIMESTAMP(3) "
        "FROM seq_1_to_320")


async def timed(repeat: int, call) -> dict:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    ordered = sorted(samples)
    return {"n": repeat, "p50_ms": statistics.median(samples),
            "p95_ms": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], "max_ms": ordered[-1]}


async def measure(url: str, settings, repeat: int) -> dict:
    from app.adapters.mysql import MySqlStore
    from app.adapters.mysql.engine import create_engine
    from app.adapters.mysql.reads.backlog import Watch
    from app.adapters.mysql.reads.console import Queries

    engine = create_engine(settings, url=url, pool_size=2, max_overflow=0)
    store = MySqlStore(engine)
    watch, queries = Watch(store), Queries(store, group=GROUP)
    gauges_kw = dict(group=GROUP, stuck_after_seconds=600, attempt_cap=20)
    reads = {
        "Watch.gauges": (lambda: watch.gauges(**gauges_kw), lambda s: Watch(s).gauges(**gauges_kw)),
        "Queries.dead_letters_of_order": (lambda: queries.dead_letters_of_order(LOOPING_ORDER),
                                          lambda s: Queries(s, group=GROUP).dead_letters_of_order(LOOPING_ORDER)),
    }
    if hasattr(Queries, "dead_letters_of_order_count"):        # the count beside them (absent before it was bounded)
        reads["Queries.dead_letters_of_order_count"] = (
            lambda: queries.dead_letters_of_order_count(LOOPING_ORDER),
            lambda s: Queries(s, group=GROUP).dead_letters_of_order_count(LOOPING_ORDER))
    doc: dict = {}
    try:
        for name, (call, build) in reads.items():
            answer = await call()
            doc[name] = await timed(repeat, call)
            doc[name]["answer"] = summary(answer)
            plans = []
            for sql, params in await statements_of(build):
                plan = explain(url, name, sql, params)
                read = [{"table": a.get("table"), "key": a.get("key"), "r_rows": a.get("r_rows")} for a in plan.analyze]
                plans.append({"sql": plan.sql, "read": read, "finding": plan.finding})
            doc[name]["statements"] = plans
            print(f"  {name}: p50 {doc[name]['p50_ms']:.1f} ms, p95 {doc[name]['p95_ms']:.1f} ms, "
                  f"max {doc[name]['max_ms']:.1f} ms; {doc[name]['answer']}", flush=True)
    finally:
        await engine.dispose()
    return doc


def summary(answer) -> dict:
    if isinstance(answer, list):
        return {"rows": len(answer)}
    if isinstance(answer, dict):
        return {k: (len(v) if isinstance(v, list) else v) for k, v in answer.items()}
    fields = getattr(answer, "__dataclass_fields__", None)
    if fields:
        return {name: getattr(answer, name) for name in fields if name in
                ("compensation_by_status", "oldest_open_seconds", "oldest_manual_seconds")}
    return {"value": repr(answer)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--one-order", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    os.environ.setdefault("IDEM_TOKEN_SECRET", "bench-ledger-reads-secret-0123456789abcdef")
    from app.settings import Settings
    from harness.services import ScratchDatabase

    settings = Settings()
    db = ScratchDatabase(settings.database.url, label=f"ledger_reads_{os.getpid()}").create()
    try:
        if not sequence_engine(db.url):
            raise SystemExit("this bench needs MariaDB's SEQUENCE engine")
        started = time.perf_counter()
        for first in range(1, args.rows + 1, CHUNK):
            run_sql(db.url, [flood_statement(first, min(first + CHUNK - 1, args.rows), args.one_order)])
        run_sql(db.url, [unsettled_statement(args.rows + 1), "ANALYZE TABLE t_compensation"])
        fill = time.perf_counter() - started
        print(f"ledger: {args.rows:,} manual rows ({args.one_order:,} of one order) and 320 unsettled, "
              f"filled in {fill:.0f}s", flush=True)
        doc = {"at": datetime.now(UTC).isoformat(), "rows": args.rows, "one_order": args.one_order,
               "fill_seconds": fill, "reads": asyncio.run(measure(db.url, settings, args.repeat)),
               "load": os.getloadavg()}
    finally:
        db.drop()
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"ledger-reads-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    out.write_text(json.dumps(doc, indent=2, default=str))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
