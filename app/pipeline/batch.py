"""Strategy D (seed 003): an optimistic pass over the whole batch, then the
failed records one by one, then dead letters; only then is the batch finished.

phase 1   every decodable event of the batch through the pipeline at once
          (multi-row statements, effect calls concurrent across orders)
phase 2   each record that failed retriably, or was deferred behind a failed
          record of its order, on its own: up to ``len(backoff)`` retries with
          those delays, orders concurrently, an order's records in offset
          order. A record waiting for another worker's lease waits for the
          lease instead (bounded), without using up its retries.
dead      non-retriable errors and exhausted retries: a t_compensation row,
letters   then the record on the dead-letter topic, acknowledged by the
          broker. If either fails, :class:`Fatal` is raised and the batch
          must not be committed.

Errors that are the database's, not the record's (:class:`StoreUnavailable`),
are waited out for ``infra_budget`` seconds per batch, then :class:`Fatal`.
A bug met while handling one record is isolated: phase 1 falls back to
phase 2, and phase 2 dead-letters that record as ``internal_error``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Awaitable, Callable, Sequence, TypeVar

from app.pipeline.errors import InternalError, LeaseHeld, MalformedEvent, PipelineError, StoreUnavailable
from app.pipeline.events import OrderEvent, decode
from app.pipeline.plan import step_keys
from app.pipeline.ports import DeadLetter, DeadLetterSink, SourceRecord, Store
from app.pipeline.processor import Processor, Result

log = logging.getLogger(__name__)
T = TypeVar("T")


class Fatal(Exception):
    """The batch cannot be finished (database gone too long, dead letter not delivered):
    the worker must stop without acknowledging it, so Kafka delivers it again."""


@dataclass
class BatchReport:
    outcomes: Counter = field(default_factory=Counter)        # applied, stale, duplicate, superseded, dead_letter
    dead_letters: list[DeadLetter] = field(default_factory=list)
    retries: Counter = field(default_factory=Counter)         # by error reason
    lease_waits: int = 0
    infra_wait_seconds: float = 0.0
    seconds: dict[str, float] = field(default_factory=dict)   # wall time per phase: decode, phase1, ...


@dataclass
class _Item:
    index: int
    record: SourceRecord
    event: OrderEvent
    first_failure: datetime | None = None
    attempts: int = 0


class BatchHandler:
    def __init__(self, processor: Processor, store: Store, sink: DeadLetterSink, *, group: str, worker_id: str,
                 backoff: Sequence[float], max_event_bytes: int, infra_budget: float, max_lease_wait: float,
                 dlq_retry_after: int = 60, concurrency: int = 64,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.processor = processor
        self.store = store
        self.sink = sink
        self.group = group
        self.worker_id = worker_id
        self.backoff = tuple(backoff)
        self.max_event_bytes = max_event_bytes
        self.infra_budget = infra_budget
        self.max_lease_wait = max_lease_wait
        self.dlq_retry_after = dlq_retry_after
        self.concurrency = concurrency
        self._sleep = sleep
        self._clock = clock

    async def handle(self, records: Sequence[SourceRecord]) -> BatchReport:
        """Process ``records`` (offset order per partition) until the batch may be committed."""
        report = BatchReport()
        mark = self._clock()

        def lap(phase: str) -> None:
            nonlocal mark
            now = self._clock()
            report.seconds[phase] = now - mark
            mark = now

        items: list[_Item] = []
        for index, record in enumerate(records):
            try:
                event = decode(record.key, record.value, max_bytes=self.max_event_bytes)
            except MalformedEvent as exc:
                report.dead_letters.append(self._letter(record, exc, attempts=1, first=_now()))
                continue
            except Exception as exc:   # a decoder bug: this record goes aside, the worker goes on
                log.exception("decoder failed on %s[%s]@%s", record.topic, record.partition, record.offset)
                error = InternalError(f"decoder: {exc.__class__.__name__}: {exc}")
                report.dead_letters.append(self._letter(record, error, attempts=1, first=_now()))
                continue
            items.append(_Item(index, record, event))
        lap("decode")

        results = await self._phase1(items, report)
        lap("phase1")
        retry: list[tuple[_Item, PipelineError | None]] = []
        for item, result in zip(items, results):
            if result.ok:
                report.outcomes[result.outcome] += 1
                continue
            if result.error is not None:
                item.attempts, item.first_failure = 1, _now()
                if not result.error.retriable:
                    report.dead_letters.append(self._letter_for(item, result.error))
                    continue
            retry.append((item, result.error))
        if retry:
            await self._phase2(retry, report)
            lap("phase2")
        if report.dead_letters:
            self._mark_superseded(report, items)
            await self._dead_letter(report)
            report.outcomes["dead_letter"] += len(report.dead_letters)
            lap("dead_letters")
        return report

    # -- phases ----------------------------------------------------------------

    async def _phase1(self, items: list[_Item], report: BatchReport) -> list[Result]:
        if not items:
            return []
        try:
            return await self._with_infra(lambda: self.processor.run([i.event for i in items]), report)
        except Fatal:
            raise
        except Exception:
            # A bug somewhere in the batch: find the record that triggers it, one by one.
            log.exception("phase 1 failed on a batch of %d; retrying its records one by one", len(items))
            return [Result(deferred=True)] * len(items)

    async def _phase2(self, retry: list[tuple[_Item, PipelineError | None]], report: BatchReport) -> None:
        chains: dict[str, list[tuple[_Item, PipelineError | None]]] = defaultdict(list)
        for item, error in retry:
            chains[item.event.order_no].append((item, error))
        slots = asyncio.Semaphore(self.concurrency)

        async def run_chain(chain):
            async with slots:
                for item, error in chain:     # an order's records stay in offset order
                    await self._retry_one(item, error, report)

        await asyncio.gather(*(run_chain(chain) for chain in chains.values()))

    async def _retry_one(self, item: _Item, error: PipelineError | None, report: BatchReport) -> None:
        retries = 0
        lease_waited = 0.0
        while True:
            if isinstance(error, LeaseHeld) and lease_waited < self.max_lease_wait:
                wait = min(error.wait_seconds + 0.05, self.max_lease_wait - lease_waited)
                report.lease_waits += 1
                lease_waited += wait
                await self._sleep(wait)
            elif error is not None and error.retriable and not isinstance(error, LeaseHeld) \
                    and retries < len(self.backoff):
                report.retries[error.reason] += 1
                await self._sleep(self.backoff[retries])
                retries += 1
            elif error is not None:
                report.dead_letters.append(self._letter_for(item, error))
                return
            result = await self._run_one(item, report)
            if result.ok:
                report.outcomes[result.outcome] += 1
                return
            error = result.error or PipelineError("deferred in a batch of one", reason="deferred")
            item.attempts += 1
            item.first_failure = item.first_failure or _now()

    async def _run_one(self, item: _Item, report: BatchReport) -> Result:
        try:
            [result] = await self._with_infra(lambda: self.processor.run([item.event]), report)
            return result
        except Fatal:
            raise
        except Exception as exc:
            log.exception("internal error on %s[%s]@%s", item.record.topic, item.record.partition,
                          item.record.offset)
            error = InternalError(f"{exc.__class__.__name__}: {exc}")
            return Result(error=error)

    async def _with_infra(self, work: Callable[[], Awaitable[T]], report: BatchReport) -> T:
        delay = 0.5
        while True:
            try:
                return await work()
            except StoreUnavailable as exc:
                if report.infra_wait_seconds >= self.infra_budget:
                    raise Fatal(f"database unavailable for {report.infra_wait_seconds:.0f}s: {exc}") from exc
                wait = min(delay, self.infra_budget - report.infra_wait_seconds)
                log.warning("database unavailable (%s); waiting %.1fs", exc, wait)
                report.infra_wait_seconds += wait
                await self._sleep(wait)
                delay = min(delay * 2, 10.0)

    # -- dead letters ------------------------------------------------------------

    async def _dead_letter(self, report: BatchReport) -> None:
        report.dead_letters.sort(key=lambda letter: (letter.record.topic, letter.record.partition,
                                                     letter.record.offset))
        letters = report.dead_letters
        # The ledger row first: the same record dead-lettered twice (a replay)
        # finds its row and adds none. Then the record, acknowledged by the broker.
        await self._with_infra(
            lambda: self.store.in_transaction(lambda tx: tx.record_dead_letters(
                letters, group=self.group, retry_after_seconds=self.dlq_retry_after)),
            report)
        try:
            await self.sink.publish(letters)
        except Exception as exc:
            raise Fatal(f"{len(letters)} dead letters not acknowledged by the broker: {exc!r}") from exc
        for letter in letters:
            log.warning("dead-lettered %s[%s]@%s (%s): %s", letter.record.topic, letter.record.partition,
                        letter.record.offset, letter.reason, letter.message[:300])

    def _letter_for(self, item: _Item, error: PipelineError) -> DeadLetter:
        event = item.event
        return replace(self._letter(item.record, error, attempts=max(item.attempts, 1),
                                    first=item.first_failure or _now()),
                       order_no=event.order_no, event_id=event.event_id, biz_key=step_keys(event)[0])

    def _letter(self, record: SourceRecord, error: PipelineError, *, attempts: int, first: datetime) -> DeadLetter:
        return DeadLetter(record=record, reason=error.reason, message=str(error), retriable=error.retriable,
                          attempts=attempts, first_failure_at=first, worker_id=self.worker_id)

    @staticmethod
    def _mark_superseded(report: BatchReport, items: list[_Item]) -> None:
        """Flag letters whose order had later events in this batch: those ran after them."""
        last_index: dict[str, int] = {}
        for item in items:
            last_index[item.event.order_no] = item.index
        positions = {id(item.record): item.index for item in items}
        report.dead_letters[:] = [
            replace(letter, may_be_superseded=True)
            if letter.order_no and last_index.get(letter.order_no, -1) > positions.get(id(letter.record), -1)
            else letter
            for letter in report.dead_letters]


def _now() -> datetime:
    return datetime.now(timezone.utc)
