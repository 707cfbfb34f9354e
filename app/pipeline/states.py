"""The two state machines, as data: ``t_idem`` rows and orders.

Every caller asks this module; nothing else decides what a legal move is.
The SQL that moves rows repeats each rule as a condition, so the database
refuses an illegal move even if Python asked for one.
"""

from __future__ import annotations

from enum import Enum, IntEnum

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


ORDER_TRANSITIONS: frozenset[tuple[OrderStatus | None, OrderStatus]] = frozenset({
    (None, OrderStatus.CREATED),
    (OrderStatus.CREATED, OrderStatus.PAID),
    (OrderStatus.PAID, OrderStatus.CONFIRMED),
    (OrderStatus.CREATED, OrderStatus.CANCELLED),
    (OrderStatus.PAID, OrderStatus.CANCELLED),
    (OrderStatus.CONFIRMED, OrderStatus.CANCELLED),
})


class Verdict(Enum):
    APPLY = Outcome.APPLIED.value    # a legal move: make it
    STALE = Outcome.STALE.value      # the order is already at or past the target: record, change nothing
    NOT_READY = "not_ready"          # an earlier move is missing (PAID before CREATED): retry later


def judge(current: OrderStatus | None, target: OrderStatus) -> Verdict:
    """What an event moving an order to ``target`` does to an order in ``current``."""
    if (current, target) in ORDER_TRANSITIONS:
        return Verdict.APPLY
    if current is not None and current >= target:
        return Verdict.STALE
    return Verdict.NOT_READY
