"""``python -m bench.bulk_retry``: how fast a bulk retry works off the dead letters an outage left.

``--rows`` CONFIRMs dead-lettered by a logistics outage and given up on (``manual``, so the
due-row drain leaves them to a person) are written as the pipeline leaves them; one real
``faust -A app worker`` starts with every setting at its default (``--rate`` sets
``BULK_RATE_PER_SECOND``), the logistics API answers at ``--latency-ms``, and a bulk retry of
``status=manual`` is started through the JSON API with the dry run's count. Reported: rows per
second from the first row settled to the last (steady, the database's clock) and from the
job's start to its end (clocked), and whether every order has exactly one waybill.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path

from app.adapters.kafka import ops as kafka_ops
from app.adapters.kafka.topics import topic_specs
from app.settings import Settings
from harness.dead_letters import write_dead_letters
from harness.fakes import FakesProcess, every_fake
from harness.services import ScratchDatabase, Worker, wait_for, worker_env

RESULTS = Path(__file__).with_name("results")
TOKEN = "bench-bulk-token"


def _call(port: int, method: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def _answers(port: int) -> bool:
    try:
        _call(port, "GET", "/bulk/")
        return True
    except OSError:
        return False


def run_once(settings: Settings, rows: int, latency_ms: float, rate: float | None) -> dict:
    load = os.getloadavg()
    db = ScratchDatabase(settings.database.url, label=f"bench_bulk_{uuid.uuid4().hex[:6]}").create()
    suffix = uuid.uuid4().hex[:8]
    events, dlq, group = f"bench-bulk-{suffix}", f"bench-bulk-dlq-{suffix}", f"bench-bulk-{suffix}"
    asyncio.run(kafka_ops.create_topics(settings.kafka.bootstrap, topic_specs(settings, events=events, dlq=dlq)))
    fakes = FakesProcess(every_fake({"latency_ms": latency_ms}))
    worker = None
    try:
        orders = write_dead_letters(db, group, events, rows, prefix="BENCH")
        overrides = {} if rate is None else {"BULK_RATE_PER_SECOND": str(rate)}
        env = worker_env(MYSQL_URL=db.url, ORDER_EVENT_TOPIC=events, DLQ_TOPIC=dlq, APP_ID=group,
                         WORKER_ID=f"bulk-{suffix}", **fakes.env(), WEB_TOKEN=TOKEN,
                         **overrides)
        worker = Worker(env, f"bench-bulk-{suffix}").start()
        wait_for(lambda: _answers(worker.web_port), timeout=120, what="the worker's web views", workers=[worker])
        selection = {"action": "retry", "filter": {"status": "manual"}}
        count = _call(worker.web_port, "POST", "/bulk/dry-run", selection)["count"]
        started = time.monotonic()
        job = _call(worker.web_port, "POST", "/bulk/", {**selection, "expected_count": count, "actor": "bench"})
        job = wait_for(lambda: (j := _call(worker.web_port, "GET", f"/bulk/{job['id']}"))["status"] == "done" and j,
                       timeout=3600, interval=0.5, what="the bulk job done", workers=[worker])
        clocked = time.monotonic() - started
        settled, first, last = db.query("SELECT COUNT(*) AS n, MIN(gmt_modified) AS a, MAX(gmt_modified) AS b "
                                        "FROM t_compensation WHERE consumer_group = %s AND status = 3",
                                        group)[0].values()
        steady = (last - first).total_seconds() if settled > 1 else 0
        waybills = fakes.ledger()["waybills"]
        return {"rows": rows, "settled": settled, "changed": job["changed"], "failed": job["failed"],
                "latency_ms": latency_ms, "bulk_rate_per_second": rate or Settings().bulk.rate_per_second,
                "steady_rows_per_second": round(settled / steady, 1) if steady else None,
                "clocked_rows_per_second": round(settled / clocked, 1), "clocked_seconds": round(clocked, 1),
                "one_waybill_each": all(len(waybills.get(o, [])) == 1 for o in orders),
                "load_average_at_start": [round(x, 2) for x in load]}
    finally:
        if worker is not None:
            worker.kill()
            worker.wait_exit(30)
        fakes.stop()
        asyncio.run(kafka_ops.delete_topics(settings.kafka.bootstrap, [events, dlq]))
        db.drop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bulk_retry", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000, help="dead letters to retry (10,000)")
    parser.add_argument("--latency-ms", type=float, default=5, help="the logistics API's latency (5)")
    parser.add_argument("--rate", type=float, help="BULK_RATE_PER_SECOND (default: the setting's default)")
    args = parser.parse_args(argv)
    result = run_once(Settings(), args.rows, args.latency_ms, args.rate)
    print(json.dumps(result), flush=True)
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    (RESULTS / f"bulk-{stamp}.json").write_text(json.dumps({"args": vars(args), "run": result}, indent=2))


if __name__ == "__main__":
    main()
