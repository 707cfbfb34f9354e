"""Read-only queries behind the error-group views: the groups of this consumer group's dead
letters, with the queue's depth beside them, and one group's inflow over time.

Three reads make a list, whatever the ledger's size: the hourly buckets of the window
(``t_error_group_hour``, at most groups x hours rows), the unsettled rows from the index
``idx_group_status_fingerprint`` alone (never the settled millions), and the groups'
descriptions (``t_error_group``). The window is whole UTC hours: the current one and the ones
before it, so the bucket sums and the counts of open rows cover exactly the same letters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from app.adapters.mysql.ledger.grouping import hour_of
from app.adapters.mysql.sql import marks
from app.adapters.mysql.store import MySqlStore
from app.pipeline.states import LedgerStatus

UNSETTLED = ", ".join(str(int(s)) for s in (LedgerStatus.OPEN, LedgerStatus.RETRYING, LedgerStatus.MANUAL))
GROUPS_MAX = 100          # the list shows this many groups at most (the most open first)


@dataclass(frozen=True)
class Window:
    """A view of the last ``hours`` hours (the current one included), in buckets of ``step`` hours."""

    name: str
    hours: int
    step: int

    def since(self, now: datetime) -> datetime:
        return hour_of(now) - timedelta(hours=self.hours - 1)

    def buckets(self, now: datetime) -> list[datetime]:
        """The buckets' starts, oldest first; a bucket of several hours starts at a multiple of them (UTC)."""
        first = self.since(now)
        first -= timedelta(hours=first.hour % self.step)
        count = (hour_of(now) - first) // timedelta(hours=self.step) + 1
        return [first + timedelta(hours=self.step * i) for i in range(count)]


WINDOWS = {"24h": Window("24h", 24, 1), "7d": Window("7d", 24 * 7, 6)}


class GroupQueries:
    def __init__(self, store: MySqlStore, *, group: str) -> None:
        self.store = store
        self.consumer_group = group

    async def _read(self, work):
        return await self.store.in_transaction(lambda tx: work(tx._exec))

    async def groups(self, window: Window, *, unsettled_only: bool) -> dict[str, Any]:
        """The groups of the window (letters whose first failure is in it), or with ``unsettled_only``
        the groups that have letters still open, retrying or manual (of any age), most open first."""
        async def work(execute):
            now = await _now(execute)
            since = window.since(now)
            totals = {fp: (int(n), first, last) for fp, n, first, last in await execute(
                "SELECT fingerprint, SUM(letters), MIN(first_at), MAX(last_at) FROM t_error_group_hour "
                "WHERE consumer_group = %s AND hour >= %s AND letters > 0 GROUP BY fingerprint",
                [self.consumer_group, since])}
            unsettled = await _unsettled(execute, self.consumer_group, [since], orders_since=[since])
            names = set(unsettled) if unsettled_only else set(unsettled) | set(totals)
            ranked = sorted(names, key=lambda fp: (-unsettled.get(fp, OPEN_NONE)["open_total"],
                                                   -totals.get(fp, (0,))[0], fp or ""))
            shown = ranked[:GROUPS_MAX]
            described = await _described(execute, self.consumer_group, [fp for fp in shown if fp is not None])
            return {"now": now, "window": window.name, "since": since,
                    "queue": _depth(unsettled, now),
                    "groups": [_group(fp, totals.get(fp), unsettled.get(fp, OPEN_NONE), described.get(fp), now)
                               for fp in shown],   # open[0], orders[0]: of the window
                    "more_groups": max(len(ranked) - GROUPS_MAX, 0)}
        return await self._read(work)

    async def group(self, fingerprint: str) -> dict[str, Any] | None:
        """One group: its figures over 24 hours and 7 days, and its inflow in the buckets of each."""
        async def work(execute):
            now = await _now(execute)
            described = await _described(execute, self.consumer_group, [fingerprint])
            if fingerprint not in described:
                return None
            longest = max(WINDOWS.values(), key=lambda w: w.hours)
            start = longest.buckets(now)[0]
            hours = {hour: int(n) for hour, n in await execute(
                "SELECT hour, letters FROM t_error_group_hour WHERE consumer_group = %s AND fingerprint = %s "
                "AND hour >= %s ORDER BY hour", [self.consumer_group, fingerprint, start])}
            sinces = [window.since(now) for window in WINDOWS.values()]
            unsettled = await _unsettled(execute, self.consumer_group, sinces, orders_of=fingerprint,
                                         orders_since=sinces)
            queue = _depth(unsettled, now)
            ours = unsettled.get(fingerprint, OPEN_NONE)
            figures = {}
            for index, (window, since) in enumerate(zip(WINDOWS.values(), sinces)):
                letters = sum(n for hour, n in hours.items() if hour >= since)
                figures[window.name] = {
                    **_open_figures(ours, letters, now, index), "letters": letters,
                    "since": since,
                    "series": [{"at": at, "letters": sum(n for hour, n in hours.items()
                                                         if at <= hour < at + timedelta(hours=window.step)
                                                         and hour >= since)}
                               for at in window.buckets(now)],
                    "bucket_hours": window.step}
            first_last = (await execute(
                "SELECT MIN(first_at), MAX(last_at), COALESCE(SUM(letters), 0) FROM t_error_group_hour "
                "WHERE consumer_group = %s AND fingerprint = %s AND letters > 0",
                [self.consumer_group, fingerprint])).first()
            return {"now": now, "fingerprint": fingerprint, **described[fingerprint], "first_seen": first_last[0],
                    "last_seen": first_last[1], "letters_total": int(first_last[2]), "windows": figures,
                    "queue": queue}
        return await self._read(work)


    async def inflow(self) -> dict[str, Any]:
        """The queue's inflow, every group together: per window, its letters and their series in the
        window's buckets (the hourly rows of ``t_error_group_hour``, at most groups x hours)."""
        async def work(execute):
            now = await _now(execute)
            longest = max(WINDOWS.values(), key=lambda w: w.hours)
            hours = {hour: int(n) for hour, n in await execute(
                "SELECT hour, SUM(letters) FROM t_error_group_hour WHERE consumer_group = %s AND hour >= %s "
                "GROUP BY hour", [self.consumer_group, longest.buckets(now)[0]])}
            return {"now": now, "windows": {window.name: _series(window, hours, now) for window in WINDOWS.values()}}
        return await self._read(work)


def _series(window: Window, hours: dict[datetime, int], now: datetime) -> dict[str, Any]:
    since = window.since(now)
    mine = {hour: n for hour, n in hours.items() if hour >= since}
    return {"letters": sum(mine.values()), "since": since, "bucket_hours": window.step,
            "series": [{"at": at, "letters": sum(n for hour, n in mine.items()
                                                 if at <= hour < at + timedelta(hours=window.step))}
                       for at in window.buckets(now)]}


OPEN_NONE = {"open_total": 0, "open": [0, 0], "orders": [0, 0], "oldest": None}


async def _now(execute) -> datetime:
    return (await execute("SELECT NOW(3)")).first()[0]       # the session is UTC


async def _unsettled(execute, group: str, sinces: Sequence[datetime], *, orders_of: str | None = None,
                     orders_since: Sequence[datetime] = ()) -> dict:
    """Per group: the letters still open, retrying or manual (all of them, and since each of
    ``sinces``), the oldest one's first failure, and the orders among those since each of
    ``orders_since`` (of the group ``orders_of`` only, if given). Read from the index alone:
    grouped by status first, in the index's order (a GROUP BY fingerprint alone, with a
    COUNT(DISTINCT), sorted the rows' ids and read every row back, far slower: the docs'
    Error groups, ``python -m bench.error_groups``), then summed here."""
    windows = "".join(", SUM(first_failure_at >= %s)" for _ in sinces)
    result = await execute(
        f"SELECT fingerprint, COUNT(*), MIN(first_failure_at){windows} FROM t_compensation "
        f"WHERE consumer_group = %s AND status IN ({UNSETTLED}) GROUP BY status, fingerprint",
        [*sinces, group])
    found: dict[str | None, dict] = {}
    for fp, n, oldest, *recent in result:
        u = found.setdefault(fp, {"open_total": 0, "open": [0] * len(sinces), "orders": [0] * len(orders_since),
                                  "oldest": None})
        u["open_total"] += int(n)
        u["open"] = [a + int(b or 0) for a, b in zip(u["open"], recent)]
        u["oldest"] = oldest if u["oldest"] is None else min(u["oldest"], oldest)
    only = " AND fingerprint = %s" if orders_of is not None else ""
    for index, since in enumerate(orders_since):
        # An order with letters of one group in two statuses is one order: DISTINCT over the index's columns.
        for fp, orders in await execute(
                "SELECT fingerprint, COUNT(order_no) FROM (SELECT DISTINCT fingerprint, order_no FROM t_compensation "
                f"WHERE consumer_group = %s AND status IN ({UNSETTLED}) AND first_failure_at >= %s{only}) AS d "
                "GROUP BY fingerprint", [group, since] + ([orders_of] if orders_of is not None else [])):
            if fp in found:
                found[fp]["orders"][index] = int(orders)
    return found


async def _described(execute, group: str, fingerprints: list[str]) -> dict[str, dict]:
    if not fingerprints:
        return {}
    result = await execute(
        "SELECT fingerprint, reason, effect, detail, sample FROM t_error_group WHERE consumer_group = %s "
        f"AND fingerprint IN ({marks(len(fingerprints))})", [group, *fingerprints])
    return {fp: {"reason": reason, "effect": effect, "detail": detail, "sample": sample}
            for fp, reason, effect, detail, sample in result}


def _age(oldest: datetime | None, now: datetime) -> float | None:
    return None if oldest is None else round((now - oldest).total_seconds(), 3)


def _depth(unsettled: dict, now: datetime) -> dict[str, Any]:
    oldest = min((u["oldest"] for u in unsettled.values() if u["oldest"] is not None), default=None)
    return {"depth": sum(u["open_total"] for u in unsettled.values()), "oldest_open_at": oldest,
            "oldest_open_age_seconds": _age(oldest, now)}


def _open_figures(unsettled: dict, letters: int, now: datetime, window: int = 0) -> dict[str, Any]:
    """The open letters of a group's window (``window``: which of the ``sinces`` it is)."""
    opened = unsettled["open"][window]
    return {"open": opened, "open_total": unsettled["open_total"],
            "open_share": round(opened / letters, 4) if letters else None,
            "orders": unsettled["orders"][window], "oldest_open_at": unsettled["oldest"],
            "oldest_open_age_seconds": _age(unsettled["oldest"], now)}


def _group(fp: str | None, totals, unsettled: dict, described: dict | None, now: datetime) -> dict[str, Any]:
    letters, first, last = totals or (0, None, None)
    return {"fingerprint": fp, **(described or {"reason": None, "effect": None, "detail": None, "sample": None}),
            "letters": letters, "first_seen": first, "last_seen": last, **_open_figures(unsettled, letters, now)}
