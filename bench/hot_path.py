"""``python -m bench.hot_path``: the worker's own CPU per event, outside Kafka and the database.

The local-only mix of the benchmark (``bench.workload``), in batches of 500, through what a
worker does in Python for each batch: decode every record (``app.pipeline.events.decode``),
its step keys, T1's plan over an empty ``t_idem`` (``plan_batch``) and the text of T1's
statements (the order upsert and the ``t_idem`` insert; the statements go to a stand-in that
keeps them, not to a database). The process's CPU time per event, best of ``--repeat`` runs,
by part: what a change to the hot path saves, measured without the machine's load in it.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from app.adapters.mysql import idem, orders
from app.pipeline.events import decode
from app.pipeline.plan import plan_batch, step_keys
from app.pipeline.tokens import StepTokens
from bench.workload import build


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.hot_path", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=50_000, help="records (50000)")
    parser.add_argument("--repeat", type=int, default=5, help="runs; the best is reported (5)")
    return parser.parse_args(argv)


async def _keep(sql: str, params) -> None:
    return None


def measure(records: list, batch: int = 500) -> dict[str, float]:
    """CPU seconds per part, over all of ``records``."""
    tokens = StepTokens(b"bench-hot-path-secret-of-32-bytes!!")
    parts = {"decode": 0.0, "keys": 0.0, "plan": 0.0, "sql": 0.0}
    clock = time.process_time
    loop = asyncio.new_event_loop()
    try:
        for start in range(0, len(records), batch):
            chunk = records[start:start + batch]
            t0 = clock()
            events = [decode(key, value, max_bytes=1 << 20) for key, value in chunk]
            t1 = clock()
            keys_of = [step_keys(event) for event in events]
            t2 = clock()
            plan = plan_batch(events, {}, {}, owner="bench/hot-path", tokens=tokens, keys_of=keys_of)
            t3 = clock()
            loop.run_until_complete(orders.upsert(_keep, list(plan.orders.values())))
            loop.run_until_complete(idem.insert(_keep, plan.inserts, owner="bench/hot-path", lease_us=60_000_000))
            t4 = clock()
            parts["decode"] += t1 - t0
            parts["keys"] += t2 - t1
            parts["plan"] += t3 - t2
            parts["sql"] += t4 - t3
    finally:
        loop.close()
    return parts


def main(argv=None) -> int:
    args = parse_args(argv)
    workload = build("local", args.events, topic="hot-path", tag="hp")
    records = workload.records
    best: dict[str, float] | None = None
    for _ in range(args.repeat):
        parts = measure(records)
        if best is None or sum(parts.values()) < sum(best.values()):
            best = parts
    assert best is not None
    n = len(records)
    print(f"{n} events of the local-only mix in batches of 500, best of {args.repeat}: CPU µs per event")
    for part, seconds in best.items():
        print(f"  {part:8s} {seconds / n * 1e6:6.2f}")
    print(f"  {'total':8s} {sum(best.values()) / n * 1e6:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
