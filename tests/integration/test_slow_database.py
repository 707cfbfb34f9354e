"""A database that is slow, not gone: every COMMIT of MariaDB is answered seconds late (a TCP
proxy the test owns holds each answer), so a heartbeat's transaction takes seconds where it took
milliseconds, and so do a batch's T1 and T3. The workers must slow down with it, not stop: no
exit, each waybill once, and the workers back to their pace when it ends. With commits of 4 s
the orders of the slow spell are done while it lasts; with commits of 11 s no call could be made
safely (a heartbeat lands too late), so nothing is claimed until the spell ends.

A slow spell longer than the infrastructure's retry budget (``INFRA_RETRY_BUDGET_SECONDS``, 20 s
here, 60 s by default) is what took every worker out (exit 70 at once, and again after each
restart while the database stayed slow): each heartbeat then outlasted its own bound, the worker's
fence refused every claim as if the database were gone, and the budget ran out.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from app.pipeline.states import LedgerStatus
from harness.events import event, order_no, record
from harness.fakes import FakesProcess
from harness.proxy import proxied_database
from harness.services import caught_up, produce, wait_for

SPELL_SECONDS = 40           # at least this long, and until the orders written during it are done
ENV = {"INFRA_RETRY_BUDGET_SECONDS": "20", "BATCH_SIZE": "20", "BATCH_WITHIN_SECONDS": "0.2",
       "BROKER_COMMIT_INTERVAL_SECONDS": "0.5"}
COMPENSATED = int(LedgerStatus.COMPENSATED)
RECEIPTS = "SELECT COUNT(*) FROM t_waybill_receipt WHERE order_no LIKE %s"


@pytest.fixture
def proxied(scratch_db):
    with proxied_database(scratch_db.url) as (proxy, url):
        yield proxy, url


def lifecycles(orders: list[str]) -> list[tuple[bytes, bytes]]:
    return [record(event(o, t)) for o in orders for t in ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM")]


def spell(settings, topics, spawn_worker, scratch_db, proxy, url, commit_seconds: float, *, done_during: bool) -> None:
    """Two workers, 20 orders before the spell, 40 during it, 20 after; every waybill once, no worker out.
    ``done_during``: the orders of the spell are done while it lasts, without a dead letter; else a batch
    may pass its deadline (BATCH_DEADLINE_SECONDS) waiting, and its records left then are dead letters
    the compensator finishes by itself (``deadline_exceeded``, compensated), never a person's work."""
    pair = topics(partitions=4)
    run = f"SLOW{uuid.uuid4().hex[:6]}"    # this run's orders alone (the scratch database is the session's)
    fakes = FakesProcess({"waybill": {"latency_ms": 20}})
    try:
        workers = [spawn_worker(pair, name=name, MYSQL_URL=url, **fakes.env(), **ENV) for name in ("a", "b")]
        before = [order_no(prefix=f"{run}A") for _ in range(20)]
        asyncio.run(produce(settings, pair.events, lifecycles(before)))
        wait_for(lambda: scratch_db.scalar(RECEIPTS, f"%{run}A%") == len(before), timeout=120,
                 what="the orders before the slow spell done", workers=workers)

        proxy.slow_commits(commit_seconds)
        slow_since = time.monotonic()
        during = [order_no(prefix=f"{run}B") for _ in range(40)]
        asyncio.run(produce(settings, pair.events, lifecycles(during)))
        if done_during:
            # The workers go on, slower: every order of the spell done while it lasts.
            wait_for(lambda: scratch_db.scalar(RECEIPTS, f"%{run}B%") == len(during), timeout=300,
                     what="the orders of the slow spell done while it lasts", workers=workers)
        # No worker out however long it lasts (wait_for fails at once if one exits).
        wait_for(lambda: time.monotonic() - slow_since >= SPELL_SECONDS, timeout=SPELL_SECONDS + 5,
                 what="a spell longer than the retry budget", workers=workers)
        proxy.slow_commits(0)

        after = [order_no(prefix=f"{run}C") for _ in range(20)]
        asyncio.run(produce(settings, pair.events, lifecycles(after)))
        wait_for(lambda: caught_up(settings, pair.events, pair.group, 4), timeout=180,
                 what="everything committed after the spell", workers=workers)
        wait_for(lambda: scratch_db.scalar(RECEIPTS, f"%{run}%") == len(before + during + after), timeout=120,
                 what="every order's waybill", workers=workers)
        ledger = fakes.ledger()["waybills"]
        assert {o: len(ledger.get(o, [])) for o in before + during + after} == {o: 1 for o in before + during + after}
        assert all(worker.alive for worker in workers)
        letters = "SELECT reason, status FROM t_compensation WHERE consumer_group = %s"
        if done_during:
            assert not scratch_db.query(letters, pair.group)
        else:
            wait_for(lambda: all(row["status"] == COMPENSATED for row in scratch_db.query(letters, pair.group)),
                     timeout=120, what="every dead letter of the spell compensated by itself", workers=workers)
            assert {row["reason"] for row in scratch_db.query(letters, pair.group)} <= {"deadline_exceeded"}
    finally:
        fakes.stop()


def test_slow_commits_slow_the_workers_down_and_take_none_out(settings, topics, spawn_worker, scratch_db, proxied):
    # Commits of 4 s, twice a heartbeat's interval: the beats land late, calls go on, slower.
    spell(settings, topics, spawn_worker, scratch_db, *proxied, 4.0, done_during=True)


def test_commits_too_slow_for_a_safe_call_hold_the_workers_without_taking_them_out(settings, topics, spawn_worker,
                                                                                   scratch_db, proxied):
    # Commits of 11 s: a heartbeat lands 11 s after it was sent, too late for a 5 s call to end before
    # another worker may take this one for dead. Nothing is claimed while it lasts, and no worker exits.
    spell(settings, topics, spawn_worker, scratch_db, *proxied, 11.0, done_during=False)
