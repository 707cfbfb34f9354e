"""Start a worker, wait until it joined its group, SIGTERM it; many times, under each event loop.

    python -m bench.start_stop_cycles --cycles 200 [--loops asyncio,uvloop]

One Kafka node of its own (``bench.broker_bounce.OwnKafka``), a one-partition topic per loop,
a scratch database on the shared MariaDB. The loops run side by side, one worker each at a
time, each in its own consumer group. A cycle: ``faust -A app worker`` with
``EVENT_LOOP=<loop>`` and ``PYTHONFAULTHANDLER=1``; the log says ``Worker ready`` (partitions
assigned), or with ``--early`` a random moment of the start-up; SIGTERM; the exit code (negative: the signal that ended it, -11 is SIGSEGV). A
worker that exits otherwise than 0 keeps its log (faulthandler writes the C-level crash's
Python stacks there); the others' logs are removed.

Results: a JSON line per cycle on stdout, totals per loop at the end, and
``bench/results/cycles-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import threading
import time
import uuid
from collections import Counter

from app.adapters.kafka import ops as kafka_ops
from app.adapters.kafka.topics import topic_specs
from app.settings import Settings
from bench.broker_bounce import HOME, RESULTS, OwnKafka
from harness.services import ROOT, ScratchDatabase, Worker, worker_env

READY = "Worker ready"


def cycle(env: dict[str, str], name: str, ready_cap: float, stop_cap: float, early: float | None = None) -> dict:
    worker = Worker(env, name).start()
    started = time.monotonic()
    result: dict = {"loop": env["EVENT_LOOP"]}
    if early is not None:
        result["sigterm_after"] = early = round(random.uniform(0, early), 2)
    try:
        while READY not in worker.logs():
            if not worker.alive or time.monotonic() - started > ready_cap:
                break
            if early is not None and time.monotonic() - started >= early:
                break
            time.sleep(0.1)
        result["ready_seconds"] = round(time.monotonic() - started, 2) if READY in worker.logs() else None
        if worker.alive:
            sent = time.monotonic()
            worker.kill(15)
            try:
                result["exit"] = worker.wait_exit(stop_cap)
            except Exception:
                worker.kill()
                result["exit"] = f"killed after {stop_cap:.0f} s"
                worker.wait_exit(30)
            result["stop_seconds"] = round(time.monotonic() - sent, 2)
        else:
            result["exit"] = worker.proc.returncode
    finally:
        if worker.alive:
            worker.kill()
            worker.wait_exit(30)
    if result["exit"] == 0 and result["ready_seconds"] is not None:
        worker.log_path.unlink(missing_ok=True)
    else:
        result["log"] = str(worker.log_path.relative_to(ROOT))
        text = worker.logs()
        result["fault"] = "Fatal Python error" in text or "Segmentation fault" in text
    return result


def run_loop(loop: str, cycles: int, base_env: dict[str, str], out: list[dict], early: float | None) -> None:
    for n in range(1, cycles + 1):
        env = worker_env(**base_env, EVENT_LOOP=loop, WORKER_ID=f"cycle-{loop}-{n}")
        result = cycle(env, f"cycle-{loop}", ready_cap=120, stop_cap=120, early=early)
        result["n"] = n
        out.append(result)
        print(json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--loops", default="asyncio,uvloop")
    parser.add_argument("--early", type=float, help="SIGTERM at a random moment this many seconds after the "
                                                   "start at most (ready or not): a stop during start-up")
    args = parser.parse_args()
    os.environ.setdefault("KAFKA_HEAP_OPTS", "-Xms128m -Xmx384m")
    HOME.mkdir(parents=True, exist_ok=True)
    kafka = OwnKafka(HOME / f"cycles-{uuid.uuid4().hex[:6]}")
    settings = Settings()
    db = ScratchDatabase(settings.database.url, label=f"cycles_{uuid.uuid4().hex[:6]}")
    started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    results: dict[str, list[dict]] = {}
    try:
        kafka.reap_leftover()
        kafka.install()
        kafka.start()
        db.create()
        threads = []
        for loop in args.loops.split(","):
            suffix = uuid.uuid4().hex[:6]
            topic, dlq = f"cycles-{loop}-{suffix}", f"cycles-dlq-{loop}-{suffix}"
            specs = topic_specs(settings.model_copy(update={"order_event_partitions": 1, "dlq_partitions": 1}),
                                events=topic, dlq=dlq)
            asyncio.run(kafka_ops.create_topics(kafka.bootstrap, specs))
            base = {"KAFKA_BROKER": f"kafka://{kafka.bootstrap}", "MYSQL_URL": db.url, "ORDER_EVENT_TOPIC": topic,
                    "DLQ_TOPIC": dlq, "APP_ID": f"cycles-{loop}-{suffix}", "ORDER_EVENT_PARTITIONS": "1",
                    "DLQ_PARTITIONS": "1", "PYTHONFAULTHANDLER": "1"}
            results[loop] = []
            threads.append(threading.Thread(target=run_loop, args=(loop, args.cycles, base, results[loop], args.early)))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        kafka.stop()
        db.drop()
    totals = {loop: dict(Counter(str(r["exit"]) for r in rs)) for loop, rs in results.items()}
    print(json.dumps({"totals": totals}))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"cycles-{started}.json"
    out.write_text(json.dumps({"args": vars(args), "totals": totals, "cycles": results}, indent=2))
    print(f"written {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
