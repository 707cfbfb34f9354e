"""The optimistic batch with per-record retries: the whole batch through the
pipeline at once, then the failed records one by one, then dead letters; only
then is the batch finished (and may Faust ack and commit it).

phase 1   every decodable event of the batch through the pipeline at once
          (multi-row statements, effect calls concurrent across orders)
phase 2   each record that failed retriably, or was deferred behind a failed
          record of its order, on its own: up to ``len(backoff)`` retries with
          those delays, orders concurrently, an order's records in offset
          order. A record waiting for another worker's lease waits for the
          lease instead (bounded), without using up its retries; so does a
          record its provider answered "not yet" (429, ``Retry-After``). Records of an
          order that ask for the same thing (same idempotency key and payload)
          are one piece of work: the first one is retried, the others share
          its end. So do they in phase 1, where the plan answers a copy
          ``duplicate`` before its lead's calls are made: a copy of a request
          that fails is dead-lettered with it, never read past.
dead      non-retriable errors and exhausted retries: a t_compensation row,
letters   then the record on the dead-letter topic (``app.pipeline.letters``).

The batch has a deadline (``deadline`` seconds from its start, well under the
group's rebalance timeout: a rebalance waits for the batch in flight, and a
member that does not rejoin in time is evicted and its commit refused). When
it passes, a record still waiting to retry is dead-lettered as retriable
(``deadline_exceeded``) and the compensator goes on with it; a call already in
flight is waited for.

Errors that are the database's, not the record's (:class:`StoreUnavailable`),
are waited out: the batch gives up (:class:`Fatal`) once the database has been
unreachable for ``infra_budget`` seconds of wall-clock time, however many
records were waiting for it at once. Those waits do not count against the
deadline: a database outage is nobody's record's fault.
A bug met while handling one record is isolated: phase 1 falls back to
phase 2, and phase 2 dead-letters that record as ``internal_error``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, defaultdict, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from opentelemetry.context import Context
from opentelemetry.trace import Span

from app.pipeline import letters, tracing
from app.pipeline.envelopes import Reading
from app.pipeline.errors import (
    Fatal,
    InternalError,
    LeaseHeld,
    MalformedEvent,
    PipelineError,
    PreconditionNotMet,
    ProviderUnavailable,
    RateLimited,
    UnhandledType,
)
from app.pipeline.events import NATIVE, OrderEvent, check_headers, decode
from app.pipeline.groups import Group
from app.pipeline.outage import OutageGuard
from app.pipeline.outcomes import Outcome
from app.pipeline.plan import step_keys
from app.pipeline.ports import DeadLetter, DeadLetterSink, SourceRecord, Store
from app.pipeline.processor import Processor, Result, Settled
from app.pipeline.steps import PIPELINES

__all__ = ["BatchHandler", "BatchReport", "Fatal"]
log = logging.getLogger(__name__)


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
    seconds: dict[str, float] = field(default_factory=dict)   # wall time per phase: decode, phase1, ...


@dataclass
class _Item:
    index: int
    record: SourceRecord
    event: OrderEvent
    first_failure: datetime | None = None
    attempts: int = 0
    span: Span | None = None            # its record's span, when traced (app.pipeline.tracing)

    @property
    def trace(self) -> Context | None:
        return tracing.context_of(self.span)

    @property
    def work(self) -> tuple[str, str]:
        """What the record asks for: two records with the same are one piece of work."""
        return step_keys(self.event)[0], self.event.payload_hash


class BatchHandler:
    def __init__(self, processor: Processor, store: Store, sink: DeadLetterSink, *, group: str, worker_id: str,
                 backoff: Sequence[float], max_event_bytes: int, infra_budget: float, max_lease_wait: float,
                 deadline: float = 15.0, dlq_retry_after: int = 60, concurrency: int = 64,
                 hold_records: int = 0, reading: Reading = NATIVE,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.processor = processor
        self.store = store
        self.sink = sink
        self.group = group
        self.worker_id = worker_id
        self.backoff = tuple(backoff)
        self.max_event_bytes = max_event_bytes
        self.reading = reading
        self.infra_budget = infra_budget
        self.max_lease_wait = max_lease_wait
        self.deadline = deadline
        self.dlq_retry_after = dlq_retry_after
        self.concurrency = concurrency
        self._sleep = sleep
        self._clock = clock
        self._gate = _OrderGate()
        # Records held while their effect's breaker is open (before their T1), at most hold_records;
        # on_hold is told when more are held (the feed does not count them against records in flight).
        self.hold_records = hold_records
        self.held = 0
        self.holding_orders: Counter[str] = Counter()            # orders with records held now
        self.on_hold: Callable[[], None] | None = None

    async def handle(self, records: Sequence[SourceRecord],
                     finished: Callable[[list[int]], None] | None = None) -> BatchReport:
        """Process ``records`` (offset order per partition) until every one of them is finished.

        ``finished`` is told the indices of records (into ``records``) as soon as they are: their
        steps' outcomes are committed, or their dead letters are in the ledger and on the topic. An
        order's records finish together; other orders do not wait for them. The batch's report is
        returned once all are."""
        report = BatchReport()
        run = _Run(self, report)
        tell = finished or _nobody
        spans = _RecordSpans(records, self.group) if tracing.on() and records else None
        if spans is not None:
            tell = spans.telling(tell)

        items: list[_Item] = []
        loose: list[tuple[DeadLetter, list[int]]] = []            # letters of records without an order
        runs: dict[tuple[str, int, int], list[tuple[int, SourceRecord]]] = defaultdict(list)
        retention = self.processor.retention
        latest = retention.latest() if retention is not None else None
        reading = self.reading
        skipped: list[int] = []
        for index, record in enumerate(records):
            if record.unreadable is not None:
                runs[record.topic, record.partition, record.unreadable.first].append((index, record))
                continue
            try:
                if record.headers:
                    check_headers(record.headers)
                event = decode(record.key, record.value, max_bytes=self.max_event_bytes, latest=latest,
                               headers=record.headers, timestamp_ms=record.timestamp_ms, reading=reading)
            except UnhandledType as exc:
                if reading.skip_unhandled:            # not ours: finished as it is, counted by its type
                    report.skipped[exc.type_name] += 1
                    report.skipped_at[exc.type_name] = (record.topic, record.partition, record.offset)
                    skipped.append(index)
                else:
                    loose.append((self._letter(record, exc), [index]))
                continue
            except MalformedEvent as exc:
                loose.append((self._letter(record, exc), [index]))
                continue
            except Exception as exc:   # a decoder bug: this record goes aside, the worker goes on
                log.exception("decoder failed on %s[%s]@%s", record.topic, record.partition, record.offset)
                error = InternalError(f"decoder: {exc.__class__.__name__}: {exc}")
                loose.append((self._letter(record, error), [index]))
                continue
            items.append(_Item(index, record, event))
        if spans is not None:
            for item in items:
                item.span = spans.of(item.index, item.event)
            loose = [(spans.dead(letter, indices), indices) for letter, indices in loose]
        if skipped:
            report.outcomes[Outcome.SKIPPED] += len(skipped)
            if spans is not None:
                spans.ended(skipped, Outcome.SKIPPED)
            tell(skipped)
        for unread in runs.values():
            letter = self._run_letter([record for _, record in unread])
            if spans is not None:
                letter = spans.dead(letter, [index for index, _ in unread])
            loose.append((letter, [index for index, _ in unread]))
            if len(unread) > 1:
                report.covered[letter.reason] += len(unread) - 1      # the run's reason
        run.lap("decode")
        orders: dict[str, list[_Item]] = defaultdict(list)
        for item in items:
            orders[item.event.order_no].append(item)
        # Entered before the first await: a later batch finds these orders held by this one.
        places = self._gate.enter(list(orders))
        try:
            await run.work(orders, places, loose, tell)
        except BaseExceptionGroup as group:         # the first of what broke the batch, as it was raised
            raise _first(group) from None
        finally:
            for order, (_, mine) in places.items():
                self._gate.leave(order, mine)
            if run.held:                            # cut short while some were held
                run._release(run.held)
            if spans is not None:
                spans.close()
        run.lap("work")
        report.infra_wait_seconds = run.guard.waited
        return report

    def _holding(self, n: int) -> None:
        self.held += n
        if n > 0 and self.on_hold is not None:
            self.on_hold()

    def _letter(self, record: SourceRecord, error: PipelineError) -> DeadLetter:
        return letters.for_record(record, error, attempts=1, first=letters.now(), worker_id=self.worker_id)

    def _run_letter(self, unread: list[SourceRecord]) -> DeadLetter:
        """One letter for the unreadable records of one record batch in this batch: a record
        batch of 200,000 unreadable records is not 200,000 letters (each with the raw batch)."""
        first, last, problem = unread[0], unread[-1], unread[0].unreadable
        assert problem is not None          # a run holds only records that came unreadable
        where = (f"This letter stands for offsets {first.offset}..{last.offset} ({len(unread)} records) of that "
                 f"record batch ({problem.first}..{problem.last}, {problem.last - problem.first + 1} records).")
        if first.offset != problem.first:
            where += f" The raw record batch is the value of the letter for offset {problem.first}."
        error = MalformedEvent(f"{problem.message} {where}", reason=problem.reason)
        return replace(self._letter(first, error), covers=(first.offset, last.offset, len(unread)))

    def _letter_for(self, item: _Item, error: PipelineError) -> DeadLetter:
        letter = letters.for_event(item.record, item.event, error, attempts=item.attempts,
                                   first=item.first_failure or letters.now(), worker_id=self.worker_id)
        return dead_lettered(letter, item.span)


def dead_lettered(letter: DeadLetter, span: Span | None) -> DeadLetter:
    """``letter`` with the context of its ``dead-letter`` span (a child of its record's ``span``)."""
    if span is None:
        return letter
    tracing.ended(span, Outcome.DEAD_LETTER, _LetterError(letter))
    child = tracing.child_span("dead-letter", tracing.context_of(span), **{
        "error.type": letter.reason, "retriable": letter.retriable, "dlq.attempts": letter.attempts,
        "idem.key": letter.biz_key, "order.no": letter.order_no})
    child.end()
    return replace(letter, trace=tracing.traceparent(child))


class _LetterError(PipelineError):
    """A letter's reason, as the error a span ends with."""

    def __init__(self, letter: DeadLetter) -> None:
        super().__init__(letter.reason, reason=letter.reason)
        self.retriable = letter.retriable


class _RecordSpans:
    """The spans of one batch when traced: the batch's, and each record's (continuing its producer's
    trace, linked to the batch's); a record's span ends when the batch handler says it is finished."""

    def __init__(self, records: Sequence[SourceRecord], group: str) -> None:
        parents = [tracing.extract(r.headers, r.value) if r.unreadable is None else None for r in records]
        self.batch = tracing.batch_span(records[0].topic, group, len(records), parents)
        self.spans = [tracing.record_span(r.topic, group, r.partition, r.offset, parent, self.batch)
                      for r, parent in zip(records, parents)]
        self.open = set(range(len(records)))

    def of(self, index: int, event) -> Span:
        span = self.spans[index]
        span.set_attribute("order.no", event.order_no)
        span.set_attribute("event.type", event.type.value)
        return span

    def dead(self, letter: DeadLetter, indices: list[int]) -> DeadLetter:
        for index in indices[1:]:
            tracing.ended(self.spans[index], Outcome.DEAD_LETTER, _LetterError(letter))
        return dead_lettered(letter, self.spans[indices[0]])

    def ended(self, indices: list[int], outcome: str) -> None:
        for index in indices:
            tracing.ended(self.spans[index], outcome)

    def telling(self, tell: Callable[[list[int]], None]) -> Callable[[list[int]], None]:
        def told(indices: list[int]) -> None:
            tell(indices)
            for index in indices:
                if index in self.open:
                    self.open.discard(index)
                    self.spans[index].end()
        return told

    def close(self) -> None:
        for index in sorted(self.open):
            self.spans[index].end()
        self.open.clear()
        self.batch.end()


HOLD_MARGIN_SECONDS = 1.0      # held records go on this long before their batch's deadline
BEHIND_LOOK_SECONDS = 0.5      # how often records behind an order of an earlier batch look whether it is held


class _OrderGate:
    """An order's records in batches in flight at once are worked one batch after another, in the
    order the batches came: an order's records in a later batch start only once the earlier batch
    is done with that order (its records there finished). Their claims are this worker's (the same
    owner), so without the wait the later batch would take the earlier one's pending claim for its
    own and call the effect a second time. Other orders of the two batches do not wait for each
    other. An order's events are in one partition when producers key by order, but not always (a
    topic given more partitions, a producer with another key)."""

    def __init__(self) -> None:
        self._last: dict[str, asyncio.Event] = {}      # order -> set when its latest holder is done

    def enter(self, orders: list[str]) -> dict[str, tuple[asyncio.Event | None, asyncio.Event]]:
        """For each order: the event of the batch before this one that holds it (None: none does), and
        this batch's, to set by :meth:`leave`."""
        places: dict[str, tuple[asyncio.Event | None, asyncio.Event]] = {}
        last = self._last
        for order in orders:
            mine = asyncio.Event()
            places[order] = (last.get(order), mine)
            last[order] = mine
        return places

    def leave(self, order: str, mine: asyncio.Event) -> None:
        mine.set()
        if self._last.get(order) is mine:
            del self._last[order]


class _Run:
    """One batch in progress: its clock, deadline and database outage."""

    def __init__(self, handler: BatchHandler, report: BatchReport) -> None:
        self.h = handler
        self.report = report
        self.started = self._mark = handler._clock()
        self.deadline = self.started + handler.deadline
        self.guard = OutageGuard(handler.infra_budget, clock=handler._clock, sleep=handler._sleep)
        self.slots = asyncio.Semaphore(handler.concurrency)      # orders retrying at once
        self.held = 0                                             # its records held now (in handler.held)

    def lap(self, phase: str) -> None:
        now = self.h._clock()
        self.report.seconds[phase] = now - self._mark
        self._mark = now

    # -- the orders of the batch -------------------------------------------------

    async def work(self, orders: dict[str, list[_Item]],
                   places: dict[str, tuple[asyncio.Event | None, asyncio.Event]],
                   loose: list[tuple[DeadLetter, list[int]]], tell: Callable[[list[int]], None]) -> None:
        """Every order on its own: those no earlier batch holds start together (one T1), the others
        as their earlier batch lets them go; each order is finished (retried, dead-lettered) and told
        as soon as its results are in. Dead letters are sent in groups."""
        letters_out = Group(500, 0.02, producers=len(orders) + (1 if loose else 0))

        async def send_letters() -> None:
            while (taken := await letters_out.next()) is not None:
                some = [letter for batch, _ in taken for letter in batch]
                self.report.dead_letters.extend(await letters.deliver(
                    some, store=self.h.store, sink=self.h.sink, group=self.h.group, owner=self.h.processor.owner,
                    retry_after=self.h.dlq_retry_after, guard=self.guard))
                for _, sent in taken:
                    sent.set_result(None)

        async def orders_and_loose() -> None:
            try:
                async with asyncio.TaskGroup() as tasks:
                    if loose:
                        tasks.create_task(self._send_loose(loose, letters_out, tell))
                    starter = _Starter(self, tasks)
                    free: list[_Item] = []
                    opened = self._open_effects()
                    for order, its in orders.items():
                        earlier = places[order][0]
                        results, held = None, None
                        if earlier is None:
                            now, held = self._split(its, opened)
                            free.extend(now)
                            results = starter.results_of(order) if now else None
                        tasks.create_task(self._order(its, places[order], results, held, starter, letters_out,
                                                      tell))
                    if free:
                        tasks.create_task(starter.run(free))
            finally:
                letters_out.close()

        async with asyncio.TaskGroup() as both:
            both.create_task(send_letters())
            both.create_task(orders_and_loose())

    async def _send_loose(self, loose: list[tuple[DeadLetter, list[int]]], letters_out: Group,
                          tell: Callable[[list[int]], None]) -> None:
        sent = asyncio.get_running_loop().create_future()
        letters_out.add(([letter for letter, _ in loose], sent), len(loose))
        await sent
        self.report.outcomes[Outcome.DEAD_LETTER] += len(loose) + sum(self.report.covered.values())
        tell([index for _, indices in loose for index in indices])

    async def _order(self, items: list[_Item], place: tuple[asyncio.Event | None, asyncio.Event],
                     results: asyncio.Future | None, held: list[_Item] | None, starter: _Starter,
                     letters_out: Group, tell: Callable[[list[int]], None]) -> None:
        """One order of the batch, from its first try to its records' end; then the order's records in
        a later batch may start."""
        earlier, mine = place
        try:
            if not await self._order_work(items, earlier, results, held, starter, letters_out, tell):
                letters_out.leave()
        finally:
            self.h._gate.leave(items[0].event.order_no, mine)

    async def _order_work(self, items: list[_Item], earlier: asyncio.Event | None, results: asyncio.Future | None,
                          held: list[_Item] | None, starter: _Starter, letters_out: Group,
                          tell: Callable[[list[int]], None]) -> bool:
        """The order's work; whether its last part sent letters (it is then done with ``letters_out``).

        Its records from the first one that needs an effect whose breaker is open are held, before
        their T1, until the breaker closes (or their batch's deadline is near); the records before it
        go on at once."""
        order = items[0].event.order_no
        now = items[:len(items) - len(held)] if held else items
        if earlier is not None:
            self.report.order_waits += 1
            await self._behind(order, earlier, len(items))
            now, held = self._split(items, self._open_effects())
            if now:
                results = starter.results_of(order)
                starter.later(now)
        sent = False
        if now:
            assert results is not None
            sent = await self._part(now, items, results, letters_out, tell, last=not held)
        if not held:
            return sent
        await self._hold(held)
        self._release(len(held))
        starter.fresh(order)
        results = starter.results_of(order)
        starter.later(held)
        return await self._part(held, items, results, letters_out, tell, last=True)

    def _count_held(self, n: int) -> None:
        if n:
            self.held += n
            self.h._holding(n)

    def _release(self, n: int) -> None:
        self._count_held(-n)

    async def _behind(self, order: str, earlier: asyncio.Event, n: int) -> None:
        """Wait for the earlier batch to be done with the order; its ``n`` records here count as held
        while the order is held there (waiting for its provider's breaker)."""
        counted = False
        try:
            while not earlier.is_set():
                holding = order in self.h.holding_orders
                if holding != counted:
                    self._count_held(n if holding else -n)
                    counted = holding
                if not self.h.holding_orders and not self._open_effects():
                    await earlier.wait()          # nothing held, no provider down: the common case
                    break
                try:
                    await asyncio.wait_for(earlier.wait(), BEHIND_LOOK_SECONDS)
                except TimeoutError:
                    pass
        finally:
            if counted:
                self._count_held(-n)

    def _hold_until(self) -> float:
        return self.deadline - min(HOLD_MARGIN_SECONDS, self.h.deadline / 4)

    def _holds(self, error: PipelineError) -> bool:
        """Whether a record refused by an open breaker waits for it (instead of its dead letter at once)."""
        return isinstance(error, ProviderUnavailable) and self.h.hold_records > 0

    def _open_effects(self) -> frozenset[str]:
        if self.h.hold_records <= 0:
            return frozenset()
        limits = getattr(self.h.processor, "limits", None)
        if limits is None:
            return frozenset()
        return frozenset(limits.open_breakers())

    def _split(self, items: list[_Item], opened: frozenset[str]) -> tuple[list[_Item], list[_Item] | None]:
        """The order's records to start now, and those to hold (from its first record that needs an
        effect whose breaker is open); none held past ``hold_records`` held in all."""
        if not opened:
            return items, None
        for at, item in enumerate(items):
            if any(step.effect.name in opened for step in PIPELINES[item.event.type].effects):
                if self.h.held + len(items) - at > self.h.hold_records:
                    return items, None           # too many held: they go on, and meet the breaker
                self._count_held(len(items) - at)
                return items[:at], items[at:]
        return items, None

    async def _hold(self, held: list[_Item], count: int = 0) -> None:
        """Until every effect these records need has its breaker closed, or lets one of them through
        to probe it, or their batch's deadline is near: they then go on (and meet the breaker if it is
        still open: dead-lettered as ``provider_unavailable``)."""
        limits = self.h.processor.limits
        until = self._hold_until()
        effects = sorted({step.effect.name for item in held for step in PIPELINES[item.event.type].effects})
        self.report.held += len(held)
        order = held[0].event.order_no
        holding = self.h.holding_orders
        holding[order] += 1
        self._count_held(count)
        try:
            for effect in effects:
                if limits.breaker_open(effect):
                    await limits.until_it_may_call(effect, until)
        finally:
            self._count_held(-count)
            holding[order] -= 1
            if not holding[order]:
                del holding[order]

    async def _part(self, part: list[_Item], items: list[_Item], results: asyncio.Future, letters_out: Group,
                    tell: Callable[[list[int]], None], *, last: bool) -> bool:
        """Records ``part`` of the order's ``items``, once their first try's ``results`` are in: retried,
        dead-lettered, then told finished. Whether it sent letters."""
        dead: list[DeadLetter] = []
        retry: list[tuple[_Item, PipelineError | None]] = []
        for lead, result, copies in _copies_follow_their_lead(part, await results):
            if result.ok:
                self.report.outcomes[result.outcome] += 1
                if copies:
                    self.report.outcomes[Outcome.DUPLICATE] += len(copies)
                tracing.ended(lead.span, result.outcome)
                for copy in copies:
                    tracing.ended(copy.span, Outcome.DUPLICATE)
                continue
            if result.error is not None:
                for item in (lead, *copies):
                    item.attempts, item.first_failure = 1, letters.now()
                if not (result.error.retriable and result.error.retry_in_batch) and not self._holds(result.error):
                    dead.append(self.h._letter_for(lead, result.error))
                    dead.extend(self.h._letter_for(item, letters.same_request(result.error, lead.record))
                                for item in copies)
                    continue
            retry.append((lead, result.error))
            retry.extend((item, result.error) for item in copies)     # one piece of work again below
        if retry:
            async with self.slots:
                await self._retry_order(retry, dead, len(part))
        if dead:
            letters.flag_overtaken(dead, {id(item.record): item.index for item in items},
                                   {items[0].event.order_no: items[-1].index})
            sent = asyncio.get_running_loop().create_future()
            letters_out.add((dead, sent), len(dead), last=last)
            await sent
            self.report.outcomes[Outcome.DEAD_LETTER] += len(dead)
        tell([item.index for item in part])
        return bool(dead) and last

    async def phase1(self, items: list[_Item], settled: Settled | None = None) -> list[Result]:
        if not items:
            return []
        try:
            traces = [i.trace for i in items] if items[0].span is not None else None
            return await self.h.processor.run([i.event for i in items], self.guard, not_after=self.deadline,
                                              settled=settled, traces=traces)
        except Fatal:
            raise
        except Exception:
            # A bug somewhere in the batch: find the record that triggers it, one by one.
            log.exception("phase 1 failed on a batch of %d; retrying its records one by one", len(items))
            return [Result(deferred=True)] * len(items)

    async def _retry_order(self, retry: list[tuple[_Item, PipelineError | None]], dead: list[DeadLetter],
                           waiting: int = 1) -> None:
        """An order's records that failed retriably, or were deferred behind one that did, on their own:
        in offset order, each retried with backoff until it ends well or must be dead-lettered.

        A record whose order is not ready for it (a CONFIRM before its CREATED: it did nothing) gives
        way to the order's later records, which may be what it waits for, and is tried again after
        them; once every record left has given way since the last that ended well, they are retried
        with backoff as the others."""
        pieces = deque(_pieces_of_work(retry))               # in offset order of their first record
        gave_way = 0                     # records that gave way in a row, none ending well since
        ended_well = 0
        waited_at: dict[int, int] = {}   # a record that gave way -> ended_well then
        while pieces:
            lead, error, same = pieces.popleft()
            may_give_way = gave_way < len(pieces)
            if id(lead) in waited_at and ended_well > waited_at.pop(id(lead)):
                error = None                 # the order moved since it gave way: tried again at once
            elif may_give_way and isinstance(error, PreconditionNotMet):
                pieces.append((lead, error, same))
                waited_at[id(lead)] = ended_well
                gave_way += 1
                continue
            retried = await self._retry(lead, error, waiting, give_way=may_give_way)
            if isinstance(retried, _NotReady):
                pieces.append((lead, retried.error, same))
                waited_at[id(lead)] = ended_well
                gave_way += 1
                continue
            if isinstance(retried, Result):
                gave_way = 0
                ended_well += 1
                self.report.outcomes[retried.outcome] += 1
                if same:
                    self.report.outcomes[Outcome.DUPLICATE] += len(same)
                tracing.ended(lead.span, retried.outcome)
                for item in same:
                    tracing.ended(item.span, Outcome.DUPLICATE)
                continue
            dead.append(self.h._letter_for(lead, retried))
            for item in same:
                item.attempts, item.first_failure = lead.attempts, lead.first_failure
                dead.append(self.h._letter_for(item, letters.same_request(retried, lead.record)))

    async def _retry(self, item: _Item, error: PipelineError | None, waiting: int = 1, *,
                     give_way: bool = False) -> Result | PipelineError | _NotReady:
        """Retry one record until it succeeds (the result) or must be dead-lettered (the error);
        ``give_way``: a first try that finds its order not ready for it returns at once."""
        h = self.h
        retries = 0
        lease_waited = 0.0
        while True:
            wait, lease_wait, not_yet = 0.0, False, False
            if error is None:
                pass                                       # deferred in phase 1: not tried yet
            elif isinstance(error, ProviderUnavailable):
                # Claimed before the breaker opened: held too, until it closes or lets this one probe.
                if not self._holds(error) or h._clock() >= self._hold_until():
                    return error
                await self._hold([item], waiting)      # the order's records of this part wait with it
                not_yet = True
            elif isinstance(error, LeaseHeld) and lease_waited < h.max_lease_wait:
                wait, lease_wait = min(error.wait_seconds + 0.05, h.max_lease_wait - lease_waited), True
            elif isinstance(error, RateLimited):
                wait, not_yet = error.wait_seconds or 0.0, True    # the provider's "not yet": no retry used
            elif error.retriable and error.retry_in_batch and not isinstance(error, LeaseHeld) \
                    and retries < len(h.backoff):
                wait = h.backoff[retries]
            else:
                return error
            if h._clock() + wait > self.deadline:
                return letters.past_deadline(error, h.deadline)
            if lease_wait:
                self.report.lease_waits += 1
                lease_waited += wait
            elif not_yet:
                if isinstance(error, RateLimited):
                    self.report.rate_limited += 1
            elif error is not None:
                self.report.retries[error.reason] += 1
                retries += 1
            if wait:
                await h._sleep(wait)
            result = await self._run_one(item)
            if result.ok:
                return result
            tried_first = error is None
            error = result.error or PipelineError("deferred in a batch of one", reason="deferred")
            item.attempts += 1
            item.first_failure = item.first_failure or letters.now()
            if give_way and tried_first and isinstance(error, PreconditionNotMet):
                return _NotReady(error)

    async def _run_one(self, item: _Item) -> Result:
        try:
            [result] = await self.h.processor.run([item.event], self.guard, not_after=self.deadline,
                                                  traces=[item.trace] if item.span is not None else None)
            return result
        except Fatal:
            raise
        except Exception as exc:
            log.exception("internal error on %s[%s]@%s", item.record.topic, item.record.partition,
                          item.record.offset)
            return Result(error=InternalError(f"{exc.__class__.__name__}: {exc}"))


class _Starter:
    """Starts orders' first tries: the orders no earlier batch holds at once, in one run; the others
    as they are let go, those let go together in one run. Each order's results come as soon as its
    calls are recorded (``Processor.run``'s ``settled``), not when the whole run is over."""

    GATHER = 0.005          # orders let go this close together share a T1

    def __init__(self, run: _Run, tasks: asyncio.TaskGroup) -> None:
        self.run_ = run
        self.tasks = tasks
        self._results: dict[str, asyncio.Future] = {}
        self._later: list[_Item] = []

    def results_of(self, order: str) -> asyncio.Future:
        future = self._results.get(order)
        if future is None:
            future = self._results[order] = asyncio.get_running_loop().create_future()
        return future

    def fresh(self, order: str) -> None:
        """The order's next run gets results of its own."""
        self._results.pop(order, None)

    def later(self, items: list[_Item]) -> None:
        if not self._later:
            self.tasks.create_task(self._gather_later())
        self._later.extend(items)

    async def _gather_later(self) -> None:
        await asyncio.sleep(self.GATHER)
        items, self._later = self._later, []
        await self.run(items)

    async def run(self, items: list[_Item]) -> None:
        futures = {item.event.order_no: self.results_of(item.event.order_no) for item in items}

        def settled(indices: list[int], results: list[Result]) -> None:
            _tell(futures[items[indices[0]].event.order_no], results)

        results = await self.run_.phase1(items, settled)
        by_order: dict[str, list[Result]] = defaultdict(list)
        for item, result in zip(items, results):
            by_order[item.event.order_no].append(result)
        for order, its in by_order.items():           # those not told yet (a run without calls, a broken one)
            _tell(futures[order], its)


def _tell(future: asyncio.Future, results: list[Result]) -> None:
    if not future.done():
        future.set_result(results)


def _nobody(indices: list[int]) -> None:
    pass


def _first(group: BaseExceptionGroup) -> BaseException:
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


def _copies_follow_their_lead(items: list[_Item], results: Sequence[Result]):
    """``(record, its result, its copies)`` in offset order: a record asking for what an earlier
    record of the batch asks for (the same request, the same payload) was answered
    ``duplicate`` by the plan before its lead's calls were made. It ends as its lead does:
    a duplicate when the lead ends well, dead-lettered with it (or retried with it) when it
    does not, never read past while the request it repeats failed."""
    leads: dict[tuple[str, str], tuple[_Item, Result, list[_Item]]] = {}
    ordered: list[tuple[_Item, Result, list[_Item]]] = []
    for item, result in zip(items, results):
        work = item.work
        first = leads.get(work)
        if first is not None and result.outcome is Outcome.DUPLICATE:
            first[2].append(item)
            continue
        entry: tuple[_Item, Result, list[_Item]] = (item, result, [])
        leads.setdefault(work, entry)
        ordered.append(entry)
    return ordered


@dataclass(frozen=True, slots=True)
class _NotReady:
    """A record's first try found its order not ready for it: it gives way to the order's next ones."""

    error: PipelineError


def _pieces_of_work(chain: list[tuple[_Item, PipelineError | None]]):
    """``(lead, its error, the other records asking for the same thing)``, in offset order of the leads."""
    pieces: dict[tuple[str, str], tuple[_Item, PipelineError | None, list[_Item]]] = {}
    for item, error in chain:
        work = item.work
        if work in pieces:
            pieces[work][2].append(item)
        else:
            pieces[work] = (item, error, [])
    return list(pieces.values())
