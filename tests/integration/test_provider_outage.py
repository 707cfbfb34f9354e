"""A real `faust -A app worker` against the fake providers in another process, the waybill
provider down: its breaker opens, the events without effects go on, the waybill records go to
the compensator, and once the provider is back every order has its one waybill. The worker's
share of a group-wide rate is on its metrics."""

from __future__ import annotations

import asyncio

from harness.events import event, order_no, record
from harness.fakes import FakesProcess
from harness.services import caught_up, produce, wait_for, worker_metric

FAST = {"BATCH_WITHIN_SECONDS": "0.3", "COMPENSATION_BACKOFF_SECONDS": "1", "COMPENSATION_BACKOFF_MAX_SECONDS": "2",
        "COMPENSATION_TIMER_SECONDS": "0.5", "COMPENSATOR_WITHIN_SECONDS": "0.3",
        "EFFECTS__WAYBILL__CALLS_PER_SECOND": "60"}


def test_a_down_provider_holds_up_nothing_else_and_its_orders_are_done_once_it_is_back(
        settings, topics, spawn_worker, scratch_db):
    fakes = FakesProcess()
    try:
        pair = topics(partitions=2, dlq_partitions=2)
        confirmed = [order_no(prefix="OUTW") for _ in range(40)]
        created = [order_no(prefix="OUTC") for _ in range(40)]
        fakes.configure({"waybill": {"outage_seconds": 3600, "timeout_ms": 50}})
        docs = [event(o, t) for o in confirmed for t in ("ORDER_CREATED", "ORDER_PAID")]
        docs += [event(o, "ORDER_CONFIRM") for o in confirmed] + [event(o, "ORDER_CREATED") for o in created]
        asyncio.run(produce(settings, pair.events, [record(d) for d in docs]))
        worker = spawn_worker(pair, **fakes.env(), **FAST)
        waybill = '{effect="waybill"}'

        wait_for(lambda: worker_metric(worker, "order_provider_breaker_open", waybill) == 1.0, timeout=90,
                 what="the waybill provider's breaker open", workers=[worker])
        wait_for(lambda: caught_up(settings, pair.events, pair.group, 2), timeout=90,
                 what="order-event committed while the provider is down", workers=[worker])
        marks = ", ".join(["%s"] * len(created))
        assert scratch_db.scalar(f"SELECT COUNT(*) FROM t_order WHERE order_no IN ({marks})", *created) == 40
        reasons = {r["reason"] for r in scratch_db.query(
            "SELECT reason FROM t_compensation WHERE order_no LIKE 'ORD-%%-OUTW%%'")}
        assert "provider_unavailable" in reasons
        share, members = (worker_metric(worker, "order_provider_rate_share_calls_per_second", waybill),
                          worker_metric(worker, "order_provider_limit_members"))
        assert members and members >= 1 and share == 60 / members

        fakes.configure({"waybill": {"outage_seconds": 0}})              # the provider is back

        def settled() -> bool:
            return scratch_db.scalar("SELECT COUNT(*) FROM t_compensation WHERE order_no LIKE 'ORD-%%-OUTW%%' "
                                     "AND status <> 3") == 0

        wait_for(settled, timeout=120, what="every waybill letter compensated", workers=[worker])
        wait_for(lambda: worker_metric(worker, "order_provider_breaker_open", waybill) == 0.0, timeout=30,
                 what="the breaker closed", workers=[worker])
        book = fakes.ledger()
        assert {o: len(book["waybills"][o]) for o in confirmed} == {o: 1 for o in confirmed}
        assert worker.alive
    finally:
        fakes.stop()


def test_an_outage_shorter_than_the_deadline_holds_its_records_and_costs_no_dead_letter(
        settings, topics, spawn_worker, scratch_db):
    fakes = FakesProcess()
    try:
        pair = topics(partitions=2, dlq_partitions=2)
        first = [order_no(prefix="HOLDA") for _ in range(30)]
        second = [order_no(prefix="HOLDB") for _ in range(30)]
        plain = [order_no(prefix="HOLDC") for _ in range(30)]
        fakes.configure({"waybill": {"outage_seconds": 3600, "timeout_ms": 50}})
        env = dict(fakes.env(), **FAST, BATCH_DEADLINE_SECONDS="25")
        worker = spawn_worker(pair, **env)
        waybill = '{effect="waybill"}'
        # The first orders' waybill calls fail until the breaker opens; they were claimed before
        # it opened and wait for it in their orders.
        docs = [event(o, t) for o in first for t in ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM")]
        asyncio.run(produce(settings, pair.events, [record(d) for d in docs]))
        wait_for(lambda: worker_metric(worker, "order_provider_breaker_open", waybill) == 1.0, timeout=90,
                 what="the waybill provider's breaker open", workers=[worker])
        # Orders that come while it is open: their CONFIRMs are held before their claim, their
        # CREATED and PAID go on, and so do orders without a waybill.
        docs = [event(o, t) for o in second for t in ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM")]
        docs += [event(o, "ORDER_CREATED") for o in plain]
        asyncio.run(produce(settings, pair.events, [record(d) for d in docs]))
        wait_for(lambda: (worker_metric(worker, "order_records_held") or 0) >= 1, timeout=60,
                 what="records held while the breaker is open", workers=[worker])
        marks = ", ".join(["%s"] * len(second))

        def went_on() -> bool:
            paid = scratch_db.scalar(f"SELECT COUNT(*) FROM t_order WHERE order_no IN ({marks}) AND status >= 2",
                                     *second)
            created = scratch_db.scalar(f"SELECT COUNT(*) FROM t_order WHERE order_no IN ({marks})", *plain)
            return paid == len(second) and created == len(plain)

        wait_for(went_on, timeout=60, what="the records before and beside the held ones done", workers=[worker])
        assert scratch_db.scalar("SELECT COUNT(*) FROM t_compensation WHERE order_no LIKE 'ORD-%%-HOLD%%'") == 0

        fakes.configure({"waybill": {"outage_seconds": 0}})              # back within the deadline
        wait_for(lambda: caught_up(settings, pair.events, pair.group, 2), timeout=120,
                 what="order-event committed to its end", workers=[worker])
        assert scratch_db.scalar("SELECT COUNT(*) FROM t_compensation WHERE order_no LIKE 'ORD-%%-HOLD%%'") == 0, \
            "a record waited for by the breaker was dead-lettered"
        book = fakes.ledger()
        assert {o: len(book["waybills"].get(o, [])) for o in first + second} == {o: 1 for o in first + second}
        assert worker_metric(worker, "order_records_held") == 0.0
    finally:
        fakes.stop()
