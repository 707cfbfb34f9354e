"""What the reconcile reads and calls, as ports: the input topic over a time range, the rows of the
tables a chunk of records needs, the providers' own records, and a case's statements.

The adapters implement them without importing this package (``app.adapters.kafka.ranges``,
``app.adapters.mysql.reconcile``, ``app.adapters.mysql.reconcile_cases``,
``app.adapters.effects.listings``), and the composition root (``app.bootstrap``) hands them over.
The rows they return are read through the shapes below (each a Protocol of read-only fields),
never through an adapter's class, so the judgement can be read and tested without a database, a
broker or a provider.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import date, datetime
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

# A step's token from its t_idem key (app.pipeline.tokens.StepTokens).
Tokens = Callable[[str], str]


# -- the input, and what the tables hold about each record --------------------------------------

class Record(Protocol):
    """One record of the input topic, as the consumer read it."""
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes]] | None: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def offset(self) -> int: ...


class Span(Protocol):
    """A partition's offsets of the range: ``start`` included, ``end`` excluded."""
    @property
    def partition(self) -> int: ...
    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...


class TopicRange(Protocol):
    """The input topic over a time range, read ``read_committed`` outside the group."""
    spans: Sequence[Span]

    async def committed(self, group: str) -> dict[int, int]:
        """The group's committed offsets, by partition (absent: nothing committed)."""
        ...

    def read(self, span: Span) -> AsyncIterator[Sequence[Record]]:
        """The span's records, a chunk at a time, in offset order."""
        ...


class OpenRange(Protocol):
    """``async with open_range(topic, since_ms, until_ms, chunk=n) as r:`` the topic's records from
    ``since_ms`` to ``until_ms`` (epoch milliseconds), at most ``chunk`` at a time."""

    def __call__(self, topic: str, since_ms: int, until_ms: int, *,
                 chunk: int) -> AbstractAsyncContextManager[TopicRange]: ...


class StepRow(Protocol):
    """A ``t_idem`` row as a run reads it."""
    @property
    def biz_key(self) -> str: ...
    @property
    def status(self) -> int: ...                # app.pipeline.states.IdemStatus
    @property
    def outcome(self) -> str | None: ...
    @property
    def attempt(self) -> int: ...
    @property
    def token(self) -> str | None: ...
    @property
    def age_seconds(self) -> float: ...         # since its last change, on the database's clock


class ReceiptRow(Protocol):
    """A receipt row of a step whose effect has a table of its own."""
    @property
    def order_no(self) -> str: ...
    @property
    def biz_key(self) -> str: ...
    @property
    def token(self) -> str: ...
    @property
    def reference(self) -> str: ...


class RunStore(Protocol):
    """What a run reads of the tables, a chunk of records at a time, and where it keeps itself."""

    # The effects whose receipts have a table of their own (what ``waybill_receipts`` reads).
    receipt_effects: Collection[str]

    async def steps(self, keys: Iterable[str]) -> Mapping[str, StepRow]: ...

    async def waybill_receipts(self, orders: Iterable[str]) -> Mapping[str, ReceiptRow]:
        """The receipts of ``orders``, by their step's key."""
        ...

    async def ledger(self, topic: str, partition: int, start: int, end: int) -> list[dict[str, Any]]:
        """The group's ledger rows naming offsets ``start`` .. ``end - 1``: ``id``, ``src_offset``,
        ``src_timestamp``, ``status``, ``reason``, ``order_no``."""
        ...

    async def begin(self, topic: str, since: datetime, until: datetime, started_by: str) -> int: ...

    async def finish(self, run_id: int, *, status: str, records: int, findings: int, report: Mapping,
                     summary: Mapping[str, int]) -> None: ...


# -- the providers' side -------------------------------------------------------------------------

class Issued(Protocol):
    """One thing a provider says it did, as its own records have it: a waybill."""
    @property
    def reference(self) -> str: ...
    @property
    def order_no(self) -> str: ...
    @property
    def key(self) -> str | None: ...            # the idempotency key it was asked under
    @property
    def created_at(self) -> datetime: ...       # the provider's clock, UTC
    @property
    def status(self) -> str: ...
    @property
    def live(self) -> bool: ...                 # not cancelled


class Cancelled(Protocol):
    """A provider's answer to a cancel."""
    @property
    def reference(self) -> str: ...             # the waybill the answer names
    @property
    def key(self) -> str | None: ...            # the key of the cancel that did it
    @property
    def cancelled_at(self) -> datetime | None: ...


class Listing(Protocol):
    """A provider's own records, by time range and by order, and its cancel."""

    def issued(self, since: datetime, until: datetime, *, page_size: int) -> AsyncIterator[Sequence[Issued]]:
        """What it did at or after ``since`` and before ``until``, oldest first, a page at a time."""
        ...

    async def of_order(self, order_no: str) -> Sequence[Issued]: ...

    async def cancel(self, reference: str, key: str) -> Cancelled: ...


class StepState(Protocol):
    """The ``t_idem`` row of an effect's step, as the providers' side reads it."""
    @property
    def biz_key(self) -> str: ...
    @property
    def part_date(self) -> date: ...
    @property
    def step(self) -> str: ...
    @property
    def status(self) -> int: ...                # app.pipeline.states.IdemStatus
    @property
    def token(self) -> str | None: ...
    @property
    def attempt(self) -> int: ...
    @property
    def owner(self) -> str | None: ...
    @property
    def claimed_at(self) -> datetime: ...       # its first claim, before its first call (UTC)
    @property
    def live(self) -> bool: ...                 # its lease still runs: a worker may be between its call and T3


class HeldReceipt(Protocol):
    """A receipt we hold: the provider's reference for what it did, and the step that wrote it."""
    @property
    def order_no(self) -> str: ...
    @property
    def reference(self) -> str: ...
    @property
    def token(self) -> str: ...
    @property
    def biz_key(self) -> str: ...
    @property
    def written_at(self) -> datetime: ...       # UTC
    @property
    def step(self) -> StepState | None: ...


class ReceiptReads(Protocol):
    """Our receipts of one effect, as the providers' side reads them, each read bounded."""
    effect: str

    async def written(self, since: datetime, until: datetime, *, limit: int) -> Sequence[HeldReceipt]:
        """Those written at or after ``since`` and before ``until``, oldest first, at most ``limit``."""
        ...

    async def of_orders(self, orders: Iterable[str]) -> Mapping[str, HeldReceipt]:
        """Those of ``orders``, by order."""
        ...

    async def steps(self, keys: Iterable[str]) -> Mapping[str, StepState]:
        """The ``t_idem`` rows of ``keys`` that exist, by key."""
        ...


# -- a case's statements -------------------------------------------------------------------------

class CaseStatements(Protocol):
    """The statements of one transaction on the cases (``t_reconcile_case`` and its history) and on
    what an adoption writes. A case is a dict of its columns, ``status`` the stored integer
    (:class:`app.reconcile.cases.CaseStatus`) and ``evidence`` decoded."""

    async def case(self, case_id: int, *, lock: bool = False) -> dict[str, Any] | None: ...

    async def history(self, case_id: int) -> list[dict[str, Any]]: ...

    async def receipt(self, effect: str, order_no: str, *, lock: bool = False) -> tuple[str, str] | None:
        """The order's receipt of ``effect``: its reference and its token."""
        ...

    async def steps(self, keys: Sequence[str], *, lock: bool = False) -> list[StepState]: ...

    async def write_receipt(self, effect: str, order_no: str, reference: str, step: StepState) -> None: ...

    async def step_done(self, step: StepState, outcome: str) -> bool:
        """The pending ``step`` moved to done, fenced by its attempt; whether it moved."""
        ...

    async def close(self, case_id: int, *, status: int, open_status: int, actor: str, note: str | None) -> bool:
        """The case moved from ``open_status`` to ``status``; whether it moved."""
        ...

    async def set_evidence(self, case_id: int, evidence: Mapping[str, Any]) -> None: ...

    async def audit(self, case_id: int, actor: str, action: str, from_status: int | None, to_status: int | None,
                    note: str | None, detail: str | None) -> None: ...


class Filed(Protocol):
    """A case as a run files it."""
    @property
    def kind(self) -> str: ...
    @property
    def effect(self) -> str: ...
    @property
    def reference(self) -> str: ...
    @property
    def provider(self) -> str: ...
    @property
    def order_no(self) -> str: ...
    @property
    def evidence(self) -> Mapping[str, Any]: ...


class CaseStore(Protocol):
    """The group's cases: a transaction of :class:`CaseStatements` (run again whole on a lost race),
    and the reads and the filing that need no judgement inside."""

    async def run(self, work: Callable[[CaseStatements], Awaitable[T]]) -> T: ...

    async def file(self, cases: Sequence[Filed], *, status: int, run_id: int | None) -> dict[tuple[str, str, str], int]:
        """Each of ``cases`` filed with ``status`` (a case filed before keeps its status, and its evidence
        is refreshed while it still has ``status``); the status before of those filed before, by
        (kind, effect, reference)."""
        ...

    async def newest(self, statuses: Iterable[int], limit: int) -> list[dict[str, Any]]:
        """At most ``limit`` of the newest cases of each of ``statuses``."""
        ...

    async def counts(self, status: int) -> dict[str, int]:
        """The cases of ``status`` by kind."""
        ...


class AtProvider(Protocol):
    """This deployment's provider of an effect, reached at the moment a person acts on a case."""
    @property
    def name(self) -> str: ...
    @property
    def can_cancel(self) -> bool: ...

    async def of_order(self, order_no: str) -> Sequence[Issued]: ...

    async def cancel(self, reference: str, key: str) -> Cancelled: ...


# effect -> this deployment's provider of it
ProviderOf = Callable[[str], AtProvider]
