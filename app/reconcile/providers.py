"""The providers' side of reconciliation: what each provider's own records say it did, against the
receipts we hold.

For each effect whose provider can list what it did (its listing, :class:`app.reconcile.ports.Listing`)
over ``[since, until)``:

=========  =====================================================================================
finding    what it is
=========  =====================================================================================
duplicate  two or more waybills, not cancelled, for one order (a provider that ignored the key, a
           call made twice): the one our receipt holds is the keeper, the others are extras
           (with no receipt, the earliest of ours is the keeper, to be adopted first). An extra
           is ours, and a person may cancel it, only when it was issued under one of this
           deployment's tokens for the order (:func:`our_tokens`); one under another key
           (customer service's re-shipment, another deployment on the same provider account)
           is ``foreign``: reported, and its case says so, but never cancelled from here
orphan     a waybill, not cancelled, for an order we hold no receipt for: a crash between the call
           and T3, or a receipt lost; adopting it makes it the receipt
missing    a receipt we hold whose waybill the provider does not list, or lists cancelled
=========  =====================================================================================

An effect whose provider cannot list (the express courier, the SMS gateway) is reported
``not_listable``, never skipped in silence.

Two clocks meet here, and a receipt is written after the provider's record of the same call (T3
follows the call; a call in doubt is replayed later): the provider is read over the range widened
by ``RECONCILE_PROVIDER_MARGIN_SECONDS`` either side, our receipts over the range itself, and an
order the provider names is looked up by its key, whenever its receipt was written. A receipt
whose waybill is not listed and whose step was first claimed before the widened range (a replay
long after the first call) makes the listing be read further back, to the claim. A finding
belongs to the range its extra waybill, its orphan or its receipt falls in, so that runs over
neighbouring ranges do not both report it (and a case is filed once however many runs find it).
A step whose claim is live (a worker between its call and T3) is in flight, not an orphan.

A range is compared a slice of ``RECONCILE_PROVIDER_SLICE_SECONDS`` at a time (each slice with its
margins), so that what one read holds does not grow with the range. Every read is bounded: the listing a page at a time and at most ``RECONCILE_PROVIDER_MAX_ROWS``
entries (beyond, the effect is ``complete: false`` and reports no missing receipts, which the
part not read might hold), the receipts by ``idx_gmt_create`` with the same bound, the rest by key.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from app.pipeline.errors import PipelineError
from app.pipeline.states import IdemStatus
from app.pipeline.steps import PIPELINES
from app.reconcile.cases import DUPLICATE, MISSING, ORPHAN, adoption_refused
from app.reconcile.ports import HeldReceipt, Issued, Listing, ReceiptReads, StepState, Tokens

PAGE_SIZE = 500                # entries of a provider's listing asked at once
FOREIGN = ("issued under a key that is none of this deployment's tokens for the order (customer service's "
           "re-shipment, another deployment on the same provider account): reported, never cancelled from here")


def effect_steps(effect: str) -> list[tuple[str, str, str]]:
    """Every (key format, event type, step name) of the steps that call ``effect``."""
    return [(pipe.key_format, event_type.value, step.name) for event_type, pipe in PIPELINES.items()
            for step in pipe.effects if step.effect.name == effect]


def step_keys(effect: str, order_no: str) -> list[str]:
    """The ``t_idem`` keys of ``effect``'s steps for ``order_no`` (the pipeline's own key format)."""
    return [form.format(order_no=order_no, type=type_, step=step) for form, type_, step in effect_steps(effect)]


def our_tokens(tokens: Tokens, effect: str, order_no: str, *stored: str | None) -> frozenset[str]:
    """Every idempotency key this deployment may have asked ``effect`` for ``order_no`` under: the
    tokens of the order's step keys under today's secret (a step's key does not vary with its attempt,
    a redrive or a replay: ``app.pipeline.plan.step_keys``), and the ``stored`` ones (the step rows'
    and the receipt's ``idem_token``: a row keeps the token it was claimed with, under an older
    secret too). A waybill under any other key is not ours to cancel."""
    return frozenset({tokens(key) for key in step_keys(effect, order_no)} | {t for t in stored if t})


@dataclass(frozen=True, slots=True)
class ProviderFinding:
    kind: str                   # duplicate, orphan, missing (app.reconcile.cases)
    effect: str
    provider: str
    order_no: str
    biz_key: str | None         # the effect step's t_idem key
    keeper: str | None          # the waybill to keep: the receipt's, the orphan, the missing one
    extras: tuple[str, ...]     # a duplicate's waybills of ours beside the keeper: a person may cancel them
    evidence: dict[str, Any]
    foreign: tuple[str, ...] = ()   # a duplicate's live waybills under keys not ours: reported, never cancelled

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "effect": self.effect, "provider": self.provider, "order_no": self.order_no,
                "biz_key": self.biz_key, "keeper": self.keeper, "extras": list(self.extras),
                "foreign": list(self.foreign), "evidence": self.evidence}

    @property
    def references(self) -> tuple[str, ...]:
        """What a person acts on, one case each: each extra of a duplicate (ours and foreign), else the keeper."""
        if self.kind == DUPLICATE:
            return self.extras + self.foreign
        return (self.keeper,) if self.keeper else ()

    def case_evidence(self, reference: str) -> dict[str, Any]:
        """What the case of ``reference`` keeps: the finding's evidence, and for a duplicate's waybill
        whether it is ours to cancel, and why not."""
        evidence = {"biz_key": self.biz_key, "keeper": self.keeper, "extras": list(self.extras),
                    "foreign": list(self.foreign), **self.evidence}
        if self.kind == DUPLICATE:
            ours = reference in self.extras
            evidence |= {"compensable": ours, "why_not": None if ours else f"{reference} was {FOREIGN}"}
        return evidence


@dataclass(frozen=True, slots=True)
class Window:
    since: datetime
    until: datetime
    margin: timedelta

    def __contains__(self, at: datetime) -> bool:
        return self.since <= at < self.until

    @property
    def wide(self) -> tuple[datetime, datetime]:
        return self.since - self.margin, self.until + self.margin


@dataclass
class ProviderSection:
    since: datetime
    until: datetime
    margin_seconds: float
    effects: dict[str, dict[str, Any]] = field(default_factory=dict)
    findings: list[ProviderFinding] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"since": self.since.isoformat(), "until": self.until.isoformat(), "margin_seconds": self.margin_seconds,
                "effects": self.effects, "findings": [f.as_dict() for f in self.findings]}


@dataclass(frozen=True, slots=True)
class ProviderSide:
    """An effect as this deployment has it: its provider, what lists the provider's records (None: it
    cannot) and our receipts of it (None: they have no table of their own to compare with)."""
    effect: str
    provider: str
    listing: Listing | None
    receipts: ReceiptReads | None


async def reconcile_providers(sides: Iterable[ProviderSide], *, since: datetime, until: datetime,
                              margin_seconds: float, slice_seconds: float, max_rows: int,
                              tokens: Tokens) -> ProviderSection:
    """Every effect's provider compared with our receipts over ``[since, until)`` (UTC), the range
    widened by ``margin_seconds`` either side for the provider's records (``RECONCILE_PROVIDER_*``)."""
    window = Window(_utc(since), _utc(until), timedelta(seconds=margin_seconds))
    section = ProviderSection(window.since, window.until, margin_seconds)
    for side in sides:
        if side.listing is None or side.receipts is None:
            section.effects[side.effect] = not_listable(side)
            continue
        try:
            found, counts = await compare_sliced(side.receipts, side.listing, side.provider, window,
                                                 slice_seconds=slice_seconds, max_rows=max_rows, tokens=tokens)
        except PipelineError as exc:
            section.effects[side.effect] = {"provider": side.provider, "not_listable": False, "error": str(exc)}
            continue
        section.effects[side.effect] = counts
        section.findings += found
    return section


def not_listable(side: ProviderSide) -> dict[str, Any]:
    why = ("the provider lists nothing of what it did" if side.listing is None
           else "its receipts have no table of their own to compare with")
    return {"provider": side.provider, "listed": None, "receipts": None, "duplicates": None, "orphans": None,
            "missing": None, "not_listable": True, "why": why}


async def compare_sliced(reads: ReceiptReads, listing: Listing, provider: str, window: Window, *,
                         slice_seconds: float, max_rows: int,
                         tokens: Tokens) -> tuple[list[ProviderFinding], dict[str, Any]]:
    """:func:`compare_effect` a slice of the range at a time, so that each read stays within ``max_rows``
    whatever the range holds; a finding belongs to one slice (the one its extra, orphan or receipt falls
    in), and one named again by a neighbour (a duplicate whose extras span two) is kept once."""
    findings: list[ProviderFinding] = []
    seen: set[tuple[str, str, tuple[str, ...]]] = set()
    totals: dict[str, Any] = {}
    start = window.since
    while start < window.until:
        end = min(start + timedelta(seconds=slice_seconds), window.until)
        found, counts = await compare_effect(reads, listing, provider, Window(start, end, window.margin),
                                             max_rows=max_rows, tokens=tokens)
        for finding in found:
            if (mark := (finding.kind, finding.order_no, finding.references)) not in seen:
                seen.add(mark)
                findings.append(finding)
        for name, value in counts.items():
            if isinstance(value, bool):
                totals[name] = totals.get(name, True) and value if name == "complete" else value
            elif isinstance(value, int):
                totals[name] = totals.get(name, 0) + value
            else:
                totals[name] = value
        start = end
    kinds = [f.kind for f in findings]
    totals.update(duplicates=kinds.count(DUPLICATE), orphans=kinds.count(ORPHAN), missing=kinds.count(MISSING),
                  slices=math.ceil((window.until - window.since).total_seconds() / slice_seconds))
    return findings, totals


async def compare_effect(reads: ReceiptReads, listing: Listing, provider: str, window: Window, *,
                         max_rows: int, tokens: Tokens) -> tuple[list[ProviderFinding], dict[str, Any]]:
    """One effect: its provider's records and our receipts read (see the module's docstring), compared."""
    listed, complete = await read_listing(listing, *window.wide, max_rows=max_rows)
    receipts = await reads.written(window.since, window.until, limit=max_rows)
    complete = complete and len(receipts) < max_rows
    held = {r.order_no: r for r in receipts}
    held |= await reads.of_orders({i.order_no for i in listed} - held.keys())
    known = {i.reference for i in listed}
    claims = [r.step.claimed_at for r in held.values() if r.reference not in known and r.step is not None]
    if claims and min(claims) < window.wide[0] and len(listed) < max_rows:
        # A receipt of a replay (or of an order whose second waybill came long after its first): its
        # waybill may predate the widened range, back to the step's first claim.
        earlier, whole = await read_listing(listing, min(claims) - window.margin, window.wide[0],
                                            max_rows=max_rows - len(listed))
        listed, complete = [*earlier, *listed], complete and whole
    steps = await _steps_of(reads, {i.order_no for i in listed} - held.keys())
    findings, in_flight = compare(reads.effect, provider, window, listed, held, steps, missing=complete,
                                  tokens=tokens)
    counts = {kind: sum(1 for f in findings if f.kind == kind) for kind in (DUPLICATE, ORPHAN, MISSING)}
    return findings, {"provider": provider, "listed": len(listed), "receipts": len(receipts),
                      "duplicates": counts[DUPLICATE], "orphans": counts[ORPHAN], "missing": counts[MISSING],
                      "not_listable": False, "in_flight": in_flight, "complete": complete}


async def _steps_of(reads: ReceiptReads, orders: Iterable[str]) -> dict[str, StepState]:
    """The effect's step row of each of ``orders`` that has one, by order."""
    keys = {key: order for order in set(orders) for key in step_keys(reads.effect, order)}
    return {keys[key]: step for key, step in (await reads.steps(keys)).items()}


async def read_listing(listing: Listing, since: datetime, until: datetime, *,
                       max_rows: int) -> tuple[list[Issued], bool]:
    """At most ``max_rows`` of the provider's records, a page at a time; whether that was all."""
    found: list[Issued] = []
    async for page in listing.issued(since, until, page_size=min(PAGE_SIZE, max_rows)):
        found += page
        if len(found) >= max_rows:
            return found[:max_rows], False
    return found, True


def compare(effect: str, provider: str, window: Window, listed: Sequence[Issued], held: Mapping[str, HeldReceipt],
            steps: Mapping[str, StepState], *, tokens: Tokens,
            missing: bool = True) -> tuple[list[ProviderFinding], int]:
    """The findings of one effect, and how many orders were in flight. ``held``: our receipts by order,
    those written in the window and those of every order listed; ``steps``: the effect's step rows of
    the orders listed that we hold no receipt for; ``missing``: whether the listing was read whole;
    ``tokens``: this deployment's (which of an order's waybills are ours, :func:`our_tokens`)."""
    findings: list[ProviderFinding] = []
    in_flight = 0
    for order, waybills in _live_by_order(listed).items():
        receipt = held.get(order)
        step = receipt.step if receipt is not None else steps.get(order)
        ours = our_tokens(tokens, effect, order, receipt.token if receipt else None, step.token if step else None)
        if receipt is not None:
            extras = [w for w in waybills if w.reference != receipt.reference]
            # Only beside the receipt's own, seen live: extras cancelled must never leave the order with none.
            if len(extras) < len(waybills) and any(w.created_at in window for w in extras):
                findings.append(_duplicate(effect, provider, order, receipt, waybills, extras, ours))
            continue
        if step is not None and step.status == IdemStatus.PENDING and step.live:
            in_flight += 1                             # between its call and T3 right now
            continue
        # The keeper to adopt is the earliest of ours; a waybill under a foreign key is never it.
        ranked = [w for w in waybills if w.key in ours] + [w for w in waybills if w.key not in ours]
        if ranked[0].created_at in window:
            findings.append(_orphan(effect, provider, order, ranked[0], step))
        if any(w.created_at in window for w in ranked[1:]):
            findings.append(_duplicate(effect, provider, order, None, ranked, ranked[1:], ours, step))
    if missing:
        by_reference = {i.reference: i for i in listed}
        for receipt in held.values():
            found = by_reference.get(receipt.reference)
            if receipt.written_at in window and (found is None or not found.live):
                others = [i for i in listed if i.order_no == receipt.order_no and i.reference != receipt.reference]
                findings.append(_missing(effect, provider, receipt, found, others))
    return findings, in_flight


def _live_by_order(listed: Iterable[Issued]) -> dict[str, list[Issued]]:
    found: dict[str, list[Issued]] = {}
    for item in sorted(listed, key=lambda i: (i.created_at, i.reference)):
        if item.live:
            found.setdefault(item.order_no, []).append(item)
    return found


def _duplicate(effect: str, provider: str, order: str, receipt: HeldReceipt | None, waybills: Sequence[Issued],
               extras: Sequence[Issued], ours: frozenset[str], step: StepState | None = None) -> ProviderFinding:
    keeper = receipt.reference if receipt is not None else waybills[0].reference
    mine = tuple(w.reference for w in extras if w.key in ours)
    foreign = tuple(w.reference for w in extras if w.key not in ours)
    evidence = {"waybills": [{**issued_evidence(w), "ours": w.key in ours} for w in waybills], "receipt": _receipt(receipt),
                "keeper_is": "our receipt's" if receipt is not None else "the earliest of ours (no receipt: adopt "
                                                                          "it first)",
                "keys": sorted({w.key or "" for w in waybills}),
                "foreign_are": FOREIGN if foreign else None}
    biz_key = receipt.biz_key if receipt is not None else (step.biz_key if step is not None else None)
    return ProviderFinding(DUPLICATE, effect, provider, order, biz_key, keeper, mine, evidence, foreign)


def _orphan(effect: str, provider: str, order: str, waybill: Issued, step: StepState | None) -> ProviderFinding:
    why = adoption_refused(step, waybill.key)
    evidence = {"waybill": issued_evidence(waybill), "step": _step(step), "receipt": None, "adoptable": why is None,
                "why_not": why}
    return ProviderFinding(ORPHAN, effect, provider, order, step.biz_key if step else None, waybill.reference, (),
                           evidence)


def _missing(effect: str, provider: str, receipt: HeldReceipt, found: Issued | None,
             others: Sequence[Issued]) -> ProviderFinding:
    evidence = {"receipt": _receipt(receipt), "step": _step(receipt.step),
                "listed_as": found.status if found is not None else None,
                "listed_for_order": [issued_evidence(i) for i in others]}
    return ProviderFinding(MISSING, effect, provider, receipt.order_no, receipt.biz_key, receipt.reference, (),
                           evidence)


def issued_evidence(item: Issued) -> dict[str, Any]:
    return {"waybill_no": item.reference, "idempotency_key": item.key, "created_at": item.created_at.isoformat(),
            "status": item.status}


def _receipt(receipt: HeldReceipt | None) -> dict[str, Any] | None:
    if receipt is None:
        return None
    return {"waybill_no": receipt.reference, "idem_token": receipt.token, "written_at": receipt.written_at.isoformat()}


def _step(step: StepState | None) -> dict[str, Any] | None:
    if step is None:
        return None
    return {"biz_key": step.biz_key, "status": IdemStatus(step.status).name.lower(), "idem_token": step.token,
            "attempt": step.attempt, "claimed_at": step.claimed_at.isoformat(), "live": step.live}


def _utc(at: datetime) -> datetime:
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
