"""A real producer, a real `faust -A app worker`, real MariaDB: every event is recorded once."""

from __future__ import annotations

import asyncio
import urllib.request

from app.pipeline.events import decode
from app.pipeline.plan import step_keys
from harness import services
from harness.events import event, order_no, record
from harness.services import produce, wait_for


def idem_key(doc: dict) -> str:
    """The local step's idempotency key of an event."""
    return step_keys(decode(*record(doc), max_bytes=1 << 20))[0]


def caught_up(settings, pair) -> bool:
    return services.caught_up(settings, pair.events, pair.group, pair.partitions)


def test_thousand_events_each_done_once_and_replay_changes_nothing(settings, topics, spawn_worker, scratch_db):
    pair = topics(partitions=8)
    orders = [order_no(prefix="E2E") for _ in range(500)]
    docs = [event(o, "ORDER_CREATED") for o in orders] + [event(o, "ORDER_PAID") for o in orders]
    keys = sorted({idem_key(d) for d in docs})
    worker = spawn_worker(pair)

    asyncio.run(produce(settings, pair.events, [record(d) for d in docs]))
    marks = ", ".join(["%s"] * len(keys))
    wait_for(lambda: scratch_db.scalar(f"SELECT COUNT(*) FROM t_idem WHERE status = 2 AND biz_key IN ({marks})",
                                       *keys) == len(keys), timeout=120, what="1,000 done rows", workers=[worker])
    before = scratch_db.query(f"SELECT biz_key, status, attempt, gmt_modified FROM t_idem "
                              f"WHERE biz_key IN ({marks}) ORDER BY biz_key", *keys)
    order_marks = ", ".join(["%s"] * len(orders))
    orders_before = scratch_db.query(f"SELECT * FROM t_order WHERE order_no IN ({order_marks}) ORDER BY order_no",
                                     *orders)
    assert len(before) == len(keys) == 1000
    assert [o["status"] for o in orders_before] == [2] * 500
    wait_for(lambda: caught_up(settings, pair), timeout=60, what="offsets committed")

    # The same events once more: no new row, no row touched again.
    asyncio.run(produce(settings, pair.events, [record(d) for d in docs]))
    wait_for(lambda: caught_up(settings, pair), timeout=120, what="replay consumed and committed")
    after = scratch_db.query(f"SELECT biz_key, status, attempt, gmt_modified FROM t_idem "
                             f"WHERE biz_key IN ({marks}) ORDER BY biz_key", *keys)
    assert after == before
    assert scratch_db.query(f"SELECT * FROM t_order WHERE order_no IN ({order_marks}) ORDER BY order_no",
                            *orders) == orders_before
    assert worker.alive


def test_malformed_event_is_logged_and_counted_without_stalling(settings, topics, spawn_worker, scratch_db):
    pair = topics(partitions=1)
    good = [event(order_no(prefix="MAL"), "ORDER_CREATED") for _ in range(5)]
    worker = spawn_worker(pair)
    records = [record(good[0]), (b"k", b"\xff\xfe not utf-8"), record(good[1]), (b"k", b"[1, 2]"),
               *[record(d) for d in good[2:]]]
    asyncio.run(produce(settings, pair.events, records))

    keys = [idem_key(d) for d in good]
    marks = ", ".join(["%s"] * len(keys))
    wait_for(lambda: scratch_db.scalar(f"SELECT COUNT(*) FROM t_idem WHERE status = 2 AND biz_key IN ({marks})",
                                       *keys) == len(keys), what="good events done", workers=[worker])
    worker.wait_log("not_utf8")
    worker.wait_log("not_object")

    def counted() -> bool:
        # The log line comes as the dead letter is sent; the counter when the batch is done.
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{worker.web_port}/metrics", timeout=10).read().decode()
        return ('order_events_malformed_total{reason="not_utf8"} 1.0' in metrics
                and 'order_events_malformed_total{reason="not_object"} 1.0' in metrics)

    wait_for(counted, timeout=30, what="both malformed records counted", workers=[worker])
    assert worker.alive
