"""A person's compensation of a duplicate waybill, against the fake logistics API in a process of its own
over real HTTP, a real worker and real MariaDB: a waybill issued under a key that is none of ours
(customer service's re-shipment) is reported and never cancelled; a case filed while both waybills were
live is refused once the courier has cancelled our receipt's, the extra left live; a cancel answered for
another waybill is refused, the case left open; each refusal audited under the person whose token acted
(``WEB_TOKENS_FILE``), whatever the body says."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from datetime import UTC, datetime

import pytest

from app.adapters.web_tokens import digest
from harness import sql_modes
from harness.events import order_no
from harness.fakes import FakesProcess
from harness.provider_cases import case_of, confirmed, issued, reconciled, runtime

settings, scratch_db = sql_modes.each_sql_mode()

WORKER = {"RETRY_BACKOFF_MS": "20,20,20", "BATCH_WITHIN_SECONDS": "0.3"}
PEOPLE = {"alice": "alice-token-" + "a" * 40, "bob": "bob-token-" + "b" * 40}


@pytest.fixture
def tokens_file(tmp_path):
    path = tmp_path / "web-tokens"
    path.write_text("".join(f"{name} operator {digest(token.encode())}\n" for name, token in PEOPLE.items()))
    return path


def as_person(worker, name: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{worker.web_port}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {PEOPLE[name]}",
                                              "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def at_provider(fakes, path: str, key: str, body: dict | None = None) -> dict:
    """A call to the logistics API made by someone else than this deployment (customer service, a courier)."""
    request = urllib.request.Request(f"{fakes.url}{path}", method="POST", data=json.dumps(body or {}).encode(),
                                     headers={"Idempotency-Key": key, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def history(scratch_db, case_id: int) -> list[dict]:
    return scratch_db.query("SELECT actor, action, to_status, note, detail FROM t_reconcile_case_audit "
                            "WHERE case_id = %s ORDER BY id", case_id)


def test_a_waybill_issued_under_another_key_is_reported_and_never_cancelled(settings, topics, spawn_worker,
                                                                            scratch_db, tokens_file):
    fakes = FakesProcess()
    try:
        since = datetime.now(UTC)
        pair = topics(partitions=1)
        worker = spawn_worker(pair, **fakes.env(), **WORKER, WEB_TOKENS_FILE=str(tokens_file))
        order = order_no(prefix="FRGN")
        keeper = confirmed(settings, scratch_db, pair, worker, order)
        # Customer service re-ships the order through the same provider account, under its own key.
        reshipped = at_provider(fakes, "/v1/waybills", "customer-service-reship-1",
                                {"order_no": order, "address": "1 Test Road"})["waybill_no"]

        async def find():
            async with runtime(settings, scratch_db, pair, fakes) as rt:
                return await reconciled(rt, since)
        section, filed = asyncio.run(find())
        [finding] = [f for f in section.findings if f.order_no == order]
        assert (finding.kind, finding.keeper, finding.extras, finding.foreign) == ("duplicate", keeper, (),
                                                                                   (reshipped,))
        assert "never cancelled from here" in finding.evidence["foreign_are"] and filed["opened"] == 1
        case = case_of(scratch_db, pair.group, "duplicate", order)
        evidence = json.loads(case["evidence"])
        assert case["reference"] == reshipped and evidence["compensable"] is False
        assert "never cancelled from here" in evidence["why_not"]

        # A person asks all the same (an old case, a script): the provider is read again and it is refused.
        status, answer = as_person(worker, "alice", "POST", f"/reconcile/cases/{case['id']}/compensate",
                                   {"confirm": reshipped, "actor": "mallory"})
        assert status == 409 and "not ours to cancel" in answer["error"], answer
        assert fakes.ledger()["cancel_calls"] == []
        assert {w["waybill_no"]: w["status"] for w in issued(fakes, order)} == {keeper: "issued", reshipped: "issued"}
        rechecked = answer["case"]["evidence"]["rechecked"]
        assert {w["waybill_no"]: w["ours"] for w in rechecked["waybills"]} == {keeper: True, reshipped: False}
        [refusal] = [h for h in history(scratch_db, case["id"]) if h["action"] == "compensate"]
        assert refusal["actor"] == "web:alice" and refusal["to_status"] is None and "mallory" in refusal["note"]
        assert "not ours to cancel" in refusal["detail"]
        assert case_of(scratch_db, pair.group, "duplicate", order)["status"] == 1       # open: a person dismisses it
        assert worker.alive
    finally:
        fakes.stop()


def test_a_case_is_refused_once_its_keeper_is_cancelled_and_a_cancel_answered_for_another_waybill(
        settings, topics, spawn_worker, scratch_db, tokens_file):
    fakes = FakesProcess({"waybill": {"ignore_idempotency_key": True}})
    try:
        since = datetime.now(UTC)
        pair = topics(partitions=1)
        worker = spawn_worker(pair, **fakes.env(), **WORKER, WEB_TOKENS_FILE=str(tokens_file))
        orders = order_no(prefix="KEPT"), order_no(prefix="MISN")
        keepers, extras = {}, {}
        for order in orders:                  # a reset makes the worker call twice: two waybills, one key
            fakes.configure({"waybill": {"reset_next": 1}})
            keepers[order] = confirmed(settings, scratch_db, pair, worker, order)
            [extras[order]] = [w["waybill_no"] for w in issued(fakes, order) if w["waybill_no"] != keepers[order]]

        async def find():
            async with runtime(settings, scratch_db, pair, fakes) as rt:
                return await reconciled(rt, since)
        _, filed = asyncio.run(find())
        assert filed["opened"] == 2
        kept, misnamed = (case_of(scratch_db, pair.group, "duplicate", order) for order in orders)
        assert json.loads(kept["evidence"])["compensable"] is True     # both live when the case was filed

        # The courier cancels our receipt's waybill; then a person compensates the case filed before.
        at_provider(fakes, f"/v1/waybills/{keepers[orders[0]]}/cancel", "courier-cancel-1")
        status, answer = as_person(worker, "alice", "POST", f"/reconcile/cases/{kept['id']}/compensate",
                                   {"confirm": extras[orders[0]], "note": "provider ignored the key"})
        assert status == 409 and f"our receipt's {keepers[orders[0]]} is cancelled" in answer["error"], answer
        assert {w["waybill_no"]: w["status"] for w in issued(fakes, orders[0])} == {
            keepers[orders[0]]: "cancelled", extras[orders[0]]: "issued"}                 # the extra still live
        assert [c["waybill_no"] for c in fakes.ledger()["cancel_calls"]] == [keepers[orders[0]]]   # the courier's
        evidence = answer["case"]["evidence"]
        assert evidence["compensable"] is False and evidence["rechecked"]["by"] == "web:alice"
        [refusal] = [h for h in history(scratch_db, kept["id"]) if h["action"] == "compensate"]
        assert (refusal["actor"], refusal["to_status"], refusal["note"]) == ("web:alice", None,
                                                                             "provider ignored the key")

        # A provider that answers a cancel about another waybill: not taken as done, the case left open.
        fakes.configure({"waybill": {"cancel_answer_override": "WB-SOMEONE-ELSE"}})
        path = f"/reconcile/cases/{misnamed['id']}/compensate"
        status, answer = as_person(worker, "bob", "POST", path, {"confirm": extras[orders[1]]})
        assert status == 409 and f"cancel of {extras[orders[1]]} about WB-SOMEONE-ELSE" in answer["error"], answer
        assert case_of(scratch_db, pair.group, "duplicate", orders[1])["status"] == 1
        [wrong] = [h for h in history(scratch_db, misnamed["id"]) if h["action"] == "compensate"]
        assert wrong["actor"] == "web:bob" and wrong["to_status"] is None and "WB-SOMEONE-ELSE" in wrong["detail"]
        # Asked again: read again, the extra is cancelled already at the provider; nothing is cancelled twice.
        fakes.configure({"waybill": {"cancel_answer_override": None}})
        status, answer = as_person(worker, "bob", "POST", path, {"confirm": extras[orders[1]]})
        assert status == 409 and "cancelled at the provider already" in answer["error"], answer
        assert [c["waybill_no"] for c in fakes.ledger()["cancels"]] == [keepers[orders[0]], extras[orders[1]]]
        assert worker.alive
    finally:
        fakes.stop()
