"""The pipeline's failure paths at its own level: real MariaDB, the fake services over real
HTTP, the batch handler in this process. A call skipped after an earlier failure, a T3 that
fails, a bad waybill number, a waybill of an order cancelled meanwhile, dead letters overtaken
by a later batch, a full connection pool, the lease checked before each call, 409s and
redirects, the ledger per consumer group, the connection's character set. Each test was
watched failing with what it checks broken."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime

import pytest
from sqlalchemy import event as sa_event
from sqlalchemy.ext.asyncio import create_async_engine

from app.adapters.mysql import MySqlStore
from app.adapters.mysql.engine import WrongCharset, check_charset
from app.pipeline.errors import ClaimExpiring, StoreUnavailable
from app.pipeline.events import EventType
from app.pipeline.ports import DeadLetter, SourceRecord
from app.pipeline.states import OrderStatus
from app.pipeline.steps import ISSUE_WAYBILL, PIPELINES, SEND_SMS, EffectStep, LocalStep, Pipeline
from harness.events import event, order_no
from harness.pipeline import ev, paid_orders, source


def calls(fakes, service: str, order: str | None = None) -> list[dict]:
    return [c for c in fakes.ledger.calls if c["service"] == service
            and (order is None or order in str(c["body"]))]


# -- 3. a skipped call is known not to have been made -------------------------------------

async def test_a_call_skipped_after_an_earlier_failure_is_sent_on_the_retry(harness, monkeypatch):
    """Two effects of one order in one batch, the first answers 503: the second was never
    called, and T3 says so, so the retry sends it (once) instead of failing it as an unknown
    outcome. (With today's steps the CONFIRM + CANCEL pair no longer reaches this point --
    the waybill is stale once the CANCEL is in the batch -- so the test declares an event
    with two effects, as a future step list may.)"""
    monkeypatch.setitem(PIPELINES, EventType.CANCEL, Pipeline(
        LocalStep("mark_cancelled", OrderStatus.CANCELLED),
        effects=(EffectStep("recall_parcel", ISSUE_WAYBILL), EffectStep("send_cancel_sms", SEND_SMS))))
    p = await harness.processor()
    [order] = await paid_orders(p, 1, "SKIP")
    harness.fakes.configure({"waybill": {"fail_next": 1, "fail_status": 503}})
    batches = harness.batches(p)
    report = await batches.handle([source(event(order, "ORDER_CANCEL"))])

    assert report.outcomes == {"applied": 1} and not report.dead_letters, report
    assert len(harness.fakes.ledger.sms[order]) == 1
    [row] = harness.idem(f"{order}:ORDER_CANCEL:send_cancel_sms")
    assert (row["status"], row["attempt"]) == (2, 2)          # claimed again after "not delivered", then done


async def test_confirm_and_cancel_in_one_batch_with_logistics_down(harness):
    """The issue's scenario as written: CONFIRM(X), CANCEL(X), logistics answers 503. No
    waybill for a cancelled order, the SMS goes out once, nothing is dead-lettered."""
    p = await harness.processor()
    [order] = await paid_orders(p, 1, "CC503")
    harness.fakes.configure({"waybill": {"fail_orders": [order], "fail_status": 503}})
    report = await harness.batches(p).handle([source(event(order, "ORDER_CONFIRM")),
                                             source(event(order, "ORDER_CANCEL"))])
    assert not report.dead_letters and report.outcomes == {"stale": 1, "applied": 1}, report
    assert calls(harness.fakes, "waybill", order) == []
    assert len(harness.fakes.ledger.sms[order]) == 1
    assert harness.idem(f"{order}:ORDER_CONFIRM:issue_waybill")[0]["outcome"] == "stale"


# -- 4. a failed T3 is retried with the outcomes the batch has ------------------------------

class T3FailsOnce(MySqlStore):
    """The database drops out right after the calls: the first T3 finds it unreachable."""

    t3_failures = 1
    t1_runs = 0

    async def in_transaction(self, work):
        store = self

        class Watched:
            def __init__(self, tx):
                self.tx = tx

            def __getattr__(self, name):
                if name == "read_idem":
                    store.t1_runs += 1
                if name == "finish_effects" and store.t3_failures:
                    store.t3_failures -= 1
                    raise StoreUnavailable("connection lost in T3 (injected)")
                return getattr(self.tx, name)

        return await super().in_transaction(lambda tx: work(Watched(tx)))


async def test_a_t3_that_fails_is_retried_with_the_same_outcomes(harness):
    p = await harness.processor(store=harness.store(T3FailsOnce))
    orders = await paid_orders(p, 20, "T3RETRY")
    t1_before = p.store.t1_runs
    report = await harness.batches(p).handle([source(event(o, "ORDER_CANCEL")) for o in orders])

    assert report.outcomes == {"applied": 20} and not report.dead_letters, report
    assert p.store.t3_failures == 0                           # the failure happened...
    assert p.store.t1_runs - t1_before == 1                   # ...and T1 and the calls were not run again
    assert all(len(harness.fakes.ledger.sms[o]) == 1 for o in orders)
    marks = ", ".join(["%s"] * len(orders))
    rows = harness.db.query(f"SELECT status, outcome FROM t_idem WHERE biz_key IN ({marks})",
                            *[f"{o}:ORDER_CANCEL:send_cancel_sms" for o in orders])
    assert Counter((r["status"], r["outcome"]) for r in rows) == {(2, "sms_accepted"): 20}


@pytest.mark.parametrize("waybill_no", ["W" * 65, 1234567])
async def test_a_bad_waybill_number_fails_its_record_not_the_batch(harness, waybill_no):
    p = await harness.processor()
    orders = await paid_orders(p, 11, "BADWB")
    bad, others = orders[0], orders[1:]
    harness.fakes.configure({"waybill": {"waybill_no_override": waybill_no}})
    records = [source(event(bad, "ORDER_CONFIRM"))] + [source(event(o, "ORDER_CANCEL")) for o in others]
    report = await harness.batches(p).handle(records)

    [letter] = report.dead_letters
    assert (letter.order_no, letter.reason, letter.retriable) == (bad, "effect_bad_receipt", False)
    assert report.outcomes == {"applied": 10, "dead_letter": 1}
    assert all(len(harness.fakes.ledger.sms[o]) == 1 for o in others)
    assert not harness.db.query("SELECT 1 FROM t_idem WHERE outcome = 'unknown_outcome_non_idempotent' "
                                "AND biz_key LIKE %s", "%BADWB%")


# -- 5. no waybill for an order that moved past it ---------------------------------------------

async def test_a_pending_waybill_is_not_called_again_once_the_order_is_cancelled(harness):
    p = await harness.processor()
    [order] = await paid_orders(p, 1, "STALEWB")
    harness.fakes.configure({"waybill": {"fail_next": 1, "fail_status": 503}})
    [confirm] = await p.run([ev(order, "ORDER_CONFIRM")])
    assert confirm.error.reason == "effect_unavailable"                  # pending, token persisted
    [cancel] = await p.run([ev(order, "ORDER_CANCEL")])
    assert cancel.outcome == "applied" and len(harness.fakes.ledger.sms[order]) == 1

    [again] = await p.run([ev(order, "ORDER_CONFIRM")])                 # a duplicate, or the compensator
    # Not called; but the 503 may have issued a waybill: a person looks for it by its token.
    assert again.error.reason == "stale_effect_may_exist" and not again.error.retriable
    assert len(calls(harness.fakes, "waybill", order)) == 1             # only the first, failed call
    [row] = harness.idem(f"{order}:ORDER_CONFIRM:issue_waybill")
    assert (row["status"], row["outcome"]) == (3, "stale") and "CANCELLED" in row["last_err"]
    [replay] = await p.run([ev(order, "ORDER_CONFIRM")])
    assert replay.outcome == "duplicate"                                # settled: no dead letter on replay


async def test_a_dead_letter_is_flagged_when_a_later_batch_moves_its_order(harness):
    p = await harness.processor()
    [order, other] = await paid_orders(p, 2, "OVERTAKE")
    confirm = event(order, "ORDER_CONFIRM")
    letter = lambda doc: DeadLetter(record=source(doc), reason="effect_unavailable", message="503",  # noqa: E731
                                    retriable=True, attempts=4, first_failure_at=datetime.now(UTC),
                                    order_no=doc["order_no"], biz_key=f"{doc['order_no']}:ORDER_CONFIRM:mark_confirmed")
    await p.store.in_transaction(lambda tx: tx.record_dead_letters(
        [letter(confirm), letter(event(other, "ORDER_CONFIRM"))], group="g"))
    flags = "SELECT order_no, may_be_superseded FROM t_compensation WHERE order_no IN (%s, %s)"
    assert {r["order_no"]: r["may_be_superseded"] for r in harness.db.query(flags, order, other)} == {
        order: 0, other: 0}

    [cancel] = await p.run([ev(order, "ORDER_CANCEL")])                 # the next batch: a later event of it
    assert cancel.outcome == "applied"
    assert {r["order_no"]: r["may_be_superseded"] for r in harness.db.query(flags, order, other)} == {
        order: 1, other: 0}
    assert harness.order(order)["has_dead_letters"] == 0


# -- 8. a full pool is an infrastructure wait ---------------------------------------------------

async def test_a_full_connection_pool_is_waited_out_not_dead_lettered(harness):
    store = harness.store(pool_size=1, max_overflow=0)
    store.engine.pool._timeout = 0.2
    p = await harness.processor(store=store)
    [order] = await paid_orders(p, 1, "POOL")

    async with store.engine.connect() as held:                        # every connection busy...
        await held.exec_driver_sql("SELECT 1")
        with pytest.raises(StoreUnavailable, match="no database connection free"):
            await store.in_transaction(lambda tx: tx.read_orders([order]))
        batch = asyncio.create_task(harness.batches(p).handle([source(event(order, "ORDER_CANCEL"))]))
        await asyncio.sleep(1.0)                                        # ...for a while, then free again
    report = await batch
    assert report.outcomes == {"applied": 1} and not report.dead_letters, report
    assert report.infra_wait_seconds > 0


# -- 11. the lease is checked right before each call ---------------------------------------------

async def test_no_call_starts_without_enough_lease_left(harness):
    """Worker A claims four keys with a 2 s lease and can call one at a time (0.9 s each);
    worker B claims whatever A's lease no longer covers. Without the check, A's third and
    fourth calls start as its lease runs out, while B calls the same keys."""
    a = await harness.processor(lease=2.0, timeout=1.0, margin=0.2, concurrency=1, owner="slow/main/a")
    b = await harness.processor(lease=30.0, timeout=1.0, owner="fast/main/b")
    orders = await paid_orders(a, 4, "LEASECHK")
    harness.fakes.configure({"waybill": {"latency_ms": 900}})
    confirms = [ev(o, "ORDER_CONFIRM") for o in orders]

    async def b_after_a_lease():
        await asyncio.sleep(2.3)
        return await b.run(confirms)

    ra, rb = await asyncio.gather(a.run(confirms), b_after_a_lease())
    assert ra[0].outcome == "applied"
    assert all(isinstance(r.error, ClaimExpiring) for r in ra[1:]), ra
    assert harness.fakes.ledger.peak_in_flight == 1
    assert all(len(harness.fakes.ledger.waybills[o]) == 1 for o in orders)
    assert [r.outcome for r in rb] == ["duplicate", "applied", "applied", "applied"]
    assert harness.idem(f"{orders[1]}:ORDER_CONFIRM:issue_waybill")[0]["owner"] == "fast/main/b"


async def test_an_sms_not_called_for_want_of_lease_is_sent_on_the_retry(harness):
    p = await harness.processor(lease=2.0, timeout=1.0, margin=0.2, concurrency=1)
    orders = await paid_orders(p, 3, "LEASESMS")
    harness.fakes.configure({"sms": {"latency_ms": 900}})
    report = await harness.batches(p).handle([source(event(o, "ORDER_CANCEL")) for o in orders])
    assert report.outcomes == {"applied": 3} and not report.dead_letters, report
    assert all(len(harness.fakes.ledger.sms[o]) == 1 for o in orders)
    assert report.lease_waits >= 1


# -- 12. HTTP answers read narrowly ------------------------------------------------------------

async def test_a_409_means_in_progress_and_is_retried_with_the_same_token(harness):
    p = await harness.processor()
    [order] = await paid_orders(p, 1, "HTTP409")
    harness.fakes.configure({"waybill": {"conflict_next": 2}})
    report = await harness.batches(p).handle([source(event(order, "ORDER_CONFIRM"))])
    assert report.outcomes == {"applied": 1} and report.retries == {"effect_unavailable": 2}
    tokens = {c["key"] for c in calls(harness.fakes, "waybill", order)}
    assert len(calls(harness.fakes, "waybill", order)) == 3 and len(tokens) == 1
    assert len(harness.fakes.ledger.waybills[order]) == 1


@pytest.mark.parametrize("lookup, reason", [(False, "unknown_outcome_non_idempotent"),
                                            (True, "effect_outcome_unknown")])
async def test_a_redirect_after_an_sms_was_accepted_is_not_followed(harness, lookup, reason):
    p = await harness.processor(sms_lookup=lookup)
    [order] = await paid_orders(p, 1, "HTTP303")
    harness.fakes.configure({"sms": {"redirect_next": 1}})
    report = await harness.batches(p).handle([source(event(order, "ORDER_CANCEL"))])
    [letter] = report.dead_letters
    assert letter.reason == reason and "303" in letter.message and letter.retriable is lookup
    assert len(harness.fakes.ledger.sms[order]) == 1                   # accepted once, never sent again



@pytest.mark.parametrize("lookup", [False, True], ids=["no_lookup", "lookup"])
@pytest.mark.parametrize("copy", ["exact", "republished"])
async def test_a_copy_of_a_request_in_its_batch_ends_as_the_request_does(harness, lookup, copy):
    """A CANCEL and its copy (the same bytes, or a new event_id) in one batch; the gateway
    answers the CANCEL's SMS with a 503, so it may have been sent. The copy never ran on its
    own: it is dead-lettered with the CANCEL, not read past as a duplicate of something that
    did not end well."""
    p = await harness.processor(sms_lookup=lookup, settle=60.0)
    [order] = await paid_orders(p, 1, f"COPY{copy[0].upper()}{int(lookup)}")
    harness.fakes.configure({"sms": {"fail_next": 1, "fail_status": 503}})
    cancel = event(order, "ORDER_CANCEL")
    again = cancel if copy == "exact" else dict(cancel, event_id=f"{cancel['event_id']}-again")
    records = [source(cancel), source(again)]
    report = await harness.batches(p, deadline=2.0).handle(records)

    assert [(letter.record, letter.event_id) for letter in report.dead_letters] == [
        (records[0], cancel["event_id"]), (records[1], again["event_id"])], report
    assert "same request as" in report.dead_letters[1].message
    assert len(harness.fakes.ledger.sms[order]) <= 1                     # never sent twice
    assert "duplicate" not in report.outcomes

# -- 13. the ledger is per consumer group and per record -----------------------------------------

async def test_ledger_rows_are_per_group_and_survive_a_recreated_topic(harness):
    store = harness.store()
    topic = f"ledger-{order_no(prefix='L')}"[:60]

    def letter(offset: int, timestamp: int) -> DeadLetter:
        return DeadLetter(record=SourceRecord(topic, 0, offset, timestamp, b"k", b"v"), reason="not_json",
                          message="x", retriable=False, attempts=1, first_failure_at=datetime.now(UTC))

    async def record(group: str, *letters: DeadLetter):
        await store.in_transaction(lambda tx: tx.record_dead_letters(list(letters), group=group))

    await record("group-a", letter(7, 1000))
    await record("group-a", letter(7, 1000))          # a replay: nothing new
    await record("group-b", letter(7, 1000))          # a second group: its own row
    await record("group-a", letter(7, 2000))          # the topic created again: offset 7 is another record
    rows = harness.db.query("SELECT consumer_group, src_timestamp FROM t_compensation WHERE src_topic = %s "
                            "ORDER BY consumer_group, src_timestamp", topic)
    assert [(r["consumer_group"], r["src_timestamp"]) for r in rows] == [
        ("group-a", 1000), ("group-a", 2000), ("group-b", 1000)]


# -- 14. utf8mb4 on every connection ------------------------------------------------------------

async def test_a_connection_in_another_charset_is_refused(settings, scratch_db):
    engine = create_async_engine(scratch_db.url, connect_args={"charset": "latin1"})
    sa_event.listen(engine.sync_engine, "connect", lambda conn, record: check_charset(conn))
    with pytest.raises(WrongCharset, match="latin1"):
        async with engine.connect():
            pass
    await engine.dispose()


async def test_the_engine_pins_utf8mb4_and_four_byte_characters_survive(harness):
    store = harness.store()
    async with store.engine.connect() as conn:
        found = (await conn.exec_driver_sql("SELECT @@character_set_client, @@character_set_connection, "
                                            "@@character_set_results")).one()
    assert tuple(found) == ("utf8mb4",) * 3
    p = await harness.processor(store=store)
    order = order_no(prefix="EMOJI")
    [created] = await p.run([ev(order, "ORDER_CREATED",
                                data={"amount_cents": 1, "phone": "1", "address": "🚚 上海 Straße"})])
    assert created.outcome == "applied" and harness.order(order)["address"] == "🚚 上海 Straße"



async def test_the_pin_wins_over_a_url_that_asks_for_another_charset(settings, scratch_db):
    from app.adapters.mysql.engine import create_engine
    engine = create_engine(settings, url=scratch_db.url + "?charset=latin1")   # the settings would refuse it
    async with engine.connect() as conn:
        found = (await conn.exec_driver_sql("SELECT @@character_set_client")).scalar()
    await engine.dispose()
    assert found == "utf8mb4"
