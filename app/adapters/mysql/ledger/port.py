"""The compensation ledger on MySQL: the compensator's ``Ledger`` port over the store."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import app.adapters.mysql.idem as idem
import app.adapters.mysql.ledger.grouping as groups
import app.adapters.mysql.ledger.statements as ledger
import app.adapters.mysql.workers as workers
from app.adapters.mysql.sql import Execute
from app.adapters.mysql.store import MySqlStore
from app.pipeline.model import LedgerRow, Settlement, SourceKey
from app.pipeline.ports import SourceRecord
from app.pipeline.states import AUTOMATIC_CLAIMS, LedgerStatus

T = TypeVar("T")


class MySqlLedger:
    def __init__(self, store: MySqlStore, *, dead_after: float | None = None) -> None:
        self.store = store
        # With the workers' heartbeats: a dead compensator's claims on ledger rows end at once.
        self.dead_after = dead_after

    async def _run(self, work: Callable[[Execute], Awaitable[T]]) -> T:
        return await self.store.in_transaction(lambda tx: work(tx._exec))

    async def find(self, source: SourceKey) -> LedgerRow | None:
        return await self._run(lambda execute: ledger.find(execute, source))

    async def get(self, row_id: int, group: str) -> LedgerRow | None:
        return await self._run(lambda execute: ledger.get(execute, row_id, group=group))

    async def add_manual(self, source: SourceKey, record: SourceRecord, reason: str, message: str) -> LedgerRow:
        """The row of ``source``, for a person; made (and audited) only if there is none yet."""
        async def work(execute: Execute) -> LedgerRow:
            found = await ledger.find(execute, source)
            if found is not None:
                return found
            await ledger.add_manual(execute, source, record, reason, message)
            row = await ledger.find(execute, source)
            await ledger.audit(execute, row.id, actor="compensator", action="opened", from_status=None,
                               to_status=row.status, note=None, detail=f"{reason}: {message}")
            return row
        return await self._run(work)

    async def next_due(self, group: str) -> float | None:
        return await self._run(lambda execute: ledger.next_due(execute, group))

    async def claim(self, row_id: int, owner: str, lease_seconds: float, *,
                    allowed: frozenset[LedgerStatus] = AUTOMATIC_CLAIMS) -> LedgerRow | None:
        async def work(execute: Execute) -> LedgerRow | None:
            if await ledger.claim(execute, row_id, owner, lease_seconds, allowed):
                return await ledger.get(execute, row_id)
            return None
        return await self._run(work)

    async def claim_due(self, group: str, limit: int, owner: str, lease_seconds: float) -> list[LedgerRow]:
        async def work(execute: Execute) -> list[LedgerRow]:
            if self.dead_after is not None:
                await workers.end_dead_ledger_claims(execute, group, self.dead_after)
            return await ledger.claim_due(execute, group, limit, owner, lease_seconds)
        return await self._run(work)

    async def settle(self, settlements: Sequence[Settlement], *, owner: str, actor: str, action: str,
                     job_id: int | None = None) -> set[int]:
        """Every settlement in one transaction; the ids that were still ``owner``'s to settle.
        The claims ``owner`` holds on their released steps are given up with them."""
        async def work(execute: Execute) -> set[int]:
            settled, failed = set(), []
            for s in settlements:
                v = s.verdict
                if not await ledger.settle(execute, s.row_id, owner, v.status, redrives=v.redrives,
                                           retry_in=v.retry_in, message=v.detail, reason=v.reason):
                    continue
                settled.add(s.row_id)
                if v.reason is not None:
                    failed.append(s.row_id)
                await ledger.audit(execute, s.row_id, actor=actor, action=action, from_status=LedgerStatus.RETRYING,
                                   to_status=v.status, note=s.note, detail=v.detail, job_id=job_id)
            # Rows that failed for a reason of their own join its error group, all in one go (their
            # buckets locked in one order). A run that failed nobody's way (deferred, superseded,
            # done) keeps the group the row came in with.
            await groups.regroup(execute, await groups.by_id(execute, sorted(failed)))
            keys = sorted({key for s in settlements if s.row_id in settled for key in s.release})
            if keys:
                await idem.release(execute, keys, owner=owner)
            return settled
        return await self._run(work)

    async def act(self, row_id: int, group: str, to: LedgerStatus, allowed: frozenset[LedgerStatus], *,
                  actor: str, action: str, note: str | None, steps: Sequence[str], step_outcome: str,
                  job_id: int | None = None) -> tuple[LedgerRow | None, bool, str | None]:
        """A person's decision, and in the same transaction the event's steps still pending
        settled with ``step_outcome`` (fenced on their attempt); refused while one is being
        worked (a live lease)."""
        async def work(execute: Execute) -> tuple[LedgerRow | None, bool, str | None]:
            row = await ledger.get(execute, row_id, group=group, lock=True)
            if row is None or row.status is to or row.status not in allowed:
                return row, False, None
            pending = await idem.pending(execute, steps) if steps else []
            busy = [p for p in pending if p.live]
            if busy:
                return row, False, (f"step {busy[0].biz_key} is being worked right now by {busy[0].owner} (its lease "
                                    f"runs {busy[0].remaining:.0f}s more); try again once it ends")
            if pending:
                await idem.settle_by_person(execute, pending, step_outcome,
                                            f"{action} by {actor} of dead letter {row_id}")
            await ledger.move(execute, row_id, to, allowed)
            await ledger.audit(execute, row_id, actor=actor, action=action, from_status=row.status, to_status=to,
                               note=note, detail=(f"settled the pending steps {', '.join(p.biz_key for p in pending)}"
                                                  f" as {step_outcome}")[:1024] if pending else None,
                               job_id=job_id)
            return await ledger.get(execute, row_id), True, None
        return await self._run(work)

    async def reopen_unknown(self, keys: Sequence[str]) -> int:
        return await self._run(lambda execute: idem.reopen_unknown(execute, keys))

    async def get_many(self, row_ids: Sequence[int], group: str) -> list[LedgerRow]:
        return await self._run(lambda execute: ledger.get_many(execute, row_ids, group=group))

    async def claim_many(self, row_ids: Sequence[int], group: str, owner: str, lease_seconds: float, *,
                         allowed: frozenset[LedgerStatus]) -> list[LedgerRow]:
        return await self._run(lambda execute: ledger.claim_many(execute, row_ids, owner, lease_seconds, group=group,
                                                                 allowed=allowed))
