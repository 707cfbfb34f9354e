"""The compensator against real MariaDB and the fake services over real HTTP: dead letters
made by the batch handler, then worked the way the dead-letter agent and the timer do."""

from __future__ import annotations

import asyncio

import pytest

from app.compensation.compensator import Compensator
from app.compensation.rules import Backoff
from app.pipeline.ports import SourceRecord
from app.pipeline.states import LedgerStatus as Status
from harness.desk import desk
from harness.events import event, order_no
from harness.pipeline import paid_orders


def waybill_calls(harness, order: str) -> list[dict]:
    return [c for c in harness.fakes.ledger.calls if c["service"] == "waybill" and c["body"]["order_no"] == order]


async def test_a_retriable_dead_letter_is_redriven_with_the_same_token_once_the_service_recovers(harness):
    d = await desk(harness)
    [order] = await paid_orders(d.main, 1, "CMPOK")
    harness.fakes.configure({"waybill": {"fail_orders": [order], "fail_status": 500}})
    [letter] = await d.dead_letters([event(order, "ORDER_CONFIRM")])
    assert d.row(letter)["reason"] == "effect_unavailable"
    assert await d.compensator.handle_dead_letter(letter, d.guard) == "open"       # still failing: backs off
    assert d.row(letter)["redrives"] == 1 and d.row(letter)["next_retry_at"] is not None

    harness.fakes.faults["waybill"].fail_orders = set()                           # the service recovers
    await asyncio.sleep(0.3)
    assert await d.compensator.run_due(10, d.guard) >= 1
    row = d.row(letter)
    assert (row["status"], row["redrives"]) == (Status.COMPENSATED, 2)
    assert len(harness.fakes.ledger.waybills[order]) == 1
    assert len({c["key"] for c in waybill_calls(harness, order)}) == 1            # one token, every call
    assert [h["action"] for h in d.history(row["id"])] == ["redrive", "redrive"]
    assert d.history(row["id"])[-1]["to_status"] == Status.COMPENSATED


async def test_a_dead_letter_not_due_yet_is_left_to_the_timer(harness):
    d = await desk(harness, retry_after=1)
    [order] = await paid_orders(d.main, 1, "CMPDUE")
    harness.fakes.configure({"waybill": {"fail_next": 4}})
    [letter] = await d.dead_letters([event(order, "ORDER_CONFIRM")])
    assert await d.compensator.handle_dead_letter(letter, d.guard) == "not_due"
    assert d.row(letter)["status"] == Status.OPEN and await d.compensator.run_due(10, d.guard) == 0
    await asyncio.sleep(1.1)
    assert await d.compensator.run_due(10, d.guard) == 1
    assert d.row(letter)["status"] == Status.COMPENSATED and len(harness.fakes.ledger.waybills[order]) == 1


async def test_still_failing_backs_off_exponentially_then_goes_to_a_person(harness):
    d = await desk(harness, backoff=Backoff(0.2, 0.3, 3))
    [order] = await paid_orders(d.main, 1, "CMPMAN")
    harness.fakes.configure({"waybill": {"fail_orders": [order], "fail_status": 503}})
    [letter] = await d.dead_letters([event(order, "ORDER_CONFIRM")])
    waits = []
    await d.compensator.handle_dead_letter(letter, d.guard)
    for _ in range(2):
        row = d.row(letter)
        waits.append((row["next_retry_at"] - row["gmt_modified"]).total_seconds())
        await asyncio.sleep(waits[-1] + 0.1)
        await d.compensator.run_due(10, d.guard)
    row = d.row(letter)
    assert waits == [pytest.approx(0.2, abs=0.01), pytest.approx(0.3, abs=0.01)]     # doubled, then capped
    assert (row["status"], row["redrives"], row["next_retry_at"]) == (Status.MANUAL, 3, None)
    assert "gave up after 3 redrives" in row["message"]


async def test_a_dead_letter_that_is_not_retriable_goes_to_a_person_at_once(harness):
    d = await desk(harness)
    [order] = await paid_orders(d.main, 1, "CMPNR")
    letters = await d.dead_letters([event(order, "ORDER_PAID", data={"amount_cents": 1})])   # payload mismatch
    # Manual as it is written, before the compensator sees its record (which may never reach the
    # topic: a worker killed between the ledger's commit and the send); open, it was never due.
    assert d.row(letters[0])["status"] == Status.MANUAL
    calls = len(harness.fakes.ledger.calls)
    assert await d.compensator.handle_dead_letter(letters[0], d.guard) == "manual"
    row = d.row(letters[0])
    assert (row["status"], row["redrives"]) == (Status.MANUAL, 0) and "recorded with payload" in row["message"]
    assert len(harness.fakes.ledger.calls) == calls


async def test_a_dead_letter_it_cannot_read_becomes_a_manual_row(harness):
    d = await desk(harness)
    nameless = SourceRecord("test-dlq", 1, 901, 5, b"k", b"v", (("trace", b"1"),))
    assert await d.compensator.handle_dead_letter(nameless, d.guard) == "manual"
    forged = SourceRecord("test-dlq", 1, 902, 5, b"k", b"v", (
        ("dlq.consumer.group", d.group.encode()), ("dlq.original.topic", b"nowhere"),
        ("dlq.original.partition", b"0"), ("dlq.original.offset", b"7")))
    assert await d.compensator.handle_dead_letter(forged, d.guard) == "manual"
    rows = harness.db.query("SELECT src_topic, src_offset, status, reason FROM t_compensation WHERE "
                            "consumer_group = %s ORDER BY src_offset", d.group)
    assert [(r["src_offset"], r["status"], r["reason"]) for r in rows] == [
        (7, Status.MANUAL, "no_ledger_row"), (901, Status.MANUAL, "unreadable_dead_letter")]


async def test_a_dead_letter_whose_order_moved_on_is_superseded_without_a_call(harness):
    d = await desk(harness)
    [order] = await paid_orders(d.main, 1, "CMPSUP")
    harness.fakes.configure({"waybill": {"fail_orders": [order], "fail_status": 503}})
    [letter] = await d.dead_letters([event(order, "ORDER_CONFIRM")])
    await d.dead_letters([event(order, "ORDER_CANCEL")])                         # a later event, a later batch
    harness.fakes.faults["waybill"].fail_orders = set()
    calls = len(waybill_calls(harness, order))
    # Not called again. The 503s may have issued a waybill (5xx is an unknown outcome), so the
    # row goes to a person with the token to look for, not to superseded.
    assert await d.compensator.handle_dead_letter(letter, d.guard) == "manual"
    assert len(waybill_calls(harness, order)) == calls and not harness.fakes.ledger.waybills.get(order)
    row = d.row(letter)
    assert row["may_be_superseded"] == 1 and "stale_effect_may_exist" in d.history(row["id"])[-1]["detail"]

    # A CONFIRM that never reached the API (its PAID had not come yet) is simply superseded.
    created = order_no(prefix="CMPSUP3")
    await d.dead_letters([event(created, "ORDER_CREATED")])
    [blocked] = await d.dead_letters([event(created, "ORDER_CONFIRM")])          # not ready: never called
    await d.dead_letters([event(created, "ORDER_CANCEL")])
    assert await d.compensator.handle_dead_letter(blocked, d.guard) == "superseded"
    assert not waybill_calls(harness, created)


async def test_a_row_whose_claimer_died_is_worked_again_once_its_claim_runs_out(harness):
    """A compensator killed between its claim and its settle leaves the row `retrying`; the
    timer picks it up when the claim has run out (found by the chaos suite: it stayed forever)."""
    d = await desk(harness)
    [order] = await paid_orders(d.main, 1, "CMPORPH")
    harness.fakes.configure({"waybill": {"fail_orders": [order], "fail_status": 503}})
    [letter] = await d.dead_letters([event(order, "ORDER_CONFIRM")])
    harness.fakes.faults["waybill"].fail_orders = set()
    row = d.row(letter)
    assert await d.ledger.claim(row["id"], "gone/compensator/1#1", 0.5) is not None     # ... and it dies here
    assert await d.compensator.run_due(10, d.guard) == 0                                 # its claim still runs
    await asyncio.sleep(0.7)
    assert await d.compensator.run_due(10, d.guard) == 1
    assert d.row(letter)["status"] == Status.COMPENSATED and len(harness.fakes.ledger.waybills[order]) == 1


async def test_a_dead_letter_already_done_is_compensated_without_a_call(harness):
    d = await desk(harness)
    [order] = await paid_orders(d.main, 1, "CMPDONE")
    harness.fakes.configure({"waybill": {"fail_next": 4}})
    [letter] = await d.dead_letters([event(order, "ORDER_CONFIRM")])
    await d.main.run([source_event(order)])                                      # a duplicate got through
    calls = len(waybill_calls(harness, order))
    assert await d.compensator.handle_dead_letter(letter, d.guard) == "compensated"
    assert len(waybill_calls(harness, order)) == calls and len(harness.fakes.ledger.waybills[order]) == 1


def source_event(order: str):
    from harness.pipeline import ev
    return ev(order, "ORDER_CONFIRM")


async def test_a_lost_sms_reply_is_found_by_asking_the_gateway(harness):
    d = await desk(harness)
    [order] = await paid_orders(d.main, 1, "CMPSMS")
    harness.fakes.configure({"sms": {"reset_next": 1}})                          # sent, the reply lost
    [letter] = await d.dead_letters([event(order, "ORDER_CANCEL")])
    assert (d.row(letter)["reason"], d.row(letter)["retriable"]) == ("effect_outcome_unknown", 1)
    await asyncio.sleep(0.6)                                                      # the settle time
    assert await d.compensator.handle_dead_letter(letter, d.guard) == "compensated"
    assert len(harness.fakes.ledger.sms[order]) == 1
    assert [c["service"] for c in harness.fakes.ledger.calls if c["service"].startswith("sms")] == [
        "sms", "sms_lookup"]


async def test_an_sms_that_never_reached_the_gateway_is_sent_once_by_the_compensator(harness):
    d = await desk(harness)
    [order] = await paid_orders(d.main, 1, "CMPSMS404")
    harness.fakes.configure({"sms": {"fail_next": 1, "fail_status": 502}})       # refused before any work
    [letter] = await d.dead_letters([event(order, "ORDER_CANCEL")])
    await asyncio.sleep(0.6)
    assert await d.compensator.handle_dead_letter(letter, d.guard) == "compensated"
    assert len(harness.fakes.ledger.sms[order]) == 1
    sms = [c for c in harness.fakes.ledger.calls if c["service"].startswith("sms")]
    assert [c["service"] for c in sms] == ["sms", "sms_lookup", "sms"]
    assert sms[0]["body"]["client_ref"] == sms[1]["client_ref"] == sms[2]["body"]["client_ref"]


async def test_without_the_lookup_an_unknown_sms_waits_for_a_person_then_is_verified_when_asked(harness):
    d = await desk(harness, lookup=False)
    [order] = await paid_orders(d.main, 1, "CMPNOLK")
    harness.fakes.configure({"sms": {"reset_next": 1}})
    [letter] = await d.dead_letters([event(order, "ORDER_CANCEL")])
    assert (d.row(letter)["reason"], d.row(letter)["status"]) == ("unknown_outcome_non_idempotent", Status.MANUAL)
    assert await d.compensator.handle_dead_letter(letter, d.guard) == "manual"
    assert "it may have been sent" in d.row(letter)["message"]

    later = await desk(harness, lookup=True, group=d.group)                       # the gateway gains the lookup
    await asyncio.sleep(0.6)
    result = await later.compensator.perform(d.row(letter)["id"], "retry", later.guard, actor="web:alice",
                                             note="the gateway has a lookup now")
    assert result.status is Status.COMPENSATED, result
    assert len(harness.fakes.ledger.sms[order]) == 1
    assert harness.idem(f"{order}:ORDER_CANCEL:send_cancel_sms")[0]["status"] == 2


async def test_a_persons_actions_are_idempotent_and_audited(harness):
    d = await desk(harness)
    [order] = await paid_orders(d.main, 1, "CMPACT")
    [letter] = await d.dead_letters([event(order, "ORDER_PAID", data={"amount_cents": 2})])
    row_id = d.row(letter)["id"]
    first = await d.compensator.perform(row_id, "resolve", d.guard, actor="web:bob", note="fixed in the shop")
    again = await d.compensator.perform(row_id, "resolve", d.guard, actor="web:bob", note="fixed in the shop")
    assert (first.changed, first.status, again.changed, again.status, again.refused) == (
        True, Status.RESOLVED, False, Status.RESOLVED, None)
    refused = await d.compensator.perform(row_id, "discard", d.guard, actor="web:bob", note=None)
    assert refused.refused and "cannot discard a row that is resolved" in refused.refused
    retry = await d.compensator.perform(row_id, "retry", d.guard, actor="web:bob", note=None)
    assert (retry.changed, retry.status) == (False, Status.RESOLVED)
    [audit] = d.history(row_id)
    assert (audit["actor"], audit["action"], audit["from_status"], audit["to_status"], audit["note"]) == (
        "web:bob", "resolve", Status.MANUAL, Status.RESOLVED, "fixed in the shop")
    missing = await d.compensator.perform(10 ** 12, "retry", d.guard, actor="web:bob", note=None)
    assert not missing.found


async def test_the_timer_runs_only_its_own_consumer_groups_rows(harness):
    """Two apps (consumer groups) sharing a database: each compensator works its own ledger."""
    d = await desk(harness)
    [order] = await paid_orders(d.main, 1, "CMPGRP")
    harness.fakes.configure({"waybill": {"fail_next": 4}})
    [letter] = await d.dead_letters([event(order, "ORDER_CONFIRM")])
    other = Compensator(d.compensator.processor, d.ledger, group="another-app", backoff=Backoff(1, 1, 3),
                        lease_seconds=30, max_event_bytes=1 << 20)
    assert await other.run_due(10, d.guard) == 0
    assert d.row(letter)["status"] == Status.OPEN and not harness.fakes.ledger.waybills.get(order)
    assert await d.compensator.run_due(10, d.guard) >= 1
    assert d.row(letter)["status"] == Status.COMPENSATED
