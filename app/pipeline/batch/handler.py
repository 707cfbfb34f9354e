"""The batch handler: a batch of records from reading to every record's end, phase by phase (the
package's docstring tells the story; each phase is a module of its own)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import app.pipeline.batch.finishing as finishing
import app.pipeline.batch.holds as holds
import app.pipeline.batch.orders as orders
from app.pipeline.batch.gate import OrderGate
from app.pipeline.batch.policy import BatchPolicy, Identity
from app.pipeline.batch.reading import read
from app.pipeline.batch.state import Batch, BatchReport, Crew, Holds, Tell
from app.pipeline.clock import REAL_TIME, Clock
from app.pipeline.envelopes import Reading
from app.pipeline.events import NATIVE
from app.pipeline.ports import DeadLetterSink, SourceRecord, Store
from app.pipeline.processor import Processor


class BatchHandler:
    """Works a worker's batches; batches in flight at once share its order gate and its held records.
    What happens to each record is told to its processor's observer."""

    def __init__(self, processor: Processor, store: Store, sink: DeadLetterSink, *, identity: Identity,
                 policy: BatchPolicy, reading: Reading = NATIVE, clock: Clock = REAL_TIME) -> None:
        self.processor = processor
        self.store = store
        self.sink = sink
        self.identity = identity
        self.policy = policy
        self.reading = reading
        self.clock = clock
        self.holds = Holds()
        self.crew = Crew(processor, store, sink, identity, policy, clock, OrderGate(), self.holds)

    @property
    def held(self) -> int:
        """Records held now, in all of its batches, while their provider's breaker is open."""
        return self.holds.records

    @property
    def on_hold(self) -> Callable[[], None] | None:
        return self.holds.on_more

    @on_hold.setter
    def on_hold(self, nudge: Callable[[], None] | None) -> None:
        """Told when more records are held (the feed does not count them against records in flight)."""
        self.holds.on_more = nudge

    async def handle(self, records: Sequence[SourceRecord], finished: Tell | None = None,
                     still_ours: Callable[[int], bool] | None = None) -> BatchReport:
        """Process ``records`` (offset order per partition) until every one of them is finished.

        ``finished`` is told the indices of records (into ``records``) as soon as they are: their
        steps' outcomes are committed, or their dead letters are in the ledger and on the topic. An
        order's records finish together; other orders do not wait for them. The batch's report is
        returned once all are. ``still_ours``: whether a record is still this worker's (a rebalance gives
        up the records of revoked partitions; one held by a person's hold then leaves it unworked)."""
        batch = self._begin(records, finished or _nobody)
        if still_ours is not None:
            batch.still_ours = still_ours
        contents = read(batch, records, self.reading)
        finishing.skipped(batch, contents.skipped)
        batch.lap("decode")
        # Entered before the first await: a later batch finds these orders held by this one.
        places = self.crew.gate.enter(list(contents.orders))
        try:
            await orders.work(batch, contents, places)
        except BaseExceptionGroup as group:         # the first of what broke the batch, as it was raised
            raise _first(group) from None
        finally:
            for order, (_, mine) in places.items():
                self.crew.gate.leave(order, mine)
            if batch.held:                          # cut short while some were held
                holds.release(batch, batch.held)
            if batch.story is not None:
                batch.story.closed()
        batch.lap("work")
        batch.report.infra_wait_seconds = batch.guard.waited
        return batch.report

    def _begin(self, records: Sequence[SourceRecord], finished: Tell) -> Batch:
        story = self.processor.observer.batch_began(records, self.identity.group) if records else None
        return Batch(self.crew, finished, story)


def _nobody(indices: list[int]) -> None:
    pass


def _first(group: BaseExceptionGroup) -> BaseException:
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error
