"""The rules of the dead-letter lifecycle: what becomes of a dead letter.

Every dead letter has a row in the compensation ledger (``t_compensation``), and the
row says what became of it:

==========  ==============================================================
open        waiting: for its retry (``next_retry_at``) or for the compensator
retrying    claimed right now (an owner and a lease, like a ``t_idem`` claim)
compensated the pipeline finished the original event (its steps are done)
superseded  the order moved past the event: nothing is left to do
manual      a person must look: not retriable, given up after N attempts,
            or a dead letter that could not even be read
resolved    a person fixed it by hand
discarded   a person decided it needs nothing
==========  ==============================================================

A row is worked by running its original event again through the same pipeline:
the same idempotency keys, so the same persisted tokens (a step already done is
skipped, a pending call is repeated with its token, never a new one). A call of a
non-idempotent effect whose outcome was unknown is verified with its service
before anything else, when the service offers that (the SMS gateway's lookup).

The compensator that works the rows is ``app.compensation.compensator``; this module is what one
redrive makes of a row (:func:`judge_redrive`) and the backoff between redrives. The statuses
and the moves between them are in ``app.pipeline.states`` with the other two state machines
(``LEDGER_TRANSITIONS``), the rows in ``app.pipeline.model`` and the ledger's port in
``app.pipeline.ports``, beside the others.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.pipeline.errors import (
    BeyondDedupRetention,
    LeaseHeld,
    NotAskableYet,
    ProviderUnavailable,
    RateLimited,
    StaleEffectMayExist,
)
from app.pipeline.model import DISCARDED_BY_PERSON, RESOLVED_BY_PERSON, LedgerRow, RedriveVerdict
from app.pipeline.outcomes import Outcome
from app.pipeline.processor import Result
from app.pipeline.states import LedgerStatus

# What a person's decision makes of the event's steps still pending (``t_idem.outcome``,
# failed): settled, never called again by a replay or a re-published copy.
STEP_OUTCOMES: dict[str, str] = {"resolve": RESOLVED_BY_PERSON, "discard": DISCARDED_BY_PERSON}

# Dead letters a retry cannot settle: it would find the steps settled and close the case
# without the check the case is for. A person resolves or discards them.
PERSON_ONLY: dict[str, str] = {
    StaleEffectMayExist.reason: "what an earlier call did may stand for an order that moved past its step (a "
                                "waybill for a cancelled order): look for it with the provider the message names, "
                                "under the idempotency token in the message, undo it if it must not stand, then "
                                "resolve or discard this row",
    BeyondDedupRetention.reason: "the order is older than the dedup store remembers, so running it could repeat "
                                 "what was done: reconcile it by hand, then resolve or discard this row",
}


@dataclass(frozen=True)
class Backoff:
    """Capped exponential: ``base`` after the first failed redrive, doubling, at most ``cap``;
    after ``max_attempts`` redrives, a person's turn."""

    base: float
    cap: float
    max_attempts: int

    def after(self, redrives: int) -> float:
        # 2 ** 64 is far past any cap; a larger exponent would overflow a float.
        return min(self.base * 2 ** min(max(redrives - 1, 0), 64), self.cap)


# Why a duplicate's steps ended without running, as a person reads it in the row's history.
SETTLED_WHY = {Outcome.STALE.value: "the order had moved past the event (stale)",
               RESOLVED_BY_PERSON: "a person resolved them", DISCARDED_BY_PERSON: "a person discarded them"}


def judge_redrive(row: LedgerRow, result: Result, backoff: Backoff) -> RedriveVerdict:
    """What one redrive of the original event makes of its ledger row. A redrive that finds every
    step already finished says which way: run (compensated), or ended without running (superseded)."""
    redrives = row.redrives + 1
    if result.outcome is Outcome.APPLIED:
        return RedriveVerdict(LedgerStatus.COMPENSATED, redrives, None, "the event ran: applied")
    if result.outcome is Outcome.DUPLICATE and result.settled is not None:
        why = SETTLED_WHY.get(result.settled, result.settled)
        return RedriveVerdict(LedgerStatus.SUPERSEDED, redrives, None,
                              f"nothing ran: its steps had ended before this redrive without running: {why}")
    if result.outcome is Outcome.DUPLICATE:
        return RedriveVerdict(LedgerStatus.COMPENSATED, redrives, None,
                              "nothing ran now: its steps had run before this redrive (another delivery of the event)")
    if result.outcome is Outcome.STALE:
        return RedriveVerdict(LedgerStatus.SUPERSEDED, redrives, None, "the order moved past the event: nothing to do")
    error = result.error
    if error is None:       # superseded (another worker claimed its key) or deferred: look again soon
        return RedriveVerdict(LedgerStatus.OPEN, row.redrives, backoff.base,
                              f"not finished here ({result.outcome or 'deferred'})")
    if isinstance(error, (LeaseHeld, NotAskableYet, RateLimited, ProviderUnavailable)):
        # Somebody else is calling it now, it is too early to ask the service about an earlier
        # call, or its provider said "not yet" or is down: not this row's failure. Again once that
        # may have changed, no redrive counted.
        return RedriveVerdict(LedgerStatus.OPEN, row.redrives, max(error.wait_seconds or 0.0, 1.0),
                              f"{error.reason}: {error}")
    if not error.retriable:
        return RedriveVerdict(LedgerStatus.MANUAL, redrives, None, f"not retriable: {error.reason}: {error}",
                              error.reason)
    if redrives >= backoff.max_attempts:
        return RedriveVerdict(LedgerStatus.MANUAL, redrives, None,
                              f"gave up after {redrives} redrives: {error.reason}: {error}", error.reason)
    retry_in = backoff.after(redrives)
    if error.wait_seconds is not None:      # it says when a retry may help (an unknown outcome's settle)
        retry_in = min(retry_in, max(error.wait_seconds, 1.0))
    return RedriveVerdict(LedgerStatus.OPEN, redrives, retry_in, f"{error.reason}: {error}", error.reason)
