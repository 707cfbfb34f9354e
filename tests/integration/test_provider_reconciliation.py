"""The providers' reconciliation with real services: a real worker and the fake logistics API in a
process of its own, over real HTTP, and real MariaDB. A provider that ignored the idempotency key
issued two waybills for one order when a reset made the worker call twice: found as a duplicate
naming the order, and its extra cancelled at the provider once through the web view, however often
people click. A receipt lost (deleted by hand, or never written: a crash between the call and T3)
is an orphan, adopted back once; a receipt of a waybill the provider never issued is missing."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest

from app.adapters.effects.waybill import WaybillListing
from app.pipeline.errors import EffectRejected
from app.pipeline.tokens import StepTokens
from app.reconcile.cases import cancel_key
from app.reconcile.providers import ProviderFinding
from harness import sql_modes
from harness.bulk_workers import TOKEN, call
from harness.events import order_no
from harness.fakes import FakesProcess, fakes_in_process
from harness.provider_cases import case_of, confirmed, issued, reconciled, runtime
from harness.services import TEST_TOKEN_SECRET, worker_metric

# Every database test here runs under the server's sql_mode and under MySQL 8's.
settings, scratch_db = sql_modes.each_sql_mode()

WORKER = {"WEB_TOKEN": TOKEN, "RETRY_BACKOFF_MS": "20,20,20", "BATCH_WITHIN_SECONDS": "0.3"}


@pytest.fixture
def fakes():
    fakes = FakesProcess({"waybill": {"ignore_idempotency_key": True}})
    yield fakes
    fakes.stop()


def both_at_once(worker, path: str, body: dict) -> list[tuple[int, dict]]:
    """The same POST from two people at the same moment."""
    start, answers = threading.Barrier(2), []

    def click() -> None:
        start.wait()
        answers.append(call(worker, "POST", path, body))

    threads = [threading.Thread(target=click) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return sorted(answers, key=lambda a: a[0])


def test_a_waybill_issued_twice_for_one_key_is_found_and_its_extra_cancelled_once(settings, topics, spawn_worker,
                                                                                  scratch_db, fakes):
    since = datetime.now(UTC)          # the scratch database holds other tests' receipts from before
    pair = topics(partitions=1)
    worker = spawn_worker(pair, **fakes.env(), **WORKER)
    twice, raced = order_no(prefix="DUPA"), order_no(prefix="DUPB")
    keepers = {}
    for order in (twice, raced):       # one at a time: each order's first call meets the reset
        fakes.configure({"waybill": {"reset_next": 1}})
        keepers[order] = confirmed(settings, scratch_db, pair, worker, order)
        waybills = issued(fakes, order)
        assert len(waybills) == 2 and len({w["idempotency_key"] for w in waybills}) == 1, waybills
    extras = {order: next(w["waybill_no"] for w in issued(fakes, order) if w["waybill_no"] != keepers[order])
              for order in keepers}

    async def find():
        async with runtime(settings, scratch_db, pair, fakes) as rt:
            first = await reconciled(rt, since)
            return first, await reconciled(rt, since)
    (section, filed), (_, again) = asyncio.run(find())
    waybill = section.effects["waybill"]
    assert (waybill["provider"], waybill["duplicates"], waybill["orphans"], waybill["missing"]) == ("waybill", 2, 0, 0)
    assert section.effects["sms"]["not_listable"] is True              # reported, not skipped in silence
    found = {f.order_no: f for f in section.findings}
    assert set(found) == {twice, raced}
    assert (found[twice].kind, found[twice].keeper, found[twice].extras) == ("duplicate", keepers[twice],
                                                                             (extras[twice],))
    assert filed == {"opened": 2, "seen_again": 0, "closed_before": 0}
    assert again == {"opened": 0, "seen_again": 2, "closed_before": 0}         # one case, however many runs

    case = case_of(scratch_db, pair.group, "duplicate", twice)
    path = f"/reconcile/cases/{case['id']}/compensate"
    status, listed = call(worker, "GET", "/reconcile/cases/")
    assert status == 200 and listed["open"]["duplicate"] == 2
    assert worker_metric(worker, "order_reconcile_cases_open", '{kind="duplicate"}') == 2
    assert {c["reference"] for c in listed["items"] if c["status"] == "open"} == set(extras.values())
    # Not confirmed, or confirmed for the keeper: refused, and nothing asked of the provider.
    assert call(worker, "POST", path, {"actor": "alice"})[0] == 400
    assert call(worker, "POST", path, {"actor": "alice", "confirm": keepers[twice]})[0] == 400
    assert fakes.ledger()["cancel_calls"] == []

    # Clicked twice: cancelled once, and the second click is told who closed the case.
    status, done = call(worker, "POST", path, {"actor": "alice", "note": "duplicate", "confirm": extras[twice]})
    assert status == 200 and done["case"]["status"] == "compensated" and done["case"]["closed_by"] == "web:alice"
    status, again = call(worker, "POST", path, {"actor": "bob", "confirm": extras[twice]})
    assert status == 409 and again["closed"]["closed_by"] == "web:alice" and again["closed"]["status"] == "compensated"
    key = cancel_key(StepTokens(TEST_TOKEN_SECRET.encode()), pair.group, case["id"], extras[twice])
    book = fakes.ledger()
    assert [(c["waybill_no"], c["key"]) for c in book["cancels"]] == [(extras[twice], key)]
    assert [c["key"] for c in book["cancel_calls"]] == [key]
    assert {w["waybill_no"]: w["status"] for w in issued(fakes, twice)} == {keepers[twice]: "issued",
                                                                             extras[twice]: "cancelled"}

    # Two people at once: one closes the case, the other is told; the provider cancels it once, under one key.
    other = case_of(scratch_db, pair.group, "duplicate", raced)
    answers = both_at_once(worker, f"/reconcile/cases/{other['id']}/compensate",
                           {"actor": "carol", "confirm": extras[raced]})
    assert [a[0] for a in answers] == [200, 409], answers
    book = fakes.ledger()
    assert [c["waybill_no"] for c in book["cancels"]] == [extras[twice], extras[raced]]
    assert {c["key"] for c in book["cancel_calls"] if c["waybill_no"] == extras[raced]} \
        == {cancel_key(StepTokens(TEST_TOKEN_SECRET.encode()), pair.group, other["id"], extras[raced])}
    assert {c["service"] for c in book["calls"]} == {"waybill"}      # the effects' calls, and nothing else
    assert worker_metric(worker, "order_reconcile_cases_open", '{kind="duplicate"}') == 0
    assert worker_metric(worker, "order_reconcile_case_actions_total", '{action="compensate"}') == 2
    history = scratch_db.query("SELECT actor, action, from_status, to_status FROM t_reconcile_case_audit "
                               "WHERE case_id = %s ORDER BY id", case["id"])
    assert history == [{"actor": "reconcile", "action": "opened", "from_status": None, "to_status": 1},
                       {"actor": "web:alice", "action": "compensate", "from_status": 1, "to_status": 3}]

    # The extras cancelled, the next run finds nothing and the cases stay closed.
    async def after():
        async with runtime(settings, scratch_db, pair, fakes) as rt:
            return await reconciled(rt, since)
    section, filed = asyncio.run(after())
    assert section.findings == [] and filed == {"opened": 0, "seen_again": 0, "closed_before": 0}
    assert worker.alive


def test_a_receipt_lost_is_adopted_back_once_and_one_the_provider_never_issued_is_missing(settings, topics,
                                                                                          spawn_worker, scratch_db,
                                                                                          fakes):
    since = datetime.now(UTC)          # the scratch database holds other tests' receipts from before
    pair = topics(partitions=1)
    worker = spawn_worker(pair, **fakes.env(), **WORKER)
    deleted, crashed, made_up = order_no(prefix="ORPHA"), order_no(prefix="ORPHB"), order_no(prefix="MISS")
    waybills = {order: confirmed(settings, scratch_db, pair, worker, order) for order in (deleted, crashed)}
    crashed_key = f"{crashed}:ORDER_CONFIRM:issue_waybill"
    step_before = scratch_db.query("SELECT idem_token, attempt FROM t_idem WHERE biz_key = %s", crashed_key)[0]
    # A receipt deleted by hand; and what a crash between the call and T3 leaves: no receipt, the step
    # pending, its lease run out.
    scratch_db.query("DELETE FROM t_waybill_receipt WHERE order_no IN (%s, %s)", deleted, crashed)
    scratch_db.query("UPDATE t_idem SET status = 1, outcome = NULL, lease_until = NOW(3) - INTERVAL 1 MINUTE "
                     "WHERE biz_key = %s", crashed_key)
    scratch_db.query("INSERT INTO t_waybill_receipt (order_no, waybill_no, idem_token, biz_key, attempt, gmt_create) "
                     "VALUES (%s, 'WB-NEVER-ISSUED', 'tok-by-hand', %s, 1, NOW(3))", made_up,
                     f"{made_up}:ORDER_CONFIRM:issue_waybill")

    async def find():
        async with runtime(settings, scratch_db, pair, fakes) as rt:
            return await reconciled(rt, since)
    section, filed = asyncio.run(find())
    found = {(f.kind, f.order_no): f for f in section.findings}
    assert set(found) == {("orphan", deleted), ("orphan", crashed), ("missing", made_up)}, section.as_dict()
    assert found[("orphan", deleted)].keeper == waybills[deleted] and found[("orphan", deleted)].evidence["adoptable"]
    assert found[("missing", made_up)].keeper == "WB-NEVER-ISSUED"
    assert filed["opened"] == 3

    # Adopted: the receipt written again with the step's token, the crashed step done; once.
    for order in (deleted, crashed):
        case = case_of(scratch_db, pair.group, "orphan", order)
        path = f"/reconcile/cases/{case['id']}/adopt"
        assert call(worker, "POST", path, {"actor": "dave", "confirm": "WB-SOMETHING-ELSE"})[0] == 400
        if order == crashed:
            answers = both_at_once(worker, path, {"actor": "dave", "confirm": waybills[order]})
        else:
            answers = [call(worker, "POST", path, {"actor": "dave", "confirm": waybills[order]}),
                       call(worker, "POST", path, {"actor": "erin", "confirm": waybills[order]})]
        assert [a[0] for a in answers] == [200, 409], answers
        assert answers[1][1]["closed"]["status"] == "adopted" and answers[1][1]["closed"]["closed_by"] == "web:dave"
        [receipt] = scratch_db.query("SELECT waybill_no, idem_token FROM t_waybill_receipt WHERE order_no = %s", order)
        [step] = scratch_db.query("SELECT status, outcome, idem_token, attempt FROM t_idem WHERE biz_key = %s",
                                  f"{order}:ORDER_CONFIRM:issue_waybill")
        assert receipt == {"waybill_no": waybills[order], "idem_token": step["idem_token"]}
        assert (step["status"], step["outcome"]) == (2, "waybill_issued")
    assert step["attempt"] == step_before["attempt"] and step["idem_token"] == step_before["idem_token"]

    # The missing one: dismissed with a note (none: refused), and it stays dismissed when found again.
    case = case_of(scratch_db, pair.group, "missing", made_up)
    path = f"/reconcile/cases/{case['id']}/dismiss"
    assert call(worker, "POST", path, {"actor": "erin", "confirm": "WB-NEVER-ISSUED"})[0] == 400
    assert call(worker, "POST", f"/reconcile/cases/{case['id']}/adopt",
                {"actor": "erin", "confirm": "WB-NEVER-ISSUED"})[0] == 409          # adopt is for an orphan
    status, done = call(worker, "POST", path, {"actor": "erin", "note": "a test row", "confirm": "WB-NEVER-ISSUED"})
    assert status == 200 and done["case"]["status"] == "dismissed" and done["case"]["note"] == "a test row"

    section, filed = asyncio.run(find())
    assert [(f.kind, f.order_no) for f in section.findings] == [("missing", made_up)]
    assert filed == {"opened": 0, "seen_again": 0, "closed_before": 1}
    assert case_of(scratch_db, pair.group, "missing", made_up)["status"] == 4

    # A duplicate of waybills the provider never issued (filed by hand): the provider is read again before
    # any cancel, lists neither, and the compensation is refused with the reason, the case open, audited.
    async def file_by_hand():
        async with runtime(settings, scratch_db, pair, fakes) as rt:
            await rt.adapters.reconcile_cases.file([ProviderFinding("duplicate", "waybill", "waybill", made_up, None,
                                                                    "WB-NEVER-ISSUED", ("WB-GONE",), {})],
                                                   run_id=None)
    asyncio.run(file_by_hand())
    case = case_of(scratch_db, pair.group, "duplicate", made_up)
    status, failed = call(worker, "POST", f"/reconcile/cases/{case['id']}/compensate",
                          {"actor": "erin", "confirm": "WB-GONE"})
    assert status == 409 and "no longer lists our receipt's WB-NEVER-ISSUED" in failed["error"], failed
    assert failed["case"]["evidence"]["rechecked"]["waybills"] == []
    assert case_of(scratch_db, pair.group, "duplicate", made_up)["status"] == 1
    assert fakes.ledger()["cancel_calls"] == []
    [attempt] = scratch_db.query("SELECT actor, to_status, detail FROM t_reconcile_case_audit WHERE case_id = %s "
                                 "AND action = 'compensate'", case["id"])
    assert attempt["actor"] == "web:erin" and attempt["to_status"] is None and "refused" in attempt["detail"]

    # The list: the open case first, then the closed ones, newest first; or one status.
    status, listed = call(worker, "GET", "/reconcile/cases/")
    assert status == 200 and [(c["status"], c["order_no"]) for c in listed["items"]][:1] == [("open", made_up)]
    closed = [c["id"] for c in listed["items"][1:]]
    assert len(closed) == 3 and closed == sorted(closed, reverse=True)
    status, adopted = call(worker, "GET", "/reconcile/cases/?status=adopted")
    assert {c["order_no"] for c in adopted["items"]} == {deleted, crashed}
    assert worker.alive


async def test_the_fake_logistics_api_lists_a_page_at_a_time_and_by_order_and_cancels_once():
    async with fakes_in_process() as (fakes, url), aiohttp.ClientSession() as session:
        listing = WaybillListing(session, base_url=url, timeout_seconds=5)
        for i in range(5):
            async with session.post(f"{url}/v1/waybills", json={"order_no": f"ORD-20261201-L{i}", "address": "x"},
                                    headers={"Idempotency-Key": f"key-{i}"}) as resp:
                assert resp.status == 201
        now = datetime.now(UTC)
        pages = [page async for page in listing.issued(now - timedelta(minutes=1), now + timedelta(minutes=1),
                                                       page_size=2)]
        assert [len(page) for page in pages] == [2, 2, 1]
        numbers = [w.reference for page in pages for w in page]
        assert numbers == sorted(numbers) and [w.key for page in pages for w in page] == [f"key-{i}" for i in range(5)]
        assert [page async for page in listing.issued(now + timedelta(minutes=1), now + timedelta(minutes=2),
                                                      page_size=2)] == []

        assert [w.reference for w in await listing.of_order("ORD-20261201-L3")] == [numbers[3]]   # whenever issued
        assert await listing.of_order("ORD-20261201-NONE") == []

        first = await listing.cancel(numbers[0], "cancel-1")
        again = await listing.cancel(numbers[0], "cancel-2")           # another key: the first cancel's answer
        assert first == again and first.key == "cancel-1" and first.cancelled_at is not None
        assert [(c["waybill_no"], c["key"]) for c in fakes.ledger.cancels] == [(numbers[0], "cancel-1")]
        [listed] = [w for page in [page async for page in listing.issued(now - timedelta(minutes=1),
                                                                           now + timedelta(minutes=1), page_size=10)]
                    for w in page if w.reference == numbers[0]]
        assert listed.status == "cancelled" and not listed.live
        with pytest.raises(EffectRejected, match="404"):
            await listing.cancel("WB-NONE", "cancel-3")
