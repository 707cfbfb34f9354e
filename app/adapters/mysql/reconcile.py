"""What the reconcile reads of the tables (its ports, ``app.reconcile.ports``): a run's rows for a
chunk of records and its runs (``t_reconcile_run``), and our receipts of an effect as the providers'
side compares them.

A run's reads are by an index: ``t_idem`` by its primary key's first column (``biz_key IN``), the
ledger by its unique key's prefix (group, topic, partition, offset range), the waybill receipts by
their primary key (``order_no IN``). A row's age is the server's clock against ``gmt_modified``, as
the stuck sweep reads it.

The providers' side reads our receipts written over a time range (``idx_gmt_create``), those of
given orders (the primary key), and ``t_idem`` rows by key, a bounded chunk at a time. An effect is
compared with its provider's records only where its receipts have a table of their own
(:data:`RECEIPT_TABLES`): the waybill's ``t_waybill_receipt``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from app.adapters.mysql.sql import marks
from app.adapters.mysql.store import MySqlStore
from app.pipeline.steps import ISSUE_WAYBILL
from app.render import json_default

# effect -> (its receipt table, the column holding the provider's reference)
RECEIPT_TABLES: Mapping[str, tuple[str, str]] = {ISSUE_WAYBILL.name: ("t_waybill_receipt", "waybill_no")}
CHUNK = 500                    # keys in one IN list
STEP_COLUMNS = ("biz_key, part_date, step, status, idem_token, attempt, owner, gmt_create, "
                "COALESCE(lease_until >= NOW(3), 0)")
REPORT_BYTES = 4 * 1024 * 1024        # a report's JSON kept in its row, at most (MEDIUMTEXT holds 16 MiB)
RUN_COLUMNS = ("id", "consumer_group", "topic", "range_from", "range_to", "started_by", "started_at",
               "finished_at", "status", "records", "findings")


@dataclass(frozen=True, slots=True)
class StepRow:
    """A ``t_idem`` row as a run reads it."""

    biz_key: str
    status: int
    outcome: str | None
    attempt: int
    token: str | None
    age_seconds: float                  # since its last change


@dataclass(frozen=True, slots=True)
class ReceiptRow:
    order_no: str
    biz_key: str
    token: str
    reference: str


@dataclass(frozen=True, slots=True)
class StepState:
    """The ``t_idem`` row of an effect's step."""
    biz_key: str
    part_date: date
    step: str
    status: int                 # app.pipeline.states.IdemStatus
    token: str | None
    attempt: int
    owner: str | None
    claimed_at: datetime        # gmt_create: its first claim, before its first call (UTC)
    live: bool                  # its lease still runs: a worker may be between its call and T3


@dataclass(frozen=True, slots=True)
class HeldReceipt:
    """A receipt we hold: the provider's reference for what it did, and the step that wrote it."""
    order_no: str
    reference: str
    token: str
    biz_key: str
    written_at: datetime        # gmt_create (UTC)
    step: StepState | None


class ReconcileReads:
    """A run's reads and its runs (``app.reconcile.ports.RunStore``)."""

    receipt_effects = frozenset(RECEIPT_TABLES)

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


class ReceiptRanges:
    """Our receipts of one effect as the providers' side reads them (``app.reconcile.ports.ReceiptReads``)."""

    def __init__(self, store: MySqlStore, effect: str) -> None:
        self.store = store
        self.effect = effect
        self.table, self.column = RECEIPT_TABLES[effect]

    async def written(self, since: datetime, until: datetime, *, limit: int) -> list[HeldReceipt]:
        """The receipts written at or after ``since`` and before ``until``, oldest first, at most ``limit``."""
        rows = await self._rows(
            f"SELECT order_no, {self.column}, idem_token, biz_key, gmt_create FROM {self.table} "
            "WHERE gmt_create >= %s AND gmt_create < %s ORDER BY gmt_create, order_no LIMIT %s",
            [_naive(since), _naive(until), limit])
        steps = await self.steps([row[3] for row in rows])
        return [_receipt(row, steps.get(row[3])) for row in rows]

    async def of_orders(self, orders: Iterable[str]) -> dict[str, HeldReceipt]:
        """The receipts of ``orders``, by order."""
        rows = []
        for chunk in chunks(sorted(set(orders)), CHUNK):
            rows += await self._rows(f"SELECT order_no, {self.column}, idem_token, biz_key, gmt_create FROM "
                                     f"{self.table} WHERE order_no IN ({marks(len(chunk))})", list(chunk))
        steps = await self.steps([row[3] for row in rows])
        return {row[0]: _receipt(row, steps.get(row[3])) for row in rows}

    async def steps(self, keys: Iterable[str]) -> dict[str, StepState]:
        """The ``t_idem`` rows of ``keys`` that exist, by key."""
        found: dict[str, StepState] = {}
        for chunk in chunks(sorted(set(keys)), CHUNK):
            rows = await self._rows(f"SELECT {STEP_COLUMNS} FROM t_idem WHERE biz_key IN ({marks(len(chunk))})",
                                    list(chunk))
            found.update((row[0], step_state(row)) for row in rows)
        return found

    async def _rows(self, sql: str, params: list) -> list:
        async def work(tx) -> list:
            return list(await tx._exec(sql, params))
        return await self.store.in_transaction(work)


def step_state(row) -> StepState:
    """A row of ``SELECT {STEP_COLUMNS}``."""
    return StepState(row[0], row[1], row[2], int(row[3]), row[4], int(row[5]), row[6], _utc(row[7]), bool(row[8]))


def _receipt(row, step: StepState | None) -> HeldReceipt:
    return HeldReceipt(row[0], row[1], row[2], row[3], _utc(row[4]), step)


def _naive(at: datetime) -> datetime:
    """A time as the DATETIME columns hold it: UTC, without a zone (the sessions' time zone is UTC)."""
    return at.astimezone(UTC).replace(tzinfo=None) if at.tzinfo else at


def _utc(at: datetime) -> datetime:
    return at.replace(tzinfo=UTC)


def chunks(items: Sequence, size: int) -> Iterable[Sequence]:
    for i in range(0, len(items), size):
        yield items[i:i + size]
