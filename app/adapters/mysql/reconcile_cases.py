"""``t_reconcile_case`` and its history (``t_reconcile_case_audit``): the statements of the cases
that the providers' reconciliation files and people act on (the ``CaseStore`` port of
``app.reconcile.ports``; what may be done, and when, is ``app.reconcile.casework``'s).

A case is unique by (group, kind, effect, reference): filed again, it keeps its status, moves its
``last_seen_at`` and, while it still has the status it was filed with, takes the new evidence.
A case's status is the stored integer the reconcile hands over; its evidence is JSON, decoded here.
Every statement names the group's own rows; a case's row is locked (``FOR UPDATE``) where the
reconcile asks, and a move is conditioned on the status it moves from, so that of two people at
once one moves it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from app.adapters.mysql.reconcile import RECEIPT_TABLES, STEP_COLUMNS, StepState, step_state
from app.adapters.mysql.sql import Execute, marks
from app.adapters.mysql.store import MySqlStore
from app.pipeline.states import IdemStatus
from app.render import json_default

T = TypeVar("T")
COLUMNS = ("id", "kind", "effect", "provider", "order_no", "reference", "evidence", "status", "found_at",
           "last_seen_at", "found_by_run", "closed_at", "closed_by", "note")
AUDIT_COLUMNS = ("at", "actor", "action", "from_status", "to_status", "note", "detail")
CHUNK = 200                 # cases filed in one statement


class Filed(Protocol):
    """A case as a run files it (``app.reconcile.casework``)."""
    kind: str
    effect: str
    reference: str
    provider: str
    order_no: str
    evidence: Mapping[str, Any]


class MySqlCases:
    def __init__(self, store: MySqlStore, *, group: str) -> None:
        self.store = store
        self.group = group[:255]

    async def run(self, work: Callable[[CaseStatements], Awaitable[T]]) -> T:
        """``work`` in one transaction, run again whole on a lost race (``Conflict``)."""
        return await self.store.in_transaction(lambda tx: work(CaseStatements(tx._exec, self.group)))

    async def file(self, cases: Sequence[Filed], *, status: int,
                   run_id: int | None) -> dict[tuple[str, str, str], int]:
        before: dict[tuple[str, str, str], int] = {}
        for start in range(0, len(cases), CHUNK):
            chunk = cases[start:start + CHUNK]

            async def work(tx, chunk=chunk) -> dict[tuple[str, str, str], int]:
                return await _file(tx._exec, group=self.group, chunk=chunk, status=status, run_id=run_id)
            before |= await self.store.in_transaction(work)
        return before

    async def newest(self, statuses: Iterable[int], limit: int) -> list[dict[str, Any]]:
        """A status at a time from ``idx_group_status_id``, never a sort of them all."""
        async def work(tx) -> list[dict[str, Any]]:
            found = []
            for status in statuses:
                result = await tx._exec(f"SELECT {', '.join(COLUMNS)} FROM t_reconcile_case WHERE consumer_group = %s "
                                        "AND status = %s ORDER BY id DESC LIMIT %s", [self.group, status, limit])
                found += [_case(row) for row in result]
            return found
        return await self.store.in_transaction(work)

    async def counts(self, status: int) -> dict[str, int]:
        async def work(tx) -> dict[str, int]:
            result = await tx._exec("SELECT kind, COUNT(*) FROM t_reconcile_case WHERE consumer_group = %s "
                                    "AND status = %s GROUP BY kind", [self.group, status])
            return {row[0]: int(row[1]) for row in result}
        return await self.store.in_transaction(work)


class CaseStatements:
    """One transaction's statements (``app.reconcile.ports.CaseStatements``)."""

    def __init__(self, execute: Execute, group: str) -> None:
        self.execute, self.group = execute, group

    async def case(self, case_id: int, *, lock: bool = False) -> dict[str, Any] | None:
        result = await self.execute(f"SELECT {', '.join(COLUMNS)} FROM t_reconcile_case WHERE consumer_group = %s "
                                    "AND id = %s" + (" FOR UPDATE" if lock else ""), [self.group, case_id])
        row = result.first()
        return _case(row) if row is not None else None

    async def history(self, case_id: int) -> list[dict[str, Any]]:
        result = await self.execute(f"SELECT {', '.join(AUDIT_COLUMNS)} FROM t_reconcile_case_audit "
                                    "WHERE case_id = %s ORDER BY id", [case_id])
        return [dict(zip(AUDIT_COLUMNS, row, strict=True)) for row in result]

    async def receipt(self, effect: str, order_no: str, *, lock: bool = False) -> tuple[str, str] | None:
        table, column = RECEIPT_TABLES[effect]
        result = await self.execute(f"SELECT {column}, idem_token FROM {table} WHERE order_no = %s"
                                    + (" FOR UPDATE" if lock else ""), [order_no])
        row = result.first()
        return (row[0], row[1]) if row is not None else None

    async def steps(self, keys: Sequence[str], *, lock: bool = False) -> list[StepState]:
        result = await self.execute(f"SELECT {STEP_COLUMNS} FROM t_idem WHERE biz_key IN ({marks(len(keys))})"
                                    + (" FOR UPDATE" if lock else ""), list(keys))
        return [step_state(row) for row in result]

    async def write_receipt(self, effect: str, order_no: str, reference: str, step: StepState) -> None:
        table, column = RECEIPT_TABLES[effect]
        await self.execute(f"INSERT INTO {table} (order_no, {column}, idem_token, biz_key, attempt, gmt_create) "
                           "VALUES (%s, %s, %s, %s, %s, NOW(3))",
                           [order_no, reference, step.token, step.biz_key, step.attempt])

    async def step_done(self, step: StepState, outcome: str) -> bool:
        moved = await self.execute(
            f"UPDATE t_idem SET status = {int(IdemStatus.DONE)}, outcome = %s, last_err = NULL, lease_until = NULL, "
            f"gmt_modified = NOW(3) WHERE biz_key = %s AND part_date = %s AND attempt = %s "
            f"AND status = {int(IdemStatus.PENDING)}", [outcome, step.biz_key, step.part_date, step.attempt])
        return moved.rowcount == 1

    async def close(self, case_id: int, *, status: int, open_status: int, actor: str, note: str | None) -> bool:
        result = await self.execute(
            "UPDATE t_reconcile_case SET status = %s, closed_at = NOW(3), closed_by = %s, note = %s "
            "WHERE consumer_group = %s AND id = %s AND status = %s",
            [status, actor[:128], None if note is None else note[:1024], self.group, case_id, open_status])
        return result.rowcount == 1

    async def set_evidence(self, case_id: int, evidence: Mapping[str, Any]) -> None:
        await self.execute("UPDATE t_reconcile_case SET evidence = %s WHERE consumer_group = %s AND id = %s",
                           [_json(evidence), self.group, case_id])

    async def audit(self, case_id: int, actor: str, action: str, from_status: int | None, to_status: int | None,
                    note: str | None, detail: str | None) -> None:
        await self.execute(
            "INSERT INTO t_reconcile_case_audit (case_id, at, actor, action, from_status, to_status, note, detail) "
            "VALUES (%s, NOW(3), %s, %s, %s, %s, %s, %s)",
            [case_id, actor[:128], action[:32], from_status, to_status, None if note is None else note[:1024],
             None if detail is None else detail[:1024]])


async def _file(execute: Execute, *, group: str, chunk: Sequence[Filed], status: int,
                run_id: int | None) -> dict[tuple[str, str, str], int]:
    keys = [(case.kind, case.effect, case.reference) for case in chunk]
    flat = [v for key in keys for v in key]
    result = await execute(
        "SELECT kind, effect, reference, status FROM t_reconcile_case WHERE consumer_group = %s "
        f"AND (kind, effect, reference) IN ({marks(len(keys), '(%s, %s, %s)')}) FOR UPDATE", [group, *flat])
    before = {(row[0], row[1], row[2]): int(row[3]) for row in result}
    params: list[Any] = []
    for case in chunk:
        params += [group, case.kind, case.effect, case.provider[:32], case.order_no[:64], case.reference[:64],
                   _json(case.evidence), status, run_id]
    # VALUES(): MariaDB's form, which MySQL 8 still takes (app.adapters.mysql.skipped_types).
    await execute(
        "INSERT INTO t_reconcile_case (consumer_group, kind, effect, provider, order_no, reference, evidence, status, "
        f"found_at, last_seen_at, found_by_run) VALUES {marks(len(chunk), '(%s, %s, %s, %s, %s, %s, %s, %s, NOW(3), NOW(3), %s)')} "
        f"ON DUPLICATE KEY UPDATE evidence = IF(status = {int(status)}, VALUES(evidence), evidence), "
        "last_seen_at = VALUES(last_seen_at)", params)
    opened = [key for key in keys if key not in before]
    if opened:
        result = await execute(
            "SELECT id, kind FROM t_reconcile_case WHERE consumer_group = %s "
            f"AND (kind, effect, reference) IN ({marks(len(opened), '(%s, %s, %s)')})",
            [group, *[v for key in opened for v in key]])
        run = f"reconcile:{run_id}" if run_id is not None else "reconcile"
        rows = list(result)
        if rows:
            await execute(
                "INSERT INTO t_reconcile_case_audit (case_id, at, actor, action, from_status, to_status, detail) "
                f"VALUES {marks(len(rows), '(%s, NOW(3), %s, %s, NULL, %s, %s)')}",
                [v for case_id, kind in rows for v in (case_id, run, "opened", status, f"found: {kind}")])
    return before


def _case(row) -> dict[str, Any]:
    case = dict(zip(COLUMNS, row, strict=True))
    case["status"] = int(case["status"])
    case["evidence"] = json.loads(case["evidence"]) if case["evidence"] else {}
    return case


def _json(value: Mapping[str, Any]) -> str:
    return json.dumps(value, default=json_default, separators=(",", ":"))
