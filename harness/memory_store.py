"""The pipeline's store in memory: the same ``Store`` / ``Transaction`` ports and the same
rules as ``app.adapters.mysql`` (status, attempt, owner and lease fencing; an order's rank
never goes down; one ledger row per record and group), for unit tests of the processor's
orchestration without MariaDB. ``harness/scenarios.py`` runs the same scenarios on
both stores, so this one cannot drift from the real one unnoticed.

Transactions run one at a time (a lock stands in for MariaDB's row locks) on a copy of
the state that replaces it on commit: a transaction that raises leaves nothing behind.
Leases are compared with :attr:`MemoryStore.now`, a clock the test moves.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import date
from typing import TypeVar

from app.adapters.mysql.receipts import WRITERS
from app.pipeline.errors import Conflict, StoreUnavailable
from app.pipeline.liveness_fence import incarnation_of
from app.pipeline.model import NOT_DELIVERED, BatchPlan, FailRow, IdemRow
from app.pipeline.ports import DeadLetter, Finished
from app.pipeline.states import ORDER_DATA, IdemStatus, Order

T = TypeVar("T")


@dataclass
class Row:
    biz_key: str
    part_date: date
    step: str
    status: IdemStatus
    attempt: int
    owner: str | None
    lease_until: float | None
    idem_token: str | None
    payload_hash: str
    outcome: str | None
    last_err: str | None = None
    modified: float = 0.0          # gmt_modified, on the store's clock
    created: float = 0.0           # gmt_create
    first_call_at: float | None = None


@dataclass
class State:
    idem: dict[str, Row] = field(default_factory=dict)
    orders: dict[str, Order] = field(default_factory=dict)
    receipts: dict[str, dict] = field(default_factory=dict)                 # order_no -> waybill receipt
    ledger: dict[tuple, dict] = field(default_factory=dict)                 # (group, topic, partition, offset, ts)
    recovery_opened: float | None = None                                    # store time an open window opened
    heartbeats: dict[str, float] = field(default_factory=dict)              # incarnation -> its last heartbeat


class MemoryStore:
    def __init__(self, *, lock_retries: int = 5) -> None:
        self.state = State()
        self.now = 0.0
        self.round_trips = 0
        self.lock_retries = lock_retries
        self.fail_next: list[Exception] = []        # raised by the next transactions, in turn
        self._lock = asyncio.Lock()

    async def in_transaction(self, work: Callable[[MemoryTransaction], Awaitable[T]]) -> T:
        for _attempt in range(self.lock_retries + 1):
            if self.fail_next:
                raise self.fail_next.pop(0)
            async with self._lock:
                draft = copy.deepcopy(self.state)
                try:
                    result = await work(MemoryTransaction(draft, self))
                except Conflict:
                    continue
                self.state = draft
                self.round_trips += 1
                return result
        raise StoreUnavailable(f"still conflicting after {self.lock_retries + 1} runs")


class MemoryTransaction:
    def __init__(self, state: State, store: MemoryStore) -> None:
        self.s = state
        self.store = store

    # -- T1 ------------------------------------------------------------------

    async def read_idem(self, keys: Sequence[str], part_dates: Sequence[date]) -> dict[str, IdemRow]:
        now = self.store.now
        found = {}
        for key in keys:
            row = self.s.idem.get(key)
            if row is not None and row.part_date in part_dates:
                expired = row.lease_until is None or row.lease_until < now
                remaining = 0.0 if row.lease_until is None else max(row.lease_until - now, 0.0)
                found[key] = IdemRow(key, row.status, row.attempt, row.owner, row.idem_token, row.payload_hash,
                                     row.outcome, row.last_err, expired, remaining,
                                     now - (max(row.modified, row.lease_until or row.modified)
                                            if row.outcome is None else row.modified),
                                     now - (row.created if row.first_call_at is None else row.first_call_at))
        return found

    async def read_orders(self, order_nos: Sequence[str]) -> dict[str, Order]:
        return {o: self.s.orders[o] for o in order_nos if o in self.s.orders}

    async def recovery_age(self) -> float | None:
        opened = self.s.recovery_opened
        return None if opened is None else max(self.store.now - opened, 0.0)

    async def take_over_dead(self, held: Sequence[IdemRow], *, dead_after: float) -> list[str]:
        now, taken = self.store.now, []
        for seen in held:
            last = self.s.heartbeats.get(incarnation_of(seen.owner))
            row = self.s.idem[seen.biz_key]
            if last is None or now - last < dead_after or row.owner != seen.owner:
                continue
            death = last + dead_after
            if row.status is IdemStatus.PENDING and row.lease_until is not None and row.lease_until > death:
                row.lease_until = death
                taken.append(seen.biz_key)
        return taken

    async def apply_plan(self, plan: BatchPlan, *, owner: str, lease_seconds: float) -> None:
        now = self.store.now
        for order in plan.orders.values():
            stored = self.s.orders.get(order.order_no)
            if stored is None:
                self.s.orders[order.order_no] = replace(order, has_dead_letters=False)
            elif order.status > stored.status:            # the rank only goes up
                data = {name: getattr(order, name) if getattr(order, name) is not None else getattr(stored, name)
                        for name in ORDER_DATA}
                self.s.orders[order.order_no] = replace(stored, status=order.status, has_dead_letters=False, **data)
            else:                                           # no move: only empty fields are filled
                data = {name: getattr(stored, name) if getattr(stored, name) is not None else getattr(order, name)
                        for name in ORDER_DATA}
                self.s.orders[order.order_no] = replace(stored, **data)
        for new in plan.inserts:
            if new.biz_key in self.s.idem:
                raise Conflict(f"{new.biz_key} inserted meanwhile")      # MySQL: 1062, and the re-run reads it
            pending = new.status is IdemStatus.PENDING
            self.s.idem[new.biz_key] = Row(new.biz_key, new.part_date, new.step, new.status, 1, owner,
                                           now + lease_seconds if pending else None, new.idem_token,
                                           new.payload_hash, new.outcome, modified=now, created=now,
                                           first_call_at=now if pending else None)
        claimed = 0
        for reclaim in plan.reclaims:
            row = self.s.idem.get(reclaim.biz_key)
            if (row is not None and row.status is IdemStatus.PENDING and row.attempt == reclaim.attempt
                    and (row.lease_until is None or row.lease_until < now or row.owner == owner)):
                if row.first_call_at is None:
                    row.first_call_at = now if row.outcome == NOT_DELIVERED else row.created
                row.attempt += 1
                row.owner, row.outcome, row.lease_until, row.modified = owner, None, now + lease_seconds, now
                claimed += 1
        if claimed != len(plan.reclaims):
            raise Conflict(f"re-claimed {claimed} of {len(plan.reclaims)} rows")
        for fail in plan.fails:
            self._fail(fail)
        if plan.superseding:
            for row in self.s.ledger.values():
                if row["order_no"] in plan.superseding and row["biz_key"] not in plan.batch_keys:
                    row["may_be_superseded"] = True

    def _fail(self, fail: FailRow, owner: str | None = None) -> bool:
        row = self.s.idem.get(fail.biz_key)
        if row is None or row.attempt != fail.attempt or (owner is not None and row.owner != owner):
            return False
        if row.status is IdemStatus.PENDING:
            row.status, row.outcome, row.last_err, row.lease_until = IdemStatus.FAILED, fail.reason, fail.message, None
            row.modified = self.store.now
            return True
        return owner is not None and row.status is IdemStatus.FAILED and row.outcome == fail.reason

    # -- T3 ------------------------------------------------------------------

    async def finish_effects(self, finished: Sequence[Finished], *, owner: str) -> set[str]:
        owned: set[str] = set()
        for item in finished:
            job = item.job
            row = self.s.idem.get(job.biz_key)
            ours = row is not None and row.owner == owner and row.attempt == job.attempt
            if item.receipt is not None:
                if ours and row.status is IdemStatus.PENDING:
                    row.status, row.outcome, row.last_err, row.lease_until = IdemStatus.DONE, job.effect.done, None, None
                    row.modified = self.store.now
                elif not (ours and row.status is IdemStatus.DONE and row.outcome == job.effect.done):
                    continue
                owned.add(job.biz_key)
                if job.effect.name in WRITERS:      # the effects whose receipt has a table of its own
                    self.s.receipts.setdefault(job.order_no, {"waybill_no": item.receipt.reference,
                                                              "idem_token": job.token, "biz_key": job.biz_key,
                                                              "attempt": job.attempt})
            elif item.error.retriable or not item.error.fails_step:
                if ours and row.status is IdemStatus.PENDING:
                    row.outcome = item.job.not_called_outcome() if item.error.not_delivered else item.error.reason
                    row.last_err, row.modified = str(item.error)[:512], self.store.now
                    if row.outcome == NOT_DELIVERED:
                        row.first_call_at = None
                    owned.add(job.biz_key)
            elif self._fail(FailRow(job.biz_key, job.part_date, job.attempt, item.error.reason, str(item.error)),
                            owner=owner):
                owned.add(job.biz_key)
        return owned

    # -- dead letters ------------------------------------------------------------

    async def record_dead_letters(self, letters: Sequence[DeadLetter], *, group: str,
                                  retry_after_seconds: int = 60, release_owner: str | None = None) -> None:
        for key in {k for letter in letters for k in letter.step_keys[1:]}:
            row = self.s.idem.get(key)
            if release_owner and row is not None and row.status is IdemStatus.PENDING and row.owner == release_owner:
                now = self.store.now - 0.001
                row.lease_until = now if row.lease_until is None else min(row.lease_until, now)
        for letter in letters:
            source = letter.record
            key = (group, source.topic, source.partition, source.offset,
                   -1 if source.timestamp_ms is None else source.timestamp_ms)
            row = self.s.ledger.setdefault(key, {"order_no": letter.order_no, "biz_key": letter.biz_key,
                                                 "reason": letter.reason, "retriable": letter.retriable,
                                                 "may_be_superseded": letter.may_be_superseded,
                                                 "truncated": letter.truncated,
                                                 "status": 1 if letter.retriable else 4})
            if row["status"] in (1, 4) and row["reason"] != letter.reason:     # back for another reason
                row.update(reason=letter.reason, retriable=letter.retriable, status=1 if letter.retriable else 4)
            if letter.order_no in self.s.orders:
                self.s.orders[letter.order_no] = replace(self.s.orders[letter.order_no], has_dead_letters=True)
