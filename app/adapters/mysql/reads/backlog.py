"""What the stuck sweep and the gauges read: pending ``t_idem`` rows past their age,
dead letters past their SLA, and counts. Every query walks an index range that holds
only unfinished work (``idx_status_modified`` on t_idem, ``idx_status_id`` and
``idx_status_next_retry`` and ``idx_group_status_first_failure`` on t_compensation), never
the done rows, so its cost follows the backlog, not the table; counts stop at ``COUNT_CAP``
rows, and an oldest age is the first entry of its index range.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from app.adapters.mysql.store import MySqlStore
from app.pipeline.states import IdemStatus, LedgerStatus

COUNT_CAP = 10_000
PENDING = int(IdemStatus.PENDING)
UNSETTLED = (int(LedgerStatus.OPEN), int(LedgerStatus.RETRYING))


@dataclass(frozen=True)
class StuckRow:
    biz_key: str
    part_date: date
    step: str
    attempt: int
    owner: str | None
    lease_until: datetime | None
    gmt_modified: datetime
    age_seconds: float
    last_err: str | None


@dataclass(frozen=True)
class LateLetter:
    id: int
    status: LedgerStatus
    reason: str
    order_no: str | None
    biz_key: str | None
    redrives: int
    first_failure_at: datetime
    age_seconds: float
    message: str | None


@dataclass(frozen=True)
class Gauges:
    stuck_by_step: dict[str, int]
    over_cap: int
    compensation_by_status: dict[str, int]      # unsettled statuses only: open, retrying, manual; at most COUNT_CAP
    oldest_open_seconds: float
    oldest_manual_seconds: float
    idem_rows: int


class Watch:
    def __init__(self, store: MySqlStore) -> None:
        self.store = store

    async def _rows(self, sql: str, params: Sequence = ()) -> list[tuple]:
        async def read(tx):
            return [tuple(row) for row in await tx._exec(sql, params)]
        return await self.store.in_transaction(read)

    # -- the sweep's pages ------------------------------------------------------------

    async def stuck(self, older_than_seconds: float, limit: int,
                    after: tuple[datetime, str] | None = None) -> list[StuckRow]:
        """Pending rows untouched for longer than ``older_than_seconds``, oldest first, a page
        of ``limit`` after the (gmt_modified, biz_key) ``after``."""
        where, params = "", [int(older_than_seconds * 1_000_000)]
        if after is not None:
            where = " AND (gmt_modified > %s OR (gmt_modified = %s AND biz_key > %s))"
            params += [after[0], after[0], after[1]]
        rows = await self._rows(
            "SELECT biz_key, part_date, step, attempt, owner, lease_until, gmt_modified, "
            "TIMESTAMPDIFF(MICROSECOND, gmt_modified, NOW(3)) / 1e6, last_err FROM t_idem "
            f"WHERE status = {PENDING} AND gmt_modified < NOW(3) - INTERVAL %s MICROSECOND{where} "
            f"ORDER BY gmt_modified, biz_key LIMIT {int(limit)}", params)
        return [StuckRow(*row[:7], float(row[7]), row[8]) for row in rows]

    async def late_letters(self, group: str, status: Sequence[LedgerStatus], older_than_seconds: float,
                           limit: int) -> list[LateLetter]:
        """Ledger rows of ``group`` in ``status`` whose first failure is older than the age, oldest first."""
        rows = await self._rows(
            "SELECT id, status, reason, order_no, biz_key, redrives, first_failure_at, "
            "TIMESTAMPDIFF(MICROSECOND, first_failure_at, NOW(3)) / 1e6, message FROM t_compensation "
            f"WHERE status IN ({', '.join(str(int(s)) for s in status)}) AND consumer_group = %s "
            "AND first_failure_at < NOW(3) - INTERVAL %s MICROSECOND ORDER BY first_failure_at, id "
            f"LIMIT {int(limit)}", [group, int(older_than_seconds * 1_000_000)])
        return [LateLetter(row[0], LedgerStatus(row[1]), *row[2:7], float(row[7]), row[8]) for row in rows]

    # -- the gauges -----------------------------------------------------------------

    async def gauges(self, *, group: str, stuck_after_seconds: float, attempt_cap: int) -> Gauges:
        async def read(tx) -> Gauges:
            stuck = await tx._exec(
                f"SELECT step, COUNT(*) FROM (SELECT step FROM t_idem WHERE status = {PENDING} AND gmt_modified < "
                f"NOW(3) - INTERVAL %s MICROSECOND LIMIT {COUNT_CAP}) AS s GROUP BY step",
                [int(stuck_after_seconds * 1_000_000)])
            stuck_by_step = {step: int(n) for step, n in stuck}
            over_cap = (await tx._exec(
                f"SELECT COUNT(*) FROM (SELECT 1 FROM t_idem WHERE status = {PENDING} AND attempt >= %s "
                f"LIMIT {COUNT_CAP}) AS c", [attempt_cap])).scalar()
            unsettled = (*UNSETTLED, int(LedgerStatus.MANUAL))
            # Per status, its count up to COUNT_CAP and its oldest row: a range of at most
            # COUNT_CAP entries and one entry of idx_group_status_first_failure, however many
            # rows wait (a flood of malformed records can leave a million for a person).
            by_status = await tx._exec(" UNION ALL ".join(
                f"SELECT {status}, (SELECT COUNT(*) FROM (SELECT 1 FROM t_compensation WHERE consumer_group = %s "
                f"AND status = {status} LIMIT {COUNT_CAP}) AS c), (SELECT TIMESTAMPDIFF(MICROSECOND, "
                "first_failure_at, NOW(3)) / 1e6 FROM t_compensation WHERE consumer_group = %s "
                f"AND status = {status} ORDER BY first_failure_at LIMIT 1)" for status in unsettled),
                [group] * (2 * len(unsettled)))
            counts = {LedgerStatus(s).name.lower(): 0 for s in unsettled}
            oldest: dict[int, float] = {}
            for status, n, age in by_status:
                counts[LedgerStatus(status).name.lower()] = int(n)
                oldest[status] = float(age or 0)
            rows = (await tx._exec("SELECT COALESCE(SUM(TABLE_ROWS), 0) FROM information_schema.PARTITIONS "
                                   "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 't_idem'")).scalar()
            return Gauges(stuck_by_step, int(over_cap or 0), counts,
                          max((oldest.get(s, 0.0) for s in UNSETTLED), default=0.0),
                          oldest.get(int(LedgerStatus.MANUAL), 0.0), int(rows or 0))

        return await self.store.in_transaction(read)


def as_dict(row: Any) -> dict[str, Any]:
    return {name: getattr(row, name) for name in row.__dataclass_fields__}
