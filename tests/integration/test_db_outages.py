"""A database that stops answering without closing anything: a TCP proxy
owned by the test sits between a real worker and MariaDB and blackholes every connection
mid-batch. Without client-side timeouts the worker waits on those connections for hours
(TCP keepalive) while it keeps heartbeating; with them it notices within a statement
timeout, treats it as an outage, and goes on once new connections get through."""

from __future__ import annotations

import asyncio
import time

import pytest

from harness.events import event, order_no, record
from harness.fakes import FakesProcess
from harness.proxy import proxied_database
from harness.services import caught_up, committed_offsets, produce, wait_for

TIMEOUTS = {"DB_STATEMENT_TIMEOUT_SECONDS": "2", "DB_TRANSACTION_TIMEOUT_SECONDS": "4",
            "DB_LOCK_WAIT_TIMEOUT_SECONDS": "1", "DB_POOL_TIMEOUT_SECONDS": "2", "DB_CONNECT_TIMEOUT_SECONDS": "2",
            "BATCH_SIZE": "20", "BATCH_WITHIN_SECONDS": "0.2", "RETRY_BACKOFF_MS": "50,100,200",
            "BROKER_SESSION_TIMEOUT_SECONDS": "10", "BROKER_HEARTBEAT_INTERVAL_SECONDS": "1",
            "BATCH_DEADLINE_SECONDS": "8", "DLQ_SEND_TIMEOUT_SECONDS": "10",
            "COMPENSATION_BACKOFF_SECONDS": "1", "COMPENSATION_TIMER_SECONDS": "1"}


@pytest.fixture
def proxied(scratch_db):
    with proxied_database(scratch_db.url) as (proxy, url):
        yield proxy, url


@pytest.fixture
def fakes():
    process = FakesProcess({"waybill": {"latency_ms": 50}})
    yield process
    process.stop()


RECEIPTS = "SELECT COUNT(*) FROM t_waybill_receipt WHERE order_no LIKE %s"


class UnderLoad:
    """60 orders created, paid and confirmed on one partition; a worker through the proxy, mid-way."""

    def __init__(self, settings, topics, spawn_worker, scratch_db, url: str, fakes, budget: str) -> None:
        self.db = scratch_db
        self.pair = topics(partitions=1)
        self.orders = [order_no(prefix="HANG") for _ in range(60)]
        docs = [event(o, t) for o in self.orders for t in ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM")]
        asyncio.run(produce(settings, self.pair.events, [record(d) for d in docs]))
        self.prefix = self.orders[0][:13] + "HANG%"
        self.worker = spawn_worker(self.pair, MYSQL_URL=url, LOGISTICS_URL=fakes.url,
                                   INFRA_RETRY_BUDGET_SECONDS=budget, **TIMEOUTS)
        wait_for(lambda: self.receipts() >= 5, timeout=90, what="work under way", workers=[self.worker])

    def receipts(self) -> int:
        return self.db.scalar(RECEIPTS, self.prefix)


def test_connections_that_hang_mid_batch_are_abandoned_and_the_worker_goes_on(settings, topics, spawn_worker,
                                                                               scratch_db, proxied, fakes):
    proxy, url = proxied
    run = UnderLoad(settings, topics, spawn_worker, scratch_db, url, fakes, budget="60")
    pair, orders, worker = run.pair, run.orders, run.worker

    proxy.blackhole()
    cut = time.monotonic()
    worker.wait_log("database did not answer in time", timeout=30)     # a bound: without timeouts, hours
    print(f"hang noticed after {time.monotonic() - cut:.1f}s")
    time.sleep(3)                                   # the outage goes on a little...
    proxy.restore()                                 # ...then new connections get through; the old ones never will

    wait_for(lambda: caught_up(settings, pair.events, pair.group, 1), timeout=120, what="everything committed",
             workers=[worker])
    # A connection cut while its transaction held row locks leaves them on the server until the
    # server drops the session (its wait_timeout, at least 60 s: app/adapters/mysql/engine.py); records that need
    # those rows meanwhile pass their batch's deadline and are dead-lettered as retriable, and the
    # compensator runs them once the locks are gone. Nothing is lost, nothing is done twice.
    wait_for(lambda: run.receipts() == len(orders), timeout=180, what="every order's waybill", workers=[worker])
    ledger = fakes.ledger()
    assert all(len(ledger["waybills"][o]) == 1 for o in orders) and ledger["peak_in_flight_per_key"] == 1
    wait_for(lambda: all(row["status"] == 3 for row in scratch_db.query(
        "SELECT status FROM t_compensation WHERE src_topic = %s", pair.events)), timeout=60,
        what="every dead letter compensated", workers=[worker])


def test_a_database_that_never_answers_again_stops_the_worker_within_its_budget(settings, topics, spawn_worker,
                                                                                 scratch_db, proxied, fakes):
    proxy, url = proxied
    run = UnderLoad(settings, topics, spawn_worker, scratch_db, url, fakes, budget="6")
    pair, orders, worker = run.pair, run.orders, run.worker

    proxy.blackhole()
    cut = time.monotonic()
    assert worker.wait_exit(90) == 70, f"expected exit 70; log {worker.log_path}"   # a bound, not a goal
    print(f"the worker stopped {time.monotonic() - cut:.1f}s after the cut")
    assert "stopping the worker without committing" in worker.logs()
    committed = asyncio.run(committed_offsets(settings, pair.group, pair.events, 1))[0]
    assert committed < len(orders) * 3
