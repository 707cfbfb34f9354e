"""``python -m bench.held_records_memory``: what a person's hold costs a worker in memory.

One worker, the default ``BREAKER_HOLD_RECORDS`` (10,000) unless ``--bound`` says otherwise, and an
SMS hold made with the CLI before any record. Then ``--records`` orders are created and cancelled
(each cancel a record that needs an SMS, about ``--value-bytes`` of JSON): the worker holds the
cancels in memory up to its bound and then takes no new batch, so the rest wait in the broker.
Printed: the worker's resident memory (VmRSS) before the records and once it holds its bound, the
difference per held record, its peak (VmHWM), how many it held and how many it did not; then the
hold is ended and the time until every SMS was sent and the partition committed to its end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid

from app.adapters.kafka import ops as kafka_ops
from app.adapters.kafka.topics import topic_specs
from app.settings import Settings
from harness.events import event, order_no, record
from harness.fakes import FakesProcess
from harness.services import ROOT, ScratchDatabase, Worker, caught_up, free_port, wait_for, worker_env, worker_metric


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    with open(f"/proc/{pid}/status") as status:
        return int(next(line for line in status if line.startswith(field)).split()[1]) / 1024


def faust(env: dict[str, str], *args: str) -> dict:
    done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "faust"), "-A", "app", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout[done.stdout.index("{"):])


def sms_sent(fakes: FakesProcess) -> int:
    return fakes.ledger()["counts"]["sms"]


def run(settings: Settings, records: int, bound: int, value_bytes: int) -> dict:
    suffix = uuid.uuid4().hex[:8]
    events, dlq, group = f"bench-held-{suffix}", f"bench-held-dlq-{suffix}", f"bench-held-{suffix}"
    single = settings.model_copy(update={"order_event_partitions": 1, "dlq_partitions": 1})
    asyncio.run(kafka_ops.create_topics(settings.kafka.bootstrap, topic_specs(single, events=events, dlq=dlq)))
    db = ScratchDatabase(settings.database.url, f"bench_held_{suffix}").create()
    fakes = FakesProcess({"waybill": {"latency_ms": 20}, "sms": {"latency_ms": 20}})
    env = worker_env(MYSQL_URL=db.url, ORDER_EVENT_TOPIC=events, DLQ_TOPIC=dlq, APP_ID=group, WORKER_ID=f"held-{suffix}",
                     WEB_PORT=str(free_port()), BREAKER_HOLD_RECORDS=str(bound), CONTROLS_REFRESH_SECONDS="0.5",
                     METRICS_REFRESH_SECONDS="1", **fakes.env())
    worker = Worker(env, f"bench-held-{suffix}")
    try:
        faust(env, "hold", "start", "--effect", "sms", "--hours", "1", "--until-released",
              "--reason", "the held-records benchmark")
        worker.start()
        wait_for(lambda: worker_metric(worker, "order_effect_held", '{effect="sms"}') == 1, timeout=120,
                 what="the worker holding sms", workers=[worker])
        before = rss_mb(worker.proc.pid)
        # The cancel reason pads a record to about value_bytes (a reason holds 255 characters at most).
        padding = "x" * min(240, max(0, value_bytes - len(json.dumps(event(order_no(prefix="HELD"), "ORDER_CANCEL")))))
        orders = [order_no(prefix="HELD") for _ in range(records)]
        docs = [event(order, "ORDER_CREATED") for order in orders]       # the cancels need their orders
        docs += [event(order, "ORDER_CANCEL", {"reason": f"customer asked {padding}"}) for order in orders]
        asyncio.run(kafka_ops.produce(settings.kafka.bootstrap, events, [record(d) for d in docs]))
        expect = min(records, bound)
        wait_for(lambda: (worker_metric(worker, "order_records_held_by_effect", '{effect="sms"}') or 0) >= expect,
                 timeout=600, what=f"{expect} records held", workers=[worker])
        time.sleep(5)                       # what the worker takes in after it reached its bound, if anything
        held = worker_metric(worker, "order_records_held_by_effect", '{effect="sms"}') or 0
        at_bound, peak = rss_mb(worker.proc.pid), rss_mb(worker.proc.pid, "VmHWM")
        sent_while_held = sms_sent(fakes)
        released = time.monotonic()
        faust(env, "hold", "end", "--effect", "sms", "--note", "the benchmark's hold ends")
        wait_for(lambda: caught_up(settings, events, group, 1), timeout=1800,
                 what="every record committed", workers=[worker])
        return {"records": records, "bound": bound, "value_bytes": value_bytes, "held": int(held),
                "cancels_not_held": records - int(held), "rss_before_mb": round(before, 1),
                "rss_at_bound_mb": round(at_bound, 1), "peak_rss_mb": round(peak, 1),
                "kib_per_held_record": round((at_bound - before) * 1024 / max(held, 1), 2),
                "sms_sent_while_held": sent_while_held,
                "seconds_from_release_to_committed": round(time.monotonic() - released, 1)}
    finally:
        worker.kill()
        worker.wait_exit(30)
        fakes.stop()
        db.drop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.held_records_memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=12_000, help="cancelled orders produced while held (12,000)")
    parser.add_argument("--bound", type=int, default=10_000, help="BREAKER_HOLD_RECORDS (10,000, the default)")
    parser.add_argument("--value-bytes", type=int, default=400, help="each record's size in bytes, about (400; 450 at most)")
    args = parser.parse_args(argv)
    print(json.dumps(run(Settings(), args.records, args.bound, args.value_bytes), indent=2))


if __name__ == "__main__":
    main()
