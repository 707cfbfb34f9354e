"""``python -m bench.effect_call``: what one logistics call costs the worker in CPU.

The worker's own client (``app.adapters.effects``: ``EffectClients`` over ``WaybillClient``,
one ``aiohttp`` session with ``EFFECT_CONCURRENCY`` connections, as ``app.bootstrap`` builds
them) calls the fake logistics API (``python -m demo.fakes``, another process, no latency), on uvloop as the worker runs,
``--calls`` times, ``--concurrency`` at a time. The figure is this process's CPU time
(user + system) per call, best of ``--repeat`` runs: the client's cost alone, whatever the
machine's load, since the server's CPU is another process's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import uuid
from datetime import date

import uvloop

from app.adapters.effects import EffectClients, http_session
from app.adapters.effects.waybill import WaybillClient
from app.pipeline.model import EffectJob
from app.pipeline.states import OrderStatus
from app.pipeline.steps import ISSUE_WAYBILL
from harness.fakes import FakesProcess


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.effect_call", description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=5000, help="calls per run (5000)")
    parser.add_argument("--concurrency", type=int, default=64, help="calls in flight (64, EFFECT_CONCURRENCY)")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the best is reported (3)")
    return parser.parse_args(argv)


def jobs(n: int) -> list[EffectJob]:
    tag = uuid.uuid4().hex[:8]
    out = []
    for i in range(n):
        order_no = f"ORD-20261201-EC{tag}{i:07d}"
        request = {"order_no": order_no, "address": f"{i % 997} Bench Road", "phone": f"+86138{i:08d}"}
        out.append(EffectJob(i, order_no, f"{order_no}:ORDER_CONFIRM:issue_waybill", date(2026, 12, 1),
                             "issue_waybill", ISSUE_WAYBILL, uuid.uuid4().hex, 1, request, OrderStatus.CONFIRMED))
    return out


async def run_once(url: str, calls: int, concurrency: int) -> float:
    async with http_session(concurrency) as session:
        clients = EffectClients({ISSUE_WAYBILL.name: WaybillClient(session, base_url=url, timeout_seconds=10)},
                                required=[ISSUE_WAYBILL])
        slots = asyncio.Semaphore(concurrency)

        async def one(job: EffectJob) -> None:
            async with slots:
                await clients.call(job)

        await asyncio.gather(*(one(job) for job in jobs(concurrency)))      # connections opened
        batch = jobs(calls)
        started = os.times()
        await asyncio.gather(*(one(job) for job in batch))
        ended = os.times()
        return (ended.user - started.user) / calls, (ended.system - started.system) / calls


def main(argv=None) -> int:
    args = parse_args(argv)
    uvloop.install()                       # as the worker runs (EVENT_LOOP=uvloop)
    fakes = FakesProcess({"waybill": {"latency_ms": 0}})
    try:
        best = min((asyncio.run(run_once(fakes.url, args.calls, args.concurrency)) for _ in range(args.repeat)),
                   key=sum)
    finally:
        fakes.stop()
    print(f"{args.calls} waybill calls, {args.concurrency} at a time, best of {args.repeat}: "
          f"{sum(best) * 1e6:.0f} µs of the client's CPU per call ({best[0] * 1e6:.0f} user, "
          f"{best[1] * 1e6:.0f} system)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
