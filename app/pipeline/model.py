"""The records the pipeline reads and writes: ``t_idem`` rows, what the first
transaction (T1) decides for a batch, and the compensation ledger's rows. Plain data;
the rules live in ``states`` (what may move where), ``steps`` (what each event does),
``plan`` (T1's decision) and ``app.compensation.rules`` (a redrive's)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import TYPE_CHECKING

from app.pipeline.errors import PipelineError
from app.pipeline.frozen import quick_init
from app.pipeline.outcomes import Outcome
from app.pipeline.states import REOPENABLE_OUTCOME, IdemStatus, LedgerStatus, Order, OrderStatus

if TYPE_CHECKING:
    from app.pipeline.steps import Effect

# t_idem.outcome of a pending row whose last attempt was not called but an earlier one may have
# been: as unknown as the earlier call (an SMS is looked up before it is sent again).
STILL_UNKNOWN = "effect_outcome_unknown"
NOT_DELIVERED = "effect_not_delivered"   # t_idem.outcome of a pending row whose last call surely did not happen
UNKNOWN = REOPENABLE_OUTCOME              # t_idem.outcome of a failed row whose call may or may not have happened

# What a claim of one step key found: taken (``new``: no row yet; ``reclaimed``: a pending row whose
# lease ran out), or ``done``, ``held`` (another worker's live lease), ``failed`` for good, ``waiting``
# for its service to settle before it is asked, ``mismatch`` (recorded with another payload), or
# ``capped`` (claimed IDEM_MAX_ATTEMPTS times), or ``past_horizon`` (an earlier call may have reached a
# provider that no longer keeps its key and cannot be asked: left to a person). Conflicts, the numerator of the conflict rate, are the
# claims that found the key done or held.
CLAIM_RESULTS = ("new", "reclaimed", "done", "held", "failed", "waiting", "mismatch", "capped", "past_horizon")
CONFLICTS = frozenset({"done", "held"})
STALE = Outcome.STALE.value              # t_idem.outcome of an effect never called: its order moved past it
# t_idem.outcome of an effect step a person settled (resolving or discarding its dead letter)
RESOLVED_BY_PERSON = "resolved_by_person"
DISCARDED_BY_PERSON = "discarded_by_person"
# Failed effect steps that are settled, not errors: a replay of their event is a duplicate.
SETTLED_FAILURES = frozenset({STALE, RESOLVED_BY_PERSON, DISCARDED_BY_PERSON})


@quick_init
@dataclass(frozen=True, slots=True)
class IdemRow:
    """A ``t_idem`` row as T1 reads it; ``expired`` and ``remaining`` use the database clock."""

    biz_key: str
    status: IdemStatus
    attempt: int
    owner: str | None
    idem_token: str | None
    payload_hash: str
    outcome: str | None
    last_err: str | None
    expired: bool
    remaining: float
    # Seconds since a call of the row's last claim was surely no longer starting (the database
    # clock): since its lease ended, or since the row last changed if that came later. A claim
    # may call until its lease is almost over, so its row's last change dates no call.
    since_call: float = 0.0
    # Seconds since the first claim whose call may have reached the provider began (``first_call_at``,
    # the database clock): what a provider's key horizon is measured against (``keys_kept_for``).
    first_call_age: float = 0.0


@quick_init
@dataclass(frozen=True, slots=True)
class NewRow:
    """A ``t_idem`` row to insert: a done local step, a freshly claimed effect, or a stale one."""

    biz_key: str
    part_date: date
    step: str
    status: IdemStatus
    payload_hash: str
    idem_token: str | None = None
    outcome: str | None = None


@dataclass(frozen=True, slots=True)
class Reclaim:
    """An existing pending row to claim again: attempt + 1, fenced on the attempt read."""

    biz_key: str
    part_date: date
    attempt: int


@dataclass(frozen=True, slots=True)
class FailRow:
    """A pending row to move to failed in T1 (fenced on the attempt read)."""

    biz_key: str
    part_date: date
    attempt: int
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class EffectJob:
    """One external call to make after T1, with the token persisted in T1."""

    index: int            # position of the event in the batch
    order_no: str
    biz_key: str
    part_date: date
    step: str
    effect: Effect
    token: str
    attempt: int          # the fencing token: T3 matches only this attempt
    request: dict
    target: OrderStatus   # the order state the call is for
    voided_by: frozenset[OrderStatus] = frozenset()   # the states in which it is stale (``EffectStep.voids``)
    verify: bool = False  # an earlier call's outcome is unknown: ask the service before calling again
    # An earlier attempt may have reached the service (any effect). If this attempt is not called
    # either, the row must keep saying so: "not delivered" would be true of this attempt only.
    earlier_unknown: bool = False
    # The provider may have forgotten this step's key (its first call is older than the provider keeps
    # keys): a lookup that finds nothing then sends nothing, and this says why, for a person.
    past_horizon: str | None = None

    def not_called_outcome(self) -> str:
        """t_idem.outcome for this attempt when it was surely not called."""
        return STILL_UNKNOWN if self.earlier_unknown else NOT_DELIVERED


@dataclass(slots=True, init=False)
class EventPlan:
    """What T1 decided for one event."""

    outcome: Outcome | None        # when nothing is left to do
    error: PipelineError | None
    deferred: bool
    jobs: list[EffectJob]
    # A replayed event none of whose steps is left to run, but one of which ended without running:
    # what its row says (its local step found the order past it, ``stale``; an effect step stale,
    # or settled by a person). None when every step ran (or runs now).
    settled: str | None

    def __init__(self, outcome: Outcome | None = None, error: PipelineError | None = None, deferred: bool = False,
                 jobs: list[EffectJob] | None = None, settled: str | None = None) -> None:
        # Written out: one of these per event of every batch, and a default_factory costs.
        self.outcome, self.error, self.deferred, self.settled = outcome, error, deferred, settled
        self.jobs = [] if jobs is None else jobs


@dataclass(slots=True)
class BatchPlan:
    events: list[EventPlan]
    orders: dict[str, Order] = field(default_factory=dict)        # final state of changed orders
    new_orders: set[str] = field(default_factory=set)
    inserts: list[NewRow] = field(default_factory=list)
    reclaims: list[Reclaim] = field(default_factory=list)
    fails: list[FailRow] = field(default_factory=list)
    # Orders moved here that have dead letters from earlier batches: those letters
    # now have later events that ran after them (``t_compensation.may_be_superseded``).
    superseding: set[str] = field(default_factory=set)
    batch_keys: set[str] = field(default_factory=set)     # their events' local keys here: not overtaken by themselves
    # Every step key looked at, by what the claim found (``CLAIM_RESULTS``), and the events found done.
    claims: Counter = field(default_factory=Counter)
    replayed: int = 0

    @property
    def writes(self) -> bool:
        return bool(self.orders or self.inserts or self.reclaims or self.fails)


# -- the compensation ledger's rows (``t_compensation``) ------------------------------------

@dataclass(frozen=True, slots=True)
class SourceKey:
    """Which record a dead letter stands for (the ledger's unique key)."""

    group: str
    topic: str
    partition: int
    offset: int
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class LedgerRow:
    id: int
    status: LedgerStatus
    reason: str
    message: str | None
    retriable: bool
    attempts: int                 # tries before it was dead-lettered
    redrives: int                 # times the compensator ran it again since
    due: bool                     # next_retry_at has passed (the database clock)
    next_retry_at: datetime | None
    order_no: str | None
    biz_key: str | None
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp_ms: int | None = None     # the record's (an outbox event's time may be it)


@dataclass(frozen=True)
class RedriveVerdict:
    status: LedgerStatus
    redrives: int
    retry_in: float | None
    detail: str
    reason: str | None = None     # the row's new reason: why it failed this time, if it did


@dataclass(frozen=True)
class Settlement:
    """What one run made of one claimed row, and the step keys whose claims it gives up."""

    row_id: int
    verdict: RedriveVerdict
    release: tuple[str, ...] = ()
    note: str | None = None


@dataclass(frozen=True)
class ActionResult:
    found: bool
    changed: bool
    refused: str | None          # why the action could not be done, if it could not
    status: LedgerStatus | None
    message: str | None

    def as_dict(self) -> dict:
        return {"changed": self.changed, "status": None if self.status is None else self.status.name.lower(),
                "message": self.message}
