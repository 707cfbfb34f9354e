"""Recovery windows (``t_recovery_window``), and what the store knows of itself (``t_store_server``):
the server it last saw, and how far it has come (its watermark).

A store that may have lost rows (a failover to a replica that lacked the last transactions, a
restore from last night's backup) no longer knows every claim it made. Tokens derived from the
step (``app.pipeline.tokens``) make a second call of an idempotent service harmless; an SMS has
no idempotency key, so while a window is open every SMS claim the store has no row of, or holds
pending, is looked up by its token before it is sent (``app.pipeline.plan``).

A window is opened by a person (``faust -A app recovery start --hours H``) or by a worker, when
the store is not what this process knows it to be:

* **another server**: each new database connection compares the server it reached with the one
  ``t_store_server`` holds, which replicated from the old primary (a replica promoted by a
  failover differs);
* **back in time**: the workers advance the store's watermark (``t_store_server.watermark``)
  every ``STORE_WATERMARK_SECONDS`` and publish it to Kafka, where a restore of the database
  cannot reach (``app.adapters.kafka.watermark``). A store whose watermark is below the highest
  this process has read there, or seen in the store itself (:class:`Remembered`), was brought
  back to an older state: a restore into the same server, which changes no server identity.
  Compared at every new connection, at start-up and at every advance.

The first connection or advance to notice records what it found (compare-and-set: one window per
change, however many workers notice it together). A server that is read-only (a replica not
promoted yet) refuses the update: the connection fails, and the worker waits for the database as
for any outage.

Here are the checks and the statements run inside a transaction of the caller's; the windows as the
CLI and the gauges read and change them, each in a transaction of its own, are ``recovery_windows``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.observability import metrics

log = logging.getLogger(__name__)

NO_SUCH_TABLE = 1146        # migrations not run yet (a command before ``alembic upgrade``)
NO_SUCH_COLUMN = 1054       # the same, one migration behind
REASON_CHARS = 1024         # t_recovery_window.reason, end_note


class Remembered:
    """The highest watermark this process knows the store reached: read from Kafka, or seen in the
    store itself. A store found below it went back in time."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def see(self, value: int | None) -> None:
        if value is not None and value > self.value:
            self.value = value


@dataclass(frozen=True, slots=True)
class StoreChange:
    """What one connection or advance found and this process opened a window for: another server
    (``before`` != ``after``), a watermark behind what was remembered (``behind``), or both."""

    before: str | None             # the server recorded before (None: it was not read)
    after: str | None
    behind: tuple[int, int] | None  # (the store's watermark, the one remembered)
    window_id: int
    hours: float

    @property
    def server_changed(self) -> bool:
        return self.before != self.after

    def reason(self) -> str:
        """Why the window is open, for ``t_recovery_window.reason`` and the log."""
        parts = []
        if self.server_changed:
            parts.append(f"the store's database server changed from {self.before} to {self.after} (a failover or a "
                         "restore onto another server)")
        if self.behind is not None:
            found, remembered = self.behind
            parts.append(f"the store went back in time: its watermark is {found}, below the {remembered} it had "
                         "reached (a restore from a backup, or a failover to a replica that lacked the last "
                         "transactions)")
        return "; ".join(parts) + ": rows acknowledged by the store before may be missing"


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
def open_sql(hours: float) -> str:
    """Open a window of ``hours`` (parameters: who, why)."""
    return ("INSERT INTO t_recovery_window (opened_at, ends_at, opened_by, reason) "
            f"VALUES (NOW(3), NOW(3) + INTERVAL {int(hours * 3_600_000_000)} MICROSECOND, %s, %s)")


def check_server(dbapi_connection: Any, *, worker_id: str, hours: float, remembered: int = 0) -> StoreChange | None:
    """On a new connection (synchronous: the engine's ``connect`` event): record the server the
    store is on, and open a recovery window of ``hours`` if it is another one than before, or if
    the store's watermark is below ``remembered``.

    Returns the change when this connection opened the window; None otherwise."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(IDENTITY_SQL)
        here = identity({str(name).lower(): str(value) for name, value in cursor.fetchall()})
        try:
            cursor.execute("SELECT server, watermark FROM t_store_server WHERE id = 1")
        except Exception as exc:
            if _code(exc) in (NO_SUCH_TABLE, NO_SUCH_COLUMN):
                dbapi_connection.rollback()
                return None
            raise
        found = cursor.fetchone()
        if found is None:
            # A new store (or one restored from before this table): this server is its first. Its
            # watermark starts where this process knows the store had come, and a window opens if
            # that is anywhere (the row itself was lost).
            cursor.execute("INSERT IGNORE INTO t_store_server (id, server, watermark, gmt_modified) "
                           "VALUES (1, %s, %s, NOW(3))", (here, remembered))
            opened = None
            if cursor.rowcount == 1 and remembered > 0:
                opened = _opened(cursor, StoreChange(here, here, (0, remembered), 0, hours), worker_id)
            dbapi_connection.commit()
            return opened
        before, watermark = found[0], int(found[1])
        behind = (watermark, remembered) if watermark < remembered else None
        if before == here and behind is None:
            dbapi_connection.rollback()
            return None
        cursor.execute("UPDATE t_store_server SET server = %s, watermark = GREATEST(watermark, %s), "
                       "gmt_modified = NOW(3) WHERE id = 1 AND server = %s AND watermark = %s",
                       (here, remembered, before, watermark))
        if cursor.rowcount != 1:         # another connection recorded the change first
            dbapi_connection.rollback()
            return None
        opened = _opened(cursor, StoreChange(before, here, behind, 0, hours), worker_id)
        dbapi_connection.commit()
        return opened
    except BaseException:
        try:
            dbapi_connection.rollback()
        except Exception:
            pass
        raise
    finally:
        cursor.close()


def _opened(cursor: Any, change: StoreChange, worker_id: str) -> StoreChange:
    cursor.execute(open_sql(change.hours),
                   (f"worker:{worker_id}"[:128], change.reason()[:REASON_CHARS]))
    return StoreChange(change.before, change.after, change.behind, int(cursor.lastrowid), change.hours)


@dataclass(frozen=True, slots=True)
class Advanced:
    """One advance of the store's watermark: its new value, and the window it opened, if the store
    was found behind."""

    watermark: int
    change: StoreChange | None


async def advance(execute: Callable, *, remembered: int, worker_id: str, hours: float) -> Advanced:
    """Move the store's watermark one past the higher of its own and ``remembered`` (in the caller's
    transaction, the row locked); open a window when the store's was below ``remembered``."""
    found = (await execute("SELECT watermark FROM t_store_server WHERE id = 1 FOR UPDATE", ())).first()
    if found is None:       # a store no connection has recorded yet (DB_SERVER_CHECK=false)
        variables = {str(name).lower(): str(value) for name, value in await execute(IDENTITY_SQL, ())}
        await execute("INSERT IGNORE INTO t_store_server (id, server, watermark, gmt_modified) "
                      "VALUES (1, %s, 0, NOW(3))", (identity(variables),))
        found = (await execute("SELECT watermark FROM t_store_server WHERE id = 1 FOR UPDATE", ())).first()
    watermark = int(found[0])
    new = max(watermark, remembered) + 1
    await execute("UPDATE t_store_server SET watermark = %s WHERE id = 1", (new,))
    if watermark >= remembered:
        return Advanced(new, None)
    change = StoreChange(None, None, (watermark, remembered), 0, hours)
    result = await execute(open_sql(hours),
                           (f"worker:{worker_id}"[:128], change.reason()[:REASON_CHARS]))
    return Advanced(new, StoreChange(None, None, change.behind, int(result.lastrowid), hours))


def report(change: StoreChange) -> None:
    """Say that this process opened a window: the log line, the metrics (and so the alerts)."""
    if change.server_changed:
        metrics.STORE_SERVER_CHANGES.inc()
    if change.behind is not None:
        metrics.STORE_WENT_BACK.inc()
    metrics.RECOVERY_WINDOW_OPEN.set(1)
    log.warning("%s, so recovery window %d is open for %g h: SMS claims the store has no row of, or holds pending, "
                "are looked up before they are sent. See the docs, Operations, After a failover or a restore.",
                change.reason().removesuffix(": rows acknowledged by the store before may be missing"),
                change.window_id, change.hours)


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
