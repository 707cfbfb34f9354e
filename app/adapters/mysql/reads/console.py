"""Read-only queries behind the web views and the CLI: the compensation queue, an
order's timeline, ``t_idem`` rows. Every value is a bound parameter; every list is
bounded and walks an index (keyset pagination, never OFFSET)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.adapters.mysql.ledger.selection import QueueFilter
from app.adapters.mysql.ledger.statements import parse_headers
from app.adapters.mysql.sql import marks
from app.adapters.mysql.store import MySqlStore
from app.pipeline.states import IdemStatus, LedgerStatus, OrderStatus

LIST_COLUMNS = ("id, status, reason, fingerprint, retriable, attempts, redrives, order_no, event_id, biz_key, src_topic, src_partition, "
                "src_offset, consumer_group, may_be_superseded, truncated, first_failure_at, next_retry_at, "
                "gmt_modified, message")
# What an order's timeline shows of its dead letters: the newest this many.
ORDER_LETTERS = 50
# The counts beside the queue read at most this many index entries per status.
COUNT_CAP = 10_000
IDEM_COLUMNS = ("biz_key, part_date, step, status, attempt, owner, lease_until, idem_token, outcome, last_err, "
                "gmt_create, gmt_modified")


def _dicts(result) -> list[dict[str, Any]]:
    keys = list(result.keys())
    return [dict(zip(keys, row)) for row in result]


def _named(row: dict[str, Any]) -> dict[str, Any]:
    if "status" in row and isinstance(row["status"], int):
        row["status"] = LedgerStatus(row["status"]).name.lower()
    return row


class Queries:
    """Reads for people. The compensation queue is this consumer group's (``group``): apps that
    share a database each see and act on their own dead letters."""

    def __init__(self, store: MySqlStore, *, group: str) -> None:
        self.store = store
        self.group = group

    async def _all(self, sql: str, params: Sequence = ()) -> list[dict[str, Any]]:
        return await self.store.in_transaction(lambda tx: self._fetch(tx, sql, params))

    @staticmethod
    async def _fetch(tx, sql: str, params: Sequence) -> list[dict[str, Any]]:
        return _dicts(await tx._exec(sql, params))

    # -- the compensation queue ------------------------------------------------------

    async def compensations(self, f: QueueFilter) -> list[dict[str, Any]]:
        where, params = ["consumer_group = %s"], [self.group]
        if f.status is not None:
            where.append("status = %s")
            params.append(int(f.status))
        if f.reason is not None:
            where.append("reason = %s")
            params.append(f.reason)
        if f.order_no is not None:
            where.append("order_no = %s")
            params.append(f.order_no)
        if f.older_than_seconds is not None:
            where.append("first_failure_at <= NOW(3) - INTERVAL %s SECOND")
            params.append(f.older_than_seconds)
        if f.fingerprint is not None:
            where.append("fingerprint = %s")
            params.append(f.fingerprint)
        if f.since is not None:
            where.append("first_failure_at >= %s")
            params.append(f.since.replace(tzinfo=None))
        if f.until is not None:
            where.append("first_failure_at < %s")
            params.append(f.until.replace(tzinfo=None))
        if f.before_id is not None:
            where.append("id < %s")
            params.append(f.before_id)
        rows = await self._all(f"SELECT {LIST_COLUMNS} FROM t_compensation WHERE {' AND '.join(where)} "
                               f"ORDER BY id DESC LIMIT {int(f.limit)}", params)
        return [_named(row) for row in rows]

    async def counts(self) -> dict[str, Any]:
        """Rows by status and, of the unsettled ones, by reason: each count stops at
        ``COUNT_CAP`` (a ledger of a million settled rows is read as far as the cap, not
        whole, on every list) and ``capped`` names the counts that reached it."""
        cap = COUNT_CAP
        parts = " UNION ALL ".join(
            f"SELECT {int(s)} AS status, COUNT(*) AS n FROM (SELECT 1 FROM t_compensation WHERE status = {int(s)} "
            f"AND consumer_group = %s LIMIT {cap + 1}) AS s{int(s)}" for s in LedgerStatus)
        by_status = {LedgerStatus(r["status"]).name.lower(): r["n"]
                     for r in await self._all(parts, [self.group] * len(LedgerStatus)) if r["n"]}
        unsettled = ", ".join(str(int(s)) for s in (LedgerStatus.OPEN, LedgerStatus.RETRYING, LedgerStatus.MANUAL))
        rows = await self._all(f"SELECT reason, COUNT(*) AS n FROM (SELECT reason FROM t_compensation "
                               f"WHERE status IN ({unsettled}) AND consumer_group = %s LIMIT {cap + 1}) AS u "
                               "GROUP BY reason", [self.group])
        by_reason = {r["reason"]: r["n"] for r in rows}
        capped = [name for name, n in by_status.items() if n > cap]
        if sum(by_reason.values()) > cap:
            capped.append("by_reason_unsettled")
        return {"by_status": {name: min(n, cap) for name, n in by_status.items()},
                "by_reason_unsettled": by_reason, "cap": cap, "capped": capped}

    async def compensation(self, row_id: int) -> dict[str, Any] | None:
        rows = await self._all(f"SELECT {LIST_COLUMNS}, src_timestamp, worker_id, record_key, record_value, "
                               "record_headers, record_key_bytes, record_key_sha256, record_value_bytes, "
                               "record_value_sha256, owner, lease_until FROM t_compensation WHERE id = %s "
                               "AND consumer_group = %s", [row_id, self.group])
        if not rows:
            return None
        row = _named(rows[0])
        row["record_headers"] = parse_headers(row["record_headers"])
        row["history"] = await self._all(
            "SELECT at, actor, action, from_status, to_status, note, detail FROM t_compensation_audit "
            "WHERE compensation_id = %s ORDER BY id", [row_id])
        for entry in row["history"]:
            for side in ("from_status", "to_status"):
                if entry[side] is not None:
                    entry[side] = LedgerStatus(entry[side]).name.lower()
        return row

    # -- orders and t_idem ---------------------------------------------------------

    async def order(self, order_no: str) -> dict[str, Any] | None:
        rows = await self._all("SELECT order_no, status, amount_cents, phone, address, paid_cents, cancel_reason, "
                               "has_dead_letters, gmt_create, gmt_modified FROM t_order WHERE order_no = %s",
                               [order_no])
        if not rows:
            return None
        order = rows[0]
        order["status"] = OrderStatus(order["status"]).name.lower()
        return order

    async def contacts(self, order_nos: Sequence[str]) -> list[dict[str, Any]]:
        """The phone and address of each of these orders that has them: what a viewer's answer
        must mask wherever it appears, though the answer may not show the order (one read of
        the primary key)."""
        if not order_nos:
            return []
        return await self._all(f"SELECT phone, address FROM t_order WHERE order_no IN ({marks(len(order_nos))})",
                               list(order_nos))

    async def idem_of_order(self, order_no: str) -> list[dict[str, Any]]:
        """Every step key of the order: they all start with ``<order_no>:`` (a range of the primary key)."""
        prefix = order_no.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + ":%"
        return self._idem_named(await self._all(
            f"SELECT {IDEM_COLUMNS} FROM t_idem WHERE biz_key LIKE %s ORDER BY gmt_create, biz_key", [prefix]))

    async def idem(self, keys: Sequence[str]) -> list[dict[str, Any]]:
        if not keys:
            return []
        return self._idem_named(await self._all(
            f"SELECT {IDEM_COLUMNS} FROM t_idem WHERE biz_key IN ({marks(len(keys))}) ORDER BY biz_key", list(keys)))

    async def stuck(self, older_than_seconds: float, limit: int) -> list[dict[str, Any]]:
        """Pending rows not touched for longer than the alert age (``idx_status_modified``)."""
        return self._idem_named(await self._all(
            f"SELECT {IDEM_COLUMNS}, TIMESTAMPDIFF(SECOND, gmt_modified, NOW(3)) AS age_seconds FROM t_idem "
            f"WHERE status = {int(IdemStatus.PENDING)} AND gmt_modified < NOW(3) - INTERVAL %s MICROSECOND "
            f"ORDER BY gmt_modified LIMIT {int(limit)}", [int(older_than_seconds * 1_000_000)]))

    async def receipts(self, order_no: str) -> list[dict[str, Any]]:
        return await self._all("SELECT order_no, waybill_no, idem_token, biz_key, attempt, gmt_create "
                               "FROM t_waybill_receipt WHERE order_no = %s", [order_no])

    async def dead_letters_of_order(self, order_no: str, limit: int = ORDER_LETTERS) -> list[dict[str, Any]]:
        """The order's newest ``limit`` dead letters, oldest of them first (a producer that keeps
        re-publishing one bad event can leave thousands: the rest are in the queue's list,
        filtered by the order). ``idx_order_group``: ``limit`` entries, then their rows."""
        rows = await self._all(f"SELECT {LIST_COLUMNS} FROM t_compensation WHERE order_no = %s AND consumer_group = %s "
                               f"ORDER BY id DESC LIMIT {int(limit)}", [order_no, self.group])
        return [_named(row) for row in reversed(rows)]

    async def dead_letters_of_order_count(self, order_no: str) -> int:
        """How many dead letters the order has, up to ``COUNT_CAP + 1`` (from the index alone)."""
        rows = await self._all(f"SELECT COUNT(*) AS n FROM (SELECT 1 FROM t_compensation WHERE order_no = %s "
                               f"AND consumer_group = %s LIMIT {COUNT_CAP + 1}) AS o", [order_no, self.group])
        return int(rows[0]["n"]) if rows else 0

    async def ping(self) -> None:
        await self._all("SELECT 1")

    @staticmethod
    def _idem_named(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for row in rows:
            row["status"] = IdemStatus(row["status"]).name.lower()
        return rows
