"""Our receipts of an effect as the providers' reconciliation reads them: those written over a time
range (``idx_gmt_create``), those of given orders (the primary key), and the ``t_idem`` rows of the
effect's step for given orders (the primary key's first column), a bounded chunk at a time.

An effect is compared with its provider's records only where its receipts have a table of their
own (:data:`RECEIPT_TABLES`): the waybill's ``t_waybill_receipt``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime

from app.adapters.mysql.sql import marks
from app.adapters.mysql.store import MySqlStore
from app.pipeline.steps import ISSUE_WAYBILL, PIPELINES

# effect -> (its receipt table, the column holding the provider's reference)
RECEIPT_TABLES: Mapping[str, tuple[str, str]] = {ISSUE_WAYBILL.name: ("t_waybill_receipt", "waybill_no")}
CHUNK = 500                    # keys in one IN list
STEP_COLUMNS = ("biz_key, part_date, step, status, idem_token, attempt, owner, gmt_create, "
                "COALESCE(lease_until >= NOW(3), 0)")


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


def effect_steps(effect: str) -> list[tuple[str, str, str]]:
    """Every (key format, event type, step name) of the steps that call ``effect``."""
    return [(pipe.key_format, event_type.value, step.name) for event_type, pipe in PIPELINES.items()
            for step in pipe.effects if step.effect.name == effect]


def step_keys(effect: str, order_no: str) -> list[str]:
    """The ``t_idem`` keys of ``effect``'s steps for ``order_no`` (the pipeline's own key format)."""
    return [form.format(order_no=order_no, type=type_, step=step) for form, type_, step in effect_steps(effect)]


class ReceiptRanges:
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
        steps = await self._steps_by_key([row[3] for row in rows])
        return [_receipt(row, steps.get(row[3])) for row in rows]

    async def of_orders(self, orders: Iterable[str]) -> dict[str, HeldReceipt]:
        """The receipts of ``orders``, by order."""
        rows = []
        for chunk in _chunks(sorted(set(orders))):
            rows += await self._rows(f"SELECT order_no, {self.column}, idem_token, biz_key, gmt_create FROM "
                                     f"{self.table} WHERE order_no IN ({marks(len(chunk))})", chunk)
        steps = await self._steps_by_key([row[3] for row in rows])
        return {row[0]: _receipt(row, steps.get(row[3])) for row in rows}

    async def steps(self, orders: Iterable[str]) -> dict[str, StepState]:
        """The effect's step row of each of ``orders`` that has one, by order."""
        keys = {key: order for order in set(orders) for key in step_keys(self.effect, order)}
        found = await self._steps_by_key(keys)
        return {keys[key]: step for key, step in found.items()}

    async def _steps_by_key(self, keys: Iterable[str]) -> dict[str, StepState]:
        found: dict[str, StepState] = {}
        for chunk in _chunks(sorted(set(keys))):
            rows = await self._rows(f"SELECT {STEP_COLUMNS} FROM t_idem WHERE biz_key IN ({marks(len(chunk))})", chunk)
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


def _chunks(items: list[str]) -> Iterable[list[str]]:
    for start in range(0, len(items), CHUNK):
        yield items[start:start + CHUNK]


def _naive(at: datetime) -> datetime:
    """A time as the DATETIME columns hold it: UTC, without a zone (the sessions' time zone is UTC)."""
    return at.astimezone(UTC).replace(tzinfo=None) if at.tzinfo else at


def _utc(at: datetime) -> datetime:
    return at.replace(tzinfo=UTC)
