"""``t_idem``'s monthly partitions: keep months ready ahead, drop the ones past the retention.

The table is ``PARTITION BY RANGE COLUMNS(part_date)`` (migration 0006): ``p_before``
(everything before the first month), one ``pYYYYMM`` per month, and ``p_future``
(MAXVALUE, a catch-all kept empty by adding months ahead of time). Adding a month
splits ``p_future`` (``REORGANIZE PARTITION``: it copies only ``p_future``'s rows, none
while months are kept ahead); dropping a month is ``DROP PARTITION``: no row-by-row
delete, no undo, whatever its size.

Both need the table's metadata lock, exclusively, for a moment. While an open
transaction uses the table, the ALTER waits for it, and every statement that comes
after the ALTER queues behind the ALTER: the pipeline would stall for as long as the
ALTER waits (MariaDB's ``lock_wait_timeout`` defaults to a day). So each ALTER runs on
a connection of its own with a short ``lock_wait_timeout``: if the lock does not come,
it gives up, the queue behind it moves on, and it is tried again a little later, then
at the next tick. MariaDB 10.11 waits for the lock twice in a DROP or REORGANIZE
PARTITION, each time up to ``lock_wait_timeout`` (measured: 1 s gives up after 2.0 s,
2 s after 4.0 s), so the session gets half of ``hold_seconds`` (PARTITION_LOCK_WAIT_SECONDS),
the longest one try may hold the pipeline up.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import date

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.adapters.mysql.store import MySqlStore, _error_code

log = logging.getLogger(__name__)

TABLE = "t_idem"
CATCH_ALL = "p_future"
LOCK_WAIT_TIMEOUT = 1205      # ER_LOCK_WAIT_TIMEOUT: also what a metadata lock wait that ran out raises


@dataclass(frozen=True)
class Partition:
    name: str
    below: date | None          # VALUES LESS THAN this date; None for MAXVALUE
    rows: int = 0               # InnoDB's estimate


@dataclass
class Changes:
    add: list[date] = field(default_factory=list)       # first days of the months to add, in order
    drop: list[str] = field(default_factory=list)


def month_start(day: date, months: int = 0) -> date:
    index = day.year * 12 + day.month - 1 + months
    return date(index // 12, index % 12 + 1, 1)


def month_name(first: date) -> str:
    return f"p{first:%Y%m}"


def plan(parts: list[Partition], *, today: date, ahead: int, drop_before: date) -> Changes:
    """What keeps the current month and ``ahead`` more ready, and what may go: every
    partition whose dates are all before ``drop_before`` (which is before today, so the
    current month is never among them). ``p_future`` is never dropped."""
    changes = Changes()
    bounded = sorted((p for p in parts if p.below is not None), key=lambda p: p.below)
    if not any(p.below is None for p in parts):
        raise ValueError(f"{TABLE} has no MAXVALUE partition {CATCH_ALL!r}: is migration 0006 applied?")
    last = bounded[-1].below if bounded else month_start(today)
    want_until = month_start(today, ahead + 1)          # the first month not needed yet
    month = month_start(last) if last.day == 1 else month_start(last, 1)
    while month < want_until:
        changes.add.append(month)
        month = month_start(month, 1)
    changes.drop = [p.name for p in bounded if p.below <= drop_before]
    return changes


class Partitions:
    def __init__(self, store: MySqlStore, *, hold_seconds: int = 2, tries: int = 3,
                 retry_delay: float = 5.0, ddl_timeout: float = 600.0) -> None:
        self.store = store
        self.engine: AsyncEngine = store.engine
        self.hold_seconds = hold_seconds
        # Two waits per statement (see the module docstring); the variable takes whole seconds.
        self.lock_wait_timeout = max(1, hold_seconds // 2)
        self.tries = tries
        self.retry_delay = retry_delay
        self.ddl_timeout = ddl_timeout

    async def list(self) -> list[Partition]:
        async def read(tx):
            result = await tx._exec(
                "SELECT PARTITION_NAME, PARTITION_DESCRIPTION, TABLE_ROWS FROM information_schema.PARTITIONS "
                "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s ORDER BY PARTITION_ORDINAL_POSITION", [TABLE])
            return list(result)

        parts = []
        for name, description, rows in await self.store.in_transaction(read):
            if name is None:
                continue        # not partitioned
            below = None if description == "MAXVALUE" else date.fromisoformat(description.strip("'"))
            parts.append(Partition(name, below, int(rows or 0)))
        return parts

    async def size(self) -> tuple[int, float]:
        """InnoDB's estimates for the whole table (information_schema, no scan): rows, and bytes
        per row with the indexes."""
        async def read(tx):
            result = await tx._exec(
                "SELECT COALESCE(SUM(TABLE_ROWS), 0), COALESCE(SUM(DATA_LENGTH + INDEX_LENGTH), 0) "
                "FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s", [TABLE])
            rows, total = result.one()
            return int(rows), float(total) / max(int(rows), 1)

        return await self.store.in_transaction(read)

    # -- changes -------------------------------------------------------------------

    async def add(self, months: list[date]) -> None:
        """Split ``p_future``: the months in order, then ``p_future`` again."""
        parts = [f"PARTITION {month_name(m)} VALUES LESS THAN ('{month_start(m, 1).isoformat()}')" for m in months]
        parts.append(f"PARTITION {CATCH_ALL} VALUES LESS THAN (MAXVALUE)")
        await self.alter(f"ALTER TABLE {TABLE} REORGANIZE PARTITION {CATCH_ALL} INTO ({', '.join(parts)})")

    async def drop(self, names: list[str]) -> None:
        for name in names:
            if not name.replace("_", "").isalnum():
                raise ValueError(f"not a partition name: {name!r}")
        await self.alter(f"ALTER TABLE {TABLE} DROP PARTITION {', '.join(names)}")

    async def alter(self, statement: str) -> None:
        """Run one ALTER that holds the pipeline up for at most ``hold_seconds`` while it waits for
        the metadata lock; a wait that runs out is tried again, ``tries`` times in all,
        ``retry_delay`` apart. Raises :class:`LockNotGranted` when every try waited in vain."""
        for attempt in range(1, self.tries + 1):
            try:
                await asyncio.wait_for(self._alter_once(statement), self.ddl_timeout)
                return
            except DBAPIError as exc:
                if _error_code(exc) != LOCK_WAIT_TIMEOUT:
                    raise
                log.warning("%s: the metadata lock did not come within %ss (an open transaction uses %s); "
                            "try %d of %d", statement[:80], self.hold_seconds, TABLE, attempt, self.tries)
                if attempt < self.tries:
                    await asyncio.sleep(self.retry_delay)
        raise LockNotGranted(f"{statement[:80]}: no metadata lock in {self.tries} tries of "
                             f"{self.hold_seconds}s; tried again at the next tick")

    async def _alter_once(self, statement: str) -> None:
        # A connection of its own, never pooled again: its session variable stays with it.
        conn = await self.engine.connect()
        try:
            await conn.exec_driver_sql(f"SET SESSION lock_wait_timeout = {int(self.lock_wait_timeout)}")
            await conn.exec_driver_sql(statement)
        finally:
            try:
                await conn.invalidate()
                await conn.close()
            except Exception:
                log.debug("closing the partition maintenance connection failed", exc_info=True)


class LockNotGranted(RuntimeError):
    """A partition change could not get the table's metadata lock in time."""

