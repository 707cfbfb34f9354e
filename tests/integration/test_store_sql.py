"""The store's SQL on its own: the database refuses what the state machines forbid,
and lock waits are retried."""

from __future__ import annotations

import asyncio
import itertools
from datetime import date

import pymysql
import pytest
from sqlalchemy.exc import IntegrityError

from app.adapters.mysql import MySqlStore, MySqlTransaction, idem, orders
from app.adapters.mysql.engine import create_engine
from app.pipeline.errors import Conflict, EffectRejected, EffectUnavailable
from app.pipeline.model import BatchPlan, EffectJob, FailRow, NewRow, Reclaim
from app.pipeline.ports import Finished, Receipt
from app.pipeline.states import IdemStatus, Order, OrderStatus, idem_move_allowed
from app.pipeline.steps import ISSUE_WAYBILL
from harness import sql_modes
from harness.services import connect

# Every database test here runs under the server's sql_mode and under MySQL 8's.
settings, scratch_db = sql_modes.each_sql_mode()

DAY = date(2026, 11, 29)
ME = "owner/main/1"
_serial = itertools.count(1)


def job(key: str, attempt: int = 1) -> EffectJob:
    return EffectJob(0, "ORD-20261129-SQL", key, DAY, "issue_waybill", ISSUE_WAYBILL, "tok", attempt, {},
                     OrderStatus.CONFIRMED)


def moves_to(target: IdemStatus):
    """Every store write that would move a row to ``target``; each returns True if it moved it."""
    async def reclaim(tx: MySqlTransaction, key: str) -> bool:
        try:
            await tx.apply_plan(BatchPlan(events=[], reclaims=[Reclaim(key, DAY, 1)]), owner=ME, lease_seconds=30)
        except Conflict:
            return False
        return True

    async def mark_done(tx, key):
        return bool(await tx.finish_effects([Finished(job(key), receipt=Receipt(reference="WB1"))],
                                            owner=ME))

    async def fail_in_t3(tx, key):
        return bool(await tx.finish_effects([Finished(job(key), error=EffectRejected("no"))], owner=ME))

    async def fail_in_t1(tx, key):
        return await idem.fail(tx._exec, FailRow(key, DAY, 1, "unknown_outcome_non_idempotent", "x"))

    return {IdemStatus.PENDING: [reclaim],
            IdemStatus.DONE: [mark_done],
            IdemStatus.FAILED: [fail_in_t3, fail_in_t1]}[target]


@pytest.fixture
async def store(settings, scratch_db):
    engine = create_engine(settings, url=scratch_db.url)
    yield MySqlStore(engine, lock_retries=0)
    await engine.dispose()


def insert_row(db, status: IdemStatus, *, expired: bool = True) -> str:
    key = f"ORD-20261129-SQL{next(_serial):05d}:ORDER_CONFIRM:issue_waybill"
    db.query("INSERT INTO t_idem (biz_key, part_date, step, status, attempt, owner, lease_until, idem_token, "
             "payload_hash, outcome) VALUES (%s, %s, 'issue_waybill', %s, 1, %s, "
             f"NOW(3) + INTERVAL {-60 if expired else 60} SECOND, 'tok', 'h', 'x')", key, DAY, int(status), ME)
    return key


ILLEGAL = [(src, dst) for src in (IdemStatus.DONE, IdemStatus.FAILED) for dst in IdemStatus
           if not idem_move_allowed(src, dst)]


@pytest.mark.parametrize("src, dst", ILLEGAL, ids=[f"{s.name}->{d.name}" for s, d in ILLEGAL])
async def test_terminal_rows_refuse_every_write(store, scratch_db, src, dst):
    key = insert_row(scratch_db, src)
    before = scratch_db.query("SELECT * FROM t_idem WHERE biz_key = %s", key)
    for write in moves_to(dst):
        async with store.engine.connect() as conn:
            moved = await write(MySqlTransaction(conn, store), key)
            await conn.commit()
        assert moved is False, f"{write.__name__} moved a {src.name} row"
        assert scratch_db.query("SELECT * FROM t_idem WHERE biz_key = %s", key) == before
    assert not scratch_db.query("SELECT * FROM t_waybill_receipt WHERE biz_key = %s", key)


async def test_a_key_cannot_be_inserted_twice(store, scratch_db):
    key = insert_row(scratch_db, IdemStatus.DONE)
    async with store.engine.connect() as conn:
        with pytest.raises(IntegrityError):
            await MySqlTransaction(conn, store).apply_plan(
                BatchPlan(events=[], inserts=[NewRow(key, DAY, "issue_waybill", IdemStatus.PENDING, "h")]),
                owner=ME, lease_seconds=30)


async def test_fencing_pending_row_refuses_a_stale_attempt_and_a_live_lease(store, scratch_db):
    key = insert_row(scratch_db, IdemStatus.PENDING, expired=False)
    async with store.engine.connect() as conn:
        tx = MySqlTransaction(conn, store)
        assert await tx.finish_effects([Finished(job(key, attempt=2), receipt=Receipt(reference="WB"))],
                                       owner=ME) == set()                 # wrong attempt
        assert await tx.finish_effects([Finished(job(key), receipt=Receipt(reference="WB"))],
                                       owner="someone/else") == set()    # not the owner
        with pytest.raises(Conflict):                                     # live lease of another owner
            await tx.apply_plan(BatchPlan(events=[], reclaims=[Reclaim(key, DAY, 1)]), owner="someone/else",
                                lease_seconds=30)
        assert await tx.finish_effects([Finished(job(key), error=EffectUnavailable("503"))], owner=ME) == {key}
        await conn.commit()
    [row] = scratch_db.query("SELECT status, attempt, outcome FROM t_idem WHERE biz_key = %s", key)
    assert (row["status"], row["attempt"], row["outcome"]) == (1, 1, "effect_unavailable")


async def test_order_rank_never_goes_down_in_sql(store, scratch_db):
    """A lower rank never moves the order back and never overwrites a field; it only fills an
    empty one (a late payment's amount on a cancelled order), and the first value stands."""
    order = f"ORD-20261129-SQLO{next(_serial):05d}"
    scratch_db.query("INSERT INTO t_order (order_no, status, cancel_reason) VALUES (%s, 4, 'gone')", order)
    for paid, reason in ((5, "other"), (7, None)):
        async with store.engine.connect() as conn:
            await orders.upsert(MySqlTransaction(conn, store)._exec,
                                [Order(order, OrderStatus.PAID, paid_cents=paid, cancel_reason=reason)])
            await conn.commit()
    [row] = scratch_db.query("SELECT status, paid_cents, cancel_reason FROM t_order WHERE order_no = %s", order)
    assert (row["status"], row["paid_cents"], row["cancel_reason"]) == (4, 5, "gone")


async def test_lock_wait_timeout_is_retried_until_the_lock_is_released(settings, scratch_db):
    """Another session holds the order row; T1 times out waiting (1205) and reruns."""
    engine = create_engine(settings.model_copy(update={"db_lock_wait_timeout_seconds": 1}), url=scratch_db.url)
    store = MySqlStore(engine, lock_retries=5)
    order = f"ORD-20261129-SQLL{next(_serial):05d}"
    scratch_db.query("INSERT INTO t_order (order_no, status) VALUES (%s, 1)", order)
    holder = connect(scratch_db.url)
    holder.autocommit(False)
    with holder.cursor() as cur:
        cur.execute("SELECT * FROM t_order WHERE order_no = %s FOR UPDATE", (order,))

    async def release_later():
        await asyncio.sleep(2.5)
        holder.commit()

    async def locked_read(tx):
        return await tx.read_orders([order])

    try:
        before = store.round_trips
        result, _ = await asyncio.gather(store.in_transaction(locked_read), release_later())
        assert result[order].status is OrderStatus.CREATED
        assert store.round_trips - before >= 3            # at least two timed-out tries, then success
    finally:
        holder.close()
        await engine.dispose()


async def test_unreachable_database_is_store_unavailable(settings):
    from app.pipeline.errors import StoreUnavailable
    engine = create_engine(settings, url="mysql+aiomysql://idem:idem@127.0.0.1:1/idem")
    try:
        with pytest.raises(StoreUnavailable):
            await MySqlStore(engine).in_transaction(lambda tx: tx.read_orders(["ORD-20261129-X"]))
    finally:
        await engine.dispose()


def test_pymysql_is_the_pinned_line():
    assert pymysql.VERSION[:2] == (1, 1), "aiomysql 0.3.2 breaks with PyMySQL >= 1.2.1"
