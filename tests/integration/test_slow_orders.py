"""A slow call holds up only its own order, with a real `faust -A app worker` and the fake providers
in another process: the records of other orders after it in the same partition are finished and
acknowledged while it hangs, the commit goes up to it and never past it, a kill -9 in that state
loses nothing and calls nothing twice, and a rebalance waits for it only so long
(``KAFKA_REVOKE_GRACE_SECONDS``), then gives it up: not committed, read again by the next owner,
its waybill issued once."""

from __future__ import annotations

import asyncio

from harness.events import event, order_no, record
from harness.fakes import FakesProcess
from harness.services import caught_up, committed_offsets, group_state, produce, wait_for

LIFE = ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM")


def test_a_kill_while_an_order_waits_behind_its_slow_call_commits_nothing_past_it_and_loses_nothing(
        settings, topics, spawn_worker, scratch_db):
    fakes = FakesProcess()
    try:
        pair = topics(partitions=1)
        slow = order_no(prefix="SLOW")
        before = [order_no(prefix="QUICK") for _ in range(20)]
        after = [order_no(prefix="QUICK") for _ in range(20)]
        others = before + after
        # Its waybill call hangs past the client's timeout (3 s), every time: it is retried with the
        # default backoff until its batch's deadline (15 s), so it is in flight for all of that.
        fakes.configure({"waybill": {"hang_orders": [slow], "timeout_ms": 20_000}})
        worker = spawn_worker(pair, "w1", **fakes.env(), BATCH_WITHIN_SECONDS="0.3",
                              BROKER_COMMIT_INTERVAL_SECONDS="0.5")
        # One partition. First the slow order's CREATED and PAID, done and committed...
        asyncio.run(produce(settings, pair.events, [record(event(slow, kind)) for kind in LIFE[:2]]))
        wait_for(lambda: caught_up(settings, pair.events, pair.group, 1), timeout=90,
                 what="the slow order paid", workers=[worker])
        # ... then other orders, its CONFIRM (offset 2 + 3 x 20 = 62), and more other orders.
        docs = [event(o, kind) for o in before for kind in LIFE] + [event(slow, "ORDER_CONFIRM")]
        docs += [event(o, kind) for o in after for kind in LIFE]
        asyncio.run(produce(settings, pair.events, [record(d) for d in docs]))
        confirm = 2 + 3 * len(before)
        marks = ", ".join(["%s"] * len(others))

        def others_done() -> bool:
            return scratch_db.scalar(f"SELECT COUNT(*) FROM t_order WHERE order_no IN ({marks}) AND status = 3",
                                     *others) == len(others)

        def committed() -> int:
            return asyncio.run(committed_offsets(settings, pair.group, pair.events, 1)).get(0, -1)

        wait_for(others_done, timeout=90, what="every other order confirmed", workers=[worker])
        wait_for(lambda: committed() >= confirm, timeout=30, what="the commit up to the slow record",
                 workers=[worker])
        letters = scratch_db.scalar("SELECT COUNT(*) FROM t_compensation WHERE order_no = %s", slow)
        assert letters == 0, "the slow record was dead-lettered before the kill: the test saw nothing in flight"
        assert committed() == confirm, "committed past a record still in flight"
        worker.kill()
        worker.wait_exit(30)
        assert committed() == confirm

        fakes.configure({"waybill": {"hang_orders": []}})
        again = spawn_worker(pair, "w2", **fakes.env(), BATCH_WITHIN_SECONDS="0.3")
        wait_for(lambda: caught_up(settings, pair.events, pair.group, 1), timeout=120,
                 what="order-event committed to its end", workers=[again])
        assert scratch_db.scalar("SELECT status FROM t_order WHERE order_no = %s", slow) == 3
        assert others_done()
        book = fakes.ledger()
        assert {o: len(book["waybills"].get(o, [])) for o in [slow, *others]} == {o: 1 for o in [slow, *others]}
    finally:
        fakes.stop()


def test_a_partition_never_committed_commits_nothing_while_its_first_order_hangs(
        settings, topics, spawn_worker, scratch_db):
    # Records are acknowledged as they finish, so a partition's first records may be in flight while
    # later ones are acknowledged: its first commit must start where its records began.
    fakes = FakesProcess()
    try:
        pair = topics(partitions=1)
        slow = order_no(prefix="SLOW")
        others = [order_no(prefix="QUICK") for _ in range(20)]
        fakes.configure({"waybill": {"hang_orders": [slow], "timeout_ms": 20_000}})
        docs = [event(slow, kind) for kind in LIFE] + [event(o, kind) for o in others for kind in LIFE]
        asyncio.run(produce(settings, pair.events, [record(d) for d in docs]))
        worker = spawn_worker(pair, "w1", **fakes.env(), BATCH_WITHIN_SECONDS="0.3",
                              BROKER_COMMIT_INTERVAL_SECONDS="0.5")
        marks = ", ".join(["%s"] * len(others))
        wait_for(lambda: scratch_db.scalar(f"SELECT COUNT(*) FROM t_order WHERE order_no IN ({marks}) "
                                           "AND status = 3", *others) == len(others),
                 timeout=90, what="every other order confirmed", workers=[worker])
        # Their records are acknowledged: give the worker's commit timer (0.5 s) a few turns by
        # waiting for the heartbeat row to move on twice (a condition, not a sleep).
        beat = "SELECT MAX(UNIX_TIMESTAMP(last_seen)) FROM t_worker"
        first = scratch_db.scalar(beat)
        wait_for(lambda: scratch_db.scalar(beat) > first + 2, timeout=30, what="two heartbeats", workers=[worker])
        assert scratch_db.scalar("SELECT COUNT(*) FROM t_compensation WHERE order_no = %s", slow) == 0
        assert asyncio.run(committed_offsets(settings, pair.group, pair.events, 1)).get(0, -1) <= 0
        worker.kill()
        worker.wait_exit(30)
    finally:
        fakes.stop()


def test_a_rebalance_gives_up_an_order_waiting_behind_its_slow_call_commits_nothing_past_it_and_calls_once(
        settings, topics, spawn_worker, scratch_db):
    fakes = FakesProcess()
    try:
        pair = topics(partitions=1)
        slow = order_no(prefix="SLOW")
        others = [order_no(prefix="QUICK") for _ in range(20)]
        # Its waybill call hangs past the client's timeout (3 s), every time, retried until the batch's
        # deadline (40 s): the rebalance below comes long before that.
        fakes.configure({"waybill": {"hang_orders": [slow], "timeout_ms": 20_000}})
        env = dict(fakes.env(), BATCH_WITHIN_SECONDS="0.3", BROKER_COMMIT_INTERVAL_SECONDS="0.5",
                   BATCH_DEADLINE_SECONDS="40", BROKER_SESSION_TIMEOUT_SECONDS="45", KAFKA_REVOKE_GRACE_SECONDS="1")
        first = spawn_worker(pair, "w1", **env)
        # First the slow order's CREATED and PAID, done and committed, then its CONFIRM (offset 2) and
        # the other orders after it.
        asyncio.run(produce(settings, pair.events, [record(event(slow, kind)) for kind in LIFE[:2]]))
        wait_for(lambda: caught_up(settings, pair.events, pair.group, 1), timeout=90,
                 what="the slow order paid", workers=[first])
        docs = [event(slow, "ORDER_CONFIRM")] + [event(o, kind) for o in others for kind in LIFE]
        asyncio.run(produce(settings, pair.events, [record(d) for d in docs]))
        confirm = 2
        marks = ", ".join(["%s"] * len(others))

        def others_done() -> bool:
            return scratch_db.scalar(f"SELECT COUNT(*) FROM t_order WHERE order_no IN ({marks}) AND status = 3",
                                     *others) == len(others)

        def committed() -> int:
            return asyncio.run(committed_offsets(settings, pair.group, pair.events, 1)).get(0, -1)

        def slow_unfinished() -> bool:
            # Its record ends with its waybill issued or with its dead letter: neither yet.
            return (scratch_db.scalar("SELECT COUNT(*) FROM t_compensation WHERE order_no = %s", slow) == 0
                    and not fakes.ledger()["waybills"].get(slow))

        wait_for(others_done, timeout=90, what="every other order confirmed", workers=[first])
        wait_for(lambda: committed() == confirm, timeout=30, what="the commit up to the slow record", workers=[first])
        assert slow_unfinished(), "the slow record finished before the rebalance: the test saw nothing in flight"

        # A second worker joins: the group cannot be stable again before the first has left the revoke.
        second = spawn_worker(pair, "w2", **env)
        wait_for(lambda: asyncio.run(group_state(settings, pair.group)) == ("Stable", 2), timeout=90,
                 what="the group stable with both workers", workers=[first, second])
        assert slow_unfinished(), "the rebalance waited for the slow record to finish"
        assert "are given up" in first.logs()
        assert committed() == confirm, "a record given up was committed"

        # The provider answers again: the first worker's call goes through under its claim, and the
        # partition's owner reads the record again and finds it done.
        fakes.configure({"waybill": {"hang_orders": []}})
        wait_for(lambda: caught_up(settings, pair.events, pair.group, 1), timeout=120,
                 what="order-event committed to its end", workers=[first, second])
        wait_for(lambda: scratch_db.scalar("SELECT status FROM t_order WHERE order_no = %s", slow) == 3,
                 timeout=60, what="the slow order confirmed", workers=[first, second])
        book = fakes.ledger()
        assert {o: len(book["waybills"].get(o, [])) for o in [slow, *others]} == {o: 1 for o in [slow, *others]}
        assert scratch_db.scalar("SELECT COUNT(*) FROM t_compensation WHERE order_no = %s", slow) == 0
    finally:
        fakes.stop()
