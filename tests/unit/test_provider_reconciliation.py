"""The providers' reconciliation as pure logic (``app.reconcile.providers.compare``, ``app.reconcile.cases``):
what a provider's records and our receipts make a duplicate, an orphan or a missing waybill, which range
a finding belongs to, what is in flight, what may be adopted, which waybills are ours to cancel, and what
a person may do to a case (and, read again at that moment, whether a compensation may cancel)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from app.adapters.effects import express, sms, waybill
from app.adapters.effects.provider import Issued
from app.adapters.mysql.reconcile import HeldReceipt, StepState
from app.pipeline.tokens import StepTokens
from app.reconcile.cases import (
    CASE_ACTIONS,
    CASE_TRANSITIONS,
    DUPLICATE,
    KINDS,
    MISSING,
    ORPHAN,
    CaseStatus,
    adoption_refused,
    cancel_key,
    compensation_refused,
    refusal,
)
from app.reconcile.providers import ProviderFinding, Window, compare, our_tokens, read_listing, step_keys

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
WINDOW = Window(T0, T0 + timedelta(hours=1), timedelta(minutes=5))
ORDER = "ORD-20261201-A1"
TOKENS = StepTokens(b"this deployment's secret")


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def issued(number: str, minutes: float, *, order: str = ORDER, key: str = "tok-1", status: str = "issued") -> Issued:
    return Issued(number, order, key, at(minutes), status)


def step(*, status: int = 2, token: str = "tok-1", live: bool = False, order: str = ORDER) -> StepState:
    return StepState(f"{order}:ORDER_CONFIRM:issue_waybill", date(2026, 12, 1), "issue_waybill", status, token, 1,
                     "w1/main/x", at(0), live)


def receipt(number: str, minutes: float, *, order: str = ORDER, token: str = "tok-1") -> HeldReceipt:
    return HeldReceipt(order, number, token, f"{order}:ORDER_CONFIRM:issue_waybill", at(minutes),
                       step(order=order, token=token))


def findings(listed, held=(), steps=None, *, missing=True, window=WINDOW) -> list[ProviderFinding]:
    found, _ = compare("waybill", "waybill", window, listed, {r.order_no: r for r in held}, steps or {},
                       missing=missing, tokens=TOKENS)
    return found


def test_a_second_live_waybill_beside_our_receipts_is_a_duplicate_naming_the_order():
    [finding] = findings([issued("WB1", 10), issued("WB2", 10.1)], [receipt("WB2", 10.2)])
    assert (finding.kind, finding.order_no, finding.keeper, finding.extras) == (DUPLICATE, ORDER, "WB2", ("WB1",))
    assert finding.references == ("WB1",)                       # the case is about the extra, never the keeper
    assert finding.evidence["keys"] == ["tok-1"]                 # one key, two waybills: the provider ignored it


def test_a_waybill_under_a_key_not_ours_is_reported_beside_our_receipt_but_never_ours_to_cancel():
    """Customer service's re-shipment, or another deployment on the same account: the same order, another key."""
    [finding] = findings([issued("WB1", 10), issued("WB2", 10.1, key="customer-service-7"), issued("WB3", 11)],
                         [receipt("WB1", 10.2)])
    assert (finding.kind, finding.keeper, finding.extras, finding.foreign) == (DUPLICATE, "WB1", ("WB3",), ("WB2",))
    assert finding.references == ("WB3", "WB2")                   # a case each: one to cancel, one reported
    assert finding.case_evidence("WB3")["compensable"] is True
    foreign = finding.case_evidence("WB2")
    assert foreign["compensable"] is False and "never cancelled from here" in foreign["why_not"]
    assert [w["ours"] for w in finding.evidence["waybills"]] == [True, False, True]
    [only] = findings([issued("WB1", 10), issued("WB2", 10.1, key="customer-service-7")], [receipt("WB1", 10.2)])
    assert (only.extras, only.foreign) == ((), ("WB2",))


def test_our_tokens_for_an_order_are_its_step_keys_tokens_and_those_our_rows_hold():
    derived = TOKENS(f"{ORDER}:ORDER_CONFIRM:issue_waybill")
    assert our_tokens(TOKENS, "waybill", ORDER) == {derived}
    assert our_tokens(TOKENS, "waybill", ORDER, "tok-old-secret", None) == {derived, "tok-old-secret"}
    assert derived not in our_tokens(TOKENS, "waybill", "ORD-20261201-B2")     # another order's are not
    # An extra under the step key's token is ours though no row holds that token (a row claimed before
    # the secret changed keeps its old one).
    [finding] = findings([issued("WB1", 10), issued("WB2", 11, key=derived)], [receipt("WB1", 10.2)])
    assert finding.extras == ("WB2",) and finding.foreign == ()


def test_with_no_receipt_the_keeper_to_adopt_is_the_earliest_of_ours():
    found = findings([issued("WB1", 10, key="customer-service-7"), issued("WB2", 11)], steps={ORDER: step()})
    assert [(f.kind, f.keeper, f.extras, f.foreign) for f in found] == [
        (ORPHAN, "WB2", (), ()), (DUPLICATE, "WB2", (), ("WB1",))]
    assert found[0].evidence["adoptable"] is True


@pytest.mark.parametrize("listed, why", [
    ([issued("WB1", 10), issued("WB2", 11)], None),
    ([issued("WB1", 10, status="cancelled"), issued("WB2", 11)], "WB1 is cancelled at the provider now"),
    ([issued("WB2", 11)], "no longer lists our receipt's WB1"),
    ([issued("WB1", 10), issued("WB2", 11, status="cancelled")], "WB2 is cancelled at the provider already"),
    ([issued("WB1", 10)], "does not list WB2"),
    ([issued("WB1", 10), issued("WB2", 11, key="customer-service-7")], "not ours to cancel"),
])
def test_a_compensation_cancels_only_a_live_extra_of_ours_beside_a_live_keeper(listed, why):
    refused = compensation_refused("WB2", "WB1", listed, {"tok-1"})
    assert refused is None if why is None else why in refused


def test_an_extra_cancelled_already_is_no_duplicate():
    assert findings([issued("WB1", 10, status="cancelled"), issued("WB2", 10.1)], [receipt("WB2", 10.2)]) == []


def test_extras_are_never_reported_beside_a_receipt_whose_own_waybill_is_not_live():
    """Cancelling the others would leave the order with no waybill: the receipt's is reported missing."""
    found = findings([issued("WB1", 10), issued("WB2", 10.1, status="cancelled")], [receipt("WB2", 10.2)])
    assert [(f.kind, f.keeper) for f in found] == [(MISSING, "WB2")]
    assert found[0].evidence["listed_as"] == "cancelled"
    assert [w["waybill_no"] for w in found[0].evidence["listed_for_order"]] == ["WB1"]   # what it lists instead


def test_a_waybill_we_hold_no_receipt_for_is_an_orphan_that_may_be_adopted():
    [finding] = findings([issued("WB1", 10)], steps={ORDER: step()})
    assert (finding.kind, finding.keeper, finding.biz_key) == (ORPHAN, "WB1", f"{ORDER}:ORDER_CONFIRM:issue_waybill")
    assert finding.evidence["adoptable"] and finding.evidence["why_not"] is None


@pytest.mark.parametrize("the_step, key, why", [
    (None, "tok-1", "no t_idem row"),
    (step(token="tok-other"), "tok-1", "token is not the waybill's idempotency key"),
    (step(), None, "token is not the waybill's idempotency key"),
    (step(status=3), "tok-1", "failed for good"),
    (step(status=1, live=True), "tok-1", "holds the step's claim"),
])
def test_an_orphan_is_adopted_only_by_the_step_that_asked_for_it(the_step, key, why):
    assert why in adoption_refused(the_step, key)


def test_a_pending_step_no_worker_holds_may_be_adopted():
    assert adoption_refused(step(status=1, live=False), "tok-1") is None


def test_an_order_between_its_call_and_its_t3_is_in_flight_not_an_orphan():
    found, in_flight = compare("waybill", "waybill", WINDOW, [issued("WB1", 10)], {},
                               {ORDER: step(status=1, live=True)}, tokens=TOKENS)
    assert (found, in_flight) == ([], 1)


def test_two_waybills_and_no_receipt_are_an_orphan_to_adopt_and_a_duplicate_of_it():
    found = findings([issued("WB1", 10), issued("WB2", 10.1)], steps={ORDER: step()})
    assert [(f.kind, f.keeper, f.extras) for f in found] == [(ORPHAN, "WB1", ()), (DUPLICATE, "WB1", ("WB2",))]
    assert "adopt it first" in found[1].evidence["keeper_is"]


def test_a_receipt_whose_waybill_the_provider_does_not_list_is_missing():
    [finding] = findings([], [receipt("WB-MADE-UP", 20)])
    assert (finding.kind, finding.keeper, finding.evidence["listed_as"]) == (MISSING, "WB-MADE-UP", None)


def test_no_receipt_is_called_missing_when_the_listing_was_not_read_whole():
    assert findings([], [receipt("WB-MADE-UP", 20)], missing=False) == []


def test_a_finding_belongs_to_the_range_its_extra_orphan_or_receipt_falls_in():
    before, after = -3, 62                                       # in the margins, outside the range
    assert findings([issued("WB1", before)], steps={ORDER: step()}) == []
    assert findings([issued("WB1", after)], steps={ORDER: step()}) == []
    assert findings([], [receipt("WB9", after)]) == []
    # The keeper long before the range, the extra inside it: this range's duplicate.
    [late] = findings([issued("WB1", -600), issued("WB2", 30)], [receipt("WB1", -599)])
    assert (late.kind, late.extras) == (DUPLICATE, ("WB2",))
    # The range before it saw the keeper alone: nothing then.
    earlier = Window(at(-660), at(-540), timedelta(minutes=5))
    assert findings([issued("WB1", -600)], [receipt("WB1", -599)], window=earlier) == []


def test_each_order_is_judged_on_its_own():
    other = "ORD-20261201-B2"
    found = findings([issued("WB1", 10), issued("WB2", 11, order=other, key="tok-2"), issued("WB3", 12, order=other,
                                                                                             key="tok-2")],
                     [receipt("WB1", 10.1), receipt("WB3", 12.1, order=other, token="tok-2")])
    assert [(f.kind, f.order_no, f.extras) for f in found] == [(DUPLICATE, other, ("WB2",))]


async def test_a_long_listing_is_read_a_page_at_a_time_up_to_its_bound():
    class Pages:
        def __init__(self, n: int) -> None:
            self.items, self.asked = [issued(f"WB{i}", i / 100) for i in range(n)], []

        async def issued(self, since, until, *, page_size):
            for start in range(0, len(self.items), page_size):
                self.asked.append(page_size)
                yield self.items[start:start + page_size]

        async def cancel(self, reference, key):
            raise AssertionError("a listing read cancels nothing")

    whole = Pages(1200)
    assert (len((found := await read_listing(whole, *WINDOW.wide, max_rows=5000))[0]), found[1]) == (1200, True)
    assert whole.asked == [500, 500, 500]
    capped = Pages(1200)
    listed, complete = await read_listing(capped, *WINDOW.wide, max_rows=700)
    assert (len(listed), complete, capped.asked) == (700, False, [500, 500])


def test_the_logistics_api_declares_a_listing_and_the_others_none():
    assert waybill.PROVIDER.listing is not None
    assert express.PROVIDER.listing is None and sms.PROVIDER.listing is None


def test_the_step_keys_are_the_pipelines_own():
    assert step_keys("waybill", ORDER) == [f"{ORDER}:ORDER_CONFIRM:issue_waybill"]
    assert step_keys("sms", ORDER) == [f"{ORDER}:ORDER_CANCEL:send_cancel_sms"]


def test_every_action_closes_only_an_open_case_of_its_kinds():
    for action, (to, kinds) in CASE_ACTIONS.items():
        assert (CaseStatus.OPEN, to) in CASE_TRANSITIONS
        for kind in KINDS:
            assert (refusal(action, kind, CaseStatus.OPEN) is None) == (kind in kinds), (action, kind)
            for closed in set(CaseStatus) - {CaseStatus.OPEN}:
                assert "already" in refusal(action, kind, closed)
    assert not any(src not in (None, CaseStatus.OPEN) for src, _ in CASE_TRANSITIONS)   # nothing leaves a close
    assert "compensate is for duplicate" in refusal("compensate", ORPHAN, CaseStatus.OPEN)
    assert "adopt is for orphan" in refusal("adopt", MISSING, CaseStatus.OPEN)


def test_a_cases_cancel_key_is_its_own_and_its_waybills_and_the_same_every_time():
    tokens = StepTokens(b"a secret")
    first = cancel_key(tokens, "orders", 7, "WB1")
    assert first == cancel_key(tokens, "orders", 7, "WB1")
    assert len({first, cancel_key(tokens, "orders", 8, "WB1"), cancel_key(tokens, "other-app", 7, "WB1"),
                cancel_key(tokens, "orders", 7, "WB2"), cancel_key(StepTokens(b"another secret"), "orders", 7, "WB1")}) == 5
    assert len(first) == 32 and int(first, 16) >= 0              # an HMAC's hex: the id is not in it


async def test_a_range_is_compared_a_slice_at_a_time_each_read_bounded_and_each_finding_once():
    from app.adapters.effects.registry import chosen
    from app.reconcile.providers import compare_sliced
    from app.settings import Settings

    other = "ORD-20261201-B2"
    waybills = [issued("WB1", 5), issued("WB2", 50),                                  # a duplicate, 45 min apart
                issued("WB3", 20, order=other, key="tok-2"), issued("WB4", 21, order=other, key="tok-2"),
                issued("WB5", 40, order="ORD-20261201-C3", key="tok-3")]             # an orphan
    held = {ORDER: receipt("WB1", 5.1), other: receipt("WB3", 20.1, order=other, token="tok-2")}

    class Listing:
        asked: list[tuple[datetime, datetime]] = []

        async def issued(self, since, until, *, page_size):
            self.asked.append((since, until))
            yield [w for w in waybills if since <= w.created_at < until]

        async def cancel(self, reference, key):
            raise AssertionError("a comparison cancels nothing")

    class Reads:
        effect = "waybill"

        async def written(self, since, until, *, limit):
            return [r for r in held.values() if since <= r.written_at < until][:limit]

        async def of_orders(self, orders):
            return {o: held[o] for o in orders if o in held}

        async def steps(self, keys):
            return {}

    listing = Listing()
    provider = chosen("waybill", Settings().effects)
    window = Window(T0, T0 + timedelta(hours=1), timedelta(minutes=5))
    found, counts = await compare_sliced(Reads(), listing, provider.name, window, slice_seconds=900, max_rows=100,
                                         tokens=TOKENS)
    # Each slice of 15 minutes read with its margins: 25 minutes; the last slice also back to the claim of
    # WB2's order (its receipt's waybill, WB1, came 45 minutes before: the late extra beside an old keeper).
    assert [(since, until) for since, until in listing.asked[:4]] == [(at(15 * i - 5), at(15 * i + 20)) for i in range(4)]
    assert listing.asked[4] == (at(-5), at(40))
    assert sorted((f.kind, f.order_no, f.references) for f in found) == [
        ("duplicate", ORDER, ("WB2",)), ("duplicate", other, ("WB4",)), ("orphan", "ORD-20261201-C3", ("WB5",))]
    assert (counts["duplicates"], counts["orphans"], counts["missing"], counts["slices"], counts["complete"]) == (
        2, 1, 0, 4, True)
