"""The express courier (a provider that refuses a repeated reference, signs every request and
answers in an envelope) through the pipeline, against its fake over real HTTP: the fake checks
the signature on its own."""

from __future__ import annotations

import aiohttp
import pytest
from pydantic import SecretStr

from app.adapters.effects.express import HEADERS, ExpressClient
from app.adapters.effects.signing import CredentialsRefused, HmacSigner
from app.pipeline.errors import EffectRejected, EffectUnavailable
from app.pipeline.states import OrderStatus
from demo.fakes.express import KEY_ID, SECRET
from harness.pipeline import ev, paid_orders

EXPRESS = {"effects__waybill__provider": "express"}


def _waybill(harness, order):
    [row] = harness.idem(f"{order}:ORDER_CONFIRM:issue_waybill")
    receipts = harness.db.query("SELECT * FROM t_waybill_receipt WHERE order_no = %s", order)
    return row, receipts


async def test_a_signed_call_issues_one_waybill_with_its_receipt(harness):
    p = await harness.processor(providers=EXPRESS)
    [order] = await paid_orders(p, 1, "EXS")
    [result] = await p.run([ev(order, "ORDER_CONFIRM")])
    assert result.outcome == "applied"
    row, [receipt] = _waybill(harness, order)
    assert (row["status"], row["outcome"]) == (2, "waybill_issued")
    assert harness.fakes.ledger.waybills[order] == [receipt["waybill_no"]]
    [call] = [c for c in harness.fakes.ledger.calls if c["service"] == "express"]
    assert call["key"] == row["idem_token"] == receipt["idem_token"]       # the reference is the step's token
    assert harness.fakes.ledger.refused_signatures == 0
    assert harness.order(order)["status"] == OrderStatus.CONFIRMED


async def test_a_call_whose_answer_was_lost_settles_with_the_first_waybill(harness):
    """The courier issued the waybill and the connection dropped before its answer: the retry is
    refused as a duplicate, and the client looks the first waybill up and takes it as the receipt."""
    p = await harness.processor(providers=EXPRESS)
    [order] = await paid_orders(p, 1, "EXR")
    harness.fakes.configure({"express": {"reset_next": 1}})
    [first] = await p.run([ev(order, "ORDER_CONFIRM")])
    assert isinstance(first.error, EffectUnavailable)
    [issued] = harness.fakes.ledger.waybills[order]
    [second] = await p.run([ev(order, "ORDER_CONFIRM")])
    assert second.outcome == "applied"
    row, [receipt] = _waybill(harness, order)
    assert receipt["waybill_no"] == issued and harness.fakes.ledger.waybills[order] == [issued]
    services = [c["service"] for c in harness.fakes.ledger.calls if c.get("key") == row["idem_token"]]
    assert services == ["express", "express", "express_lookup"]


async def test_a_duplicate_whose_lookup_fails_is_retried_and_settles_once(harness):
    p = await harness.processor(providers=EXPRESS)
    [order] = await paid_orders(p, 1, "EXN")
    harness.fakes.configure({"express": {"reset_next": 1, "lookup_fail_next": 1}})
    await p.run([ev(order, "ORDER_CONFIRM")])
    [result] = await p.run([ev(order, "ORDER_CONFIRM")])            # a duplicate; its lookup answers 503
    assert isinstance(result.error, EffectUnavailable) and ": lookup: answered 503" in str(result.error)
    assert _waybill(harness, order)[0]["status"] == 1          # still pending: the next retry asks again
    [result] = await p.run([ev(order, "ORDER_CONFIRM")])
    assert result.outcome == "applied"
    [issued] = harness.fakes.ledger.waybills[order]
    assert _waybill(harness, order)[1][0]["waybill_no"] == issued


async def test_a_business_refusal_in_the_envelope_fails_the_record_for_a_person(harness):
    p = await harness.processor(providers=EXPRESS)
    [order] = await paid_orders(p, 1, "EXB")
    harness.fakes.configure({"express": {"reject_orders": [order]}})
    [result] = await p.run([ev(order, "ORDER_CONFIRM")])
    assert isinstance(result.error, EffectRejected)
    assert harness.fakes.ledger.waybills.get(order) is None


async def test_a_wrong_secret_is_refused_at_start_up_and_never_retried(harness):
    async with aiohttp.ClientSession() as session:
        good = ExpressClient(session, base_url=harness.base_url, timeout_seconds=2.0,
                             signer=HmacSigner(KEY_ID, SecretStr(SECRET), **_headers()))
        await good.check_credentials()                       # accepted: raises nothing
        wrong = ExpressClient(session, base_url=harness.base_url, timeout_seconds=2.0,
                              signer=HmacSigner(KEY_ID, SecretStr("not-the-secret"), **_headers()))
        with pytest.raises(CredentialsRefused, match="refused this deployment's signature.*EFFECTS__WAYBILL__SECRET"):
            await wrong.check_credentials()
    assert harness.fakes.ledger.refused_signatures == 1
    # A secret changed under a running worker: its calls fail for a person, with what to check.
    p = await harness.processor(providers={**EXPRESS, "effects__waybill__secret": "rotated-away"})
    [order] = await paid_orders(p, 1, "EXW")
    [result] = await p.run([ev(order, "ORDER_CONFIRM")])
    assert isinstance(result.error, EffectRejected) and "EFFECTS__WAYBILL__SECRET" in str(result.error)
    assert "rotated-away" not in str(result.error)
    assert _waybill(harness, order)[0]["status"] == 3          # failed for good: no loop of retries


async def test_a_replayed_signature_is_refused_by_the_fake(harness):
    """The fake's own check can fail: the same nonce twice is refused (what a replayed request meets)."""
    signer = HmacSigner(KEY_ID, SecretStr(SECRET), **_headers())
    headers = signer.headers("GET", "/express/v1/orders/x", b"")
    async with aiohttp.ClientSession() as session:
        statuses = []
        for _ in range(2):
            async with session.get(f"{harness.base_url}/express/v1/orders/x", headers=headers) as resp:
                statuses.append((resp.status, (await resp.json())["code"]))
    assert statuses == [(200, 1004), (401, 1001)]


def _headers():
    return HEADERS
