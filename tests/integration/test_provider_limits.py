"""Provider limits against the fake providers over real HTTP and real MariaDB, the batch handler in
this process: a provider's 429 is "not yet" (the same claim calls again after its Retry-After, no
retry nor claim used up, nothing dead-lettered), a worker told the limit stays under it, and a
group-wide rate is shared among the live workers their heartbeats count. Each test was watched
failing with what it checks broken."""

from __future__ import annotations

import time
from collections import Counter

from app.adapters.mysql.heartbeat import Heartbeat
from app.pipeline.breaker import PROBE_SECONDS
from app.pipeline.limits import EffectLimit, ProviderLimits
from app.pipeline.liveness_fence import SelfFence
from app.pipeline.model import NOT_DELIVERED
from harness.desk import desk
from harness.events import event, order_no
from harness.pipeline import paid_orders, source


def calls(fakes, service: str) -> list[dict]:
    return [c for c in fakes.ledger.calls if c["service"] == service]


async def test_a_provider_answering_429_is_waited_for_and_nothing_is_dead_lettered(harness):
    """A provider granting 5 calls/s, a batch of 20 waybills at once: most calls meet a 429. Each
    is made again under its claim after the Retry-After; every order gets its one waybill, no
    record is dead-lettered, no retry is used up and no key was claimed twice."""
    p = await harness.processor()
    orders = await paid_orders(p, 20, "RL")
    harness.fakes.configure({"waybill": {"calls_per_second": 5}})
    report = await harness.batches(p).handle([source(event(o, "ORDER_CONFIRM")) for o in orders])

    assert report.outcomes == {"applied": 20} and not report.dead_letters, report
    assert not report.retries, report.retries
    assert harness.fakes.ledger.rate_limited["waybill"] > 0           # the provider did say "not yet"
    assert {o: len(harness.fakes.ledger.waybills[o]) for o in orders} == {o: 1 for o in orders}
    attempts = [row["attempt"] for o in orders for row in harness.idem(f"{o}:ORDER_CONFIRM:issue_waybill")]
    assert attempts == [1] * 20                                        # one claim each: a 429 used none up


async def test_a_worker_told_the_limit_makes_no_call_over_it(harness):
    """The same provider, the worker told 4 calls/s: the provider never answers 429."""
    p = await harness.processor(limits=ProviderLimits({"waybill": EffectLimit(calls_per_second=4)}))
    orders = await paid_orders(p, 12, "RT")
    harness.fakes.configure({"waybill": {"calls_per_second": 5}})
    report = await harness.batches(p).handle([source(event(o, "ORDER_CONFIRM")) for o in orders])

    assert report.outcomes == {"applied": 12} and not report.dead_letters, report
    assert harness.fakes.ledger.rate_limited["waybill"] == 0
    calls = sorted(c["at"] for c in harness.fakes.ledger.calls if c["service"] == "waybill")
    assert len(calls) == 12 and calls[-1] - calls[0] >= 11 / 4 * 0.9   # spaced at the rate, not at once


async def test_an_sms_gateway_answering_429_sends_each_message_once(harness):
    """The SMS gateway (no idempotency of its own, contract lookup) answers 429: nothing was sent,
    so the same claim sends again, and each order's SMS goes out once."""
    p = await harness.processor()
    orders = await paid_orders(p, 8, "RS")
    harness.fakes.configure({"sms": {"calls_per_second": 3}})
    report = await harness.batches(p).handle([source(event(o, "ORDER_CANCEL")) for o in orders])

    assert report.outcomes == {"applied": 8} and not report.dead_letters, report
    assert harness.fakes.ledger.rate_limited["sms"] > 0
    assert {o: len(harness.fakes.ledger.sms[o]) for o in orders} == {o: 1 for o in orders}


async def test_a_group_rate_is_shared_among_the_live_workers(harness):
    """Three processes beat; each one's share of a group-wide 30 calls/s is 10. One stops: 15."""
    # The processes of earlier tests are over; some were killed and would still count for a while.
    harness.db.query("UPDATE t_worker SET stopped_at = NOW(3) WHERE stopped_at IS NULL")
    limits = [ProviderLimits({"waybill": EffectLimit(calls_per_second=30)}) for _ in range(3)]
    beats = [Heartbeat(harness.store(), f"share-{i}/{i}", f"share-{i}", SelfFence(15.0), every=1.0,
                       on_members=limits[i].set_members) for i in range(3)]
    for beat in beats:
        assert await beat.beat_once()
    assert await beats[0].beat_once() and await beats[1].beat_once()
    assert [round(limit.share("waybill"), 6) for limit in limits[:2]] == [10.0, 10.0]
    await beats[2].stop()
    assert await beats[0].beat_once()
    assert limits[0].share("waybill") == 15.0


async def test_a_call_whose_turn_comes_after_the_deadline_is_not_made_and_goes_to_the_compensator(harness):
    """A worker told 2 calls/s, a batch of 10 waybills and a deadline of 2 s: the calls whose turn
    comes after the deadline are not made (nor waited for); their records are dead-lettered as
    retriable (``deadline_exceeded``) for the compensator, their steps left "not delivered"."""
    p = await harness.processor(limits=ProviderLimits({"waybill": EffectLimit(calls_per_second=2)}))
    orders = await paid_orders(p, 10, "RD")
    report = await harness.batches(p, deadline=2).handle([source(event(o, "ORDER_CONFIRM")) for o in orders])

    lettered = {letter.order_no for letter in report.dead_letters}
    assert 1 <= report.outcomes["applied"] <= 6 and report.outcomes["applied"] + len(lettered) == 10, report
    assert {(letter.reason, letter.retriable) for letter in report.dead_letters} == {("deadline_exceeded", True)}
    called = {c["body"]["order_no"] for c in harness.fakes.ledger.calls if c["service"] == "waybill"}
    assert called == set(orders) - lettered                            # a record past its turn: never called
    for order in lettered:
        [row] = harness.idem(f"{order}:ORDER_CONFIRM:issue_waybill")
        assert (row["status"], row["attempt"], row["outcome"]) == (1, 1, NOT_DELIVERED)


async def test_a_dead_provider_costs_the_rest_nothing_and_a_probe_brings_it_back(harness):
    """The waybill provider goes down (every call 503s): once most of its calls have failed, its
    breaker opens. The records that would call it are dead-lettered as retriable at once, without
    more calls; the batch's events without effects are applied. When the provider is back, one
    probe closes the breaker, and the records go through, each order with one waybill."""
    shift = [0.0]
    limits = ProviderLimits(clock=lambda: time.monotonic() + shift[0])
    p = await harness.processor(limits=limits)
    orders = await paid_orders(p, 25, "BK")
    fresh = [order_no(prefix="BKF") for _ in range(10)]
    harness.fakes.configure({"waybill": {"outage_seconds": 600, "timeout_ms": 50}})
    report = await harness.batches(p).handle([source(event(o, "ORDER_CONFIRM")) for o in orders]
                                             + [source(event(o, "ORDER_CREATED")) for o in fresh])

    assert report.outcomes["applied"] == 10 and len(report.dead_letters) == 25, report
    assert all(letter.retriable and letter.order_no in orders for letter in report.dead_letters)
    assert Counter(letter.reason for letter in report.dead_letters)["provider_unavailable"] > 0
    assert len(calls(harness.fakes, "waybill")) == 25                 # phase 1's calls only: none retried
    assert limits.open_breakers() == ["waybill"]

    harness.fakes.configure({"waybill": {"outage_seconds": 0}})      # the provider is back
    shift[0] += PROBE_SECONDS                                         # the next probe is due
    first = await harness.batches(p).handle([source(event(orders[0], "ORDER_CONFIRM"))])
    assert first.outcomes == {"applied": 1} and limits.open_breakers() == []
    rest = await harness.batches(p).handle([source(event(o, "ORDER_CONFIRM")) for o in orders[1:]])
    assert rest.outcomes == {"applied": 24} and not rest.dead_letters, rest
    assert {o: len(harness.fakes.ledger.waybills[o]) for o in orders} == {o: 1 for o in orders}


async def test_the_compensator_leaves_a_down_providers_letters_and_redrives_them_once_it_is_back(harness):
    """While the breaker is open, the compensator does not redrive the letters of its provider: no
    claim (none counts towards IDEM_MAX_ATTEMPTS), no call, no redrive counted. Once a probe closes
    it, the letters are redriven and each order gets its one waybill."""
    shift = [0.0]
    limits = ProviderLimits(clock=lambda: time.monotonic() + shift[0])
    d = await desk(harness, limits=limits)
    orders = await paid_orders(d.main, 25, "BC")
    harness.fakes.configure({"waybill": {"outage_seconds": 600, "timeout_ms": 50}})
    await d.dead_letters([event(o, "ORDER_CONFIRM") for o in orders])
    assert limits.open_breakers() == ["waybill"]

    def due_now() -> None:
        harness.db.query("UPDATE t_compensation SET next_retry_at = NOW(3) - INTERVAL 1 SECOND "
                         "WHERE consumer_group = %s AND status = 1", d.group)

    def attempts() -> list[int]:
        return [row["attempt"] for o in orders for row in harness.idem(f"{o}:ORDER_CONFIRM:issue_waybill")]

    made, claimed = len(calls(harness.fakes, "waybill")), attempts()
    due_now()
    assert await d.compensator.run_due(100, d.guard) == 25
    rows = harness.db.query("SELECT id, status, redrives FROM t_compensation WHERE consumer_group = %s", d.group)
    assert {(r["status"], r["redrives"]) for r in rows} == {(1, 0)}
    assert all("provider_unavailable: not redriven" in d.history(r["id"])[-1]["detail"] for r in rows)
    assert len(calls(harness.fakes, "waybill")) == made and attempts() == claimed

    harness.fakes.configure({"waybill": {"outage_seconds": 0}})      # the provider is back
    shift[0] += PROBE_SECONDS
    for _ in range(3):                                                # the probe's round, then the rest
        due_now()
        await d.compensator.run_due(100, d.guard)
    statuses = {r["status"] for r in harness.db.query(
        "SELECT status FROM t_compensation WHERE consumer_group = %s", d.group)}
    assert statuses == {3}                                            # every letter compensated
    assert {o: len(harness.fakes.ledger.waybills[o]) for o in orders} == {o: 1 for o in orders}
