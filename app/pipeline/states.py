"""The three state machines, as data: ``t_idem`` rows, orders (and the ``Order`` row
itself) and the compensation ledger's rows (``t_compensation``).

Every caller asks this module; nothing else decides what a legal move is.
The SQL that moves rows repeats each rule as a condition, so the database
refuses an illegal move even if Python asked for one.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum, IntEnum

from app.pipeline.frozen import quick_init
from app.pipeline.outcomes import Outcome


class IdemStatus(IntEnum):
    PENDING = 1
    DONE = 2
    FAILED = 3


# (from, to) pairs a t_idem row may take; None is "no row yet".
#   None    -> PENDING  claim of a new key (T1)
#   None    -> DONE     a local step, claimed and applied in one transaction (T1)
#   None    -> FAILED   an effect whose order moved past its target in the same T1: never called, "stale"
#   PENDING -> PENDING  re-claim after the lease expired: attempt + 1 (T1)
#   PENDING -> DONE     effect succeeded, receipt written (T3, fenced by attempt)
#   PENDING -> FAILED   effect refused for good (T3), or stale / unknown outcome on re-claim (T1); fenced by attempt
# DONE and FAILED are terminal: nothing leaves them.
IDEM_TRANSITIONS: frozenset[tuple[IdemStatus | None, IdemStatus]] = frozenset({
    (None, IdemStatus.PENDING),
    (None, IdemStatus.DONE),
    (None, IdemStatus.FAILED),
    (IdemStatus.PENDING, IdemStatus.PENDING),
    (IdemStatus.PENDING, IdemStatus.DONE),
    (IdemStatus.PENDING, IdemStatus.FAILED),
})

TERMINAL: frozenset[IdemStatus] = frozenset({IdemStatus.DONE, IdemStatus.FAILED})


# The one way out of FAILED: a call whose outcome was unknown (``UNKNOWN``) is reopened to be
# verified, once its service offers a lookup; the verification either records it done or
# calls again. Nothing else leaves FAILED, and nothing leaves DONE.
IDEM_REOPEN: tuple[IdemStatus, IdemStatus] = (IdemStatus.FAILED, IdemStatus.PENDING)
REOPENABLE_OUTCOME = "unknown_outcome_non_idempotent"


def idem_move_allowed(src: IdemStatus | None, dst: IdemStatus, *, outcome: str | None = None) -> bool:
    if (src, dst) == IDEM_REOPEN:
        return outcome == REOPENABLE_OUTCOME
    return (src, dst) in IDEM_TRANSITIONS


class OrderStatus(IntEnum):
    """Order states; the integer is the rank, and an order's rank never goes down."""

    CREATED = 1
    PAID = 2
    CONFIRMED = 3
    CANCELLED = 4


@quick_init
@dataclass(frozen=True, slots=True)
class Order:
    """A ``t_order`` row. The fields between ``status`` and ``has_dead_letters`` are the
    order's data: local steps copy event fields onto them (``steps.LocalStep.sets``)."""

    order_no: str
    status: OrderStatus
    amount_cents: int | None = None
    phone: str | None = None
    address: str | None = None
    paid_cents: int | None = None
    cancel_reason: str | None = None
    has_dead_letters: bool = False        # a dead letter of this order awaits the order's next move


ORDER_DATA: tuple[str, ...] = tuple(f.name for f in fields(Order)
                                    if f.name not in ("order_no", "status", "has_dead_letters"))


ORDER_TRANSITIONS: frozenset[tuple[OrderStatus | None, OrderStatus]] = frozenset({
    (None, OrderStatus.CREATED),
    (OrderStatus.CREATED, OrderStatus.PAID),
    (OrderStatus.PAID, OrderStatus.CONFIRMED),
    (OrderStatus.CREATED, OrderStatus.CANCELLED),
    (OrderStatus.PAID, OrderStatus.CANCELLED),
    (OrderStatus.CONFIRMED, OrderStatus.CANCELLED),
})


class MoveVerdict(Enum):
    APPLY = Outcome.APPLIED.value    # a legal move: make it
    STALE = Outcome.STALE.value      # the order is already at or past the target: record, change nothing
    NOT_READY = "not_ready"          # an earlier move is missing (PAID before CREATED): retry later


def judge_move(current: OrderStatus | None, target: OrderStatus) -> MoveVerdict:
    """What an event moving an order to ``target`` does to an order in ``current``."""
    if (current, target) in ORDER_TRANSITIONS:
        return MoveVerdict.APPLY
    if current is not None and current >= target:
        return MoveVerdict.STALE
    return MoveVerdict.NOT_READY


class LedgerStatus(IntEnum):
    """A dead letter's row in the compensation ledger (``t_compensation.status``)."""

    OPEN = 1            # waiting: for its retry (next_retry_at) or for the compensator
    RETRYING = 2        # claimed right now (an owner and a lease, like a t_idem claim)
    COMPENSATED = 3     # the pipeline finished the original event (its steps are done)
    MANUAL = 4          # a person must look: not retriable, given up, or unreadable
    DISCARDED = 5       # a person decided it needs nothing
    SUPERSEDED = 6      # the order moved past the event: nothing is left to do
    RESOLVED = 7        # a person fixed it by hand


L = LedgerStatus
LEDGER_SETTLED: frozenset[LedgerStatus] = frozenset({L.COMPENSATED, L.DISCARDED, L.SUPERSEDED, L.RESOLVED})
# Where a claim may start (a ``retrying`` row whose claim ran out always may): the compensator's
# own runs take open rows only; a person's retry takes a row that waits for a person too.
AUTOMATIC_CLAIMS: frozenset[LedgerStatus] = frozenset({L.OPEN})
PERSON_CLAIMS: frozenset[LedgerStatus] = frozenset({L.OPEN, L.MANUAL})
# What a person may do, and from where; doing it twice changes nothing the second time.
PERSON_ACTIONS: dict[str, tuple[LedgerStatus, frozenset[LedgerStatus]]] = {
    "resolve": (L.RESOLVED, frozenset({L.OPEN, L.MANUAL})),
    "discard": (L.DISCARDED, frozenset({L.OPEN, L.MANUAL})),
}

# (from, to) pairs a ledger row may take; None is "no row yet". Each write of
# ``app.adapters.mysql.ledger.statements`` repeats its part as a SQL condition.
#   None     -> OPEN | MANUAL           a dead letter written: retriable or not (record, add_manual)
#   OPEN | MANUAL -> OPEN | MANUAL      the same record dead-lettered again for another reason (record)
#   OPEN     -> RETRYING                claimed by the compensator or a person (claim, claim_due)
#   MANUAL   -> RETRYING                claimed by a person's retry (claim with PERSON_CLAIMS)
#   RETRYING -> RETRYING                a claim whose lease ran out, taken over
#   RETRYING -> OPEN | MANUAL | COMPENSATED | SUPERSEDED   what the redrive made of it (settle, owner only)
#   OPEN | MANUAL -> RESOLVED | DISCARDED                  a person's decision (move)
# COMPENSATED, SUPERSEDED, RESOLVED and DISCARDED are settled: nothing leaves them.
LEDGER_TRANSITIONS: frozenset[tuple[LedgerStatus | None, LedgerStatus]] = frozenset({
    (None, L.OPEN), (None, L.MANUAL),
    (L.OPEN, L.OPEN), (L.OPEN, L.MANUAL), (L.MANUAL, L.OPEN), (L.MANUAL, L.MANUAL),
    *((src, L.RETRYING) for src in AUTOMATIC_CLAIMS | PERSON_CLAIMS | {L.RETRYING}),
    *((L.RETRYING, dst) for dst in (L.OPEN, L.MANUAL, L.COMPENSATED, L.SUPERSEDED)),
    *((src, to) for to, sources in PERSON_ACTIONS.values() for src in sources),
})
del L


def ledger_move_allowed(src: LedgerStatus | None, dst: LedgerStatus) -> bool:
    return (src, dst) in LEDGER_TRANSITIONS
