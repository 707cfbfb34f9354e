"""The whole loop with real workers: a dead letter made by the order-event agent, taken
by the compensator agent, retried with backoff by the timer, and finished once the
service answers again; the SMS whose reply was lost is found by asking the gateway; the
SMS that never reached it is sent exactly once by the compensator."""

from __future__ import annotations

import asyncio

from harness.events import event, order_no, record
from harness.fakes import FakesProcess
from harness.services import caught_up, produce, wait_for

FAST = {"RETRY_BACKOFF_MS": "20,20,20", "BATCH_WITHIN_SECONDS": "0.3", "DLQ_RETRY_AFTER_SECONDS": "1",
        "COMPENSATION_BACKOFF_SECONDS": "1", "COMPENSATION_BACKOFF_MAX_SECONDS": "2", "COMPENSATION_MAX_ATTEMPTS": "30",
        "COMPENSATION_TIMER_SECONDS": "0.5", "SMS_LOOKUP_SETTLE_SECONDS": "2", "COMPENSATOR_WITHIN_SECONDS": "0.3"}


def test_dead_letters_are_compensated_once_the_services_answer(settings, topics, spawn_worker, scratch_db):
    fakes = FakesProcess()
    try:
        pair = topics(partitions=2, dlq_partitions=2)
        waybill, lost_reply, never_sent = (order_no(prefix=p) for p in ("LOOPWB", "LOOPLOST", "LOOPNEVER"))
        fakes.configure({"waybill": {"fail_orders": [waybill], "fail_status": 500},
                         "sms": {"fail_orders": [never_sent], "fail_status": 502, "reset_next": 1}})
        docs = [event(o, t) for o in (waybill, lost_reply, never_sent) for t in ("ORDER_CREATED", "ORDER_PAID")]
        docs += [event(waybill, "ORDER_CONFIRM"), event(lost_reply, "ORDER_CANCEL"), event(never_sent, "ORDER_CANCEL")]
        asyncio.run(produce(settings, pair.events, [record(d) for d in docs]))
        worker = spawn_worker(pair, **fakes.env(), **FAST)

        def ledger(order: str) -> dict | None:
            rows = scratch_db.query("SELECT * FROM t_compensation WHERE order_no = %s", order)
            return rows[0] if rows else None

        # The logistics API keeps answering 500: the compensator backs off and tries again.
        wait_for(lambda: (ledger(waybill) or {}).get("redrives", 0) >= 2, timeout=90,
                 what="the waybill's dead letter retried twice", workers=[worker])
        wait_for(lambda: ledger(never_sent) is not None, timeout=60, what="the SMS dead letter", workers=[worker])
        fakes.configure({"waybill": {"fail_orders": []}, "sms": {"fail_orders": []}})    # both services are back

        def settled() -> bool:
            return all((ledger(o) or {}).get("status") == 3 for o in (waybill, lost_reply, never_sent))

        wait_for(settled, timeout=120, what="every dead letter compensated", workers=[worker])
        wait_for(lambda: caught_up(settings, pair.events, pair.group, 2), timeout=60, what="order-event committed",
                 workers=[worker])
        wait_for(lambda: caught_up(settings, pair.dlq, pair.group, 2), timeout=60, what="the DLQ committed",
                 workers=[worker])

        book = fakes.ledger()
        assert len(book["waybills"][waybill]) == 1
        tokens = {c["key"] for c in book["calls"] if c["service"] == "waybill" and c["body"]["order_no"] == waybill}
        assert len(tokens) == 1, tokens                                                   # one token throughout
        strangers = {c["body"]["order_no"] for c in book["calls"] if c["service"] == "waybill"} - {waybill}
        assert not strangers, f"calls for orders of no one here: {strangers}"
        assert len(book["sms"][lost_reply]) == 1 and len(book["sms"][never_sent]) == 1
        steps = {r["biz_key"].split(":")[0]: r["status"] for r in scratch_db.query(
            "SELECT biz_key, status FROM t_idem WHERE step IN ('issue_waybill', 'send_cancel_sms') AND "
            "biz_key LIKE 'ORD-%%-LOOP%%'")}
        assert steps == {waybill: 2, lost_reply: 2, never_sent: 2}
        assert scratch_db.scalar("SELECT COUNT(*) FROM t_waybill_receipt WHERE order_no = %s", waybill) == 1
        lookups = [c["client_ref"] for c in book["calls"] if c["service"] == "sms_lookup"]
        assert lookups, "the gateway was never asked"
        history = scratch_db.query("SELECT a.action, a.to_status FROM t_compensation_audit a JOIN t_compensation c "
                                   "ON c.id = a.compensation_id WHERE c.order_no = %s ORDER BY a.id", waybill)
        assert history[-1] == {"action": "redrive", "to_status": 3} and len(history) >= 3
        assert worker.alive
    finally:
        fakes.stop()


def test_dead_letters_no_kafka_record_can_be_never_stop_a_worker(settings, topics, spawn_worker, scratch_db):
    """Records a person or a replay tool writes to the dead-letter topic with our group's header
    and origins the ledger cannot store (a partition above INT, an offset above BIGINT, a topic of
    300 characters): each became a failed INSERT, the worker exited 70, and so did every worker
    that was given the partition after it. Now each is a row for a person, and the worker goes on."""
    pair = topics(partitions=1, dlq_partitions=1)
    good = {"dlq.consumer.group": pair.group.encode(), "dlq.original.topic": pair.events.encode(),
            "dlq.original.partition": b"0", "dlq.original.offset": b"7", "dlq.original.timestamp": b"1"}
    bad = [{**good, "dlq.original.partition": b"2147483648"}, {**good, "dlq.original.offset": b"9" * 19},
           {**good, "dlq.original.topic": b"t" * 300}]
    asyncio.run(produce(settings, pair.dlq, [(b"k", b"{}", list(h.items())) for h in bad]))
    worker = spawn_worker(pair, **FAST)
    wait_for(lambda: caught_up(settings, pair.dlq, pair.group, 1), timeout=60, what="the DLQ committed",
             workers=[worker])
    rows = scratch_db.query("SELECT src_offset, status, reason FROM t_compensation WHERE consumer_group = %s "
                            "ORDER BY src_offset", pair.group)
    assert [(r["src_offset"], r["status"], r["reason"]) for r in rows] == [
        (0, 4, "unreadable_dead_letter"), (1, 4, "unreadable_dead_letter"), (2, 4, "unreadable_dead_letter")]
    assert worker.alive
