"""What a run of the processor carries through its three transactions (one :class:`Run` value), and
how each event ended (:class:`Result`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from app.pipeline.errors import PipelineError
from app.pipeline.events import OrderEvent
from app.pipeline.model import BatchPlan
from app.pipeline.outcomes import Outcome

T = TypeVar("T")
# Runs each database step: the batch handler's waits out an unreachable database (and re-runs the step)
# within its budget (``app.pipeline.outage``).
Guard = Callable[[Callable[[], Awaitable[T]]], Awaitable[T]]
# Told the indices of an order's events and their results as soon as every one of them has its result.
Settled = Callable[[list[int], list["Result"]], None]


async def unguarded(work: Callable[[], Awaitable[T]]) -> T:
    return await work()


@dataclass(frozen=True, slots=True)
class Result:
    """How one event ended in one run of the pipeline."""

    outcome: Outcome | None = None      # applied, stale, duplicate or superseded when it ended well
    error: PipelineError | None = None
    deferred: bool = False              # not tried: an earlier event of its order is unfinished
    settled: str | None = None          # a duplicate whose steps ended without running: why (EventPlan.settled)

    @property
    def ok(self) -> bool:
        return self.outcome is not None


@dataclass(eq=False)
class Run:
    """One pass of events (offset order) through T1, T2 and T3, as it goes."""

    events: Sequence[OrderEvent]
    guard: Guard
    owner: str                          # who claims the steps
    attempt_cap: int | None             # claims of a key before a person must decide (None: a person asked)
    not_after: float | None             # the caller's deadline, on the processor's clock
    traces: Sequence[object | None] | None      # each event's record's trace, when an observer follows them
    claimed_at: float = field(init=False, default=0.0)   # on the processor's clock, when its T1 began
    plan: BatchPlan = field(init=False)
    results: list[Result | None] = field(init=False, default_factory=list)      # None: not ended yet

    def trace(self, index: int) -> object | None:
        return self.traces[index] if self.traces else None
