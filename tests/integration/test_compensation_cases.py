"""The dead letters a compensator meets after an outage or at a person's hands: cases for a
person that a retry must not close, rows that must come due, two rows of one step, a person's
decision and the steps still pending, draining thousands, a claim that runs out, and dead
letters that no Kafka record can be. Real MariaDB, the fake services over real HTTP."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from app.compensation.compensator import Compensator
from app.compensation.rules import Backoff
from app.pipeline.controls import Controls, Hold
from app.pipeline.limits import EffectLimit, ProviderLimits
from app.pipeline.ports import SourceRecord
from app.pipeline.states import PERSON_CLAIMS
from app.pipeline.states import LedgerStatus as Status
from harness import sql_modes
from harness.desk import desk
from harness.events import event
from harness.pipeline import ev, paid_orders, source

# Every database test here runs under the server's sql_mode and under MySQL 8's.
settings, scratch_db = sql_modes.each_sql_mode()


def calls(harness, service: str, order: str) -> list[dict]:
    return [c for c in harness.fakes.ledger.calls if c["service"] == service and order in str(c.get("body"))]


async def test_a_case_for_a_person_is_not_closed_by_a_retry_and_a_new_reason_replaces_the_old(harness):
    """A CONFIRM dead-lettered while logistics answered 503, then its order cancelled: the same
    record, dead-lettered again, now says a waybill may exist for a cancelled order. Its row
    takes that reason and goes to a person; a retry would find the step settled (stale) and
    close the case as compensated without the check it asks for, so it is refused."""
    d = await desk(harness)
    [order] = await paid_orders(d.main, 1, "CMPCASE")
    harness.fakes.configure({"waybill": {"fail_orders": [order], "fail_status": 503}})
    confirm = source(event(order, "ORDER_CONFIRM"))
    await d.batches.handle([confirm])
    [row] = harness.db.query("SELECT id, status, reason FROM t_compensation WHERE consumer_group = %s", d.group)
    assert (row["status"], row["reason"]) == (Status.OPEN, "effect_unavailable")
    await d.batches.handle([source(event(order, "ORDER_CANCEL"))])
    await asyncio.sleep(0.6)                                                  # the main claim runs out
    await d.batches.handle([confirm])                                         # the same record, replayed
    [row] = harness.db.query("SELECT id, status, reason, retriable FROM t_compensation WHERE consumer_group = %s",
                             d.group)
    assert (row["status"], row["reason"], row["retriable"]) == (Status.MANUAL, "stale_effect_may_exist", 0)

    retry = await d.compensator.perform(row["id"], "retry", d.guard, actor="web:alice", note=None)
    assert not retry.changed and retry.status is Status.MANUAL and "look for it with the provider the message names" in retry.refused
    resolved = await d.compensator.perform(row["id"], "resolve", d.guard, actor="web:alice", note="no waybill")
    assert resolved.changed and resolved.status is Status.RESOLVED


async def test_a_held_effects_dead_letter_waits_for_the_hold_even_at_a_persons_retry_and_no_redrive_is_counted(
        harness):
    """An SMS dead-lettered while the gateway answered 503 (not sent), then a person holds the SMS effect: the
    drain leaves its letter open for after the hold and so does a person's retry (a bulk job's chunk
    is a person's redrive too): no call, no redrive counted, not for a person. Once the hold ends, a
    retry sends the SMS, once."""
    limits = ProviderLimits({"waybill": EffectLimit(), "sms": EffectLimit()})
    limits.controls = Controls()
    d = await desk(harness, limits=limits)
    [order] = await paid_orders(d.main, 1, "CMPHELD")
    harness.fakes.configure({"sms": {"fail_orders": [order], "fail_status": 503}})
    [letter] = await d.dead_letters([event(order, "ORDER_CANCEL")])
    row = d.row(letter)
    assert row["status"] == Status.OPEN and order not in harness.fakes.ledger.sms      # 503: may have been sent
    harness.fakes.configure({"sms": {"fail_orders": []}})
    now = datetime.now(UTC).replace(tzinfo=None)
    limits.controls.update([Hold(1, "sms", now - timedelta(minutes=1), now + timedelta(hours=1), False,
                                 "the gateway's maintenance", "web:alice", True)], [])
    sms_calls = len(calls(harness, "sms", order))
    attempts_sql = "SELECT attempt FROM t_idem WHERE biz_key LIKE %s"
    attempts = harness.db.query(attempts_sql, f"{order}:%send_cancel_sms")
    await asyncio.sleep(0.6)                                                   # the letter is due
    assert await d.compensator.run_due(10, d.guard) == 1
    row = d.row(letter)
    assert (row["status"], row["redrives"]) == (Status.OPEN, 0) and "effect_held" in row["message"]
    retried = await d.compensator.perform(row["id"], "retry", d.guard, actor="web:bob", note=None)
    assert retried.status is Status.OPEN and "effect_held" in d.row(letter)["message"]
    assert d.row(letter)["redrives"] == 0 and len(calls(harness, "sms", order)) == sms_calls
    assert harness.db.query(attempts_sql, f"{order}:%send_cancel_sms") == attempts       # not even claimed
    assert order not in harness.fakes.ledger.sms

    limits.controls.update([], [])                                             # the hold ends
    released = await d.compensator.perform(row["id"], "retry", d.guard, actor="web:bob", note=None)
    assert released.status is Status.COMPENSATED and len(harness.fakes.ledger.sms[order]) == 1


async def test_a_retry_that_fails_retriably_leaves_its_row_due(harness):
    """An unknown SMS outcome from a time without the lookup (not retriable, for a person); the
    gateway now has one, a person retries, the lookup answers 503: the row is open and must be
    due (retriable), or it is never retried and never goes to a person."""
    d = await desk(harness, lookup=False, backoff=Backoff(0.2, 0.4, 3))
    [order] = await paid_orders(d.main, 1, "CMPDUE2")
    harness.fakes.configure({"sms": {"reset_next": 1}})
    [letter] = await d.dead_letters([event(order, "ORDER_CANCEL")])
    later = await desk(harness, lookup=True, group=d.group, backoff=Backoff(0.2, 0.4, 3))
    row_id = d.row(letter)["id"]
    await asyncio.sleep(0.6)
    harness.fakes.configure({"sms": {"lookup_fail_next": 1}})
    retried = await later.compensator.perform(row_id, "retry", later.guard, actor="web:alice", note=None)
    assert retried.status is Status.OPEN
    row = d.row(letter)
    assert (row["retriable"], row["reason"]) == (1, "effect_unavailable")
    await asyncio.sleep(0.7)                      # due again, and the settle after the failed lookup has passed
    assert await later.compensator.run_due(10, later.guard) == 1
    assert d.row(letter)["status"] == Status.COMPENSATED and len(harness.fakes.ledger.sms[order]) == 1


async def test_two_rows_of_one_step_worked_at_once_make_one_call(harness):
    """A CANCEL and its re-published copy (a new event_id, the same request) are two dead letters
    of one SMS step. Worked at once in one worker (the agent and the timer, or two clicks), they
    shared one t_idem owner, so the second claim re-took the first's live lease: two SMS."""
    d = await desk(harness)
    [order] = await paid_orders(d.main, 1, "CMPTWO")
    harness.fakes.configure({"sms": {"fail_orders": [order], "fail_status": 400}})       # surely not sent
    first, copy = event(order, "ORDER_CANCEL"), event(order, "ORDER_CANCEL")
    letters = await d.dead_letters([first]) + await d.dead_letters([copy])    # two batches (one batch: one work)
    assert len(letters) == 2 and len({d.row(letter)["id"] for letter in letters}) == 2
    harness.fakes.configure({"sms": {"fail_orders": [], "latency_ms": 300}})
    await asyncio.gather(*(d.compensator.perform(d.row(letter)["id"], "retry", d.guard, actor="web:bob", note=None)
                           for letter in letters))
    assert harness.fakes.ledger.peak_in_flight == 1
    assert len(harness.fakes.ledger.sms[order]) == 1
    loser = [d.row(letter) for letter in letters if d.row(letter)["status"] != Status.COMPENSATED]
    assert [(row["status"], row["message"][:10]) for row in loser] == [(Status.OPEN, "lease_held")]
    harness.db.query("UPDATE t_compensation SET next_retry_at = UTC_TIMESTAMP(3) WHERE id = %s", loser[0]["id"])
    await d.compensator.drain(d.guard, seconds=5, batch_size=10)                       # when it comes due
    assert {d.row(letter)["status"] for letter in letters} == {Status.COMPENSATED}
    assert len(harness.fakes.ledger.sms[order]) == 1


async def test_resolve_and_discard_settle_the_steps_still_pending(harness):
    """A person resolves a dead letter whose waybill step is pending (503s): the step is settled
    in the same transaction, so the stuck sweep stops alerting on it and a replay (or a
    re-published copy) does not call the API again. Refused while a step is being called."""
    d = await desk(harness)
    resolved, discarded, busy = await paid_orders(d.main, 3, "CMPSET")
    harness.fakes.configure({"waybill": {"fail_orders": [resolved, discarded, busy], "fail_status": 503}})
    letters = await d.dead_letters([event(o, "ORDER_CONFIRM") for o in (resolved, discarded, busy)])
    harness.fakes.faults["waybill"].fail_orders = set()
    for letter, action, outcome in ((letters[0], "resolve", "resolved_by_person"),
                                    (letters[1], "discard", "discarded_by_person")):
        done = await d.compensator.perform(d.row(letter)["id"], action, d.guard, actor="web:carol", note=None)
        assert done.changed
        key = d.row(letter)["biz_key"].replace("mark_confirmed", "issue_waybill")
        [step] = harness.idem(key)
        assert (step["status"], step["outcome"]) == (3, outcome) and "web:carol" in step["last_err"]
    before = len(calls(harness, "waybill", resolved)) + len(calls(harness, "waybill", discarded))
    replays = await d.main.run([ev(resolved, "ORDER_CONFIRM"), ev(discarded, "ORDER_CONFIRM")])
    assert [r.outcome for r in replays] == ["duplicate", "duplicate"]
    assert len(calls(harness, "waybill", resolved)) + len(calls(harness, "waybill", discarded)) == before
    assert not harness.fakes.ledger.waybills.get(resolved)

    busy_key = f"{busy}:ORDER_CONFIRM:issue_waybill"
    harness.db.query("UPDATE t_idem SET lease_until = UTC_TIMESTAMP(3) + INTERVAL 30 SECOND, owner = 'w2/main/1' "
                     "WHERE biz_key = %s", busy_key)                                      # someone calls it now
    refused = await d.compensator.perform(d.row(letters[2])["id"], "resolve", d.guard, actor="web:carol", note=None)
    assert not refused.changed and "being worked right now by w2/main/1" in refused.refused
    assert d.row(letters[2])["status"] == Status.OPEN and harness.idem(busy_key)[0]["status"] == 1


async def test_a_redrive_whose_steps_had_ended_says_whether_they_ran(harness):
    """Two dead letters of one CONFIRM (the event and its re-published copy, logistics answering
    503). A person resolves the first: its waybill step is settled without a call. A retry of the
    copy then runs nothing: it is superseded and says why, not "compensated: the event ran". For
    another order, the first retry issues the waybill and the copy's retry finds it done: the
    copy is compensated (its steps ran), and its history says they ran before it."""
    d = await desk(harness)
    settled, ran = await paid_orders(d.main, 2, "CMPRAN")
    harness.fakes.configure({"waybill": {"fail_orders": [settled, ran], "fail_status": 503}})
    letters = {}
    for order in (settled, ran):
        first, copy = event(order, "ORDER_CONFIRM"), event(order, "ORDER_CONFIRM")
        letters[order] = await d.dead_letters([first]) + await d.dead_letters([copy])
    harness.fakes.faults["waybill"].fail_orders = set()
    first, copy = (d.row(letter)["id"] for letter in letters[settled])
    assert (await d.compensator.perform(first, "resolve", d.guard, actor="web:dan", note="by phone")).changed
    superseded = await d.compensator.perform(copy, "retry", d.guard, actor="web:dan", note=None)
    assert superseded.status is Status.SUPERSEDED, superseded
    assert "nothing ran" in superseded.message and "a person resolved them" in superseded.message
    assert not harness.fakes.ledger.waybills.get(settled)
    first, copy = (d.row(letter)["id"] for letter in letters[ran])
    applied = await d.compensator.perform(first, "retry", d.guard, actor="web:dan", note=None)
    assert (applied.status, applied.message) == (Status.COMPENSATED, "the event ran: applied")
    again = await d.compensator.perform(copy, "retry", d.guard, actor="web:dan", note=None)
    assert again.status is Status.COMPENSATED and "had run before this redrive" in again.message, again
    assert len(harness.fakes.ledger.waybills[ran]) == 1


async def test_the_timer_drains_every_due_row_not_ten_a_tick(harness):
    """A logistics outage leaves 250 dead letters; once they are due one drain works them all,
    a batch at a time, each waybill issued once (it ran 10 rows per 30 s tick for the group)."""
    d = await desk(harness)
    orders = await paid_orders(d.main, 250, "CMPDRAIN")
    harness.fakes.configure({"waybill": {"fail_orders": orders, "fail_status": 503}})
    await d.dead_letters([event(o, "ORDER_CONFIRM") for o in orders])
    harness.fakes.faults["waybill"].fail_orders = set()
    assert await d.compensator.drain(d.guard, seconds=60, batch_size=100) == 250
    rows = harness.db.query("SELECT status, COUNT(*) AS n FROM t_compensation WHERE consumer_group = %s "
                            "GROUP BY status", d.group)
    assert {r["status"]: r["n"] for r in rows} == {Status.COMPENSATED: 250}
    assert all(len(harness.fakes.ledger.waybills[o]) == 1 for o in orders)


async def test_a_retry_whose_claim_ran_out_says_so_and_settles_nothing(harness):
    """A row's claim must outlast its redrive; when it does not, another claimer takes the row
    over, the late settle is fenced out, and the retry answers "changed: false"."""
    d = await desk(harness)
    [order] = await paid_orders(d.main, 1, "CMPLATE")
    harness.fakes.configure({"waybill": {"fail_orders": [order], "fail_status": 503}})
    [letter] = await d.dead_letters([event(order, "ORDER_CONFIRM")])
    harness.fakes.configure({"waybill": {"fail_orders": [], "latency_ms": 1500}})
    slow = Compensator(d.compensator.processor, d.ledger, group=d.group, backoff=Backoff(0.2, 0.4, 3),
                       lease_seconds=0.5, max_event_bytes=1 << 20)
    retry = asyncio.create_task(slow.perform(d.row(letter)["id"], "retry", d.guard, actor="web:dan", note=None))
    await asyncio.sleep(0.8)
    assert await d.compensator.run_due(10, d.guard) == 1                    # the row's claim had run out
    result = await retry
    assert not result.changed and "took the row over" in result.refused
    assert len(harness.fakes.ledger.waybills[order]) == 1


async def test_automatic_claims_never_take_a_row_that_waits_for_a_person(harness):
    d = await desk(harness)
    [order] = await paid_orders(d.main, 1, "CMPMANC")
    [letter] = await d.dead_letters([event(order, "ORDER_PAID", data={"amount_cents": 1})])   # payload mismatch
    row_id = d.row(letter)["id"]
    assert d.row(letter)["status"] == Status.MANUAL
    assert await d.ledger.claim(row_id, "auto/compensator/1#1", 30) is None
    claimed = await d.ledger.claim(row_id, "web/compensator/1#2", 30, allowed=PERSON_CLAIMS)
    assert claimed is not None and claimed.status is Status.RETRYING


async def test_another_groups_rows_are_not_found(harness):
    d = await desk(harness)
    [order] = await paid_orders(d.main, 1, "CMPSCOPE")
    [letter] = await d.dead_letters([event(order, "ORDER_PAID", data={"amount_cents": 1})])
    other = Compensator(d.compensator.processor, d.ledger, group="another-app", backoff=Backoff(1, 1, 3),
                        lease_seconds=30, max_event_bytes=1 << 20)
    for action in ("retry", "resolve", "discard"):
        assert not (await other.perform(d.row(letter)["id"], action, d.guard, actor="web:eve", note=None)).found
    assert d.row(letter)["status"] == Status.MANUAL


@pytest.mark.parametrize("field, value, why", [
    ("dlq.original.partition", b"2147483648", "not a whole number from 0 to 2147483647"),
    ("dlq.original.offset", b"9223372036854775808", "not a whole number from 0 to 9223372036854775807"),
    ("dlq.original.topic", b"t" * 300, "is not a Kafka topic name"),
    ("dlq.original.timestamp", b"-5", "not a whole number from -1"),
    ("dlq.original.offset", b"\xff", "is not UTF-8"),
])
async def test_a_dead_letter_no_kafka_record_can_be_is_a_row_for_a_person(harness, field, value, why):
    """Written to the dead-letter topic by a person or a replay tool, with our group's header:
    its origin could not be stored (strict mode), and the compensator exited 70 on it, for ever,
    and with it every worker given that partition."""
    d = await desk(harness)
    headers = {"dlq.consumer.group": d.group.encode(), "dlq.original.topic": b"order-event",
               "dlq.original.partition": b"0", "dlq.original.offset": b"7", "dlq.original.timestamp": b"1", field: value}
    record = SourceRecord("test-dlq", 2, 4242, 5, b"k", b"{}", tuple(headers.items()))
    assert await d.compensator.handle_dead_letter(record, d.guard) == "manual"
    [row] = harness.db.query("SELECT src_topic, src_partition, src_offset, status, reason, message FROM t_compensation "
                             "WHERE consumer_group = %s", d.group)
    assert (row["src_topic"], row["src_offset"], row["status"], row["reason"]) == (
        "test-dlq", 4242, Status.MANUAL, "unreadable_dead_letter")
    assert why in row["message"]
