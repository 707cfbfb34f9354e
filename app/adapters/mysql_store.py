"""The pipeline's store on MySQL / MariaDB (SQLAlchemy engine, aiomysql driver).

Every method of :class:`MySqlTransaction` is one statement: a whole batch
costs a handful of round trips, whatever its size. Each write repeats its
rule as a SQL condition (status, attempt, owner, lease), so the database
refuses a move the state machine forbids even if the caller asked for it.

Every statement and every transaction has a client-side time limit: a
connection whose peer vanished (a half-open TCP connection, a network cut
that drops packets instead of refusing them) would otherwise wait for the
kernel's keepalive, two hours by default, while the worker keeps
heartbeating and nobody notices. A timed-out connection is discarded, never
returned to the pool, and the timeout is an infrastructure failure
(:class:`StoreUnavailable`), like a refused connection or an exhausted pool.

A transaction re-run after its commit was lost (the connection died during
COMMIT) must not mistake its own earlier success for somebody else's: T3's
fenced writes count a row already moved by this owner and attempt to the
same place as their own.

Two MariaDB/MySQL traps shape the SQL here:

* ``INSERT ... ON DUPLICATE KEY UPDATE`` assignments run left to right and
  each sees the columns already updated; a column that a later condition
  reads must be assigned last (``status`` in the ``t_order`` upsert).
* SQLAlchemy's MySQL dialects connect with CLIENT_FOUND_ROWS, so affected-row
  counts of an upsert say nothing about who won. Claims are decided under
  ``SELECT ... FOR UPDATE`` and fenced writes are checked by matched rows.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
from datetime import date, datetime
from typing import Awaitable, Callable, Sequence, TypeVar

from sqlalchemy.exc import DBAPIError, InterfaceError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.pipeline.errors import PipelineError, StoreUnavailable
from app.pipeline.plan import NOT_DELIVERED, BatchPlan, IdemRow, Order
from app.pipeline.ports import DeadLetter, Finished
from app.pipeline.states import IdemStatus, OrderStatus
from app.pipeline.steps import Effect

log = logging.getLogger(__name__)
T = TypeVar("T")

# Deadlock, lock-wait timeout (MySQL), and MariaDB's "record changed since last read".
LOCK_ERRORS = {1213, 1205, 1020}
# Lost races on an insert: somebody else inserted the same key first. The rerun sees it.
RACE_ERRORS = {1062}
# The server is gone, or never was.
CONNECTION_ERRORS = {2002, 2003, 2005, 2006, 2013, 2014, 2045, 2055, 1040, 1053}


class Conflict(Exception):
    """A fenced write matched fewer rows than the reads under lock promised; rerun the transaction."""


class StoreFailure(PipelineError):
    """The database refused a statement for a reason a retry will not fix (a bug or bad data)."""

    reason = "store_error"


def _marks(n: int, group: str = "%s") -> str:
    return ", ".join([group] * n)


# Values made of these characters are written into the SQL text as they are,
# quoted: without quotes or backslashes they cannot end the literal. Keys,
# hashes, tokens and dates all qualify (order numbers are validated ASCII), so
# a 500-row statement needs no per-value escaping in Python -- that escaping
# was a quarter of a batch's CPU time. Anything else goes through the driver.
_INLINE = re.compile(r"[A-Za-z0-9:_./+\-]*")


class _Sql:
    """Builds a statement: ``lit`` inlines a value when that is safe, else adds a parameter.
    Call it once per place the value appears: a parameter fills one ``%s``."""

    def __init__(self) -> None:
        self.params: list = []

    def lit(self, value) -> str:
        if value is None:
            return "NULL"
        if isinstance(value, bool):
            return "1" if value else "0"
        if isinstance(value, int):
            return str(int(value))
        if isinstance(value, date) and not isinstance(value, datetime):
            return f"'{value.isoformat()}'"
        if isinstance(value, str) and _INLINE.fullmatch(value):
            return f"'{value}'"
        self.params.append(value)
        return "%s"

    def tuple(self, *values) -> str:
        return "(" + ", ".join(self.lit(v) for v in values) + ")"

    def list(self, values) -> str:
        return ", ".join(self.lit(v) for v in values)


def _error_code(exc: DBAPIError) -> int | None:
    args = getattr(exc.orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


class MySqlStore:
    """Runs pipeline transactions with lock-error retries and time limits; counts round trips."""

    def __init__(self, engine: AsyncEngine, *, lock_retries: int = 5, statement_timeout: float = 15.0,
                 transaction_timeout: float = 30.0,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.engine = engine
        self.lock_retries = lock_retries
        self.statement_timeout = statement_timeout
        self.transaction_timeout = transaction_timeout
        self.round_trips = 0
        self._sleep = sleep

    async def in_transaction(self, work: Callable[["MySqlTransaction"], Awaitable[T]]) -> T:
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._attempt(work)
            except (Conflict, DBAPIError) as exc:
                code = None if isinstance(exc, Conflict) else _error_code(exc)
                retriable = isinstance(exc, Conflict) or code in LOCK_ERRORS or code in RACE_ERRORS
                if retriable and attempt <= self.lock_retries:
                    delay = random.uniform(0.005, 0.05) * attempt
                    log.info("transaction rerun %d after %s", attempt, exc.__class__.__name__ if code is None
                             else f"MySQL error {code}")
                    await self._sleep(delay)
                    continue
                if isinstance(exc, DBAPIError) and (code in CONNECTION_ERRORS or exc.connection_invalidated
                                                    or isinstance(exc, InterfaceError)):
                    # A pooled connection may have died with a server restart: one fresh try.
                    if attempt == 1:
                        continue
                    raise StoreUnavailable(f"database unreachable: {exc.orig!r}") from exc
                if retriable:
                    raise StoreUnavailable(f"still conflicting after {attempt} runs: {exc}") from exc
                raise StoreFailure(f"database refused a statement: {getattr(exc, 'orig', exc)!r}") from exc
            except TimeoutError as exc:     # before OSError: TimeoutError is one
                raise StoreUnavailable(f"database did not answer in time ({exc or 'client-side timeout'})") from exc
            except PoolTimeout as exc:
                # Every pooled connection is busy: a wait for the infrastructure like any other.
                raise StoreUnavailable(f"no database connection free: {exc}") from exc
            except OSError as exc:
                if attempt == 1:
                    continue
                raise StoreUnavailable(f"database unreachable: {exc!r}") from exc

    async def _attempt(self, work: Callable[["MySqlTransaction"], Awaitable[T]]) -> T:
        """One try: checkout, ``work``, commit, all inside the transaction's time limit.

        A connection that timed out or was cancelled mid-statement is in an unknown
        state (a reply may still be on its way): it is invalidated, not pooled."""
        conn = self.engine.connect()
        started = False
        try:
            async with asyncio.timeout(self.transaction_timeout):
                await conn.start()
                started = True
                result = await work(MySqlTransaction(conn, self))
                await self._bounded(conn.commit())
                self.round_trips += 1
        except BaseException as exc:
            if started:
                await self._discard(conn, broken=isinstance(exc, (TimeoutError, asyncio.CancelledError)))
            raise
        # Committed: a connection that fails to go back to the pool is dropped, the result stands.
        await self._discard(conn, broken=False)
        return result

    async def _discard(self, conn: AsyncConnection, *, broken: bool) -> None:
        """Give the connection back to the pool, or, if it is broken (or giving it back fails), drop it."""
        if not broken:
            try:
                await self._bounded(conn.close())     # rolls back and returns the connection to the pool
                return
            except Exception:
                pass
        try:
            await conn.invalidate()
            await conn.close()
        except Exception:
            log.debug("discarding a broken database connection failed", exc_info=True)

    async def _bounded(self, step: Awaitable[T]) -> T:
        async with asyncio.timeout(self.statement_timeout):
            return await step


class MySqlTransaction:
    """One open transaction; every method is one round trip."""

    def __init__(self, conn: AsyncConnection, store: MySqlStore) -> None:
        self.conn = conn
        self.store = store

    async def _exec(self, sql: str, params: Sequence = ()):
        self.store.round_trips += 1
        return await self.store._bounded(self.conn.exec_driver_sql(sql, tuple(params)))

    # -- T1 ------------------------------------------------------------------

    async def read_idem(self, keys: Sequence[str], part_dates: Sequence[date]) -> dict[str, IdemRow]:
        if not keys:
            return {}
        sql = _Sql()
        # The lease is compared with the database clock, which also wrote it.
        result = await self._exec(
            "SELECT biz_key, status, attempt, owner, idem_token, payload_hash, outcome, last_err, "
            "COALESCE(lease_until < NOW(3), 1), "
            "COALESCE(TIMESTAMPDIFF(MICROSECOND, NOW(3), lease_until), 0) "
            f"FROM t_idem WHERE biz_key IN ({sql.list(keys)}) AND part_date IN ({sql.list(part_dates)}) "
            "FOR UPDATE", sql.params)
        return {row[0]: IdemRow(row[0], IdemStatus(row[1]), row[2], row[3], row[4], row[5], row[6], row[7],
                                bool(row[8]), max(row[9], 0) / 1e6)
                for row in result}

    async def read_orders(self, order_nos: Sequence[str]) -> dict[str, Order]:
        if not order_nos:
            return {}
        sql = _Sql()
        result = await self._exec(
            "SELECT order_no, status, amount_cents, phone, address, paid_cents, cancel_reason, has_dead_letters "
            f"FROM t_order WHERE order_no IN ({sql.list(order_nos)}) FOR UPDATE", sql.params)
        return {row[0]: Order(row[0], OrderStatus(row[1]), *row[2:7], has_dead_letters=bool(row[7]))
                for row in result}

    async def apply_plan(self, plan: BatchPlan, *, owner: str, lease_seconds: float) -> None:
        lease_us = int(lease_seconds * 1_000_000)
        if plan.orders:
            await self._upsert_orders(list(plan.orders.values()))
        if plan.inserts:
            sql = _Sql()
            lease = f"NOW(3) + INTERVAL {lease_us} MICROSECOND"
            values = ", ".join(
                f"({sql.lit(row.biz_key)}, {sql.lit(row.part_date)}, {sql.lit(row.step)}, {int(row.status)}, 1, "
                f"{sql.lit(owner)}, {lease if row.status is IdemStatus.PENDING else 'NULL'}, "
                f"{sql.lit(row.idem_token)}, {sql.lit(row.payload_hash)}, {sql.lit(row.outcome)}, NOW(3), NOW(3))"
                for row in plan.inserts)
            # A plain INSERT: a key someone else inserted meanwhile fails the whole
            # transaction (1062), and the rerun reads it.
            await self._exec(
                "INSERT INTO t_idem (biz_key, part_date, step, status, attempt, owner, lease_until, idem_token, "
                f"payload_hash, outcome, gmt_create, gmt_modified) VALUES {values}", sql.params)
        if plan.reclaims:
            sql = _Sql()
            keys = [r.biz_key for r in plan.reclaims]
            # Fenced: only rows still pending at the attempt we read, whose lease
            # ran out or is ours. attempt + 1 is the new fencing token.
            result = await self._exec(
                f"UPDATE t_idem SET attempt = attempt + 1, owner = {sql.lit(owner)}, outcome = NULL, "
                f"lease_until = NOW(3) + INTERVAL {lease_us} MICROSECOND, gmt_modified = NOW(3) "
                f"WHERE biz_key IN ({sql.list(keys)}) "
                f"AND part_date IN ({sql.list(sorted({r.part_date for r in plan.reclaims}))}) "
                f"AND status = {int(IdemStatus.PENDING)} "
                f"AND (biz_key, attempt) IN ({', '.join(sql.tuple(r.biz_key, r.attempt) for r in plan.reclaims)}) "
                f"AND (lease_until < NOW(3) OR owner = {sql.lit(owner)})", sql.params)
            if result.rowcount != len(keys):
                raise Conflict(f"re-claimed {result.rowcount} of {len(keys)} rows")
        for fail in plan.fails:
            await self._fail_pending(fail.biz_key, fail.part_date, fail.attempt, fail.reason, fail.message)
        if plan.superseding:
            await self._flag_overtaken_letters(sorted(plan.superseding), sorted(plan.batch_keys))

    async def _flag_overtaken_letters(self, order_nos: list[str], batch_keys: list[str]) -> None:
        """Dead letters of these orders now have later events that ran after them."""
        sql = _Sql()
        spare = f" AND (biz_key IS NULL OR biz_key NOT IN ({sql.list(batch_keys)}))" if batch_keys else ""
        await self._exec(
            "UPDATE t_compensation SET may_be_superseded = 1, gmt_modified = NOW(3) "
            f"WHERE order_no IN ({sql.list(order_nos)}) AND may_be_superseded = 0{spare}", sql.params)

    async def _upsert_orders(self, orders: list[Order]) -> None:
        sql = _Sql()
        columns = ((o.order_no, int(o.status), o.amount_cents, o.phone, o.address, o.paid_cents, o.cancel_reason)
                   for o in orders)
        values = ", ".join(f"({sql.list(row)}, NOW(3), NOW(3))" for row in columns)
        # The order's rank only goes up. Columns whose condition reads status
        # come first: each assignment sees the ones before it. A move clears
        # has_dead_letters: the letters it stood for were flagged in this T1.
        await self._exec(
            "INSERT INTO t_order (order_no, status, amount_cents, phone, address, paid_cents, cancel_reason, "
            f"gmt_create, gmt_modified) VALUES {values} "
            "ON DUPLICATE KEY UPDATE "
            "paid_cents = IF(VALUES(status) > status, COALESCE(VALUES(paid_cents), paid_cents), paid_cents), "
            "cancel_reason = IF(VALUES(status) > status, COALESCE(VALUES(cancel_reason), cancel_reason), "
            "cancel_reason), "
            "has_dead_letters = IF(VALUES(status) > status, 0, has_dead_letters), "
            "gmt_modified = IF(VALUES(status) > status, NOW(3), gmt_modified), "
            "status = IF(VALUES(status) > status, VALUES(status), status)", sql.params)

    async def _fail_pending(self, key: str, part_date: date, attempt: int, reason: str, message: str,
                            owner: str | None = None) -> bool:
        fence = (f"biz_key = %s AND part_date = %s AND attempt = %s" + (" AND owner = %s" if owner else ""))
        where = [key, part_date, attempt] + ([owner] if owner else [])
        result = await self._exec(
            f"UPDATE t_idem SET status = {int(IdemStatus.FAILED)}, outcome = %s, last_err = %s, lease_until = NULL, "
            f"gmt_modified = NOW(3) WHERE {fence} AND status = {int(IdemStatus.PENDING)}",
            [reason, message[:512], *where])
        if result.rowcount == 1 or owner is None:
            return result.rowcount == 1
        # A T3 re-run after a lost commit: the row may already be where we put it.
        again = await self._exec(
            f"SELECT 1 FROM t_idem WHERE {fence} AND status = {int(IdemStatus.FAILED)} AND outcome = %s",
            [*where, reason])
        return again.first() is not None

    # -- T3 ------------------------------------------------------------------

    async def finish_effects(self, finished: Sequence[Finished], *, owner: str) -> set[str]:
        """Record how each call ended, fenced on (owner, attempt); return the keys still ours.

        Running it twice with the same outcomes (a re-run after a lost commit) gives
        the same answer and writes nothing more."""
        owned: set[str] = set()
        done = [f for f in finished if f.receipt is not None]
        by_outcome: dict[str, list[Finished]] = {}
        for item in done:
            by_outcome.setdefault(item.receipt.outcome, []).append(item)
        for outcome, items in by_outcome.items():
            owned |= await self._mark_done(outcome, items, owner)
        receipts = [f for f in done if f.job.biz_key in owned and f.job.effect is Effect.WAYBILL]
        if receipts:
            params = [v for f in receipts for v in (f.job.order_no, f.receipt.waybill_no, f.job.token,
                                                   f.job.biz_key, f.job.attempt)]
            # One receipt per order, written only with the fenced pending -> done of
            # its key: an existing one can only be this T3's own, from a lost commit.
            await self._exec(
                "INSERT INTO t_waybill_receipt (order_no, waybill_no, idem_token, biz_key, attempt, gmt_create) "
                f"VALUES {_marks(len(receipts), '(%s, %s, %s, %s, %s, NOW(3))')} "
                "ON DUPLICATE KEY UPDATE order_no = order_no", params)
        for item in finished:
            if item.error is None:
                continue
            job, error = item.job, item.error
            if error.retriable:
                # Stays pending; the note says why, and for a call that surely did not
                # go through, that it did not (so even a non-idempotent one may be claimed again).
                note = NOT_DELIVERED if error.not_delivered else error.reason
                result = await self._exec(
                    "UPDATE t_idem SET outcome = %s, last_err = %s, gmt_modified = NOW(3) WHERE biz_key = %s "
                    f"AND part_date = %s AND status = {int(IdemStatus.PENDING)} AND owner = %s AND attempt = %s",
                    [note, str(error)[:512], job.biz_key, job.part_date, owner, job.attempt])
                ours = result.rowcount == 1
            else:
                ours = await self._fail_pending(job.biz_key, job.part_date, job.attempt, error.reason, str(error),
                                                owner=owner)
            if ours:
                owned.add(job.biz_key)
        return owned

    async def _mark_done(self, outcome: str, items: list[Finished], owner: str) -> set[str]:
        keys = [f.job.biz_key for f in items]
        pairs = [v for f in items for v in (f.job.biz_key, f.job.attempt)]
        dates = sorted({f.job.part_date for f in items})
        fence = (f"biz_key IN ({_marks(len(keys))}) AND part_date IN ({_marks(len(dates))}) "
                 f"AND owner = %s AND (biz_key, attempt) IN ({_marks(len(keys), '(%s, %s)')})")
        result = await self._exec(
            f"UPDATE t_idem SET status = {int(IdemStatus.DONE)}, outcome = %s, last_err = NULL, lease_until = NULL, "
            f"gmt_modified = NOW(3) WHERE {fence} AND status = {int(IdemStatus.PENDING)}",
            [outcome, *keys, *dates, owner, *pairs])
        if result.rowcount == len(keys):
            return set(keys)
        # Some leases were lost (or a lost commit moved them already): find the rows that are ours.
        rows = await self._exec(
            f"SELECT biz_key FROM t_idem WHERE {fence} AND status = {int(IdemStatus.DONE)} AND outcome = %s",
            [*keys, *dates, owner, *pairs, outcome])
        return {row[0] for row in rows}

    # -- dead letters ----------------------------------------------------------

    async def record_dead_letters(self, letters: Sequence[DeadLetter], *, group: str,
                                  retry_after_seconds: int = 60) -> None:
        """One ledger row per letter, keyed by the consumer group and the record's source
        (topic, partition, offset and timestamp: a topic deleted and created again reuses
        offsets, not timestamps): writing the same letter again (a replay after a crash)
        leaves the first row as it is.

        The letters' orders are marked ``has_dead_letters``: their next move (a later
        event, in a later batch) flags these rows ``may_be_superseded``."""
        if not letters:
            return
        params: list = []
        values = []
        for letter in letters:
            record = letter.record
            values.append("(%s, %s, %s, %s, %s, %s, %s, %s, 1, %s, %s, %s, %s, "
                          + (f"NOW(3) + INTERVAL {int(retry_after_seconds)} SECOND" if letter.retriable else "NULL")
                          + ", %s, %s, %s, %s, NOW(3), NOW(3))")
            params += [record.topic, record.partition, record.offset,
                       -1 if record.timestamp_ms is None else record.timestamp_ms, group, letter.order_no,
                       letter.event_id, letter.biz_key, letter.reason[:64], letter.message[:1024], letter.retriable,
                       letter.attempts, letter.may_be_superseded, letter.truncated, letter.worker_id,
                       letter.first_failure_at.replace(tzinfo=None)]
        await self._exec(
            "INSERT INTO t_compensation (src_topic, src_partition, src_offset, src_timestamp, consumer_group, "
            "order_no, event_id, biz_key, status, reason, message, retriable, attempts, next_retry_at, "
            "may_be_superseded, truncated, worker_id, first_failure_at, gmt_create, gmt_modified) "
            f"VALUES {', '.join(values)} ON DUPLICATE KEY UPDATE src_offset = src_offset", params)
        orders = sorted({letter.order_no for letter in letters if letter.order_no})
        if orders:
            await self._exec(f"UPDATE t_order SET has_dead_letters = 1 WHERE order_no IN ({_marks(len(orders))})",
                             orders)
