"""A provider that forgets its idempotency keys after a while, against real workers, Kafka and
MariaDB, with the fakes over HTTP playing it (``forget_keys_after_seconds``: a key older than that
is new to them again, their records stay).

An order's waybill call reaches the provider, which issues the waybill, but the worker never hears
of it: the event is dead-lettered. Redriven inside the provider's key horizon, the call replays the
key and settles with that waybill. Redriven after it, a call would issue a second one: the logistics
API (no lookup by key) leaves the step to a person, through the compensator's redrive, a person's
retry and a bulk retry alike, until the person adopts the waybill the provider issued (a reconcile
run finds it); the express courier is asked with its lookup and the step completes from it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from harness.bulk_workers import TOKEN, call
from harness.events import event, order_no, record
from harness.fakes import FakesProcess
from harness.services import ROOT, produce, wait_for

FAUST = Path(sys.executable).parent / "faust"
LIFECYCLE = ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM")
# The worker's first redrive of a dead letter comes DLQ_RETRY_AFTER_SECONDS after it, past the
# provider's horizon (the deployment's setting and the fake's agree); a person's retry comes at once.
HORIZON = 12
FAST = {"WEB_TOKEN": TOKEN, "RETRY_BACKOFF_MS": "20,20,20", "BATCH_WITHIN_SECONDS": "0.3",
        "DLQ_RETRY_AFTER_SECONDS": str(HORIZON + 4), "COMPENSATION_BACKOFF_SECONDS": "1",
        "COMPENSATION_TIMER_SECONDS": "0.5", "COMPENSATOR_WITHIN_SECONDS": "0.3", "BULK_TIMER_SECONDS": "0.5",
        "EFFECTS__WAYBILL__KEYS_KEPT_FOR_SECONDS": str(HORIZON), "EFFECTS__WAYBILL__LOOKUP_SETTLE_SECONDS": "1"}


def step_key(order: str) -> str:
    return f"{order}:ORDER_CONFIRM:issue_waybill"


def letter(db, order: str) -> dict | None:
    rows = db.query("SELECT id, status, reason, message FROM t_compensation WHERE order_no = %s", order)
    return rows[0] if rows else None


def waybill_calls(book: dict, service: str, order: str) -> list[dict]:
    return [c for c in book["calls"] if c["service"] == service and (c.get("body") or {}).get("order_no") == order]


def reconcile(worker) -> subprocess.CompletedProcess:
    """What the dead letter's message tells the person to run."""
    return subprocess.run([str(FAUST), "-A", "app", "reconcile", "--last", "1h"], cwd=ROOT, capture_output=True,
                          text=True, env=worker.env, timeout=180)


def test_a_waybill_redriven_past_its_key_horizon_is_left_to_a_person_and_never_issued_twice(settings, topics,
                                                                                            spawn_worker, own_db):
    fakes = FakesProcess({"waybill": {"forget_keys_after_seconds": HORIZON}})
    try:
        pair = topics(partitions=1)
        worker = spawn_worker(pair, **fakes.env(), **FAST, MYSQL_URL=own_db.url)
        inside, past = order_no(prefix="KHIN"), order_no(prefix="KHPAST")
        # Every call issues (or replays) the waybill, then answers 303: the worker never learns of it.
        fakes.configure({"waybill": {"redirect_next": 1000}})
        asyncio.run(produce(settings, pair.events, [record(event(o, t)) for o in (inside, past) for t in LIFECYCLE]))
        wait_for(lambda: all(letter(own_db, o) for o in (inside, past)), timeout=90,
                 what="both CONFIRMs dead-lettered", workers=[worker])
        fakes.configure({"waybill": {"redirect_next": 0}})          # the API answers again
        [first_inside] = fakes.ledger()["waybills"][inside]
        [first_past] = fakes.ledger()["waybills"][past]

        # Inside the horizon: a person's retry replays the key, and the API answers with the first waybill.
        status, answer = call(worker, "POST", f"/compensation/{letter(own_db, inside)['id']}/retry", {"actor": "ann"})
        assert status == 200 and answer["status"] == "compensated", answer
        assert fakes.ledger()["waybills"][inside] == [first_inside]
        assert own_db.scalar("SELECT waybill_no FROM t_waybill_receipt WHERE order_no = %s", inside) == first_inside

        # Past it: the compensator's redrive does not call; the dead letter waits for a person with the facts.
        # Settled: neither open (1) nor retrying (2), the redrive's own state while it runs.
        settled = wait_for(lambda: (row := letter(own_db, past)) and row["status"] not in (1, 2) and row,
                           timeout=HORIZON + 60, what="the CONFIRM past the horizon redriven", workers=[worker])
        book = fakes.ledger()
        assert book["waybills"][past] == [first_past], book["waybills"][past]        # no second waybill
        [step] = own_db.query("SELECT status, idem_token, attempt FROM t_idem WHERE biz_key = %s", step_key(past))
        assert (settled["status"], settled["reason"]) == (4, "key_horizon_passed"), settled
        for fact in (step["idem_token"], "EFFECTS__WAYBILL__KEYS_KEPT_FOR_SECONDS", "reconcile --last"):
            assert fact in settled["message"], (fact, settled["message"])
        assert step["status"] == 1                                                  # pending: adoptable
        taken = book["keys"]["waybill"][step["idem_token"]]
        calls = waybill_calls(book, "waybill", past)
        assert calls and all(c["at"] <= taken + HORIZON for c in calls), calls     # no call past the horizon

        # A person's retry and a bulk retry go through the same decision: nothing called, still a person's.
        status, answer = call(worker, "POST", f"/compensation/{settled['id']}/retry", {"actor": "bob"})
        assert status == 200 and answer["status"] == "manual" and "KEYS_KEPT_FOR_SECONDS" in answer["message"], answer
        selection = {"action": "retry", "filter": {"status": "manual", "reason": "key_horizon_passed"}}
        status, dry = call(worker, "POST", "/bulk/dry-run", selection)
        assert status == 200 and dry["count"] == 1, dry
        status, job = call(worker, "POST", "/bulk/", {**selection, "expected_count": 1, "actor": "bob"})
        assert status == 201, job
        wait_for(lambda: call(worker, "GET", f"/bulk/{job['id']}")[1]["status"] == "done", timeout=60,
                 what="the bulk retry done", workers=[worker])
        assert call(worker, "GET", f"/bulk/{job['id']}")[1]["failed"] == 1
        assert len(waybill_calls(fakes.ledger(), "waybill", past)) == len(calls)
        assert letter(own_db, past)["status"] == 4 and fakes.ledger()["waybills"][past] == [first_past]

        # The person's way out: a reconcile finds the waybill issued under the step's token as an orphan;
        # adopted, the step is done, and a retry of the dead letter settles it.
        ran = reconcile(worker)
        assert ran.returncode in (0, 1), ran.stderr[-3000:]
        [case] = own_db.query("SELECT id, reference FROM t_reconcile_case WHERE kind = 'orphan' AND order_no = %s", past)
        assert case["reference"] == first_past
        status, adopted = call(worker, "POST", f"/reconcile/cases/{case['id']}/adopt",
                               {"actor": "bob", "confirm": first_past})
        assert status == 200, adopted
        status, answer = call(worker, "POST", f"/compensation/{settled['id']}/retry", {"actor": "bob"})
        assert status == 200 and answer["status"] == "compensated", answer
        assert own_db.scalar("SELECT waybill_no FROM t_waybill_receipt WHERE order_no = %s", past) == first_past
        assert fakes.ledger()["waybills"][past] == [first_past]
        assert worker.alive
    finally:
        fakes.stop()


def test_an_express_waybill_redriven_past_its_key_horizon_completes_from_the_couriers_lookup(settings, topics,
                                                                                           spawn_worker, scratch_db):
    fakes = FakesProcess({"express": {"forget_keys_after_seconds": HORIZON}})
    try:
        pair = topics(partitions=1)
        worker = spawn_worker(pair, **fakes.env(), **FAST, EFFECTS__WAYBILL__PROVIDER="express")
        order = order_no(prefix="KHEX")
        # The courier issues the waybill and the connection drops; its lookup fails until the dead letter.
        fakes.configure({"express": {"reset_next": 1, "lookup_fail_next": 1000}})
        asyncio.run(produce(settings, pair.events, [record(event(order, t)) for t in LIFECYCLE]))
        wait_for(lambda: letter(scratch_db, order), timeout=90, what="the CONFIRM dead-lettered", workers=[worker])
        fakes.configure({"express": {"lookup_fail_next": 0}})
        [issued] = fakes.ledger()["waybills"][order]

        settled = wait_for(lambda: (row := letter(scratch_db, order)) and row["status"] not in (1, 2) and row,
                           timeout=HORIZON + 60, what="the CONFIRM past the horizon redriven", workers=[worker])
        assert settled["status"] == 3, settled                                       # compensated
        book = fakes.ledger()
        assert book["waybills"][order] == [issued], book["waybills"][order]        # no second waybill
        assert scratch_db.scalar("SELECT waybill_no FROM t_waybill_receipt WHERE order_no = %s", order) == issued
        [step] = scratch_db.query("SELECT idem_token FROM t_idem WHERE biz_key = %s", step_key(order))
        taken = book["keys"]["express"][step["idem_token"]]
        late = [c["service"] for c in book["calls"] if c.get("key") == step["idem_token"] and c["at"] > taken + HORIZON]
        assert late == ["express_lookup"], late                                     # asked, never sent again
        assert worker.alive
    finally:
        fakes.stop()
