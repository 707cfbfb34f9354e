"""Strategy D with a real worker: per-record failures, dead letters, safe commits, graceful stop."""

from __future__ import annotations

import asyncio
import re
import urllib.request

import pytest

from app.pipeline.events import decode
from app.pipeline.plan import step_keys
from harness.events import event, order_no, record
from harness.fakes import FakesProcess
from harness.services import caught_up, committed_offsets, consume_all, produce, wait_for

FAST_RETRIES = {"RETRY_BACKOFF_MS": "50,100,200", "BATCH_WITHIN_SECONDS": "0.5",
                "BROKER_SESSION_TIMEOUT_SECONDS": "6", "BROKER_HEARTBEAT_INTERVAL_SECONDS": "1",
                "BATCH_DEADLINE_SECONDS": "5"}


def local_key(doc: dict) -> str:
    return step_keys(decode(*record(doc), max_bytes=1 << 20))[0]


def headers(rec) -> dict[str, str]:
    return {k: v.decode() for k, v in rec.headers}


def done_count(db, keys) -> int:
    marks = ", ".join(["%s"] * len(keys))
    return db.scalar(f"SELECT COUNT(*) FROM t_idem WHERE status = 2 AND biz_key IN ({marks})", *keys)


@pytest.fixture
def fakes():
    process = FakesProcess()
    yield process
    process.stop()


def test_record_failing_at_index_k_of_500(settings, topics, spawn_worker, scratch_db, fakes):
    """One batch of 500 on one partition: a malformed record at index 137 and, at 300, a
    CONFIRM whose logistics call keeps failing. The other 498 are done, those two are
    dead-lettered, and the group's offset moves past the whole batch."""
    pair = topics(partitions=1)
    created = [event(order_no(prefix="K"), "ORDER_CREATED") for _ in range(249)]
    paid = [event(d["order_no"], "ORDER_PAID") for d in created]
    good = created + paid                                   # 498 events; PAIDs start at index 249
    failing = paid[10]["order_no"]                          # paid at index 259 (260 after the insert)
    records = [record(d) for d in good]
    records.insert(137, (b"ORD-BAD", b"{not json"))
    records.insert(300, record(event(failing, "ORDER_CONFIRM")))
    assert len(records) == 500
    fakes.configure({"waybill": {"fail_orders": [failing], "fail_status": 503}})
    asyncio.run(produce(settings, pair.events, records))

    worker = spawn_worker(pair, BATCH_SIZE="500", BATCH_WITHIN_SECONDS="5", LOGISTICS_URL=fakes.url,
                          RETRY_BACKOFF_MS="50,100,200", COMPENSATOR_ENABLED="false")   # the rows as dead-lettered
    wait_for(lambda: caught_up(settings, pair.events, pair.group, 1), timeout=120, what="batch committed",
             workers=[worker])
    assert "order_batch_events_count 1.0" in urllib.request.urlopen(
        f"http://127.0.0.1:{worker.web_port}/metrics", timeout=10).read().decode(), "not a single batch"

    assert done_count(scratch_db, [local_key(d) for d in good]) == 498
    letters = asyncio.run(consume_all(settings, pair.dlq, expect=2, timeout=30))
    by_offset = {int(headers(r)["dlq.original.offset"]): r for r in letters}
    assert sorted(by_offset) == [137, 300]
    bad = headers(by_offset[137])
    assert (by_offset[137].key, by_offset[137].value) == (b"ORD-BAD", b"{not json")
    assert (bad["dlq.error.type"], bad["dlq.retriable"], bad["dlq.attempts"]) == ("not_json", "false", "1")
    confirm = headers(by_offset[300])
    assert (confirm["dlq.error.type"], confirm["dlq.retriable"], confirm["dlq.attempts"]) == (
        "effect_unavailable", "true", "4")
    assert confirm["dlq.original.topic"] == pair.events and confirm["dlq.consumer.group"] == pair.group
    assert confirm["dlq.worker.id"] and confirm["dlq.first.failure"] and confirm["dlq.original.timestamp"]
    assert by_offset[300].key == failing.encode()
    waybill_calls = [c for c in fakes.ledger()["calls"] if c["service"] == "waybill"]
    assert len(waybill_calls) == 4                                   # 1 + 3 retries, one token
    assert len({c["key"] for c in waybill_calls}) == 1
    ledger = scratch_db.query("SELECT src_offset, reason, retriable, attempts, status FROM t_compensation "
                              "WHERE src_topic = %s ORDER BY src_offset", pair.events)
    assert [(r["src_offset"], r["reason"], r["retriable"], r["attempts"], r["status"]) for r in ledger] == [
        (137, "not_json", 0, 1, 4), (300, "effect_unavailable", 1, 4, 1)]
    assert worker.alive


def test_dead_letter_write_failure_commits_nothing_and_the_batch_comes_back(settings, topics, spawn_worker,
                                                                            scratch_db):
    pair = topics(partitions=1)
    good = [event(order_no(prefix="DLQF"), "ORDER_CREATED") for _ in range(20)]
    records = [record(d) for d in good[:10]] + [(b"ORD-BAD", b"\xff")] + [record(d) for d in good[10:]]
    asyncio.run(produce(settings, pair.events, records))

    broken = spawn_worker(pair, "broken", DLQ_TOPIC=f"{pair.dlq}-missing", DLQ_SEND_TIMEOUT_SECONDS="3",
                          BATCH_WITHIN_SECONDS="2", **{k: v for k, v in FAST_RETRIES.items()
                                                      if k != "BATCH_WITHIN_SECONDS"})
    assert broken.wait_exit(90) == 70, f"expected exit 70; log {broken.log_path}"
    assert "stopping the worker without committing" in broken.logs()
    assert asyncio.run(committed_offsets(settings, pair.group, pair.events, 1)) == {0: 0}
    assert asyncio.run(consume_all(settings, pair.dlq, expect=1, timeout=3)) == []

    fixed = spawn_worker(pair, "fixed", **FAST_RETRIES)
    wait_for(lambda: caught_up(settings, pair.events, pair.group, 1), timeout=90, what="redelivered batch",
             workers=[fixed])
    [letter] = asyncio.run(consume_all(settings, pair.dlq, expect=1, timeout=30))
    assert letter.value == b"\xff" and headers(letter)["dlq.original.offset"] == "10"
    assert done_count(scratch_db, [local_key(d) for d in good]) == 20
    assert scratch_db.scalar("SELECT COUNT(*) FROM t_compensation WHERE src_topic = %s", pair.events) == 1


def test_sigterm_mid_stream_finishes_the_batch_and_nothing_is_processed_twice(settings, topics, spawn_worker,
                                                                             scratch_db, fakes):
    pair = topics(partitions=2)
    orders = [order_no(prefix="TERM") for _ in range(150)]
    docs = [event(o, t) for o in orders for t in ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM")]
    asyncio.run(produce(settings, pair.events, [record(d) for d in docs]))
    fakes.configure({"waybill": {"latency_ms": 150}})
    env = dict(FAST_RETRIES, BATCH_SIZE="60", EFFECT_CONCURRENCY="4", EFFECT_TIMEOUT_SECONDS="1", LEASE_SECONDS="100",
               LOGISTICS_URL=fakes.url)

    first = spawn_worker(pair, "first", **env)
    receipts = "SELECT COUNT(*) FROM t_waybill_receipt WHERE order_no LIKE %s"
    prefix = orders[0][:13] + "TERM%"
    wait_for(lambda: scratch_db.scalar(receipts, prefix) >= 10, timeout=90, what="some waybills",
             workers=[first])
    # Two batches in flight (BATCHES_IN_FLIGHT=2, one per partition) when SIGTERM comes: both finish.
    wait_for(lambda: in_flight(first) == 2, timeout=60, what="two batches in flight", workers=[first])
    assert first.stop(timeout=90) == 0, f"graceful stop failed; log {first.log_path}"
    done_by_first = scratch_db.scalar(receipts, prefix)
    assert done_by_first < len(orders), "the stream was over before SIGTERM: make the test slower"

    second = spawn_worker(pair, "second", **env)
    wait_for(lambda: caught_up(settings, pair.events, pair.group, 2), timeout=180, what="all processed",
             workers=[second])
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{second.web_port}/metrics", timeout=10).read().decode()
    assert 'order_events_total{outcome="duplicate"}' not in metrics, "events were processed twice"
    assert scratch_db.scalar(receipts, prefix) == len(orders)
    ledger = fakes.ledger()
    assert sum(c["service"] == "waybill" for c in ledger["calls"]) == len(orders)   # no call repeated
    assert all(len(ledger["waybills"][o]) == 1 for o in orders)


def in_flight(worker) -> float:
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{worker.web_port}/metrics", timeout=10).read().decode()
    found = re.search(r"^order_batch_in_flight (\S+)$", metrics, re.M)
    return float(found.group(1)) if found else 0.0


def test_later_events_of_a_dead_lettered_order_still_run(settings, topics, spawn_worker, scratch_db, fakes):
    pair = topics(partitions=1)
    order = order_no(prefix="SUP")
    first = [event(order, "ORDER_CREATED"), event(order, "ORDER_PAID", data={"amount_cents": 1})]
    asyncio.run(produce(settings, pair.events, [record(d) for d in first]))
    worker = spawn_worker(pair, LOGISTICS_URL=fakes.url, **FAST_RETRIES)
    wait_for(lambda: done_count(scratch_db, [local_key(first[1])]) == 1, what="order paid", workers=[worker])

    conflicting = event(order, "ORDER_PAID", data={"amount_cents": 2})
    asyncio.run(produce(settings, pair.events, [record(conflicting), record(event(order, "ORDER_CONFIRM"))]))
    wait_for(lambda: scratch_db.scalar("SELECT status FROM t_order WHERE order_no = %s", order) == 3,
             what="confirm ran after the dead-lettered event", workers=[worker])
    [letter] = asyncio.run(consume_all(settings, pair.dlq, expect=1, timeout=30))
    assert headers(letter)["dlq.error.type"] == "payload_mismatch"
    assert headers(letter)["dlq.may.be.superseded"] == "true"
    [row] = scratch_db.query("SELECT reason, may_be_superseded FROM t_compensation WHERE src_topic = %s",
                             pair.events)
    assert (row["reason"], row["may_be_superseded"]) == ("payload_mismatch", 1)


def test_database_down_longer_than_the_budget_stops_without_committing(settings, topics, spawn_worker, scratch_db):
    pair = topics(partitions=1)
    good = [event(order_no(prefix="DBDOWN"), "ORDER_CREATED") for _ in range(10)]
    asyncio.run(produce(settings, pair.events, [record(d) for d in good]))

    down = spawn_worker(pair, "down", MYSQL_URL="mysql+aiomysql://idem:idem@127.0.0.1:1/idem",
                        INFRA_RETRY_BUDGET_SECONDS="2", **FAST_RETRIES)
    assert down.wait_exit(90) == 70, f"expected exit 70; log {down.log_path}"
    assert "database unavailable" in down.logs()
    assert asyncio.run(committed_offsets(settings, pair.group, pair.events, 1)) == {0: 0}

    up = spawn_worker(pair, "up", **FAST_RETRIES)
    wait_for(lambda: caught_up(settings, pair.events, pair.group, 1), timeout=90, what="redelivered batch",
             workers=[up])
    assert done_count(scratch_db, [local_key(d) for d in good]) == 10


def test_a_batch_has_a_deadline_and_identical_records_are_one_piece_of_work(settings, topics, spawn_worker,
                                                                            scratch_db):
    """CREATED plus 100 re-published CONFIRMs of an order whose PAID never came. Without a
    deadline and without merging the copies, this one batch would retry for 100 x 7 s; here the copies are retried as one, the deadline dead-letters all 100 as
    retriable (for the compensator), and the batch is committed."""
    pair = topics(partitions=1)
    order = order_no(prefix="DEADLINE")
    confirms = [event(order, "ORDER_CONFIRM") for _ in range(100)]
    asyncio.run(produce(settings, pair.events, [record(event(order, "ORDER_CREATED"))] + [record(d) for d in confirms]))
    worker = spawn_worker(pair, **{**FAST_RETRIES, "RETRY_BACKOFF_MS": "1000,2000,4000", "BATCH_SIZE": "500",
                                   "BATCH_WITHIN_SECONDS": "2", "BATCH_DEADLINE_SECONDS": "4"})
    wait_for(lambda: caught_up(settings, pair.events, pair.group, 1), timeout=60, what="the batch committed",
             workers=[worker])
    letters = asyncio.run(consume_all(settings, pair.dlq, expect=100, timeout=30))
    assert len(letters) == 100
    assert {(headers(r)["dlq.error.type"], headers(r)["dlq.retriable"]) for r in letters} == {
        ("deadline_exceeded", "true")}
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{worker.web_port}/metrics", timeout=10).read().decode()
    retries = [line for line in metrics.splitlines() if line.startswith("order_record_retries_total{")]
    assert retries == ['order_record_retries_total{reason="precondition_not_met"} 2.0'], retries
    rows = scratch_db.query("SELECT reason, retriable, next_retry_at IS NOT NULL AS due FROM t_compensation "
                            "WHERE src_topic = %s", pair.events)
    assert {(r["reason"], r["retriable"], r["due"]) for r in rows} == {("deadline_exceeded", 1, 1)} and len(rows) == 100
