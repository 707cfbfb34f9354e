"""Strategy D's control flow with scripted collaborators (no I/O, no real sleeping)."""

from __future__ import annotations

import pytest

from app.pipeline.batch import BatchHandler, BatchPolicy, Fatal, Identity
from app.pipeline.clock import Clock
from app.pipeline.envelopes import Reading
from app.pipeline.errors import (
    EffectRejected,
    EffectUnavailable,
    LeaseHeld,
    PreconditionNotMet,
    ProviderUnavailable,
    RateLimited,
    StoreUnavailable,
    UnknownOutcomeNonIdempotent,
)
from app.pipeline.limits import ProviderLimits
from app.pipeline.observer import NoObserver
from app.pipeline.outcomes import Outcome
from app.pipeline.ports import SourceRecord, UnreadableRun
from app.pipeline.processor import Result
from harness.events import event, order_no, record

OK = Result(outcome="applied")


class ScriptedProcessor:
    """Answers each run from a script per order: a list of results (or exceptions) consumed in order.
    A batch run answers for every event; unknown orders succeed."""

    owner = "scripted/main/1"
    retention = None            # as Processor has it without IDEM_RETENTION_DAYS: no order refused for its date
    observer = NoObserver()

    def __init__(self, script=None, batch_error=None):
        self.script = {k: list(v) for k, v in (script or {}).items()}
        self.batch_error = batch_error
        self.runs: list[list[str]] = []

    async def run(self, events, guard=None, not_after=None, settled=None, traces=None):
        async def once():
            self.runs.append([e.order_no for e in events])
            if len(events) > 1 and self.batch_error is not None:
                raise self.batch_error
            results = []
            for e in events:
                steps = self.script.get(e.order_no)
                answer = steps.pop(0) if steps else OK
                if isinstance(answer, BaseException):
                    raise answer
                results.append(answer)
            return results

        return await (guard(once) if guard else once())


class Tx:
    def __init__(self, store):
        self.store = store

    async def record_dead_letters(self, letters, *, group, retry_after_seconds, release_owner=None):
        if self.store.fail_ledger:
            raise StoreUnavailable("ledger down")
        self.store.ledger += list(letters)


class Store:
    round_trips = 0

    def __init__(self, fail_ledger=False):
        self.ledger = []
        self.fail_ledger = fail_ledger

    async def in_transaction(self, work):
        return await work(Tx(self))


class Sink:
    def __init__(self, error=None):
        self.sent = []
        self.error = error

    def prepare(self, letters):
        return list(letters)

    async def publish(self, letters):
        if self.error:
            raise self.error
        self.sent += list(letters)


class Sleeps(list):
    """Records every sleep and moves a virtual clock by it (one record at a time: sequential time)."""

    now = 0.0

    async def __call__(self, seconds):
        self.append(round(seconds, 3))
        self.now += seconds

    def clock(self):
        return self.now


def handler(processor, store=None, sink=None, reading=None, sleeps=None, **policy):
    """A handler on virtual time (its sleeps recorded); ``policy``: BatchPolicy's fields to set otherwise."""
    sleeps = Sleeps() if sleeps is None else sleeps
    rules = dict(backoff=(0.2, 0.8, 3.2), max_event_bytes=1 << 20, infra_budget=5, max_lease_wait=10)
    options = dict(reading=reading) if reading is not None else {}
    h = BatchHandler(processor, store or Store(), sink or Sink(), identity=Identity("g", "w"),
                     policy=BatchPolicy(**{**rules, **policy}), clock=Clock(sleeps.clock, sleeps), **options)
    return h, sleeps


def records(*docs_or_raw):
    out = []
    for offset, item in enumerate(docs_or_raw):
        key, value = record(item) if isinstance(item, dict) else item
        out.append(SourceRecord("order-event", 0, offset, 1000, key, value))
    return out


async def test_retriable_failure_uses_the_backoff_then_dead_letters():
    o = order_no()
    failing = [Result(error=EffectUnavailable("503"))] * 4
    h, sleeps = handler(ScriptedProcessor({o: failing}))
    report = await h.handle(records(event(o, "ORDER_CONFIRM"), event(order_no(), "ORDER_CREATED")))
    assert sleeps == [0.2, 0.8, 3.2]
    [letter] = report.dead_letters
    assert (letter.reason, letter.retriable, letter.attempts, letter.order_no) == ("effect_unavailable", True, 4, o)
    assert report.outcomes == {"applied": 1, "dead_letter": 1}
    assert h.store.ledger == h.sink.sent == [letter]


async def test_non_retriable_failure_is_dead_lettered_at_once():
    o = order_no()
    h, sleeps = handler(ScriptedProcessor({o: [Result(error=EffectRejected("422"))]}))
    report = await h.handle(records(event(o, "ORDER_CONFIRM")))
    assert sleeps == [] and report.dead_letters[0].attempts == 1
    assert report.dead_letters[0].retriable is False


async def test_retry_succeeds_and_deferred_records_follow_in_offset_order():
    o = order_no()
    script = {o: [Result(error=EffectUnavailable("503")), Result(deferred=True), OK, OK]}
    processor = ScriptedProcessor(script)
    h, sleeps = handler(processor)
    report = await h.handle(records(event(o, "ORDER_PAID"), event(o, "ORDER_CONFIRM")))
    assert processor.runs == [[o, o], [o], [o]]      # the batch, then PAID retried, then CONFIRM
    assert sleeps == [0.2]
    assert report.outcomes == {"applied": 2} and not report.dead_letters


async def test_lease_wait_does_not_use_up_retries_and_is_bounded():
    o, p = order_no(), order_no()
    held = Result(error=LeaseHeld("held", wait_seconds=2.0))
    h, sleeps = handler(ScriptedProcessor({o: [held, held, OK], p: [held] * 10}), max_lease_wait=5)
    report = await h.handle(records(event(o, "ORDER_CONFIRM"), event(p, "ORDER_CONFIRM")))
    assert sorted(sleeps) == sorted([2.05, 2.05, 2.05, 2.05, 0.9])
    [letter] = report.dead_letters
    assert (letter.order_no, letter.reason, letter.retriable) == (p, "lease_held", True)
    assert report.lease_waits == 5


async def test_a_provider_not_yet_is_waited_for_without_using_up_retries():
    """A record its provider answered 429 more times than there are retries waits each Retry-After
    out and ends well; one still told "not yet" at the deadline goes to the compensator."""
    o, p = order_no(), order_no()
    later = Result(error=RateLimited("429", wait_seconds=1.5))
    h, sleeps = handler(ScriptedProcessor({o: [later] * 5 + [OK], p: [later] * 20}), deadline=15)
    report = await h.handle(records(event(o, "ORDER_CONFIRM"), event(p, "ORDER_CONFIRM")))
    assert report.outcomes["applied"] == 1 and not report.retries
    [letter] = report.dead_letters
    assert (letter.order_no, letter.reason, letter.retriable) == (p, "deadline_exceeded", True)
    assert set(sleeps) == {1.5} and len(sleeps) > 5      # every wait its Retry-After; none a backoff
    assert report.rate_limited == len(sleeps)


async def test_a_bug_in_the_batch_is_isolated_to_its_record():
    bad = order_no()
    processor = ScriptedProcessor({bad: [ZeroDivisionError("boom")]}, batch_error=ZeroDivisionError("boom"))
    h, _ = handler(processor)
    report = await h.handle(records(event(order_no(), "ORDER_CREATED"), event(bad, "ORDER_CREATED"),
                                    event(order_no(), "ORDER_CREATED")))
    [letter] = report.dead_letters
    assert (letter.order_no, letter.reason, letter.retriable) == (bad, "internal_error", False)
    assert "ZeroDivisionError" in letter.message
    assert report.outcomes["applied"] == 2


async def test_database_outage_is_waited_out_then_fatal():
    o = order_no()
    h, sleeps = handler(ScriptedProcessor({o: [StoreUnavailable("down"), OK]}))
    report = await h.handle(records(event(o, "ORDER_CREATED")))
    assert report.outcomes == {"applied": 1} and sleeps == [0.5]

    h, sleeps = handler(ScriptedProcessor({o: [StoreUnavailable("down")] * 100}), infra_budget=3)
    with pytest.raises(Fatal):
        await h.handle(records(event(o, "ORDER_CREATED")))
    assert sum(sleeps) == pytest.approx(3)


async def test_dead_letter_not_acknowledged_is_fatal():
    h, _ = handler(ScriptedProcessor(), sink=Sink(error=TimeoutError("no ack")))
    with pytest.raises(Fatal):
        await h.handle(records((b"k", b"\xff")))


async def test_ledger_unavailable_is_fatal_after_the_budget():
    h, _ = handler(ScriptedProcessor(), store=Store(fail_ledger=True), infra_budget=1)
    with pytest.raises(Fatal):
        await h.handle(records((b"k", b"\xff")))
    assert h.sink.sent == []                    # the ledger row comes first


async def test_malformed_records_never_reach_the_pipeline():
    processor = ScriptedProcessor()
    h, _ = handler(processor)
    report = await h.handle(records((b"k", b"[]"), (None, None)))
    assert [letter.reason for letter in report.dead_letters] == ["not_object", "empty_value"]
    assert processor.runs == []


async def test_types_not_handled_are_finished_at_once_and_counted_by_type_unless_strict():
    o = order_no()
    shipped = event(o, "ORDER_PAID", type="ORDER_SHIPPED")
    batch = records(shipped, event(o, "ORDER_CREATED"), event(o, "ORDER_PAID", type="ORDER_REFUNDED"), shipped)
    processor = ScriptedProcessor()
    h, _ = handler(processor)
    told: list[list[int]] = []
    report = await h.handle(batch, finished=lambda indices: told.append(sorted(indices)))
    assert told[0] == [0, 2, 3] and sorted(i for t in told for i in t) == [0, 1, 2, 3]
    assert report.skipped == {"ORDER_SHIPPED": 2, "ORDER_REFUNDED": 1}
    assert report.outcomes == {Outcome.SKIPPED: 3, Outcome.APPLIED: 1} and report.dead_letters == []
    assert processor.runs == [[o]]
    h, _ = handler(ScriptedProcessor(), reading=Reading(skip_unhandled=False))
    report = await h.handle(batch)
    assert [letter.reason for letter in report.dead_letters] == ["unknown_type"] * 3 and not report.skipped


class OrderStates:
    """A processor whose orders move CREATED -> PAID -> CONFIRMED: an event its order is not ready
    for fails (PreconditionNotMet), and the order's later events in the same run are deferred."""

    owner = "states/main/1"
    retention = None
    observer = NoObserver()
    NEEDS = {"ORDER_CREATED": None, "ORDER_PAID": "ORDER_CREATED", "ORDER_CONFIRM": "ORDER_PAID"}

    def __init__(self):
        self.state: dict[str, str] = {}
        self.runs: list[list[str]] = []

    async def run(self, events, guard=None, not_after=None, settled=None, traces=None):
        self.runs.append([e.type.value for e in events])
        results, blocked = [], set()
        for e in events:
            if e.order_no in blocked:
                results.append(Result(deferred=True))
            elif self.state.get(e.order_no) != self.NEEDS[e.type.value]:
                blocked.add(e.order_no)
                results.append(Result(error=PreconditionNotMet(f"{e.type.value} before its time")))
            else:
                self.state[e.order_no] = e.type.value
                results.append(OK)
        return results


async def test_an_event_its_order_is_not_ready_for_gives_way_to_the_orders_next_events():
    o = order_no()
    processor = OrderStates()
    h, sleeps = handler(processor)
    report = await h.handle(records(event(o, "ORDER_CONFIRM"), event(o, "ORDER_PAID"), event(o, "ORDER_CREATED")))
    assert report.dead_letters == [] and report.outcomes == {Outcome.APPLIED: 3}
    assert processor.state[o] == "ORDER_CONFIRM"
    assert processor.runs == [["ORDER_CONFIRM", "ORDER_PAID", "ORDER_CREATED"], ["ORDER_PAID"], ["ORDER_CREATED"],
                              ["ORDER_CONFIRM"], ["ORDER_PAID"], ["ORDER_CONFIRM"]]
    assert sleeps == []                    # the order moved each time: no backoff used


async def test_an_event_whose_predecessor_never_comes_is_retried_with_backoff_then_dead_lettered():
    o = order_no()
    processor = OrderStates()
    h, sleeps = handler(processor)
    report = await h.handle(records(event(o, "ORDER_CONFIRM"), event(o, "ORDER_CREATED")))
    assert [letter.reason for letter in report.dead_letters] == ["precondition_not_met"]
    assert processor.state[o] == "ORDER_CREATED" and report.outcomes[Outcome.APPLIED] == 1
    assert sleeps == [0.2, 0.8, 3.2]


async def test_letter_is_flagged_when_later_events_of_its_order_ran():
    o = order_no()
    h, _ = handler(ScriptedProcessor({o: [Result(error=EffectRejected("no")), OK]}))
    report = await h.handle(records(event(o, "ORDER_CONFIRM"), event(o, "ORDER_CANCEL")))
    assert report.dead_letters[0].may_be_superseded is True
    h, _ = handler(ScriptedProcessor({o: [OK, Result(error=EffectRejected("no"))]}))
    report = await h.handle(records(event(o, "ORDER_PAID"), event(o, "ORDER_CONFIRM")))
    assert report.dead_letters[0].may_be_superseded is False


async def test_a_decoder_bug_dead_letters_the_record_and_the_batch_goes_on(monkeypatch):
    import app.pipeline.batch.reading as batch

    real = batch.decode

    def flaky(key, value, **kw):
        if value == b"boom":
            raise KeyError("decoder bug")
        return real(key, value, **kw)

    monkeypatch.setattr(batch, "decode", flaky)
    h, _ = handler(ScriptedProcessor())
    report = await h.handle(records((b"k", b"boom"), event(order_no(), "ORDER_CREATED")))
    [letter] = report.dead_letters
    assert (letter.reason, letter.retriable) == ("internal_error", False)
    assert report.outcomes["applied"] == 1


async def test_dead_letters_go_out_in_offset_order():
    o = order_no()
    h, _ = handler(ScriptedProcessor({o: [Result(error=EffectRejected("no"))]}))
    await h.handle(records(event(o, "ORDER_CONFIRM"), (b"k", b"[]")))
    assert [letter.record.offset for letter in h.sink.sent] == [0, 1]


# -- the batch deadline, pieces of work, the wall-clock outage budget ------------------------

async def test_a_hundred_identical_records_not_ready_are_one_piece_of_work_and_meet_the_deadline():
    """CREATED plus 100 CONFIRMs of an order whose PAID is missing: the
    CONFIRMs are one request, retried once as one; at the deadline it and its 99 copies are
    dead-lettered as retriable deadline_exceeded, and the batch is over."""
    o = order_no()
    not_ready = Result(error=PreconditionNotMet("PAID missing"))
    confirm = event(o, "ORDER_CONFIRM")
    copies = [dict(confirm, event_id=f"e{i}") for i in range(100)]     # re-published: same request
    processor = ScriptedProcessor({o: [OK, not_ready] + [Result(deferred=True)] * 99 + [not_ready] * 10})
    h, sleeps = handler(processor, deadline=3.0)
    report = await h.handle(records(event(o, "ORDER_CREATED"), *copies))

    assert len(processor.runs) == 1 + 2               # the batch, then the lead twice (0.2 s, 0.8 s)
    assert sleeps == [0.2, 0.8] and sleeps.now <= 3.0  # the 3.2 s retry would pass the deadline
    assert report.outcomes == {"applied": 1, "dead_letter": 100}
    assert {(letter.reason, letter.retriable) for letter in report.dead_letters} == {("deadline_exceeded", True)}
    assert sorted(letter.record.offset for letter in report.dead_letters) == list(range(1, 101))
    assert "precondition_not_met" in report.dead_letters[0].message
    assert all("same request as" in letter.message for letter in report.dead_letters[1:])


async def test_copies_of_a_request_that_succeeds_are_duplicates():
    o = order_no()
    confirm = event(o, "ORDER_CONFIRM")
    processor = ScriptedProcessor({o: [Result(error=EffectUnavailable("503")), Result(deferred=True), OK]})
    h, _ = handler(processor)
    report = await h.handle(records(confirm, dict(confirm, event_id="again")))
    assert report.outcomes == {"applied": 1, "duplicate": 1} and len(processor.runs) == 2



DUPLICATE = Result(outcome=Outcome.DUPLICATE)     # what the plan answers a copy of a request already in the batch


@pytest.mark.parametrize("ending, reason", [(EffectRejected("no"), "effect_rejected"),
                                            (UnknownOutcomeNonIdempotent("503, may have been sent"),
                                             "unknown_outcome_non_idempotent")])
async def test_a_copy_of_a_request_that_fails_for_good_is_dead_lettered_with_it(ending, reason):
    o = order_no()
    cancel = event(o, "ORDER_CANCEL")
    h, _ = handler(ScriptedProcessor({o: [Result(error=ending), DUPLICATE]}))
    report = await h.handle(records(cancel, dict(cancel, event_id="again")))
    assert [(letter.record.offset, letter.reason) for letter in report.dead_letters] == [(0, reason), (1, reason)]
    assert "same request as order-event[0]@0" in report.dead_letters[1].message
    assert report.outcomes == {"dead_letter": 2}


async def test_a_copy_follows_its_request_through_the_retries():
    o = order_no()
    cancel = event(o, "ORDER_CANCEL")
    retried_then_ok = ScriptedProcessor({o: [Result(error=EffectUnavailable("503")), DUPLICATE, OK]})
    h, _ = handler(retried_then_ok)
    report = await h.handle(records(cancel, cancel))
    assert report.outcomes == {"applied": 1, "duplicate": 1} and len(retried_then_ok.runs) == 2

    retried_then_rejected = ScriptedProcessor({o: [Result(error=EffectUnavailable("503")), DUPLICATE,
                                                   Result(error=EffectRejected("no"))]})
    h, _ = handler(retried_then_rejected)
    report = await h.handle(records(cancel, cancel))
    assert [letter.reason for letter in report.dead_letters] == ["effect_rejected"] * 2
    assert len(retried_then_rejected.runs) == 2                # the copy is not run on its own


async def test_a_duplicate_of_an_earlier_batch_is_not_a_copy_of_another_request():
    """Two different requests of one order, the first a replay the plan answers ``duplicate``:
    the second's failure is its own."""
    o = order_no()
    h, _ = handler(ScriptedProcessor({o: [DUPLICATE, Result(error=EffectRejected("no"))]}))
    report = await h.handle(records(event(o, "ORDER_CONFIRM"), event(o, "ORDER_CANCEL")))
    assert report.outcomes == {"duplicate": 1, "dead_letter": 1}
    assert [letter.record.offset for letter in report.dead_letters] == [1]

async def test_a_lease_wait_longer_than_the_deadline_is_dead_lettered_for_the_compensator():
    o = order_no()
    h, sleeps = handler(ScriptedProcessor({o: [Result(error=LeaseHeld("held", wait_seconds=25.0))]}),
                        deadline=15.0, max_lease_wait=60)
    report = await h.handle(records(event(o, "ORDER_CONFIRM")))
    [letter] = report.dead_letters
    assert (letter.reason, letter.retriable) == ("deadline_exceeded", True) and sleeps == []
    assert "lease_held" in letter.message


async def test_records_deferred_past_the_deadline_are_not_tried():
    o = order_no()

    class Slow(ScriptedProcessor):
        """Each retry of the first record is a call that takes 2 s (virtual)."""

        async def run(self, events, guard=None, not_after=None, settled=None, traces=None):
            if len(events) == 1:
                sleeps.now += 2.0
            return await super().run(events, guard)

    processor = Slow({o: [Result(error=EffectUnavailable("503")), Result(deferred=True),
                          Result(error=EffectUnavailable("503"))]})
    h, sleeps = handler(processor, deadline=1.5)
    report = await h.handle(records(event(o, "ORDER_CONFIRM"), event(o, "ORDER_CANCEL")))
    assert [(letter.record.offset, letter.reason) for letter in report.dead_letters] == [
        (0, "deadline_exceeded"), (1, "deadline_exceeded")]
    assert "not tried" in report.dead_letters[1].message
    assert len(processor.runs) == 2                    # the batch, one retry of the first; the second never


async def test_a_short_outage_met_by_many_records_at_once_is_waited_out():
    """64 orders retrying at once meet a database that is gone for 0.3 s (real time): the
    budget is the outage's wall-clock length, not the sum of 64 waits."""
    import asyncio
    import time as real_time

    back = real_time.monotonic() + 0.3

    class Flaky(ScriptedProcessor):
        async def run(self, events, guard=None, not_after=None, settled=None, traces=None):
            async def once():
                if len(events) == 1 and real_time.monotonic() < back:
                    raise StoreUnavailable("down")
                return [Result(error=PreconditionNotMet("x")) if len(events) > 1 else OK for _ in events]
            return await guard(once)

    h = BatchHandler(Flaky(), Store(), Sink(), identity=Identity("g", "w"), policy=BatchPolicy(
        backoff=(0.0, 0.0, 0.0), max_event_bytes=1 << 20, infra_budget=1.0, max_lease_wait=1, deadline=10,
        concurrency=64))
    report = await h.handle(records(*[event(order_no(), "ORDER_PAID") for _ in range(64)]))
    assert report.outcomes == {"applied": 64} and not report.dead_letters
    assert 0.2 < report.infra_wait_seconds < 1.0
    assert asyncio.get_running_loop()


async def test_unreadable_records_and_raw_header_keys_are_dead_lettered():
    processor = ScriptedProcessor()
    h, _ = handler(processor)
    good = event(order_no(), "ORDER_CREATED")
    key, value = record(good)
    unreadable = SourceRecord("order-event", 0, 0, 1, None, b"raw batch", (),
                              UnreadableRun("oversized", "a gzip record batch ... decompresses to more than 64 MiB",
                                            0, 0))
    raw_header = SourceRecord("order-event", 0, 1, 1, key, value,
                              (("\udcff\udcfebad", b"1"),))
    report = await h.handle([unreadable, raw_header])
    assert [(letter.reason, letter.retriable) for letter in report.dead_letters] == [
        ("oversized", False), ("header_not_utf8", False)]
    assert "decompresses" in report.dead_letters[0].message and processor.runs == []


async def test_a_run_of_unreadable_records_is_one_letter_that_says_what_it_stands_for():
    """One record batch over the bound, 2,000 offsets: one letter per batch for all of them,
    not one each with the raw batch (the ledger's one INSERT of 2,000 copies crash-looped the
    worker)."""
    processor = ScriptedProcessor()
    h, _ = handler(processor)
    run = UnreadableRun("oversized", "a gzip record batch decompresses to more than 64 MiB", 10, 2009)
    placeholders = [SourceRecord("order-event", 3, offset, 1, None, b"raw" if offset == 10 else b"", (), run)
                    for offset in range(500, 1000)]
    good = [SourceRecord("order-event", 0, 7, 1, *record(event(order_no(), "ORDER_CREATED")))]
    report = await h.handle(placeholders + good)
    [letter] = report.dead_letters
    assert (letter.record.offset, letter.covers, letter.reason) == (500, (500, 999, 500), "oversized")
    assert "offsets 500..999 (500 records)" in letter.message and "letter for offset 10" in letter.message
    assert report.covered == {"oversized": 499}
    assert report.outcomes == {"applied": 1, "dead_letter": 500}


class GatedProcessor(ScriptedProcessor):
    """Holds each run until the test lets it go, and records which runs were under way at once."""

    def __init__(self):
        super().__init__()
        import asyncio
        self.release = asyncio.Event()
        self.running: list[set[str]] = []
        self.overlapped: list[tuple[set[str], set[str]]] = []

    async def run(self, events, guard=None, not_after=None, settled=None, traces=None):
        mine = {e.order_no for e in events}
        for other in self.running:
            self.overlapped.append((other, mine))
        self.running.append(mine)
        try:
            await self.release.wait()
            return [OK for _ in events]
        finally:
            self.running.remove(mine)


async def test_a_batch_with_an_order_of_a_batch_in_flight_waits_for_it_and_others_do_not():
    # Two batches of one worker share its owner: at once on the same order, the later one would
    # take the earlier one's pending claim for its own and call the effect again.
    import asyncio
    shared, a, b = order_no(), order_no(), order_no()
    processor = GatedProcessor()
    h, _ = handler(processor)
    first = asyncio.create_task(h.handle(records(event(shared, "ORDER_CONFIRM"), event(a, "ORDER_CREATED"))))
    other = asyncio.create_task(h.handle(records(event(b, "ORDER_CREATED"))))
    same = asyncio.create_task(h.handle(records(event(shared, "ORDER_CONFIRM"))))
    for _ in range(20):
        await asyncio.sleep(0)
    assert {shared, a} in processor.running and {b} in processor.running      # disjoint: at once
    assert {shared} not in processor.running                                   # waits for `first`
    processor.release.set()
    reports = await asyncio.gather(first, other, same)
    assert not any(x & y for x, y in processor.overlapped), processor.overlapped
    assert [r.order_waits for r in reports] == [0, 0, 1]


class OrderByOrderProcessor(ScriptedProcessor):
    """Tells each order's results (``settled``) when the test lets that order go."""

    def __init__(self):
        super().__init__()
        import asyncio
        self.gates: dict[str, asyncio.Event] = {}

    def gate(self, order):
        import asyncio
        return self.gates.setdefault(order, asyncio.Event())

    async def run(self, events, guard=None, not_after=None, settled=None, traces=None):
        import asyncio
        self.runs.append([e.order_no for e in events])
        by_order: dict[str, list[int]] = {}
        for index, e in enumerate(events):
            by_order.setdefault(e.order_no, []).append(index)

        async def one(order, indices):
            await self.gate(order).wait()
            if settled is not None:
                settled(indices, [OK for _ in indices])

        await asyncio.gather(*(one(order, indices) for order, indices in by_order.items()))
        return [OK for _ in events]


async def test_each_order_is_finished_as_soon_as_its_own_calls_are_and_a_slow_one_holds_only_its_order():
    import asyncio
    slow, fast, later = order_no(), order_no(), order_no()
    processor = OrderByOrderProcessor()
    h, _ = handler(processor)
    told: list[list[int]] = []
    batch = records(event(slow, "ORDER_CONFIRM"), event(fast, "ORDER_CREATED"), event(slow, "ORDER_PAID"),
                    event(fast, "ORDER_CONFIRM"))
    first = asyncio.create_task(h.handle(batch, finished=told.append))
    second = asyncio.create_task(h.handle(records(event(fast, "ORDER_PAID"), event(later, "ORDER_CREATED")),
                                          finished=told.append))
    processor.gate(fast).set()
    processor.gate(later).set()
    for _ in range(500):
        if len(told) == 3:
            break
        await asyncio.sleep(0.01)
    # the fast order, then its record in the next batch once the first batch was done with it
    assert sorted(map(sorted, told)) == [[0], [1], [1, 3]], told
    assert not first.done() and second.done()
    processor.gate(slow).set()
    await first
    assert told[-1] == [0, 2]


class BreakerProcessor(ScriptedProcessor):
    """A scripted processor with a worker's provider limits, whose waybill breaker the test opens."""

    def __init__(self, sleeps, script=None):
        super().__init__(script)
        self.limits = ProviderLimits(clock=sleeps.clock, sleep=sleeps)

    def open_breaker(self, effect="waybill"):
        for key in range(20):
            self.limits.ended(effect, True, probe=False, key=str(key), error="timed out")
        assert self.limits.open_breakers() == [effect]


def breaker_handler(script=None, **kw):
    sleeps = Sleeps()
    processor = BreakerProcessor(sleeps, script)
    h, _ = handler(processor, sleeps=sleeps, **kw)
    return h, processor, sleeps


async def test_an_open_breaker_holds_its_effects_records_before_their_claim_and_lets_the_rest_go_on():
    a, b = order_no(), order_no()
    h, processor, sleeps = breaker_handler(hold_records=100, deadline=15)
    processor.open_breaker()
    told = []
    recs = records(event(a, "ORDER_CREATED"), event(a, "ORDER_PAID"), event(b, "ORDER_CREATED"),
                   event(a, "ORDER_CONFIRM"))
    report = await h.handle(recs, finished=lambda indices: told.append(sorted(indices)))
    # A's CREATED and PAID and B went on in the first run; A's CONFIRM waited, unclaimed, for the
    # breaker's probe (5 s later) and was let through as the probe.
    assert processor.runs == [[a, a, b], [a]]
    assert sleeps.clock() >= 5.0 and report.held == 1
    assert sorted(map(tuple, told)) == [(0, 1), (2,), (3,)] and told[-1] == [3]
    assert report.outcomes[Outcome.DEAD_LETTER] == 0 and h.held == 0


async def test_a_held_record_goes_on_near_its_deadline_and_meets_the_breaker():
    a = order_no()
    refused = ProviderUnavailable("not called, its provider's breaker is open", wait_seconds=5)
    h, processor, sleeps = breaker_handler({a: [Result(error=refused)]}, hold_records=100, deadline=3)
    processor.open_breaker()
    await h.handle(records(event(a, "ORDER_CONFIRM")))
    # Held until 0.75 s before the batch's deadline (the probe comes at 5 s), then claimed, refused
    # by the breaker and dead-lettered as provider_unavailable: not held again past the deadline.
    assert processor.runs == [[a]] and 2.0 <= sleeps.clock() < 3.0
    assert [letter.reason for letter in h.sink.sent] == ["provider_unavailable"]
    assert h.held == 0


async def test_a_record_refused_by_a_breaker_that_opened_after_its_claim_waits_for_it_without_a_retry():
    a = order_no()
    refused = ProviderUnavailable("not called, its provider's breaker is open", wait_seconds=5)
    h, processor, sleeps = breaker_handler({a: [Result(error=refused), OK]}, hold_records=100, deadline=15)
    first = processor.run

    async def run(events, guard=None, not_after=None, settled=None, traces=None):
        if not processor.runs:
            processor.open_breaker()              # closed at its claim, open when its call came
        return await first(events, guard, not_after, settled)

    processor.run = run
    report = await h.handle(records(event(a, "ORDER_CONFIRM")))
    assert processor.runs == [[a], [a]] and sleeps.clock() >= 5.0
    assert report.retries == {} and report.outcomes[Outcome.DEAD_LETTER] == 0


async def test_no_record_is_held_past_the_cap_or_with_holding_off():
    a, b = order_no(), order_no()
    for cap in (0, 1):
        h, processor, _ = breaker_handler(hold_records=cap, deadline=15)
        processor.open_breaker()
        await h.handle(records(event(a, "ORDER_CONFIRM"), event(b, "ORDER_PAID"), event(b, "ORDER_CONFIRM")))
        # the cap 1 takes A's CONFIRM; B's two records are more than is left
        assert processor.runs == ([[a, b, b]] if cap == 0 else [[b, b], [a]])


# -- a person's hold (app.pipeline.controls) ----------------------------------------------------

def person_hold(effect: str = "waybill", active: bool = True):
    from datetime import datetime

    from app.pipeline.controls import Hold

    now = datetime(2026, 12, 8, 2, 0)
    return Hold(1, effect, now, now, False, "maintenance", "web:alice", active)


def held_handler(script=None, **kw):
    from app.pipeline.controls import Controls

    h, processor, sleeps = breaker_handler(script, **kw)
    controls = Controls()
    controls.update([person_hold()], [])
    processor.limits.controls = controls
    return h, processor, sleeps, controls


async def release_after(controls, tries: int = 20, *, moved=None, sleeps=None):
    """End the hold once the handler has waited a little (real time: the hold's wait is not virtual)."""
    import asyncio

    for _ in range(tries):
        await asyncio.sleep(0)
    if sleeps is not None:
        sleeps.now += moved          # the hold outlasted the batch's deadline by far
    controls.update([], [])


async def test_a_person_held_effect_holds_its_records_past_the_deadline_and_dead_letters_none():
    import asyncio

    a, b = order_no(), order_no()
    h, processor, sleeps, controls = held_handler(hold_records=100, deadline=3)
    told = []
    handling = asyncio.create_task(h.handle(records(event(a, "ORDER_CREATED"), event(a, "ORDER_CONFIRM"),
                                                    event(b, "ORDER_PAID")),
                                            finished=lambda indices: told.append(sorted(indices))))
    await asyncio.sleep(0.05)
    # A's CREATED and B went on at once; A's CONFIRM waits, unclaimed, whatever the deadline says.
    assert processor.runs == [[a, b]] and not handling.done() and h.held == 1
    assert h.holds.by_effect["waybill"] == 1
    await release_after(controls, moved=100.0, sleeps=sleeps)
    report = await handling
    assert processor.runs == [[a, b], [a]]
    assert report.outcomes[Outcome.DEAD_LETTER] == 0 and h.sink.sent == [] and h.held == 0
    assert sorted(map(tuple, told)) == [(0,), (1,), (2,)] or sorted(map(tuple, told)) == [(0, 1), (2,)]


async def test_a_record_refused_by_a_hold_seen_after_its_claim_waits_for_its_end_with_a_fresh_deadline():
    import asyncio

    from app.pipeline.errors import EffectHeld

    a = order_no()
    refused = EffectHeld("not called, waybill is held by web:alice: maintenance", wait_seconds=30)
    h, processor, sleeps, controls = held_handler({a: [Result(error=refused), OK]}, hold_records=100, deadline=3)
    controls.update([], [])                    # not held at its claim; held when its call came
    first = processor.run

    async def run(events, guard=None, not_after=None, settled=None, traces=None):
        if not processor.runs:
            controls.update([person_hold()], [])
        return await first(events, guard, not_after, settled)

    processor.run = run
    handling = asyncio.create_task(h.handle(records(event(a, "ORDER_CONFIRM"))))
    await asyncio.sleep(0.05)
    assert not handling.done()
    await release_after(controls, moved=100.0, sleeps=sleeps)
    report = await handling
    assert processor.runs == [[a], [a]]
    assert report.outcomes[Outcome.DEAD_LETTER] == 0 and report.retries == {}


async def test_a_held_record_given_up_by_a_rebalance_leaves_the_hold_unworked():
    import asyncio

    a = order_no()
    h, processor, _, controls = held_handler(hold_records=100, deadline=3)
    ours = {"yes": True}
    told = []
    handling = asyncio.create_task(h.handle(records(event(a, "ORDER_CONFIRM")), finished=told.append,
                                            still_ours=lambda index: ours["yes"]))
    await asyncio.sleep(0.05)
    ours["yes"] = False                        # its partition was revoked: the next owner holds it
    report = await asyncio.wait_for(handling, 5)
    assert processor.runs == [] and told == [[0]] and report.outcomes[Outcome.DEAD_LETTER] == 0
    assert h.held == 0 and controls.is_held("waybill")


async def test_records_held_by_a_person_are_held_past_the_cap_and_never_meet_the_breaker():
    import asyncio

    a, b = order_no(), order_no()
    h, processor, sleeps, controls = held_handler(hold_records=1, deadline=15)
    handling = asyncio.create_task(h.handle(records(event(a, "ORDER_CONFIRM"), event(b, "ORDER_CONFIRM"))))
    await asyncio.sleep(0.05)
    assert processor.runs == [] and h.held == 2         # both held, the cap notwithstanding
    await release_after(controls)
    report = await handling
    assert sorted(map(sorted, processor.runs)) == [sorted([a, b])] and report.outcomes[Outcome.DEAD_LETTER] == 0
