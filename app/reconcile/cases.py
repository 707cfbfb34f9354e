"""A reconcile case's life, as data: what it is about, where it stands, and what a person may do.

A case comes from a finding of the providers' reconciliation (``app.reconcile.providers``) and is
``open`` until a person closes it, once:

=============  ==================  ==========================================================
action         kinds               what it does
=============  ==================  ==========================================================
compensate     duplicate           cancels the extra waybill at the provider, with a key of
                                   the case's own (:func:`cancel_key`): a click repeated, or
                                   two people at once, cancel it once; only after reading
                                   the order's waybills at the provider again, at that
                                   moment (:func:`compensation_refused`), and only when the
                                   provider's answer names the waybill asked for
adopt          orphan              makes the waybill our receipt and its step done, in one
                                   transaction, after checking the step's token is the
                                   waybill's key and no receipt exists
dismiss        any (a note)        nothing at the provider or in our tables
=============  ==================  ==========================================================

Every status but ``open`` is final: a run that finds the same thing again only says it saw it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from enum import IntEnum

from app.pipeline.states import IdemStatus
from app.reconcile.ports import Issued, StepState

DUPLICATE, ORPHAN, MISSING = "duplicate", "orphan", "missing"
KINDS: tuple[str, ...] = (DUPLICATE, ORPHAN, MISSING)


class CaseStatus(IntEnum):
    OPEN = 1
    ADOPTED = 2
    COMPENSATED = 3
    DISMISSED = 4


# action -> (the status it closes the case with, the kinds it applies to); every action starts from OPEN.
CASE_ACTIONS: dict[str, tuple[CaseStatus, frozenset[str]]] = {
    "compensate": (CaseStatus.COMPENSATED, frozenset({DUPLICATE})),
    "adopt": (CaseStatus.ADOPTED, frozenset({ORPHAN})),
    "dismiss": (CaseStatus.DISMISSED, frozenset(KINDS)),
}
# (from, to) pairs a case may take; None is "no case yet" (a run files it).
CASE_TRANSITIONS: frozenset[tuple[CaseStatus | None, CaseStatus]] = frozenset(
    {(None, CaseStatus.OPEN)} | {(CaseStatus.OPEN, to) for to, _ in CASE_ACTIONS.values()})


def case_move_allowed(src: CaseStatus | None, dst: CaseStatus) -> bool:
    return (src, dst) in CASE_TRANSITIONS


def refusal(action: str, kind: str, status: CaseStatus) -> str | None:
    """Why ``action`` cannot be done to a case of ``kind`` that is ``status``; None if it can."""
    if action not in CASE_ACTIONS:
        return f"no action {action!r}: {', '.join(CASE_ACTIONS)}"
    to, kinds = CASE_ACTIONS[action]
    if status is not CaseStatus.OPEN:
        return f"the case is {status.name.lower()} already"
    if kind not in kinds:
        return f"{action} is for {' or '.join(sorted(kinds))} cases; this one is {kind}"
    return None


def cancel_key(tokens, group: str, case_id: int, reference: str) -> str:
    """The idempotency key of a case's cancel of ``reference``: the case's own and the waybill's, under
    the deployment's secret (``app.pipeline.tokens.StepTokens``), so every cancel of one case asks the
    provider the same question, a key never stands for another waybill, and two deployments sharing a
    provider account never share a key."""
    return tokens(f"{group}:reconcile_case:{case_id}:cancel:{reference}")


def compensation_refused(reference: str, keeper: str, listed: Sequence[Issued], ours: Collection[str]) -> str | None:
    """Why the extra ``reference`` must not be cancelled now, judged from what the provider lists for
    the order at the moment a person acts (``listed``) beside our receipt's ``keeper``; None if it may:
    the keeper is still live (the order keeps a waybill), the extra still live, and issued under one of
    ``ours`` (this deployment's tokens for the order, ``app.reconcile.providers.our_tokens``)."""
    by_reference = {item.reference: item for item in listed}
    kept, extra = by_reference.get(keeper), by_reference.get(reference)
    if kept is None:
        return (f"the provider no longer lists our receipt's {keeper} for the order: cancelling {reference} could "
                "leave the order with no waybill")
    if not kept.live:
        return (f"our receipt's {keeper} is {kept.status} at the provider now: {reference} may be the order's last "
                "live waybill")
    if extra is None:
        return f"the provider does not list {reference} for the order"
    if not extra.live:
        return f"{reference} is {extra.status} at the provider already: nothing to cancel"
    if extra.key not in ours:
        return (f"{reference} was issued under a key that is none of this deployment's tokens for the order "
                "(customer service's re-shipment, another deployment on the same provider account): not ours "
                "to cancel")
    return None


def adoption_refused(step: StepState | None, key: str | None) -> str | None:
    """Why a waybill issued under ``key`` cannot become the receipt of ``step``; None if it can: the
    step exists, asked under that very key, and is done, or pending with no worker on its claim (a
    pending row moves to done as T3 would have moved it; a failed one never leaves failed)."""
    if step is None:
        return "no t_idem row of the step: nothing of ours asked for this waybill"
    if not key or step.token != key:
        return "the step's token is not the waybill's idempotency key: another request's waybill"
    if step.status == IdemStatus.FAILED:
        return "the step is failed for good; a failed row is never made done"
    if step.status == IdemStatus.PENDING and step.live:
        return f"a worker holds the step's claim ({step.owner}); its T3 may yet write the receipt"
    return None
