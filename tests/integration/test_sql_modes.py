"""The SQL under each sql_mode (``harness/sql_modes.py``): the sessions really have the
mode, and every read the web views, the CLI, the sweep, the gauges and the timers make runs
under it, with the answers the rows planted imply. The workers run these only in the
modules that start real workers; here they run in this process, once per mode.

And the one statement whose meaning depended on how the server orders the assignments of an
``ON DUPLICATE KEY UPDATE``: the named lease, under MariaDB's SIMULTANEOUS_ASSIGNMENT too."""

from __future__ import annotations

import asyncio
from contextlib import closing

import pytest
from alembic.util import CommandError

from app.adapters.mysql import MySqlStore
from app.adapters.mysql.clock import DatabaseClock
from app.adapters.mysql.engine import create_engine, session_sql_mode
from app.adapters.mysql.leases import MySqlLeases
from app.adapters.mysql.ledger.selection import QueueFilter
from app.adapters.mysql.partitions import CATCH_ALL, Partitions
from app.adapters.mysql.reads.backlog import Watch
from app.adapters.mysql.reads.console import Queries
from app.adapters.mysql.reads.view_audit import Seen, ViewAudit
from app.adapters.mysql.skipped_types import SkippedTypes
from app.pipeline.states import LedgerStatus as Status
from harness import sql_modes
from harness.desk import desk
from harness.events import event, order_no
from harness.pipeline import ev, paid_orders
from harness.services import ScratchDatabase, connect

settings, scratch_db = sql_modes.each_sql_mode()


async def session_mode(settings, db) -> str:
    engine = create_engine(settings, url=db.url, pool_size=1)
    try:
        async with engine.connect() as conn:
            return (await conn.exec_driver_sql("SELECT @@SESSION.sql_mode")).scalar()
    finally:
        await engine.dispose()


async def test_the_engine_and_the_tests_own_sessions_have_the_mode(settings, scratch_db):
    expected = set((settings.database.sql_mode or scratch_db.scalar("SELECT @@GLOBAL.sql_mode")).split(","))
    assert set((await session_mode(settings, scratch_db)).split(",")) == expected      # the server sorts them
    assert set(scratch_db.scalar("SELECT @@SESSION.sql_mode").split(",")) == expected


@sql_modes.server_only
@pytest.mark.parametrize("before, after", [
    ("STRICT_TRANS_TABLES,NO_BACKSLASH_ESCAPES,NO_ZERO_DATE", "STRICT_TRANS_TABLES,NO_ZERO_DATE"),
    ("NO_BACKSLASH_ESCAPES,STRICT_TRANS_TABLES", "STRICT_TRANS_TABLES"),
    ("STRICT_TRANS_TABLES,NO_BACKSLASH_ESCAPES", "STRICT_TRANS_TABLES"),
    ("NO_BACKSLASH_ESCAPES", ""),
    ("STRICT_TRANS_TABLES,ANSI_QUOTES", "STRICT_TRANS_TABLES,ANSI_QUOTES"),
])
def test_a_server_mode_with_no_backslash_escapes_loses_that_mode_alone(settings, scratch_db, before, after):
    """With DB_SQL_MODE unset a session keeps the server's mode, but never NO_BACKSLASH_ESCAPES:
    aiomysql escapes bytes with backslashes whatever the mode (a quote in a record would end its
    literal). The server's global mode is not ours to set, so the session plays it."""
    with closing(connect(scratch_db.url, sql_mode="STRICT_TRANS_TABLES")) as conn, conn.cursor() as cur:
        cur.execute(f"SET SESSION sql_mode = '{before}'")
        cur.execute(f"SET SESSION {session_sql_mode(None)}")
        cur.execute("SELECT @@SESSION.sql_mode AS mode")
        assert set(filter(None, cur.fetchone()["mode"].split(","))) == set(filter(None, after.split(",")))


@sql_modes.server_only
def test_the_migrations_session_takes_the_mode(settings):
    """A mode the server refuses stops the migration: it reached the migration's session."""
    db = ScratchDatabase(settings.database.url, sql_mode="NO_SUCH_MODE").create(migrated=False)
    try:
        with pytest.raises(CommandError, match="refused our session .*1231.*NO_SUCH_MODE"):   # ER_WRONG_VALUE_FOR_VAR
            db.migrate()
        with closing(connect(db.url)) as conn, conn.cursor() as cur:
            assert cur.execute("SHOW TABLES") == 0
    finally:
        db.drop()


async def test_every_read_of_the_views_the_sweep_and_the_gauges_answers_under_the_mode(harness):
    d = await desk(harness)
    [order] = await paid_orders(d.main, 1, "MODES")
    [confirmed] = await d.main.run([ev(order, "ORDER_CONFIRM")])
    assert confirmed.outcome == "applied"
    [letter] = await d.dead_letters([event(order, "ORDER_PAID", data={"amount_cents": 1})])   # a new payload
    store: MySqlStore = d.main.store
    queries = Queries(store, group=d.group)
    [row] = await queries.compensations(QueueFilter(order_no=order))
    assert row["status"] == "manual" and row["order_no"] == order
    assert [r["id"] for r in await queries.compensations(QueueFilter(status=Status.MANUAL, before_id=row["id"] + 1,
                                                                       older_than_seconds=0))] == [row["id"]]
    counts = await queries.counts()
    assert counts["by_status"] == {"manual": 1} and counts["by_reason_unsettled"] == {row["reason"]: 1}
    discarded = await d.compensator.perform(row["id"], "discard", d.guard, actor="web:modes", note="a test")
    assert discarded.found
    detail = await queries.compensation(row["id"])
    assert detail["status"] == "discarded" and detail["record_value"]
    assert [(h["action"], h["from_status"], h["to_status"]) for h in detail["history"]] == [
        ("discard", "manual", "discarded")]
    assert (await queries.order(order))["status"] == "confirmed"
    steps = await queries.idem_of_order(order)
    assert f"{order}:ORDER_CONFIRM:issue_waybill" in {s["biz_key"] for s in steps} and len(steps) >= 3
    assert [s["status"] for s in await queries.idem([f"{order}:ORDER_CONFIRM:issue_waybill"])] == ["done"]
    assert [r["order_no"] for r in await queries.receipts(order)] == [order]
    assert [r["id"] for r in await queries.dead_letters_of_order(order)] == [row["id"]]
    assert all(r["status"] == "pending" for r in await queries.stuck(0, 10))
    await queries.ping()
    audit = ViewAudit(store, group=d.group)
    for what in ("dead_letter", "timeline"):
        await audit.record(Seen("web:modes", "operator", what, f"/x/{what}", compensation_id=row["id"], order_no=order))
    [newest] = await audit.recent(limit=1)
    assert [r["what"] for r in await audit.recent(limit=5, before_id=newest["id"])] == ["dead_letter"]

    watch = Watch(store)
    [late] = await watch.late_letters(d.group, [Status.DISCARDED], 0, 10)
    assert late.id == row["id"] and late.age_seconds >= 0
    stuck = await watch.stuck(0, 5)
    assert [(r.gmt_modified, r.biz_key) for r in stuck] == sorted((r.gmt_modified, r.biz_key) for r in stuck)
    gauges = await watch.gauges(group=d.group, stuck_after_seconds=3600, attempt_cap=20)
    assert gauges.compensation_by_status == {"open": 0, "retrying": 0, "manual": 0}   # settled: discarded
    assert gauges.oldest_manual_seconds == 0 and gauges.idem_rows >= 0

    partitions = Partitions(store)
    parts = await partitions.list()
    assert parts[-1].name == CATCH_ALL and parts[-1].below is None
    rows, bytes_per_row = await partitions.size()
    assert rows >= 0 and bytes_per_row > 0
    assert abs(await DatabaseClock().sync(store)) < 60

    skipped = SkippedTypes(store, group=d.group)
    await skipped.add({"ORDER_SHIPPED": (2, ("t", 0, 9)), "ORDER_RETURNED": (1, None)})
    assert await skipped.census(declared={"ORDER_SHIPPED"}, new_within_seconds=3600) == (2, 1)
    assert await skipped.census(declared=(), new_within_seconds=3600) == (2, 2)
    await asyncio.sleep(0.05)
    assert await skipped.census(declared=(), new_within_seconds=0.01) == (2, 0)        # first seen 50 ms ago
    assert [t["event_type"] for t in await skipped.list()] == ["ORDER_SHIPPED", "ORDER_RETURNED"]


@pytest.mark.parametrize("assignment", ["", "SIMULTANEOUS_ASSIGNMENT"], ids=["left-to-right", "simultaneous"])
async def test_a_lease_taken_over_is_live_however_the_server_orders_the_assignments(settings, scratch_db,
                                                                                    assignment):
    """MariaDB's SIMULTANEOUS_ASSIGNMENT evaluates every assignment of an ``ON DUPLICATE KEY
    UPDATE`` from the row as it was: a lease whose expiry moved only if the *new* owner was us
    was taken over already expired, and the next worker took it at once."""
    mode = ",".join(filter(None, [settings.database.sql_mode or scratch_db.scalar("SELECT @@GLOBAL.sql_mode"),
                                  assignment]))
    engine = create_engine(settings.model_copy(update={"db_sql_mode": mode}), url=scratch_db.url)
    try:
        leases = MySqlLeases(MySqlStore(engine))
        name = f"modes:{order_no()}"
        assert await leases.acquire(name, "a", 0.2)
        assert not await leases.acquire(name, "b", 30)                # a's lease is live
        await asyncio.sleep(0.3)
        assert await leases.acquire(name, "b", 30)                    # a's ran out: b takes it ...
        assert not await leases.acquire(name, "a", 30)                # ... for 30 s
        assert await leases.acquire(name, "b", 30)                    # and renews its own
        await leases.release(name, "b")                               # its lease ends now:
        await asyncio.sleep(0.01)                                     # a millisecond later it has ended
        assert await leases.acquire(name, "a", 30)
    finally:
        await engine.dispose()


async def test_a_bulk_job_runs_its_statements_under_the_mode(harness):
    """The bulk job's statements (``app.adapters.mysql.ledger.bulk_jobs``): dry run, the job and its items,
    its lease, a chunk recorded, done; a pause and an abort."""
    from app.adapters.mysql.ledger.bulk_jobs import MySqlBulkJobs
    from app.compensation.bulk import BulkRunner

    d = await desk(harness)
    orders = await paid_orders(d.main, 3, "MODESBULK")
    await d.dead_letters([event(o, "ORDER_PAID", data={"amount_cents": 1}) for o in orders])   # manual
    jobs = MySqlBulkJobs(d.main.store, group=d.group)
    f = QueueFilter(status=Status.MANUAL, older_than_seconds=0)
    found = await jobs.dry_run(f, cap=10, sample=2)
    assert found["count"] == 3 and len(found["sample"]) == 2 and not found["capped"]
    job = await jobs.create("discard", f, expected=3, tolerance_percent=1, cap=10, actor="web:modes", note="n")
    assert job["total"] == 3 and job["status"] == "running" and job["filter"]["status"] == "manual"

    async def work(j, ids, guard, held):
        return await d.compensator.bulk(j.action, ids, guard, actor=j.actor, note=j.note, job_id=j.id, held=held)

    runner = BulkRunner(jobs, work, group=d.group, owner="modes/bulk/1", lease_seconds=30, chunk_size=2, rate=1e6,
                        busy_retry_seconds=1)
    while await runner.step(d.guard) is not None and runner.held is not None:
        pass
    done = await jobs.get(job["id"])
    assert (done["status"], done["done"], done["changed"], done["remaining"]) == ("done", 3, 3, 0)
    assert [j["id"] for j in await jobs.jobs()] == [job["id"]] and await jobs.failures(job["id"]) == []
    assert await jobs.take(d.group, "another/bulk/2", 30) is None                        # nothing runs now
    more = await paid_orders(d.main, 1, "MODESBULK2")
    await d.dead_letters([event(o, "ORDER_PAID", data={"amount_cents": 1}) for o in more])
    other = await jobs.create("resolve", f, expected=1, tolerance_percent=0, cap=10, actor="cli:modes", note=None)
    paused, changed = await jobs.command(other["id"], "pause", actor="web:p")
    assert changed and paused["status"] == "paused" and paused["paused_by"] == "web:p"
    aborted, _ = await jobs.command(other["id"], "abort", actor="web:a")
    assert aborted["status"] == "aborted" and aborted["remaining"] == 1 and aborted["finished_at"] is not None
