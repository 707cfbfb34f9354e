"""What the reconcile reads of the tables, a chunk of records at a time, and its runs (``t_reconcile_run``).

Every read is by an index: ``t_idem`` by its primary key's first column (``biz_key IN``), the ledger
by its unique key's prefix (group, topic, partition, offset range), the waybill receipts by their
primary key (``order_no IN``). A row's age is the server's clock against ``gmt_modified``, as the
stuck sweep reads it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from app.adapters.mysql.sql import marks
from app.adapters.mysql.store import MySqlStore
from app.reconcile.input import ReceiptRow, StepRow
from app.render import json_default

REPORT_BYTES = 4 * 1024 * 1024        # a report's JSON kept in its row, at most (MEDIUMTEXT holds 16 MiB)
RUN_COLUMNS = ("id", "consumer_group", "topic", "range_from", "range_to", "started_by", "started_at",
               "finished_at", "status", "records", "findings")


class ReconcileReads:
    def __init__(self, store: MySqlStore, *, group: str) -> None:
        self.store = store
        self.group = group[:255]

    async def steps(self, keys: Iterable[str]) -> dict[str, StepRow]:
        keys = sorted(set(keys))
        if not keys:
            return {}

        async def work(tx):
            result = await tx._exec(
                "SELECT biz_key, status, outcome, attempt, idem_token, "
                "TIMESTAMPDIFF(MICROSECOND, gmt_modified, NOW(3)) / 1000000 "
                f"FROM t_idem WHERE biz_key IN ({marks(len(keys), '%s')})", keys)
            return {row[0]: StepRow(row[0], int(row[1]), row[2], int(row[3]), row[4], float(row[5] or 0))
                    for row in result}
        return await self.store.in_transaction(work)

    async def waybill_receipts(self, orders: Iterable[str]) -> dict[str, ReceiptRow]:
        """The waybill receipts of ``orders``, by their step's key."""
        orders = sorted(set(orders))
        if not orders:
            return {}

        async def work(tx):
            result = await tx._exec(
                "SELECT order_no, biz_key, idem_token, waybill_no FROM t_waybill_receipt "
                f"WHERE order_no IN ({marks(len(orders), '%s')})", orders)
            return {row[1]: ReceiptRow(row[0], row[1], row[2], row[3]) for row in result}
        return await self.store.in_transaction(work)

    async def ledger(self, topic: str, partition: int, start: int, end: int) -> list[dict[str, Any]]:
        """The group's ledger rows naming offsets ``start`` .. ``end - 1`` of ``topic``'s ``partition``."""
        async def work(tx):
            result = await tx._exec(
                "SELECT id, src_offset, src_timestamp, status, reason, order_no FROM t_compensation "
                "WHERE consumer_group = %s AND src_topic = %s AND src_partition = %s AND src_offset >= %s "
                "AND src_offset < %s", [self.group, topic, partition, start, end])
            return [dict(zip(("id", "src_offset", "src_timestamp", "status", "reason", "order_no"), row, strict=True))
                    for row in result]
        return await self.store.in_transaction(work)

    # -- runs -------------------------------------------------------------------------
    async def begin(self, topic: str, since: datetime, until: datetime, started_by: str) -> int:
        async def work(tx):
            result = await tx._exec(
                "INSERT INTO t_reconcile_run (consumer_group, topic, range_from, range_to, started_by, status) "
                "VALUES (%s, %s, %s, %s, %s, 'running')",
                [self.group, topic[:249], since.replace(tzinfo=None), until.replace(tzinfo=None), started_by[:128]])
            return int(result.lastrowid)
        return await self.store.in_transaction(work)

    async def finish(self, run_id: int, *, status: str, records: int, findings: int, report: Mapping,
                     summary: Mapping[str, int]) -> None:
        text = json.dumps(report, default=json_default, separators=(",", ":"))
        if len(text) > REPORT_BYTES:
            text = json.dumps({**report, "findings": report.get("findings", [])[:100], "truncated": True},
                              default=json_default, separators=(",", ":"))
        await self.store.in_transaction(lambda tx: tx._exec(
            "UPDATE t_reconcile_run SET finished_at = NOW(3), status = %s, records = %s, findings = %s, report = %s, "
            "summary = %s WHERE id = %s", [status, records, findings, text, json.dumps(dict(summary)), run_id]))

    async def runs(self, limit: int = 50) -> list[dict[str, Any]]:
        """The group's latest runs, newest first, without their reports."""
        async def work(tx):
            result = await tx._exec(
                f"SELECT {', '.join(RUN_COLUMNS)} FROM t_reconcile_run WHERE consumer_group = %s "
                "ORDER BY id DESC LIMIT %s", [self.group, limit])
            return [dict(zip(RUN_COLUMNS, row, strict=True)) for row in result]
        return await self.store.in_transaction(work)

    async def run(self, run_id: int) -> dict[str, Any] | None:
        async def work(tx):
            result = await tx._exec(
                f"SELECT {', '.join(RUN_COLUMNS)}, report FROM t_reconcile_run WHERE consumer_group = %s AND id = %s",
                [self.group, run_id])
            return result.first()
        row = await self.store.in_transaction(work)
        if row is None:
            return None
        found = dict(zip((*RUN_COLUMNS, "report"), row, strict=True))
        found["report"] = json.loads(found["report"]) if found["report"] else None
        return found

    async def forget(self, older_than_days: float, limit: int = 1000) -> int:
        """Delete the group's runs that started more than ``older_than_days`` ago, at most ``limit``."""
        seconds = int(older_than_days * 86400)
        result = await self.store.in_transaction(lambda tx: tx._exec(
            "DELETE FROM t_reconcile_run WHERE consumer_group = %s AND started_at < NOW(3) - INTERVAL "
            f"{seconds} SECOND ORDER BY id LIMIT {int(limit)}", [self.group]))
        return result.rowcount

    async def latest_completed(self) -> tuple[dict[str, int], float, float] | None:
        """The latest run that completed (clean or with findings): its findings by kind, when it finished and
        where its range ended (epoch seconds, the server's clock read as UTC), for the gauges every worker sets.
        The group's runs by ``idx_group_id``, newest first."""
        async def work(tx):
            result = await tx._exec(
                "SELECT summary, UNIX_TIMESTAMP(finished_at), UNIX_TIMESTAMP(range_to) FROM t_reconcile_run "
                "WHERE consumer_group = %s AND status IN ('clean', 'findings') ORDER BY id DESC LIMIT 1", [self.group])
            return result.first()
        row = await self.store.in_transaction(work)
        if row is None:
            return None
        return json.loads(row[0] or "{}"), float(row[1]), float(row[2])


def chunks(items: Sequence, size: int) -> Iterable[Sequence]:
    for i in range(0, len(items), size):
        yield items[i:i + size]
