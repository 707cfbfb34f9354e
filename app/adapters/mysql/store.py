"""The pipeline's store on MySQL / MariaDB (SQLAlchemy engine, aiomysql driver):
transactions, their retry policy and their time limits. The statements are in
the modules of each table (``idem``, ``orders``, ``receipts``, ``ledger.statements``).

Every statement and every transaction has a client-side time limit: a
connection whose peer vanished (a half-open TCP connection, a network cut
that drops packets instead of refusing them) would otherwise wait for the
kernel's keepalive, two hours by default, while the worker keeps
heartbeating and nobody notices. A timed-out connection is discarded, never
returned to the pool, and the timeout is an infrastructure failure
(:class:`StoreUnavailable`), like a refused connection or an exhausted pool,
or a server that refuses writes because it is read-only (a failover under way).

A transaction re-run after its commit was lost (the connection died during
COMMIT) must not mistake its own earlier success for somebody else's: T3's
fenced writes count a row already moved by this owner and attempt to the
same place as their own.

Two MariaDB/MySQL traps shape the SQL here:

* ``INSERT ... ON DUPLICATE KEY UPDATE`` assignments run left to right and
  each sees the columns already updated; a column that a later condition
  reads must be assigned last (``status`` in the ``t_order`` upsert). MariaDB's
  SIMULTANEOUS_ASSIGNMENT mode evaluates them all from the old row instead:
  every statement here means the same either way (``tests/integration/test_sql_modes.py``).
* SQLAlchemy's MySQL dialects connect with CLIENT_FOUND_ROWS, so affected-row
  counts of an upsert say nothing about who won. Claims are decided under
  ``SELECT ... FOR UPDATE`` and fenced writes are checked by matched rows.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sqlalchemy.exc import DBAPIError, InterfaceError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.adapters.mysql.preflight import tls_failure
from app.adapters.mysql.transaction import MySqlTransaction
from app.pipeline.errors import Conflict, StoreFailure, StoreUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")

# Deadlock, lock-wait timeout (MySQL), and MariaDB's "record changed since last read".
LOCK_ERRORS = {1213, 1205, 1020}
# Lost races on an insert: somebody else inserted the same key first. The re-run sees it.
RACE_ERRORS = {1062}
# The server is gone, or never was; 2026: it came back without TLS while MYSQL_SSL_* asks for TLS
# (nothing was sent: see app.adapters.mysql.tls), which the next start-up names; 4031: MySQL
# 8.0.24+ closed the connection for idling past wait_timeout and says so (MariaDB just closes it:
# 2013 or 2006).
CONNECTION_ERRORS = {2002, 2003, 2005, 2006, 2013, 2014, 2026, 2045, 2055, 1040, 1053, 4031}
# The server takes no writes: a replica, or a primary demoted in a failover, while the traffic
# still reaches it (1290 ER_OPTION_PREVENTS_STATEMENT "running with the --read-only option",
# what MariaDB and MySQL raise; MySQL's 1836 ER_READ_ONLY_MODE; 1792, a transaction read-only
# because the server makes them so by default: the pipeline never asks for one). Waited out
# like an outage until the failover ends: no record's fault, never a dead letter.
READ_ONLY_ERRORS = {1290, 1836, 1792}


def _error_code(exc: DBAPIError) -> int | None:
    args = getattr(exc.orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _read_only(exc: DBAPIError, code: int | None) -> bool:
    """The server refused a write because it is read-only. 1290 names the option that prevents
    the statement, and only ``--read-only`` (MySQL: also ``--super-read-only``) is a failover's:
    ``--secure-file-priv`` and the like are a statement that will never run."""
    if code == 1290:
        return "read-only" in str(exc.orig).lower()
    return code in READ_ONLY_ERRORS


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

    async def in_transaction(self, work: Callable[[MySqlTransaction], Awaitable[T]]) -> T:
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
                    raise StoreUnavailable(f"database unreachable: {exc.orig!r}{tls_failure(exc)}") from exc
                if retriable:
                    raise StoreUnavailable(f"still conflicting after {attempt} runs: {exc}") from exc
                if isinstance(exc, DBAPIError) and _read_only(exc, code):
                    raise StoreUnavailable(f"database is read-only (a replica, or a failover under way): "
                                           f"{exc.orig!r}") from exc
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

    async def _attempt(self, work: Callable[[MySqlTransaction], Awaitable[T]]) -> T:
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
                await self.bounded(conn.commit())
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
                await self.bounded(conn.close())     # rolls back and returns the connection to the pool
                return
            except Exception:
                pass
        try:
            await conn.invalidate()
            await conn.close()
        except Exception:
            log.debug("discarding a broken database connection failed", exc_info=True)

    async def bounded(self, step: Awaitable[T]) -> T:
        async with asyncio.timeout(self.statement_timeout):
            return await step
