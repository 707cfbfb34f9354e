"""The pipeline against real MariaDB and the fake services over real HTTP."""

from __future__ import annotations

import asyncio
from collections import Counter

from app.pipeline.errors import (
    EffectNotDelivered,
    EffectRejected,
    EffectUnavailable,
    LeaseHeld,
    PayloadMismatch,
    PreconditionNotMet,
    UnknownOutcomeNonIdempotent,
)
from app.pipeline.states import OrderStatus
from harness.events import order_no
from harness.pipeline import ev, paid_orders
from harness.services import free_port


async def test_local_batch_of_500_costs_five_round_trips_and_a_replay_two(harness):
    p = await harness.processor()
    events = [ev(order_no(prefix="RT"), "ORDER_CREATED") for _ in range(500)]
    before = p.store.round_trips
    results = await p.run(events)
    assert [r.outcome for r in results] == ["applied"] * 500
    assert p.store.round_trips - before <= 5

    before = p.store.round_trips
    results = await p.run(events)
    assert [r.outcome for r in results] == ["duplicate"] * 500
    assert p.store.round_trips - before <= 2


async def test_owner_names_that_need_escaping_work_in_every_statement(harness):
    p = await harness.processor(owner="o'brien [x] \\ %s/main/1")
    [order] = await paid_orders(p, 1, "ESC")
    harness.fakes.configure({"waybill": {"fail_next": 1}})
    [first] = await p.run([ev(order, "ORDER_CONFIRM")])                  # insert + retriable note
    [second] = await p.run([ev(order, "ORDER_CONFIRM")])                 # reclaim + done
    assert isinstance(first.error, EffectUnavailable) and second.outcome == "applied"
    assert harness.idem(f"{order}:ORDER_CONFIRM:issue_waybill")[0]["owner"] == "o'brien [x] \\ %s/main/1"


async def test_confirm_issues_one_waybill_with_receipt_in_t3(harness):
    p = await harness.processor()
    [order] = await paid_orders(p, 1, "WB")
    [result] = await p.run([ev(order, "ORDER_CONFIRM")])
    assert result.outcome == "applied"
    [row] = harness.idem(f"{order}:ORDER_CONFIRM:issue_waybill")
    [receipt] = harness.db.query("SELECT * FROM t_waybill_receipt WHERE order_no = %s", order)
    assert (row["status"], row["outcome"], row["attempt"]) == (2, "waybill_issued", 1)
    assert receipt["idem_token"] == row["idem_token"] and receipt["attempt"] == 1
    assert harness.fakes.ledger.waybills[order] == [receipt["waybill_no"]]
    assert harness.order(order)["status"] == OrderStatus.CONFIRMED


async def test_unknown_outcome_keeps_pending_and_the_retry_reuses_the_token(harness):
    p = await harness.processor()
    [order] = await paid_orders(p, 1, "TOK")
    harness.fakes.configure({"waybill": {"fail_next": 1, "fail_status": 503}})
    [first] = await p.run([ev(order, "ORDER_CONFIRM")])
    assert isinstance(first.error, EffectUnavailable) and first.error.retriable
    [row] = harness.idem(f"{order}:ORDER_CONFIRM:issue_waybill")
    assert (row["status"], row["outcome"]) == (1, "effect_unavailable")

    [second] = await p.run([ev(order, "ORDER_CONFIRM")])
    assert second.outcome == "applied"
    keys = [c["key"] for c in harness.fakes.ledger.calls if c["service"] == "waybill"]
    assert keys == [row["idem_token"], row["idem_token"]]           # generated once, reused verbatim
    assert len(harness.fakes.ledger.waybills[order]) == 1
    assert harness.idem(f"{order}:ORDER_CONFIRM:issue_waybill")[0]["attempt"] == 2


async def test_business_refusal_fails_for_good(harness):
    p = await harness.processor()
    [order] = await paid_orders(p, 1, "REJ")
    harness.fakes.configure({"waybill": {"reject_orders": [order]}})
    [result] = await p.run([ev(order, "ORDER_CONFIRM")])
    assert isinstance(result.error, EffectRejected) and not result.error.retriable
    [row] = harness.idem(f"{order}:ORDER_CONFIRM:issue_waybill")
    assert (row["status"], row["outcome"]) == (3, "effect_rejected") and "422" in row["last_err"]
    assert not harness.db.query("SELECT * FROM t_waybill_receipt WHERE order_no = %s", order)
    [replay] = await p.run([ev(order, "ORDER_CONFIRM")])                 # terminal: no new call
    assert replay.error.reason == "effect_rejected"
    assert sum(c["service"] == "waybill" for c in harness.fakes.ledger.calls) == 1


async def test_sms_with_unknown_outcome_is_never_sent_twice(harness):
    """A gateway without the lookup: the row fails for a person to reconcile, never sent again."""
    p = await harness.processor(timeout=0.5, sms_lookup=False)
    orders = await paid_orders(p, 2, "SMS")
    harness.fakes.configure({"sms": {"timeout_next": 1, "timeout_ms": 2000, "reset_next": 1}})
    for order in orders:   # one times out, one is reset after sending
        [result] = await p.run([ev(order, "ORDER_CANCEL")])
        assert isinstance(result.error, UnknownOutcomeNonIdempotent) and not result.error.retriable
        [row] = harness.idem(f"{order}:ORDER_CANCEL:send_cancel_sms")
        assert (row["status"], row["outcome"]) == (3, "unknown_outcome_non_idempotent")
        [again] = await p.run([ev(order, "ORDER_CANCEL")])
        assert again.error.reason == "unknown_outcome_non_idempotent"
    calls = Counter(c["body"]["text"].split()[1] for c in harness.fakes.ledger.calls if c["service"] == "sms")
    assert calls == {orders[0]: 1, orders[1]: 1}
    await asyncio.sleep(2)   # the timed-out request completes at the gateway
    assert sum(len(v) for v in harness.fakes.ledger.sms.values()) <= 2


async def test_sms_with_unknown_outcome_is_verified_with_the_gateway_and_sent_once(harness):
    """With the lookup: the row stays pending; asking too early (a request may still be on
    its way) is refused; once the settle time has passed the gateway is asked: the reply
    that was lost, and the request that timed out but landed, are both found, and neither
    SMS goes out again."""
    p = await harness.processor(timeout=0.5, settle=3.0)
    orders = await paid_orders(p, 2, "SMSV")
    harness.fakes.configure({"sms": {"timeout_next": 1, "timeout_ms": 2000, "reset_next": 1}})
    for order in orders:   # one times out, one is reset after sending
        [result] = await p.run([ev(order, "ORDER_CANCEL")])
        assert result.error.reason == "effect_outcome_unknown" and result.error.retriable
        [row] = harness.idem(f"{order}:ORDER_CANCEL:send_cancel_sms")
        assert (row["status"], row["outcome"]) == (1, "effect_outcome_unknown")
        [early] = await p.run([ev(order, "ORDER_CANCEL")])
        assert early.error.reason == "effect_outcome_unknown" and "is asked once" in str(early.error)
    assert not [c for c in harness.fakes.ledger.calls if c["service"] == "sms_lookup"]
    await asyncio.sleep(3.2)   # the settle time; the timed-out request has landed meanwhile
    for order in orders:
        [later] = await p.run([ev(order, "ORDER_CANCEL")])
        assert later.outcome == "applied", later
        assert harness.idem(f"{order}:ORDER_CANCEL:send_cancel_sms")[0]["status"] == 2
        assert len(harness.fakes.ledger.sms[order]) == 1
    assert sum(c["service"] == "sms" for c in harness.fakes.ledger.calls) == 2          # never a second send
    assert sum(c["service"] == "sms_lookup" for c in harness.fakes.ledger.calls) == 2


async def test_sms_refused_connection_is_retried_and_sent_once(harness):
    dead = f"http://127.0.0.1:{free_port()}"
    down = await harness.processor(sms_url=dead, owner="sms-w/main/1")
    [order] = await paid_orders(down, 1, "SMSR")
    [first] = await down.run([ev(order, "ORDER_CANCEL")])
    assert isinstance(first.error, EffectNotDelivered) and first.error.retriable
    up = await harness.processor(owner="sms-w/main/1")      # same owner: its own lease
    [second] = await up.run([ev(order, "ORDER_CANCEL")])
    assert second.outcome == "applied"
    assert len(harness.fakes.ledger.sms[order]) == 1


async def test_stale_event_changes_nothing_and_calls_nothing(harness):
    p = await harness.processor()
    [order] = await paid_orders(p, 1, "STALE")
    [cancel] = await p.run([ev(order, "ORDER_CANCEL")])
    assert cancel.outcome == "applied"
    [confirm] = await p.run([ev(order, "ORDER_CONFIRM")])                # a CONFIRM after the CANCEL
    assert confirm.outcome == "stale"
    assert harness.order(order)["status"] == OrderStatus.CANCELLED
    assert harness.idem(f"{order}:ORDER_CONFIRM:mark_confirmed")[0]["outcome"] == "stale"
    assert not harness.idem(f"{order}:ORDER_CONFIRM:issue_waybill")
    assert not harness.fakes.ledger.waybills.get(order)

    # PAID -> CREATED: an order known to the table (its t_idem rows long purged)
    # receives a CREATED event; it stays PAID.
    old = order_no(prefix="STALE")
    harness.db.query("INSERT INTO t_order (order_no, status, amount_cents) VALUES (%s, 2, 5)", old)
    [created] = await p.run([ev(old, "ORDER_CREATED")])
    assert created.outcome == "stale" and harness.order(old)["status"] == OrderStatus.PAID
    assert harness.order(old)["amount_cents"] == 5


async def test_paid_before_created_is_retriable_and_writes_nothing(harness):
    p = await harness.processor()
    order = order_no(prefix="PRE")
    [result] = await p.run([ev(order, "ORDER_PAID")])
    assert isinstance(result.error, PreconditionNotMet) and result.error.retriable
    assert harness.order(order) is None and not harness.idem(f"{order}:ORDER_PAID:mark_paid")


async def test_same_key_with_another_payload_is_not_executed(harness):
    p = await harness.processor()
    [order] = await paid_orders(p, 1, "MIS")
    [result] = await p.run([ev(order, "ORDER_PAID", data={"amount_cents": 1})])
    assert isinstance(result.error, PayloadMismatch) and result.error.reason == "payload_mismatch"
    assert harness.order(order)["paid_cents"] != 1


async def test_two_claimers_never_call_the_same_key_at_once(harness):
    """Two pipelines on separate connections race for the same 100 keys, three rounds."""
    a, b = await harness.processor(), await harness.processor()
    harness.fakes.configure({"waybill": {"latency_ms": 20}})
    for round_ in range(3):
        orders = await paid_orders(a, 100, f"RACE{round_}")
        confirms = [ev(o, "ORDER_CONFIRM") for o in orders]
        ra, rb = await asyncio.gather(a.run(confirms), b.run(list(reversed(confirms))))
        rb.reverse()
        for x, y in zip(ra, rb):
            winners = [r for r in (x, y) if r.outcome == "applied"]
            losers = [r for r in (x, y) if r.outcome != "applied"]
            assert len(winners) == 1, (x, y)
            assert losers[0].outcome == "duplicate" or isinstance(losers[0].error, LeaseHeld)
        for o in orders:
            assert len(harness.fakes.ledger.waybills[o]) == 1
    assert harness.fakes.ledger.peak_in_flight == 1
    calls = sum(c["service"] == "waybill" for c in harness.fakes.ledger.calls)
    assert calls == 300


async def test_worker_whose_lease_was_taken_over_cannot_mark_done(harness):
    slow = await harness.processor(lease=0.3, timeout=5, lease_check=False)     # stalls in its call
    fast = await harness.processor(lease=30, timeout=5)
    [order] = await paid_orders(slow, 1, "FENCE")
    harness.fakes.configure({"waybill": {"latency_ms": 1000}})
    confirm = ev(order, "ORDER_CONFIRM")

    async def later():
        await asyncio.sleep(0.6)             # the slow one's lease has run out
        return await fast.run([confirm])

    [stale_owner], [new_owner] = await asyncio.gather(slow.run([confirm]), later())
    assert stale_owner.outcome == "superseded"
    assert new_owner.outcome == "applied"
    [row] = harness.idem(f"{order}:ORDER_CONFIRM:issue_waybill")
    [receipt] = harness.db.query("SELECT * FROM t_waybill_receipt WHERE order_no = %s", order)
    assert row["attempt"] == 2 and receipt["attempt"] == 2 and row["owner"] == fast.owner
    assert len(harness.fakes.ledger.waybills[order]) == 1


def test_no_biz_key_has_two_rows(scratch_db):
    assert scratch_db.query("SELECT biz_key FROM t_idem GROUP BY biz_key HAVING COUNT(*) > 1") == []
