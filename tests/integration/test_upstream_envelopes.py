"""A real `faust -A app worker` reading events as upstreams publish them: CloudEvents in binary and
structured mode (from aiokafka and from kcat) next to native records, a Debezium outbox relay's
records, types it does not handle (skipped and counted, or dead-lettered when strict), versions it
cannot read, and an order's events out of order. Every order ends right, with one waybill per
confirmed order."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time

from harness.events import cloudevent, event, order_no, outbox, record
from harness.fakes import FakesProcess
from harness.services import caught_up, produce, wait_for, worker_metric

LIFECYCLE = ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM")
CONFIRMED = 3


def statuses(db, orders: list[str]) -> dict[str, int]:
    marks = ", ".join(["%s"] * len(orders))
    return {r["order_no"]: r["status"] for r in db.query(
        f"SELECT order_no, status FROM t_order WHERE order_no IN ({marks})", *orders)}


def letters_of(db, topic: str) -> list[dict]:
    """The dead letters of records that are no event (no order number known)."""
    return db.query("SELECT reason, status FROM t_compensation WHERE src_topic = %s AND order_no IS NULL ORDER BY id",
                    topic)


def letters(db, orders: list[str]) -> list[dict]:
    marks = ", ".join(["%s"] * len(orders))
    return db.query(f"SELECT order_no, reason, status FROM t_compensation WHERE order_no IN ({marks}) ORDER BY id",
                    *orders)


def kcat_produce(bootstrap: str, topic: str, key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> None:
    kcat = shutil.which("kcat") or shutil.which("kafkacat")
    assert kcat, "kcat is needed (make test-tools installs Debian's kcat)"
    args = [kcat, "-P", "-b", bootstrap, "-t", topic, "-K", "\t"]
    for name, data in headers:
        args += ["-H", f"{name}={data.decode()}"]
    subprocess.run(args, input=key + b"\t" + value + b"\n", check=True, timeout=60)


def test_cloudevents_native_records_and_types_not_handled_side_by_side(settings, topics, spawn_worker, scratch_db):
    fakes = FakesProcess()
    try:
        pair = topics(partitions=2)
        native, binary, structured, by_kcat = (order_no(prefix=p) for p in ("ENVN", "ENVB", "ENVS", "ENVK"))
        orders = [native, binary, structured, by_kcat]
        recs = [record(event(native, t)) for t in LIFECYCLE]
        recs += [cloudevent(event(binary, t)) for t in LIFECYCLE]
        recs += [cloudevent(event(structured, t), structured=True) for t in LIFECYCLE]
        # Types this processor does not act on, as a real order topic carries them.
        recs += [record(event(native, "ORDER_PAID", type="ORDER_SHIPPED")),
                 cloudevent(event(binary, "ORDER_PAID"), type_name="com.shop.order.delivered"),
                 record(event(native, "ORDER_PAID", type="ORDER_SHIPPED"))]
        # A version this processor does not read: dead-lettered, its reason naming it.
        v2 = order_no(prefix="ENVV")
        recs.append(cloudevent(event(v2, "ORDER_CREATED"), dataschema="https://schemas.example/order-created/v2"))
        asyncio.run(produce(settings, pair.events, recs))
        for t in LIFECYCLE:
            kcat_produce(settings.kafka.bootstrap, pair.events, *cloudevent(event(by_kcat, t)))
        worker = spawn_worker(pair, **fakes.env(), FOREIGN_EVENT_TYPES="ORDER_SHIPPED")

        wait_for(lambda: statuses(scratch_db, orders) == dict.fromkeys(orders, CONFIRMED), timeout=120,
                 what="the four orders confirmed", workers=[worker])
        wait_for(lambda: caught_up(settings, pair.events, pair.group, 2), timeout=60,
                 what="every record committed", workers=[worker])
        wait_for(lambda: worker_metric(worker, "order_events_skipped_total", '{type="ORDER_SHIPPED"}') == 2.0,
                 timeout=30, what="the skipped types counted", workers=[worker])
        # A type FOREIGN_EVENT_TYPES does not name is no series of its own (a record never makes one).
        assert worker_metric(worker, "order_events_skipped_total", '{type="other"}') == 1.0
        worker.wait_log("skipped 2 event(s) of type 'ORDER_SHIPPED'")
        assert letters(scratch_db, orders) == []
        assert [(r["reason"], r["status"]) for r in letters_of(scratch_db, pair.events)] == [
            ("unsupported_version:2", 4)]
        waybills = fakes.ledger()["waybills"]
        assert {o: len(waybills.get(o, ())) for o in orders} == dict.fromkeys(orders, 1)
        assert worker.alive
    finally:
        fakes.stop()


def test_strict_mode_dead_letters_the_types_not_handled(settings, topics, spawn_worker, scratch_db):
    pair = topics(partitions=1)
    o = order_no(prefix="ENVT")
    asyncio.run(produce(settings, pair.events, [record(event(o, "ORDER_CREATED")),
                                                record(event(o, "ORDER_PAID", type="ORDER_SHIPPED"))]))
    worker = spawn_worker(pair, UNHANDLED_EVENT_TYPES="dead_letter")
    wait_for(lambda: letters_of(scratch_db, pair.events) != [], timeout=90, what="the dead letter", workers=[worker])
    assert [(r["reason"], r["status"]) for r in letters_of(scratch_db, pair.events)] == [("unknown_type", 4)]
    wait_for(lambda: statuses(scratch_db, [o]) == {o: 1}, timeout=60, what="the order created", workers=[worker])


def test_outbox_records_out_of_order_converge_without_a_person(settings, topics, spawn_worker, scratch_db):
    """Outbox records (payload only, the id and type in headers, the time the record's): an order's
    CONFIRM before its CREATED and PAID in one batch gives way to them; a CONFIRM whose PAID comes
    later (another batch) is dead-lettered and redriven by the compensator with the defaults."""
    fakes = FakesProcess()
    try:
        pair = topics(partitions=1)
        together, apart = order_no(prefix="OOOT"), order_no(prefix="OOOA")
        first = [outbox(event(together, t)) for t in ("ORDER_CONFIRM", "ORDER_PAID", "ORDER_CREATED")]
        first += [outbox(event(apart, t)) for t in ("ORDER_CONFIRM", "ORDER_CREATED")]
        first.append(outbox(event(together, "ORDER_CREATED")))                 # a replay of an older one
        asyncio.run(produce(settings, pair.events, first))
        worker = spawn_worker(pair, EVENT_ENVELOPE="outbox", **fakes.env())
        wait_for(lambda: statuses(scratch_db, [together]) == {together: CONFIRMED}, timeout=90,
                 what="the order whose events came together, confirmed", workers=[worker])
        wait_for(lambda: letters(scratch_db, [apart]) != [], timeout=90, what="the early CONFIRM dead-lettered",
                 workers=[worker])
        started = time.monotonic()
        asyncio.run(produce(settings, pair.events, [outbox(event(apart, "ORDER_PAID"))]))
        wait_for(lambda: statuses(scratch_db, [apart]) == {apart: CONFIRMED}, timeout=240,
                 what="the early CONFIRM redriven by the compensator", workers=[worker])
        print(f"out of order across batches: converged {time.monotonic() - started:.1f} s after the PAID came")
        assert [(r["reason"], r["status"]) for r in letters(scratch_db, [apart])] == [("precondition_not_met", 3)]
        assert letters(scratch_db, [together]) == []
        waybills = fakes.ledger()["waybills"]
        assert {o: len(waybills.get(o, ())) for o in (together, apart)} == {together: 1, apart: 1}
    finally:
        fakes.stop()
