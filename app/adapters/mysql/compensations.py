"""The compensation ledger on MySQL: the compensator's ``Ledger`` port over the store."""

from __future__ import annotations

from typing import Awaitable, Callable, Sequence, TypeVar

from app.adapters.mysql import idem, ledger
from app.adapters.mysql.sql import Execute
from app.adapters.mysql.store import MySqlStore
from app.pipeline.compensation import LedgerRow, SourceKey, Status
from app.pipeline.ports import SourceRecord

T = TypeVar("T")


class MySqlLedger:
    def __init__(self, store: MySqlStore) -> None:
        self.store = store

    async def _run(self, work: Callable[[Execute], Awaitable[T]]) -> T:
        return await self.store.in_transaction(lambda tx: work(tx._exec))

    async def find(self, source: SourceKey) -> LedgerRow | None:
        return await self._run(lambda execute: ledger.find(execute, source))

    async def get(self, row_id: int) -> LedgerRow | None:
        return await self._run(lambda execute: ledger.get(execute, row_id))

    async def add_manual(self, source: SourceKey, record: SourceRecord, reason: str, message: str) -> LedgerRow:
        async def work(execute: Execute) -> LedgerRow:
            await ledger.add_manual(execute, source, record, reason, message)
            row = await ledger.find(execute, source)
            await ledger.audit(execute, row.id, actor="compensator", action="opened", from_status=None,
                               to_status=row.status, note=None, detail=f"{reason}: {message}")
            return row
        return await self._run(work)

    async def due(self, group: str, limit: int) -> list[LedgerRow]:
        return await self._run(lambda execute: ledger.due(execute, group, limit))

    async def claim(self, row_id: int, owner: str, lease_seconds: float) -> LedgerRow | None:
        async def work(execute: Execute) -> LedgerRow | None:
            if await ledger.claim(execute, row_id, owner, lease_seconds):
                return await ledger.get(execute, row_id)
            return None
        return await self._run(work)

    async def settle(self, row_id: int, owner: str, status: Status, *, redrives: int, retry_in: float | None,
                     actor: str, action: str, detail: str, note: str | None = None) -> bool:
        async def work(execute: Execute) -> bool:
            if not await ledger.settle(execute, row_id, owner, status, redrives=redrives, retry_in=retry_in,
                                       message=detail):
                return False
            await ledger.audit(execute, row_id, actor=actor, action=action, from_status=Status.RETRYING,
                               to_status=status, note=note, detail=detail)
            return True
        return await self._run(work)

    async def act(self, row_id: int, to: Status, allowed: frozenset[Status], *, actor: str, action: str,
                  note: str | None) -> tuple[LedgerRow | None, bool]:
        async def work(execute: Execute) -> tuple[LedgerRow | None, bool]:
            row = await ledger.get(execute, row_id, lock=True)
            if row is None or row.status is to or row.status not in allowed:
                return row, False
            await ledger.move(execute, row_id, to, allowed)
            await ledger.audit(execute, row_id, actor=actor, action=action, from_status=row.status, to_status=to,
                               note=note, detail=None)
            return await ledger.get(execute, row_id), True
        return await self._run(work)

    async def reopen_unknown(self, keys: Sequence[str]) -> int:
        return await self._run(lambda execute: idem.reopen_unknown(execute, keys))
