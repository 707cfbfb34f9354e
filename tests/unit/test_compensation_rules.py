"""What one redrive makes of a ledger row, and where a dead letter says it came from: pure rules."""

from __future__ import annotations

import pytest

from app.compensation.headers import source_of
from app.compensation.rules import Backoff, judge_redrive
from app.pipeline.errors import (
    EffectOutcomeUnknown,
    EffectUnavailable,
    LeaseHeld,
    NotAskableYet,
    ProviderUnavailable,
    RateLimited,
    StaleEffectMayExist,
)
from app.pipeline.model import LedgerRow
from app.pipeline.outcomes import Outcome
from app.pipeline.ports import SourceRecord
from app.pipeline.processor import Result
from app.pipeline.states import LedgerStatus as Status


def row(**kw) -> LedgerRow:
    fields = dict(id=1, status=Status.RETRYING, reason="deadline_exceeded", message=None, retriable=True, attempts=1,
                  redrives=0, due=True, next_retry_at=None, order_no="ORD-20261201-A1", biz_key=None, key=None,
                  value=None)
    return LedgerRow(**{**fields, **kw})


def test_a_huge_attempt_cap_never_overflows_the_backoff():
    backoff = Backoff(60, 3600, 10 ** 9)
    assert backoff.after(1) == 60 and backoff.after(2) == 120 and backoff.after(10 ** 6) == 3600


def test_a_failed_redrive_gives_the_row_its_new_reason_and_leaves_it_due():
    backoff = Backoff(60, 3600, 5)
    open_ = judge_redrive(row(), Result(error=EffectUnavailable("503")), backoff)
    assert (open_.status, open_.reason, open_.retry_in) == (Status.OPEN, "effect_unavailable", 60)
    manual = judge_redrive(row(), Result(error=StaleEffectMayExist("a waybill may exist")), backoff)
    assert (manual.status, manual.reason) == (Status.MANUAL, "stale_effect_may_exist")
    held = judge_redrive(row(), Result(error=LeaseHeld("busy", wait_seconds=3)), backoff)
    assert (held.status, held.reason, held.redrives) == (Status.OPEN, None, 0)      # not the row's failure
    done = judge_redrive(row(), Result(outcome=Outcome.DUPLICATE), backoff)
    assert (done.status, done.reason) == (Status.COMPENSATED, None)


def test_a_redrive_too_early_to_ask_about_an_earlier_call_waits_for_its_settle_and_counts_no_redrive():
    backoff = Backoff(60, 3600, 5)
    early = judge_redrive(row(redrives=2), Result(error=NotAskableYet("settling", wait_seconds=7.5)), backoff)
    assert (early.status, early.redrives, early.retry_in, early.reason) == (Status.OPEN, 2, 7.5, None)
    unknown = judge_redrive(row(), Result(error=EffectOutcomeUnknown("reset", wait_seconds=12)), backoff)
    assert (unknown.status, unknown.redrives, unknown.retry_in) == (Status.OPEN, 1, 12)     # sooner than 60 s
    late = judge_redrive(row(), Result(error=EffectOutcomeUnknown("reset", wait_seconds=900)), backoff)
    assert late.retry_in == 60                                                              # never later than backoff


@pytest.mark.parametrize("error", [RateLimited("429", wait_seconds=2), ProviderUnavailable("down", wait_seconds=9)])
def test_a_provider_saying_not_yet_or_down_counts_no_redrive(error):
    """However long a provider is down or limits calls, its letters are never given up for it."""
    verdict = judge_redrive(row(redrives=4), Result(error=error), Backoff(60, 3600, 5))
    assert (verdict.status, verdict.redrives, verdict.retry_in) == (Status.OPEN, 4, error.wait_seconds)


def test_a_redrive_that_ran_nothing_says_so():
    """Every step already finished: run before (compensated), or ended without running
    (superseded, with why); never "the event ran" for a run that did nothing."""
    backoff = Backoff(60, 3600, 5)
    ran = judge_redrive(row(), Result(outcome=Outcome.APPLIED), backoff)
    assert (ran.status, ran.detail) == (Status.COMPENSATED, "the event ran: applied")
    before = judge_redrive(row(), Result(outcome=Outcome.DUPLICATE), backoff)
    assert before.status is Status.COMPENSATED and "nothing ran now" in before.detail
    for settled, why in (("stale", "moved past the event"), ("resolved_by_person", "a person resolved them"),
                         ("discarded_by_person", "a person discarded them")):
        verdict = judge_redrive(row(), Result(outcome=Outcome.DUPLICATE, settled=settled), backoff)
        assert verdict.status is Status.SUPERSEDED and why in verdict.detail, settled


def dlq(**headers) -> SourceRecord:
    base = {"dlq.consumer.group": b"g", "dlq.original.topic": b"order-event", "dlq.original.partition": b"3",
            "dlq.original.offset": b"42", "dlq.original.timestamp": b"1764000000000"}
    base.update({k.replace("_", "."): v for k, v in headers.items()})
    return SourceRecord("order-event-dlq", 0, 1, 1, b"k", b"v", tuple((k, v) for k, v in base.items() if v is not None))


def test_the_origin_of_a_dead_letter_is_read_within_what_kafka_and_the_ledger_hold():
    key = source_of(dlq())
    assert (key.group, key.topic, key.partition, key.offset, key.timestamp_ms) == ("g", "order-event", 3, 42,
                                                                                   1764000000000)
    assert source_of(dlq(dlq_original_timestamp=b"")).timestamp_ms == -1
    assert source_of(dlq(dlq_original_offset=str(2 ** 63 - 1).encode())).offset == 2 ** 63 - 1


@pytest.mark.parametrize("field, value, why", [
    ("dlq_original_partition", b"2147483648", "from 0 to 2147483647"), ("dlq_original_partition", b"-1", "from 0"),
    ("dlq_original_offset", str(2 ** 63).encode(), "from 0 to 9223372036854775807"),
    ("dlq_original_offset", b"4e2", "whole number"), ("dlq_original_topic", b"t" * 250, "topic name"),
    ("dlq_original_topic", b"a/b", "topic name"), ("dlq_consumer_group", b"g" * 256, "not 1 to 255"),
    ("dlq_original_offset", None, "missing dlq.original.offset"), ("dlq_original_offset", b"\xff", "not UTF-8")])
def test_an_origin_no_kafka_record_can_have_is_refused_with_the_reason(field, value, why):
    with pytest.raises(ValueError, match=why):
        source_of(dlq(**{field: value}))
