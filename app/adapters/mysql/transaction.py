"""One open transaction, as the pipeline's ``Transaction`` port: every method is one
statement (one round trip) per table it touches, whatever the batch's size."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from datetime import date
from typing import Protocol, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection

import app.adapters.mysql.idem as idem
import app.adapters.mysql.ledger.statements as ledger
import app.adapters.mysql.orders as orders
import app.adapters.mysql.recovery as recovery
import app.adapters.mysql.workers as workers
from app.adapters.mysql.receipts import WRITERS
from app.pipeline.model import BatchPlan, FailRow, IdemRow
from app.pipeline.ports import DeadLetter, Finished
from app.pipeline.states import Order

T = TypeVar("T")


class Limits(Protocol):
    """What a transaction needs of its store: the round trips it counts, and the time limit each
    statement runs under (``MySqlStore`` is one)."""
    round_trips: int

    async def bounded(self, step: Awaitable[T]) -> T: ...


class MySqlTransaction:
    def __init__(self, conn: AsyncConnection, store: Limits) -> None:
        self.conn = conn
        self.store = store

    async def _exec(self, sql: str, params: Sequence = ()):
        self.store.round_trips += 1
        return await self.store.bounded(self.conn.exec_driver_sql(sql, tuple(params)))

    # -- T1 ------------------------------------------------------------------

    async def read_idem(self, keys: Sequence[str], part_dates: Sequence[date]) -> dict[str, IdemRow]:
        return await idem.read(self._exec, keys, part_dates)

    async def read_orders(self, order_nos: Sequence[str]) -> dict[str, Order]:
        return await orders.read(self._exec, order_nos)

    async def recovery_age(self) -> float | None:
        return await recovery.open_age(self._exec)

    async def take_over_dead(self, held: Sequence[IdemRow], *, dead_after: float) -> list[str]:
        return await workers.end_dead_leases(self._exec, held, dead_after)

    async def apply_plan(self, plan: BatchPlan, *, owner: str, lease_seconds: float) -> None:
        lease_us = int(lease_seconds * 1_000_000)
        if plan.orders:
            await orders.upsert(self._exec, list(plan.orders.values()))
        if plan.inserts:
            await idem.insert(self._exec, plan.inserts, owner=owner, lease_us=lease_us)
        if plan.reclaims:
            await idem.reclaim(self._exec, plan.reclaims, owner=owner, lease_us=lease_us)
        for fail in plan.fails:
            await idem.fail(self._exec, fail)
        if plan.superseding:
            await ledger.flag_overtaken(self._exec, sorted(plan.superseding), sorted(plan.batch_keys))

    # -- T3 ------------------------------------------------------------------

    async def finish_effects(self, finished: Sequence[Finished], *, owner: str) -> set[str]:
        """Record how each call ended, fenced on (owner, attempt); return the keys still ours.

        Running it twice with the same outcomes (a re-run after a lost commit) gives
        the same answer and writes nothing more."""
        owned: set[str] = set()
        by_effect: dict[str, list[Finished]] = {}
        for item in finished:
            if item.receipt is not None:
                by_effect.setdefault(item.job.effect.name, []).append(item)
        for name, items in by_effect.items():
            ours = await idem.mark_done(self._exec, items[0].job.effect.done, items, owner=owner)
            owned |= ours
            writer = WRITERS.get(name)
            if writer is not None and (done := [f for f in items if f.job.biz_key in ours]):
                await writer(self._exec, done)
        for item in finished:
            if item.error is None:
                continue
            error, job = item.error, item.job
            if error.retriable or not error.fails_step:
                ours = await idem.note(self._exec, item, job.not_called_outcome() if error.not_delivered
                                       else error.reason, owner=owner)
            else:
                ours = await idem.fail(self._exec, FailRow(job.biz_key, job.part_date, job.attempt, error.reason,
                                                           str(error)), owner=owner)
            if ours:
                owned.add(job.biz_key)
        return owned

    # -- dead letters ------------------------------------------------------------

    async def record_dead_letters(self, letters: Sequence[DeadLetter], *, group: str,
                                  retry_after_seconds: int = 60, release_owner: str | None = None) -> None:
        if letters:
            await ledger.record(self._exec, letters, group=group, retry_after_seconds=retry_after_seconds)
            keys = sorted({key for letter in letters for key in letter.step_keys[1:]})
            if release_owner and keys:
                await idem.release(self._exec, keys, owner=release_owner)
