"""The optimistic pass: every order's records tried once, as many orders as can be in one run of the
processor (one T1, calls concurrent across orders, T3s in groups). Each order's results come as soon
as its calls are recorded, not when the whole run is over; a slow order holds up only itself.

The orders no earlier batch holds start together, in one run; those behind an earlier batch, and held
records once their breaker lets them go, start as they are let go (those let go together share a run).
A bug met in a run sends its records to the retries one by one, where it is isolated.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict

from app.pipeline.batch.state import Batch, Item
from app.pipeline.errors import Fatal
from app.pipeline.processor import Result, Settled

log = logging.getLogger(__name__)


async def first_try(batch: Batch, items: list[Item], settled: Settled | None = None) -> list[Result]:
    """One run of ``items``' events through the processor: each one's result (``deferred`` all of
    them, to be tried one by one, when the run met a bug)."""
    if not items:
        return []
    try:
        return await batch.crew.processor.run([item.event for item in items], batch.guard, not_after=batch.deadline,
                                         settled=settled, traces=batch.traces(items))
    except Fatal:
        raise
    except Exception:
        # A bug somewhere in the batch: find the record that triggers it, one by one.
        log.exception("phase 1 failed on a batch of %d; retrying its records one by one", len(items))
        return [Result(deferred=True)] * len(items)


class Starter:
    """Starts orders' first tries in the batch's task group; each order's results are a future of
    their own (:meth:`results_of`), set as soon as its calls are recorded."""

    GATHER = 0.005          # orders let go this close together share a T1

    def __init__(self, batch: Batch, tasks: asyncio.TaskGroup) -> None:
        self.batch = batch
        self.tasks = tasks
        self._results: dict[str, asyncio.Future] = {}
        self._later: list[Item] = []

    def results_of(self, order: str) -> asyncio.Future:
        future = self._results.get(order)
        if future is None:
            future = self._results[order] = asyncio.get_running_loop().create_future()
        return future

    def fresh(self, order: str) -> None:
        """The order's next run gets results of its own."""
        self._results.pop(order, None)

    def later(self, items: list[Item]) -> None:
        """Start ``items`` with whatever else is let go within ``GATHER`` seconds."""
        if not self._later:
            self.tasks.create_task(self._gather_later())
        self._later.extend(items)

    async def _gather_later(self) -> None:
        await asyncio.sleep(self.GATHER)
        items, self._later = self._later, []
        await self.run(items)

    async def run(self, items: list[Item]) -> None:
        futures = {item.event.order_no: self.results_of(item.event.order_no) for item in items}

        def settled(indices: list[int], results: list[Result]) -> None:
            _tell(futures[items[indices[0]].event.order_no], results)

        results = await first_try(self.batch, items, settled)
        by_order: dict[str, list[Result]] = defaultdict(list)
        for item, result in zip(items, results):
            by_order[item.event.order_no].append(result)
        for order, its in by_order.items():           # those not told yet (a run without calls, a broken one)
            _tell(futures[order], its)


def _tell(future: asyncio.Future, results: list[Result]) -> None:
    if not future.done():
        future.set_result(results)
