"""What a batch carries from phase to phase: one :class:`Batch` value, handed to each phase's
functions in turn (nothing calls back up). It holds what the batch works with (its handler's
:class:`Crew`: the processor, the store, the dead-letter sink, the rules, the clock, shared by every
batch), and what is the batch's own: its deadline, its outage guard, its retry slots, its held records,
its report, its letters group, whom it tells that records are finished, and how an observer follows
its records."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from app.pipeline.batch.gate import OrderGate
from app.pipeline.batch.policy import BatchPolicy, Identity
from app.pipeline.clock import Clock
from app.pipeline.events import OrderEvent
from app.pipeline.groups import Group
from app.pipeline.observer import BatchStory
from app.pipeline.outage import OutageGuard
from app.pipeline.outcomes import Outcome
from app.pipeline.plan import step_keys
from app.pipeline.ports import DeadLetter, DeadLetterSink, SourceRecord, Store
from app.pipeline.processor import Processor

Tell = Callable[[list[int]], None]


@dataclass
class BatchReport:
    outcomes: Counter = field(default_factory=Counter)        # by Outcome
    skipped: Counter = field(default_factory=Counter)         # records of types not handled, by type
    skipped_at: dict[str, tuple[str, int, int]] = field(default_factory=dict)   # the latest of each: where
    dead_letters: list[DeadLetter] = field(default_factory=list)
    # unreadable records that are not a letter of their own: another letter stands for their run
    covered: Counter = field(default_factory=Counter)          # by reason
    retries: Counter = field(default_factory=Counter)         # by error reason
    lease_waits: int = 0
    rate_limited: int = 0                                     # records that waited out a 429 between tries
    order_waits: int = 0                                      # batches in flight it waited for (same orders)
    held: int = 0                                             # records held while their provider was down
    infra_wait_seconds: float = 0.0                           # wall clock the database was unreachable
    seconds: dict[str, float] = field(default_factory=dict)   # wall time per phase: decode, work


@dataclass
class Item:
    """A record of the batch that is an event."""

    index: int                          # in the batch
    record: SourceRecord
    event: OrderEvent
    trace: object | None = None         # its record's trace, when an observer follows the batch
    first_failure: datetime | None = None
    attempts: int = 0

    @property
    def work(self) -> tuple[str, str]:
        """What the record asks for: two records with the same are one piece of work."""
        return step_keys(self.event)[0], self.event.payload_hash


class Holds:
    """The records a handler's batches hold now while their provider's breaker is open (before their
    T1), and the orders they belong to; ``on_more`` is told when more are held (the feed does not count
    them against records in flight)."""

    def __init__(self) -> None:
        self.records = 0
        self.orders: Counter[str] = Counter()      # orders with records held now
        self.by_effect: Counter[str] = Counter()   # records held now for each effect held (by a person or its breaker)
        self.on_more: Callable[[], None] | None = None

    def add(self, n: int) -> None:
        self.records += n
        if n > 0 and self.on_more is not None:
            self.on_more()


@dataclass(frozen=True, slots=True)
class Crew:
    """What a handler's batches work with, the same for each of them."""

    processor: Processor
    store: Store
    sink: DeadLetterSink
    identity: Identity
    policy: BatchPolicy
    clock: Clock
    gate: OrderGate                     # an order's batches one after another
    holds: Holds                        # the records its batches hold now


@dataclass(eq=False)
class Batch:
    """One batch in progress."""

    crew: Crew
    finished: Tell                      # told the indices of records as soon as they are finished
    story: BatchStory | None            # how an observer follows its records (None: none does)
    still_ours: Callable[[int], bool] = field(default=lambda index: True)   # not given up by a rebalance
    report: BatchReport = field(init=False, default_factory=BatchReport)
    started: float = field(init=False)
    deadline: float = field(init=False)  # on the crew's clock: a record still waiting to retry then is dead-lettered
    guard: OutageGuard = field(init=False)          # waits out an unreachable database, within the budget
    slots: asyncio.Semaphore = field(init=False)    # orders retrying at once
    letters: Group = field(init=False)  # its dead letters, sent in groups (``dead_letters.deliver``)
    held: int = field(init=False, default=0)        # its records held now (in the crew's ``holds`` too)
    _mark: float = field(init=False)

    def __post_init__(self) -> None:
        clock, policy = self.crew.clock, self.crew.policy
        self.started = self._mark = clock.now()
        self.deadline = self.started + policy.deadline
        self.guard = OutageGuard(policy.infra_budget, clock=clock.now, sleep=clock.sleep)
        self.slots = asyncio.Semaphore(policy.concurrency)

    def lap(self, phase: str) -> None:
        """The wall time since the last lap, as ``phase``'s."""
        now = self.crew.clock.now()
        self.report.seconds[phase] = now - self._mark
        self._mark = now

    def tell(self, indices: list[int]) -> None:
        """Records ``indices`` are finished: their outcomes committed, or their letters sent."""
        self.finished(indices)
        if self.story is not None:
            self.story.finished(indices)

    def ended(self, lead: Item, outcome: Outcome, copies: Sequence[Item] = ()) -> None:
        """``lead`` ended well with ``outcome``, and its ``copies`` (records asking for the same) as
        duplicates."""
        self.report.outcomes[outcome] += 1
        if copies:
            self.report.outcomes[Outcome.DUPLICATE] += len(copies)
        if self.story is not None:
            self.story.ended([lead.index], outcome)
            self.story.ended([copy.index for copy in copies], Outcome.DUPLICATE)

    def traces(self, items: Sequence[Item]) -> list[object | None] | None:
        """The records' traces for a run of their events (None: not followed)."""
        return [item.trace for item in items] if self.story is not None else None

    def ours(self, items: Sequence[Item]) -> bool:
        """Whether every one of ``items`` is still this worker's to work (none given up by a rebalance)."""
        return all(self.still_ours(item.index) for item in items)

    def count_held(self, n: int) -> None:
        if n:
            self.held += n
            self.crew.holds.add(n)
