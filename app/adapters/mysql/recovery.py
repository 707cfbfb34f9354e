"""Recovery windows (``t_recovery_window``) and the server the store last saw (``t_store_server``).

A store that may have lost rows (a failover to a replica that lacked the last transactions, a
restore from last night's backup) no longer knows every claim it made. Tokens derived from the
step (``app.pipeline.tokens``) make a second call of an idempotent service harmless; an SMS has
no idempotency key, so while a window is open a fresh claim of it is looked up by its token
before it is sent (``app.pipeline.plan``).

A window is opened by a person (``faust -A app recovery start --hours H``) or by a worker: each
new database connection compares the server it reached with the one ``t_store_server`` holds,
which replicated from the old primary; on a difference the first connection to notice records
the new server and opens a window (compare-and-set: one window per change, however many workers
notice it together). A server that is read-only (a replica not promoted yet) refuses the
update: the connection fails, and the worker waits for the database as for any outage.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from app.adapters.mysql.store import MySqlStore

log = logging.getLogger(__name__)

NO_SUCH_TABLE = 1146        # migrations not run yet (a command before ``alembic upgrade``)
REASON_CHARS = 1024         # t_recovery_window.reason, end_note


@dataclass(frozen=True, slots=True)
class ServerChange:
    """What one connection found: the store's server changed, and this connection opened a window."""

    before: str
    after: str
    window_id: int
    hours: float


def identity(variables: dict[str, str]) -> str:
    """A server's identity from its global variables: MySQL's ``server_uuid`` (made at the first
    start, unique), else (MariaDB has none) ``hostname:port#server_id`` (servers of one
    replication topology must have distinct server ids)."""
    uuid = variables.get("server_uuid")
    if uuid:
        return uuid
    return f"{variables.get('hostname', '?')}:{variables.get('port', '?')}#{variables.get('server_id', '?')}"


IDENTITY_SQL = ("SHOW GLOBAL VARIABLES WHERE Variable_name IN "
                "('server_uuid', 'hostname', 'port', 'server_id')")


def check_server(dbapi_connection: Any, *, worker_id: str, hours: float) -> ServerChange | None:
    """On a new connection (synchronous: the engine's ``connect`` event): record the server the
    store is on, and open a recovery window of ``hours`` if it is another one than before.

    Returns the change when this connection opened the window; None otherwise."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(IDENTITY_SQL)
        here = identity({str(name).lower(): str(value) for name, value in cursor.fetchall()})
        try:
            cursor.execute("SELECT server FROM t_store_server WHERE id = 1")
        except Exception as exc:
            if _code(exc) == NO_SUCH_TABLE:
                dbapi_connection.rollback()
                return None
            raise
        found = cursor.fetchone()
        if found is not None and found[0] == here:
            dbapi_connection.rollback()
            return None
        if found is None:
            # A new store (or one restored from before this table): this server is its first.
            cursor.execute("INSERT IGNORE INTO t_store_server (id, server, gmt_modified) VALUES (1, %s, NOW(3))",
                           (here,))
            dbapi_connection.commit()
            return None
        before = found[0]
        cursor.execute("UPDATE t_store_server SET server = %s, gmt_modified = NOW(3) WHERE id = 1 AND server = %s",
                       (here, before))
        if cursor.rowcount != 1:         # another connection recorded the change first
            dbapi_connection.rollback()
            return None
        reason = (f"the store's database server changed from {before} to {here} (a failover or a restore): "
                  "rows acknowledged by the old one may be missing")
        window_id = _open(cursor, hours=hours, actor=f"worker:{worker_id}", reason=reason)
        dbapi_connection.commit()
        return ServerChange(before, here, window_id, hours)
    except BaseException:
        try:
            dbapi_connection.rollback()
        except Exception:
            pass
        raise
    finally:
        cursor.close()


def _open(cursor: Any, *, hours: float, actor: str, reason: str) -> int:
    cursor.execute("INSERT INTO t_recovery_window (opened_at, ends_at, opened_by, reason) "
                   f"VALUES (NOW(3), NOW(3) + INTERVAL {int(hours * 3_600_000_000)} MICROSECOND, %s, %s)",
                   (actor[:128], reason[:REASON_CHARS]))
    return int(cursor.lastrowid)


def _code(exc: BaseException) -> int | None:
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


# -- the pipeline's read (T1), and what people and timers do ---------------------------------------

OPEN_AGE_SQL = ("SELECT TIMESTAMPDIFF(MICROSECOND, MAX(opened_at), NOW(3)) FROM t_recovery_window "
                "WHERE ends_at > NOW(3) AND ended_at IS NULL")


async def open_age(execute: Callable) -> float | None:
    """Seconds since the newest open window opened, or None when none is open."""
    result = await execute(OPEN_AGE_SQL, ())
    value = result.scalar()
    return None if value is None else max(int(value), 0) / 1e6


@dataclass(frozen=True, slots=True)
class Window:
    id: int
    opened_at: datetime
    ends_at: datetime
    opened_by: str
    reason: str
    ended_at: datetime | None
    ended_by: str | None
    end_note: str | None
    open: bool

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


class RecoveryWindows:
    """The windows, for the CLI, the gauges and the tests."""

    def __init__(self, store: "MySqlStore") -> None:
        self.store = store

    async def start(self, *, hours: float, actor: str, note: str) -> Window:
        if not 0 < hours <= 24 * 90:
            raise ValueError("a recovery window lasts more than 0 and at most 2160 hours (90 days)")

        async def work(tx) -> Window:
            result = await tx._exec(
                "INSERT INTO t_recovery_window (opened_at, ends_at, opened_by, reason) "
                f"VALUES (NOW(3), NOW(3) + INTERVAL {int(hours * 3_600_000_000)} MICROSECOND, %s, %s)",
                [actor[:128], note[:REASON_CHARS]])
            return (await self._select(tx, f"WHERE id = {int(result.lastrowid)}"))[0]

        return await self.store.in_transaction(work)

    async def end(self, *, actor: str, note: str) -> list[Window]:
        """End every open window now; the windows ended."""
        async def work(tx) -> list[Window]:
            ending = await self._select(tx, "WHERE ends_at > NOW(3) AND ended_at IS NULL", lock=True)
            if not ending:
                return []
            ids = ", ".join(str(w.id) for w in ending)
            await tx._exec("UPDATE t_recovery_window SET ended_at = NOW(3), ended_by = %s, end_note = %s "
                           f"WHERE id IN ({ids})", [actor[:128], note[:REASON_CHARS]])
            return await self._select(tx, f"WHERE id IN ({ids})")

        return await self.store.in_transaction(work)

    async def recent(self, limit: int = 20) -> list[Window]:
        return await self.store.in_transaction(lambda tx: self._select(tx, f"ORDER BY id DESC LIMIT {int(limit)}"))

    async def open_age(self) -> float | None:
        return await self.store.in_transaction(lambda tx: open_age(tx._exec))

    async def server(self) -> str | None:
        async def work(tx) -> str | None:
            result = await tx._exec("SELECT server FROM t_store_server WHERE id = 1", ())
            return result.scalar()

        return await self.store.in_transaction(work)

    @staticmethod
    async def _select(tx, where: str, *, lock: bool = False) -> list[Window]:
        result = await tx._exec(
            "SELECT id, opened_at, ends_at, opened_by, reason, ended_at, ended_by, end_note, "
            f"(ends_at > NOW(3) AND ended_at IS NULL) FROM t_recovery_window {where}"
            f"{' FOR UPDATE' if lock else ''}", ())
        return [Window(*row[:8], open=bool(row[8])) for row in result]
