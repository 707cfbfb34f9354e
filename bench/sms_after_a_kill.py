"""How long an SMS waits when its worker is SIGKILLed between its claim and its call: the path
behind the slowest SMS of a chaos run, measured on its own, with every setting at its default.

    python -m bench.sms_after_a_kill [--orders 200] [--takeover restart|survivor]

A scratch database on the shared MariaDB, topics of its own on the shared Kafka, the fake services
answering in 100 ms. Worker A (``CHAOS_KILL_AT=a_b``) creates and pays ``--orders`` orders, then
takes their CANCELs and dies right after the first batch's claims committed (T1), before any SMS
call: the claims are pending, their leases running, no outcome recorded. Then, with
``--takeover restart``, a fresh worker starts at once (a supervisor's restart); with
``--takeover survivor``, a worker that ran beside A all along takes A's partitions once the group
has noticed A is gone (``BROKER_SESSION_TIMEOUT_SECONDS``). Every order's SMS must go out once.

Per order, from the gateway's ledger and the database: consumed (the first transaction that took
the CANCEL) -> SMS accepted. Results: a table on stdout and ``bench/results/sms-kill-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
import uuid
from datetime import UTC, datetime

from app.adapters.kafka.topics import topic_specs
from app.settings import Settings
from bench.broker_bounce import RESULTS
from harness.events import event, order_no, record
from harness.fakes import FakesProcess, every_fake
from harness.services import ScratchDatabase, Worker, create_topics, delete_topics, produce, wait_for, worker_env

PARTITIONS = 2


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(round(p / 100 * len(ordered), 9)) - 1)]


def run(orders: int, takeover: str) -> dict:
    settings = Settings()
    tag = uuid.uuid4().hex[:8]
    events, dlq, group = f"bench-kill-events-{tag}", f"bench-kill-dlq-{tag}", f"bench-kill-{tag}"
    specs = [s for s in topic_specs(settings.model_copy(update={"order_event_partitions": PARTITIONS,
                                                                "dlq_partitions": 1}), events=events, dlq=dlq)]
    asyncio.run(create_topics(settings, specs))
    db = ScratchDatabase(settings.database.url).create()
    fakes = FakesProcess(every_fake({"latency_ms": 100}))
    env = dict(MYSQL_URL=db.url, ORDER_EVENT_TOPIC=events, DLQ_TOPIC=dlq, APP_ID=group,
               ORDER_EVENT_PARTITIONS=str(PARTITIONS), DLQ_PARTITIONS="1", **fakes.env())
    workers: list[Worker] = []

    def start(name: str, **more: str) -> Worker:
        worker = Worker(worker_env(**env, WORKER_ID=f"{name}-{tag}", **more), f"bench-kill-{name}").start()
        workers.append(worker)
        worker.wait_log("Worker ready", timeout=120)
        return worker

    try:
        doomed = start("a", CHAOS_KILL_AT="a_b")
        if takeover == "survivor":
            start("survivor")
        numbers = [order_no(prefix="KILL") for _ in range(orders)]
        asyncio.run(produce(settings, events, [record(event(o, t)) for o in numbers
                                               for t in ("ORDER_CREATED", "ORDER_PAID")]))
        wait_for(lambda: db.scalar("SELECT COUNT(*) FROM t_order WHERE status = 2") == orders, timeout=120,
                 what="every order paid")
        asyncio.run(produce(settings, events, [record(event(o, "ORDER_CANCEL")) for o in numbers]))
        doomed.wait_exit(120)
        killed_at = time.time()
        claimed = db.scalar("SELECT COUNT(*) FROM t_idem WHERE step = 'send_cancel_sms' AND status = 1 "
                            "AND outcome IS NULL")
        if takeover == "restart":
            start("restarted")
        wait_for(lambda: len(fakes.ledger()["sms"]) == orders, timeout=1200, interval=1.0,
                 what="every order's SMS", workers=[w for w in workers if w is not doomed])
        ledger = fakes.ledger()
        consumed = {row["biz_key"].split(":")[0]: row["gmt_create"].replace(tzinfo=UTC).timestamp()
                    for row in db.query("SELECT biz_key, gmt_create FROM t_idem WHERE step = 'mark_cancelled'")}
        waits = {o: min(s["at"] for s in sent) - consumed[o] for o, sent in ledger["sms"].items()}
        twice = sum(len(sent) > 1 for sent in ledger["sms"].values())
        cut = sorted(w for o, w in waits.items() if w > 5)
        lookups = [c["at"] - killed_at for c in ledger["calls"] if c["service"] == "sms_lookup"]
        letters = db.query("SELECT reason, COUNT(*) AS n, MAX(redrives) AS redrives FROM t_compensation "
                           "GROUP BY reason")
        result = {
            "at": datetime.now(UTC).isoformat(timespec="seconds"), "orders": orders, "takeover": takeover,
            "claims_cut": claimed, "second_sms": twice,
            "cut_sms_seconds": {"count": len(cut), "min": round(min(cut, default=0), 1),
                                "p50": round(percentile(cut, 50), 1) if cut else None,
                                "max": round(max(cut, default=0), 1)},
            "all_sms_seconds": {"p50": round(percentile(list(waits.values()), 50), 2),
                                "p99": round(percentile(list(waits.values()), 99), 2),
                                "max": round(max(waits.values()), 2)},
            "first_lookup_after_kill": round(min(lookups), 1) if lookups else None,
            "dead_letters": letters,
        }
    finally:
        for worker in workers:
            if worker.alive:
                worker.kill()
                worker.wait_exit(30)
        fakes.stop()
        db.drop()
        asyncio.run(delete_topics(settings, [events, dlq]))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sms_after_a_kill", description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=200)
    parser.add_argument("--takeover", choices=("restart", "survivor"), default="restart")
    args = parser.parse_args()
    result = run(args.orders, args.takeover)
    print(json.dumps(result, indent=1, default=str))
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    (RESULTS / f"sms-kill-{stamp}.json").write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
