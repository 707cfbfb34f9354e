"""Strategy D's control flow with scripted collaborators (no I/O, no real sleeping)."""

from __future__ import annotations

import pytest

from app.pipeline.batch import BatchHandler, Fatal
from app.pipeline.errors import (EffectRejected, EffectUnavailable, LeaseHeld, PreconditionNotMet,
                                 StoreUnavailable)
from app.pipeline.ports import SourceRecord
from app.pipeline.processor import Result
from tests.support.events import event, order_no, record

OK = Result(outcome="applied")


class ScriptedProcessor:
    """Answers each run from a script per order: a list of results (or exceptions) consumed in order.
    A batch run answers for every event; unknown orders succeed."""

    def __init__(self, script=None, batch_error=None):
        self.script = {k: list(v) for k, v in (script or {}).items()}
        self.batch_error = batch_error
        self.runs: list[list[str]] = []

    async def run(self, events):
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


class Tx:
    def __init__(self, store):
        self.store = store

    async def record_dead_letters(self, letters, *, group, retry_after_seconds):
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

    async def publish(self, letters):
        if self.error:
            raise self.error
        self.sent += list(letters)


class Sleeps(list):
    async def __call__(self, seconds):
        self.append(round(seconds, 3))


def handler(processor, store=None, sink=None, **kw):
    sleeps = Sleeps()
    options = dict(group="g", worker_id="w", backoff=(0.2, 0.8, 3.2), max_event_bytes=1 << 20, infra_budget=5,
                   max_lease_wait=10, sleep=sleeps)
    options.update(kw)
    h = BatchHandler(processor, store or Store(), sink or Sink(), **options)
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
    script = {o: [Result(error=PreconditionNotMet("not yet")), Result(deferred=True), OK, OK]}
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


async def test_letter_is_flagged_when_later_events_of_its_order_ran():
    o = order_no()
    h, _ = handler(ScriptedProcessor({o: [Result(error=EffectRejected("no")), OK]}))
    report = await h.handle(records(event(o, "ORDER_CONFIRM"), event(o, "ORDER_CANCEL")))
    assert report.dead_letters[0].may_be_superseded is True
    h, _ = handler(ScriptedProcessor({o: [OK, Result(error=EffectRejected("no"))]}))
    report = await h.handle(records(event(o, "ORDER_PAID"), event(o, "ORDER_CONFIRM")))
    assert report.dead_letters[0].may_be_superseded is False


async def test_a_decoder_bug_dead_letters_the_record_and_the_batch_goes_on(monkeypatch):
    import app.pipeline.batch as batch

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
