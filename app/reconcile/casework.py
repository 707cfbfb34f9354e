"""The cases' work: a run files what the providers' reconciliation found as cases for a person
(``app.reconcile.providers``), people read them, and a person acts on one (what may be done to
which case is ``app.reconcile.cases``; the statements are a :class:`~app.reconcile.ports.CaseStore`'s).

A finding is filed as one case per reference (each extra of a duplicate; an orphan; a missing
waybill): a run that finds it again moves its ``last_seen_at`` and, while it is open, its evidence;
a closed case stays closed.

Each action closes an open case once, inside one transaction that reads the case under lock and
moves it only from ``open``: of two people at once one closes it and the other is told who did. An
adoption writes the receipt and moves the step in the same transaction, after checking again what
the finding saw. A compensation's cancel is a call to the provider, never made inside a
transaction: the case is checked (open, our receipt holds another waybill, and this deployment's
tokens for the order read), the provider asked again what it holds for the order, at that moment
(the run that filed the case may be hours old: since then the courier may have cancelled our
receipt's waybill, or someone the extra); unless our receipt's waybill is still live there, the
extra still live and issued under one of our tokens, the compensation is refused, audited, and the
case's evidence refreshed with what the provider said. Then the provider is called with the case's
own key (:func:`~app.reconcile.cases.cancel_key`: a cancel asked twice is done once), its answer
must name the waybill asked for (an answer about another is refused and audited, the case left
open), and the case is closed. Between the read and the cancel is one HTTP round trip; a change at
the provider inside it is not seen.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from app.observability.metrics import RECONCILE_CASE_ACTIONS, RECONCILE_CASES_OPEN
from app.pipeline.errors import Conflict
from app.pipeline.states import IdemStatus
from app.pipeline.steps import effects_used
from app.reconcile.cases import (
    CASE_ACTIONS,
    KINDS,
    CaseStatus,
    adoption_refused,
    cancel_key,
    compensation_refused,
    refusal,
)
from app.reconcile.ports import AtProvider, Cancelled, CaseStatements, CaseStore, Issued, ProviderOf, Tokens
from app.reconcile.providers import ProviderFinding, issued_evidence, our_tokens, step_keys

MAX_LIST = 500
OPEN = CaseStatus.OPEN


class NotCancellable(Exception):
    """This deployment cannot cancel at the provider a case names."""


class AnswerMismatch(Exception):
    """The provider answered a cancel about another waybill than the one asked for."""


@dataclass(frozen=True, slots=True)
class Acted:
    """What became of a person's action: ``refused`` says why not (``case`` then says what closed it)."""
    case: dict[str, Any] | None
    changed: bool = False
    refused: str | None = None

    @property
    def found(self) -> bool:
        return self.case is not None


@dataclass(frozen=True, slots=True)
class Filed:
    """A case as a run files it: one reference of a finding."""
    kind: str
    effect: str
    reference: str
    provider: str
    order_no: str
    evidence: Mapping[str, Any]


class Casework:
    def __init__(self, store: CaseStore, providers: ProviderOf, *, group: str, tokens: Tokens) -> None:
        """``providers``: this deployment's provider of an effect; ``tokens``: which waybills are ours
        to cancel (:func:`~app.reconcile.providers.our_tokens`) and each cancel's key."""
        self.store, self.providers, self.group, self.tokens = store, providers, group, tokens

    # -- a run files what it found -------------------------------------------------------

    async def file(self, findings: Iterable[ProviderFinding], run_id: int | None) -> dict[str, int]:
        """One case per reference of ``findings``; counts of those ``opened`` now, ``seen_again`` (open
        before) and ``closed_before`` (a person closed it; left so)."""
        rows = {(f.kind, f.effect, ref): f for f in findings for ref in f.references}
        cases = [Filed(kind, effect, ref, f.provider, f.order_no, f.case_evidence(ref))
                 for (kind, effect, ref), f in sorted(rows.items(), key=lambda item: item[0])]
        before = await self.store.file(cases, status=int(OPEN), run_id=run_id)
        counts = {"opened": len(cases) - len(before), "seen_again": sum(1 for s in before.values() if s == OPEN),
                  "closed_before": sum(1 for s in before.values() if s != OPEN)}
        await self.refresh_gauge()
        return counts

    # -- what people read ----------------------------------------------------------------

    async def list(self, status: CaseStatus | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """The group's cases of ``status``, or open ones first and then the closed, newest first (at
        most ``limit``)."""
        limit = max(1, min(limit, MAX_LIST))
        if status is not None:
            return [_named(case) for case in await self.store.newest([int(status)], limit)]
        found = await self.store.newest([int(OPEN)], limit)
        left = limit - len(found)
        if left:
            closed = await self.store.newest([int(s) for s in CaseStatus if s is not OPEN], left)
            found += sorted(closed, key=lambda case: case["id"], reverse=True)[:left]
        return [_named(case) for case in found]

    async def get(self, case_id: int) -> dict[str, Any] | None:
        """One case with its history."""
        async def work(tx: CaseStatements) -> dict[str, Any] | None:
            case = await tx.case(case_id)
            if case is not None:
                case["history"] = await tx.history(case_id)
            return case
        case = await self.store.run(work)
        return None if case is None else _named(case)

    async def refresh_gauge(self) -> dict[str, int]:
        """``order_reconcile_cases_open{kind}`` from the table; the counts."""
        counts = {kind: 0 for kind in KINDS} | await self.store.counts(int(OPEN))
        for kind, count in counts.items():
            RECONCILE_CASES_OPEN.labels(kind).set(count)
        return counts

    # -- a person acts -------------------------------------------------------------------

    async def act(self, case_id: int, action: str, actor: str, note: str | None) -> Acted:
        """``compensate`` (the case's provider read again and asked to cancel the case's reference;
        :class:`NotCancellable` when this deployment cannot), ``adopt`` or ``dismiss`` an open case,
        once, audited."""
        if action == "compensate":
            acted = await self._compensate(case_id, actor, note)
        elif action == "adopt":
            acted = await self.store.run(lambda tx: _adopt(tx, case_id, actor, note))
        else:
            if action == "dismiss" and not (note or "").strip():
                raise ValueError("a dismissal needs a note: why nothing is to be done")
            acted = await self.store.run(lambda tx: _close(tx, case_id, action, actor, note))
        if acted.changed:
            RECONCILE_CASE_ACTIONS.labels(action).inc()
            await self.refresh_gauge()
        return Acted(None if acted.case is None else _named(acted.case), acted.changed, acted.refused)

    async def _compensate(self, case_id: int, actor: str, note: str | None) -> Acted:
        before, keeper, stored, provider = await self.store.run(lambda tx: self._compensable(tx, case_id))
        if before.refused is not None:
            return before
        case = before.case
        assert case is not None and keeper is not None and provider is not None
        reference, order = case["reference"], case["order_no"]
        key = cancel_key(self.tokens, self.group, case_id, reference)
        try:
            listed = await provider.of_order(order)           # read again now: see the module's docstring
            ours = our_tokens(self.tokens, case["effect"], order, *stored)
            why = compensation_refused(reference, keeper, listed, ours)
            if why is not None:
                return await self.store.run(lambda tx: _refuse(tx, case_id, actor, note, why, listed, ours))
            said = _answer(provider.name, reference, key, await provider.cancel(reference, key))
        except AnswerMismatch as exc:
            wrong = str(exc)
            await self.store.run(lambda tx: tx.audit(case_id, actor, "compensate", OPEN, None, note, wrong))
            return Acted(case, refused=wrong)
        except Exception as exc:
            detail = f"the provider's listing or cancel failed, nothing changed: {exc}"
            await self.store.run(lambda tx: tx.audit(case_id, actor, "compensate", OPEN, None, note, detail))
            raise
        return await self.store.run(lambda tx: _close(tx, case_id, "compensate", actor, note, detail=said,
                                                      done_anyway=said))

    async def _compensable(self, tx: CaseStatements,
                           case_id: int) -> tuple[Acted, str | None, Sequence[str | None], AtProvider | None]:
        """An open duplicate whose order's receipt holds another waybill than the one to cancel; that
        waybill (the keeper), the tokens our tables hold for the order's step (the receipt's, the
        rows') and the provider that cancels it."""
        case = await tx.case(case_id, lock=True)
        if case is None:
            return Acted(None, refused=f"no reconcile case {case_id}"), None, [], None
        provider = self._provider(case) if case["status"] == OPEN else None
        acted = _refused(case, "compensate")
        if acted.refused is not None:
            return acted, None, [], None
        held = await tx.receipt(case["effect"], case["order_no"])
        if held is None:
            return Acted(case, refused="the order has no receipt: adopt its waybill first, then cancel the others"), \
                None, [], None
        if held[0] == case["reference"]:
            return Acted(case, refused=f"our receipt holds {held[0]}: it is the keeper, not an extra"), None, [], None
        steps = await tx.steps(step_keys(case["effect"], case["order_no"]))
        return acted, held[0], [held[1], *(step.token for step in steps)], provider

    def _provider(self, case: Mapping[str, Any]) -> AtProvider:
        """The provider of the case's effect as this deployment reaches it, or :class:`NotCancellable`
        when this deployment's provider of the effect is another or cannot cancel."""
        provider = self.providers(case["effect"])
        if provider.name != case["provider"] or not provider.can_cancel:
            raise NotCancellable(f"the case is about {case['provider']}'s {case['effect']}; this deployment's "
                                 f"provider of it is {provider.name}, which "
                                 + ("cannot cancel" if not provider.can_cancel else "did not issue it"))
        return provider


def _answer(provider: str, reference: str, key: str, done: Cancelled) -> str:
    """What the provider's answer to the cancel of ``reference`` says, for the audit; an answer about
    another waybill is :class:`AnswerMismatch`."""
    if done.reference != reference:
        raise AnswerMismatch(f"{provider} answered the cancel of {reference} about {done.reference[:64]}: "
                             f"not taken as done; the case stays open: look {reference} up at the provider "
                             "before anything else")
    when = done.cancelled_at.isoformat() if done.cancelled_at else "at a time it does not say"
    by = "this case's key" if done.key == key else "another key (cancelled before this case asked)"
    return f"{provider} cancelled {reference} {when}, under {by} (...{key[-4:]})"


# -- inside a transaction -------------------------------------------------------------------

def _refused(case: dict[str, Any], action: str) -> Acted:
    return Acted(case, refused=refusal(action, case["kind"], CaseStatus(case["status"])))


async def _open_case(tx: CaseStatements, case_id: int, action: str) -> Acted:
    """The case, locked, and why ``action`` cannot be done to it (None: it can)."""
    case = await tx.case(case_id, lock=True)
    if case is None:
        return Acted(None, refused=f"no reconcile case {case_id}")
    return _refused(case, action)


async def _refuse(tx: CaseStatements, case_id: int, actor: str, note: str | None, why: str,
                  listed: Sequence[Issued], ours: frozenset[str]) -> Acted:
    """A compensation refused on what the provider lists now: audited, and the open case's evidence
    refreshed with it (a run that finds the case again writes its own)."""
    acted = await _open_case(tx, case_id, "compensate")
    if acted.refused is not None or acted.case is None:
        return acted
    evidence = {**acted.case["evidence"], "compensable": False, "why_not": why,
                "rechecked": {"at": datetime.now(UTC).isoformat(), "by": actor,
                              "waybills": [{**issued_evidence(w), "ours": w.key in ours} for w in listed]}}
    await tx.set_evidence(case_id, evidence)
    await tx.audit(case_id, actor, "compensate", OPEN, None, note, f"refused: {why}")
    return Acted(await tx.case(case_id), refused=f"not cancelled: {why}")


async def _close(tx: CaseStatements, case_id: int, action: str, actor: str, note: str | None, *,
                 detail: str | None = None, done_anyway: str | None = None) -> Acted:
    acted = await _open_case(tx, case_id, action)
    if acted.refused is not None:
        if done_anyway is not None and acted.case is not None:     # the provider did it; someone closed it first
            status = acted.case["status"]
            await tx.audit(case_id, actor, action, status, status, note,
                           f"{done_anyway}; the case had been closed meanwhile by {acted.case['closed_by']}")
        return acted
    to, _ = CASE_ACTIONS[action]
    if not await tx.close(case_id, status=int(to), open_status=int(OPEN), actor=actor, note=note):
        # Locked and open above: the store runs the whole transaction again.
        raise Conflict(f"reconcile case {case_id} moved under its lock")
    await tx.audit(case_id, actor, action, OPEN, to, note, detail)
    return Acted(await tx.case(case_id), changed=True)


async def _adopt(tx: CaseStatements, case_id: int, actor: str, note: str | None) -> Acted:
    """The orphan waybill written as the order's receipt and its step done, checked again under locks."""
    acted = await _open_case(tx, case_id, "adopt")
    if acted.refused is not None:
        return acted
    case = acted.case
    assert case is not None
    effect, order, reference = case["effect"], case["order_no"], case["reference"]
    key = (case["evidence"].get("waybill") or {}).get("idempotency_key")
    steps = await tx.steps(step_keys(effect, order), lock=True)
    step = next((s for s in steps if s.token == key), steps[0] if steps else None)
    held = await tx.receipt(effect, order, lock=True)
    why = adoption_refused(step, key) or (f"the order has a receipt now ({held[0]})" if held is not None else None)
    if why is not None:
        return Acted(case, refused=f"not adopted: {why}")
    assert step is not None
    await tx.write_receipt(effect, order, reference, step)
    if step.status == IdemStatus.PENDING and not await tx.step_done(step, effects_used()[effect].done):
        # Locked above, pending and not live: the store runs the whole transaction again.
        raise Conflict(f"the step {step.biz_key} moved under its lock")
    detail = (f"receipt {reference} written for {step.biz_key} (attempt {step.attempt}); the step was "
              f"{IdemStatus(step.status).name.lower()}" + (", now done" if step.status == IdemStatus.PENDING else ""))
    return await _close(tx, case_id, "adopt", actor, note, detail=detail)


def _named(case: dict[str, Any]) -> dict[str, Any]:
    """A case as people read it: its status, and those of its history, by name."""
    named = {**case, "status": _name(case["status"])}
    if "history" in case:
        named["history"] = [{**entry, "from_status": _name(entry["from_status"]),
                             "to_status": _name(entry["to_status"])} for entry in case["history"]]
    return named


def _name(status: int | None) -> str | None:
    return None if status is None else CaseStatus(status).name.lower()
