"""T3: the calls' outcomes recorded, fenced by attempt; committed, that is cut point C. Then each event
of the run gets its result (:func:`settle`).

The attempt is the fencing token: a worker whose lease ran out while it was in T2 finds
``attempt = n`` no longer matches in T3: another worker claimed the key, so this one writes no receipt
and leaves the key to it (its event ends ``superseded``).

Once T2 is over, its outcomes are facts that must reach T3 as they are: a failed T3 is retried with the
same outcomes (never by running T1 and T2 again, which would find the SMS rows pending with no outcome
and could only call their sends unknown).

A caller that wants each order's results as soon as they are (``Processor.run``'s ``settled``: the
batch handler) gets T2 and T3 without the barrier (:meth:`Records.as_they_finish`): each order's calls
run on their own, and what finished is recorded in groups.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Sequence

from app.pipeline.errors import Fatal, PipelineError, StoreUnavailable
from app.pipeline.groups import Group
from app.pipeline.model import EffectJob
from app.pipeline.observer import Observer
from app.pipeline.outcomes import Outcome
from app.pipeline.ports import Finished, Store
from app.pipeline.processor.calls import Calls, chains
from app.pipeline.processor.policy import ProcessorPolicy
from app.pipeline.processor.state import Guard, Result, Run, Settled

log = logging.getLogger(__name__)

Recorded = tuple[set[str], dict[str, PipelineError]]      # the keys still ours; those not written, why


class Records:
    def __init__(self, store: Store, *, policy: ProcessorPolicy, observer: Observer) -> None:
        self.store = store
        self.settle_group = policy.settle_group
        self.settle_after = policy.settle_after
        self.observer = observer

    async def record(self, run: Run, finished: list[Finished]) -> Recorded:
        """T3 of ``finished``: the keys still ours, and those whose outcome could not be written."""
        if not run.traces:
            return await self._write(finished, run.guard, run.owner)
        began = time.time_ns()
        owned, broken = await self._write(finished, run.guard, run.owner)
        self.observer.recorded(run.traces, finished, owned, broken, began)
        return owned, broken

    async def _write(self, finished: list[Finished], guard: Guard, owner: str) -> Recorded:
        """Record every outcome.

        An unreachable database is waited out by ``guard``, re-running T3 with the
        same outcomes (a T3 whose commit was lost finds its rows already moved by
        this owner and attempt, and counts them as its own). A statement the
        database refuses for good is a bug or bad data: the outcomes are then
        written one per transaction, so only the one that breaks is lost.
        """
        async def write(items: list[Finished]) -> set[str]:
            return await guard(lambda: self.store.in_transaction(
                lambda tx: tx.finish_effects(items, owner=owner)))

        try:
            return await write(finished), {}
        except (StoreUnavailable, Fatal):
            raise
        except Exception as exc:
            log.warning("T3 failed for %d outcomes (%r); writing them one by one", len(finished), exc)
        owned: set[str] = set()
        broken: dict[str, PipelineError] = {}
        for item in finished:
            try:
                owned |= await write([item])
            except (StoreUnavailable, Fatal):
                raise
            except Exception as exc:
                log.exception("T3 could not record the outcome of %s", item.job.biz_key)
                broken[item.job.biz_key] = PipelineError(
                    f"{item.job.biz_key}: the outcome of its call could not be recorded: {exc}",
                    reason=getattr(exc, "reason", "internal_error"))
        return owned, broken

    async def as_they_finish(self, run: Run, jobs: list[EffectJob], calls: Calls, settled: Settled) -> None:
        """T2 and T3 without the barrier: each order's chain of calls runs on its own, and what has
        finished is recorded in groups (``settle_group`` outcomes, or ``settle_after`` seconds after
        the first of a group finished, whichever comes first); each order is told its results as
        soon as its group's T3 has committed. Orders without calls are told at once."""
        results = run.results
        of_order: dict[str, list[int]] = defaultdict(list)
        for index, event in enumerate(run.events):
            of_order[event.order_no].append(index)
        by_order = chains(jobs)
        for order, indices in of_order.items():
            if order not in by_order:
                settled(indices, [results[i] for i in indices])     # type: ignore[misc]
        group = Group(self.settle_group, self.settle_after, producers=len(by_order))

        async def record_groups() -> None:
            while (taken := await group.next()) is not None:
                finished = [outcome for _, done, _ in taken for outcome in done]
                skipped = {index for _, _, passed in taken for index in passed}
                self.observer.cut("b_c")
                owned, broken = await self.record(run, finished)
                self.observer.cut("after_c")
                indices = [i for order, _, _ in taken for i in of_order[order]]
                settle(run, finished, skipped, owned, broken, only=indices)
                for order, _, _ in taken:
                    settled(of_order[order], [results[i] for i in of_order[order]])   # type: ignore[misc]

        async def call_chain(order: str, chain: list[EffectJob]) -> None:
            done, passed = await calls.chain(run, chain)
            group.add((order, done, passed), len(done))

        self.observer.cut("a_b")
        recorder = asyncio.ensure_future(record_groups())
        try:
            await asyncio.gather(*(call_chain(order, chain) for order, chain in by_order.items()))
        finally:
            group.close()           # what finished is recorded even if a chain broke: its calls were made
            await recorder


def settle(run: Run, finished: list[Finished], skipped: set[int], owned: set[str],
           broken: dict[str, PipelineError], only: Sequence[int] | None = None) -> None:
    """The results of the run's events (``only`` those) that its calls decide."""
    plan, results = run.plan, run.results
    by_event: dict[int, list[Finished]] = defaultdict(list)
    for item in finished:
        by_event[item.job.index].append(item)
    for index in (range(len(plan.events)) if only is None else only):
        event_plan = plan.events[index]
        if results[index] is not None:
            continue
        done = by_event[index]
        failed = next((broken[f.job.biz_key] for f in done if f.job.biz_key in broken), None)
        if failed is not None:
            results[index] = Result(error=failed)
            continue
        if index in skipped:
            results[index] = Result(deferred=True)
            continue
        lost = [f.job.biz_key for f in done if f.job.biz_key not in owned]
        error = next((f.error for f in done if f.error is not None), None)
        if lost:
            # Fenced out in T3: another claimer owns these keys now and holds this event too.
            log.warning("lease lost before T3, leaving %s to the new owner", ", ".join(lost))
            results[index] = Result(outcome=Outcome.SUPERSEDED)
        elif error is not None:
            results[index] = Result(error=error)
        elif len(done) < len(event_plan.jobs):
            results[index] = Result(deferred=True)
        else:
            results[index] = Result(outcome=Outcome.APPLIED)
