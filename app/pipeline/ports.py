"""The edges of the pipeline: what it needs from a database, the external
services and the dead-letter topic. ``app.adapters`` plugs in the real ones
(MySQL through SQLAlchemy + aiomysql, aiohttp, aiokafka); tests may plug in
their own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any, Protocol, TypeVar

from app.pipeline.errors import PipelineError
from app.pipeline.frozen import quick_init
from app.pipeline.model import BatchPlan, EffectJob, IdemRow, LedgerRow, Settlement, SourceKey
from app.pipeline.states import AUTOMATIC_CLAIMS, LedgerStatus, Order
from app.pipeline.steps import Contract

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Receipt:
    """What a successful effect call returned: the service's reference for what it did
    (a waybill number, a message id) and the effect's own fields (``Effect.receipt_fields``)."""

    reference: str | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Finished:
    """The end of one effect call, for T3."""

    job: EffectJob
    receipt: Receipt | None = None
    error: PipelineError | None = None


@dataclass(frozen=True, slots=True)
class UnreadableRun:
    """Why the client could not read a record: it stands with the other records of the same
    record batch it could not read either, offsets ``first`` to ``last``. The raw batch is the
    value of the record at ``first`` only; the others point to it (their value is empty)."""

    reason: str
    message: str
    first: int
    last: int


@quick_init
@dataclass(frozen=True, slots=True)
class SourceRecord:
    """A Kafka record as consumed, kept byte for byte for the dead-letter topic."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    # when the client could not read the record at all (the value is then the raw batch, or empty)
    unreadable: UnreadableRun | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    record: SourceRecord
    reason: str
    message: str
    retriable: bool
    attempts: int
    first_failure_at: datetime
    order_no: str | None = None
    event_id: str | None = None
    biz_key: str | None = None
    may_be_superseded: bool = False   # later events of the same order ran after this one
    worker_id: str | None = None
    truncated: bool = False           # the dead-letter record carries only the start of the original
    step_keys: tuple[str, ...] = ()   # every idempotency key of its event (claims released on dead-lettering)
    # A letter that stands for several unreadable records of one record batch: the offsets of the
    # first and last of them in this batch, and how many they are (the others get no letter).
    covers: tuple[int, int, int] | None = None
    # How soon a retry may help, when its error knows (``PipelineError.wait_seconds``): the letter
    # is due then, if sooner than DLQ_RETRY_AFTER_SECONDS.
    retry_in: float | None = None
    # The W3C traceparent of the span that dead-lettered the record (``app.observability.pipeline_spans``),
    # when traced: the letter's ``dlq.traceparent`` header. The record's own trace headers stay as they were.
    trace: str | None = None


class Transaction(Protocol):
    """One database transaction; every method is one statement (one round trip)."""

    async def read_idem(self, keys: Sequence[str], part_dates: Sequence[date]) -> dict[str, IdemRow]: ...
    async def read_orders(self, order_nos: Sequence[str]) -> dict[str, Order]: ...
    async def recovery_age(self) -> float | None:
        """Seconds since the newest open recovery window opened; None when none is open."""
        ...
    async def take_over_dead(self, held: Sequence[IdemRow], *, dead_after: float) -> list[str]:
        """End the live leases of ``held`` whose owner's process is dead (no heartbeat for
        ``dead_after`` seconds, or stopped) at its presumed death; the keys whose lease ended."""
        ...
    async def apply_plan(self, plan: BatchPlan, *, owner: str, lease_seconds: float) -> None: ...
    async def finish_effects(self, finished: Sequence[Finished], *, owner: str) -> set[str]: ...
    async def record_dead_letters(self, letters: Sequence[DeadLetter], *, group: str, retry_after_seconds: int,
                                  release_owner: str | None = None) -> None: ...


class Store(Protocol):
    round_trips: int

    async def in_transaction(self, work: Callable[[Transaction], Awaitable[T]]) -> T:
        """Run ``work`` in a transaction, commit, and re-run it after a deadlock or lock-wait
        timeout. Raises :class:`~app.pipeline.errors.StoreUnavailable` when the database
        cannot be used."""
        ...


class EffectClient(Protocol):
    contracts: Mapping[str, Contract]  # the deployed providers' contracts, by effect name
    verifiable: Mapping[str, float]    # effects whose provider can be asked (``lookup``): how long after an
                                       # unknown outcome it is safe to ask
    askable: Mapping[str, float]       # effects whose client can look a call up (any contract): the same
    horizons: Mapping[str, float]      # how long each effect's provider keeps keys, seconds (absent: for ever)

    async def call(self, job: EffectJob) -> Receipt:
        """Make the call of ``job`` with its token; raise a :class:`PipelineError` that says
        whether the outcome is known and whether a retry may help."""
        ...

    async def lookup(self, job: EffectJob) -> Receipt | None:
        """Ask the service whether it ever accepted ``job``'s token: its receipt if so, None if it
        surely did not; a :class:`PipelineError` if it cannot say now."""
        ...


class DeadLetterSink(Protocol):
    def prepare(self, letters: Sequence[DeadLetter]) -> list[DeadLetter]:
        """The letters as they will be published (``truncated`` set where the record will be cut)."""
        ...

    async def publish(self, letters: Sequence[DeadLetter]) -> None:
        """Send every letter and return once the broker acknowledged all of them; raise otherwise."""
        ...


class Ledger(Protocol):
    """The compensation ledger, as the compensator needs it. Rows are this consumer group's."""

    async def find(self, source: SourceKey) -> LedgerRow | None: ...
    async def get(self, row_id: int, group: str) -> LedgerRow | None: ...
    async def add_manual(self, source: SourceKey, record: SourceRecord, reason: str, message: str) -> LedgerRow: ...
    async def claim(self, row_id: int, owner: str, lease_seconds: float, *,
                    allowed: frozenset[LedgerStatus] = AUTOMATIC_CLAIMS) -> LedgerRow | None: ...
    async def claim_due(self, group: str, limit: int, owner: str, lease_seconds: float) -> list[LedgerRow]: ...
    async def next_due(self, group: str) -> float | None:
        """Seconds until this group's next row comes due (0: one is), None when none waits."""
        ...
    async def settle(self, settlements: Sequence[Settlement], *, owner: str, actor: str, action: str,
                     job_id: int | None = None) -> set[int]: ...
    async def act(self, row_id: int, group: str, to: LedgerStatus, allowed: frozenset[LedgerStatus], *,
                  actor: str, action: str, note: str | None, steps: Sequence[str], step_outcome: str,
                  job_id: int | None = None) -> tuple[LedgerRow | None, bool, str | None]: ...
    async def reopen_unknown(self, keys: Sequence[str]) -> int: ...
    async def get_many(self, row_ids: Sequence[int], group: str) -> list[LedgerRow]: ...
    async def claim_many(self, row_ids: Sequence[int], group: str, owner: str, lease_seconds: float, *,
                         allowed: frozenset[LedgerStatus]) -> list[LedgerRow]: ...
