"""What a provider module declares: the effect it serves, its contract, how its client is built.
Every provider module has one :class:`Provider` (``PROVIDER``), listed once in
:mod:`app.adapters.effects.registry`. Its fake, for the demo and the tests, is declared beside the
other fakes, outside the product (``demo/fakes/``).

Every provider says how long it keeps an idempotency key (``keys_kept_for``): its promise that a
repeated key (a replayed call, a refused duplicate, a lookup by the key) is answered as the first
call's. Past it, a call in doubt is asked about with the provider's lookup, or left to a person:
never repeated blindly (the docs' exactly-once page, "A provider's key horizon"). None is only for a
provider that truly keeps them for ever; a deployment may set its own
(``EFFECTS__<EFFECT>__KEYS_KEPT_FOR_SECONDS``), from the provider's documentation or contract.

A provider that can say what it did, by time range and for one order, and cancel one of those
things declares a ``listing`` (:class:`Listing`): reconciliation (``app.reconcile.providers``)
compares its records with our receipts and offers a person to cancel a duplicate (after reading the
order's records again, ``app.reconcile.casework``). One that cannot (the express courier,
the SMS gateway) declares none, and the reconcile reports it as not listable.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

import aiohttp

from app.pipeline.model import EffectJob
from app.pipeline.steps import Contract, Effect
from app.settings.effects import ResolvedEffect


def where(job: EffectJob) -> str:
    """How a client's messages begin: ``<effect> for <order>``. Error groups read the effect from it
    (``app.compensation.fingerprints``), so it is the effect's name, whatever the provider."""
    return f"{job.effect.name} for {job.order_no}"


CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class Issued:
    """One thing a provider says it did, as its own records have it: a waybill."""
    reference: str              # its number for it (the waybill number): what a receipt holds
    order_no: str
    key: str | None             # the idempotency key it was asked under
    created_at: datetime        # the provider's clock, UTC
    status: str                 # "issued", "cancelled", or what else the provider says

    @property
    def live(self) -> bool:
        return self.status != CANCELLED


@dataclass(frozen=True, slots=True)
class Cancelled:
    """A provider's answer to a cancel: done now, or done before (the same answer again)."""
    reference: str              # the waybill the answer names (a caller checks it is the one asked for)
    key: str | None             # the key of the cancel that did it
    cancelled_at: datetime | None


class Listing(Protocol):
    """What a provider that lists what it did offers reconciliation. Both raise the pipeline's
    errors (``EffectUnavailable``: try again; ``EffectRejected``: it will not)."""

    def issued(self, since: datetime, until: datetime, *, page_size: int) -> AsyncIterator[list[Issued]]:
        """What it did at or after ``since`` and before ``until`` (its clock), oldest first, a page at a time."""
        ...

    async def of_order(self, order_no: str) -> list[Issued]:
        """Everything it did for ``order_no``, whenever, cancelled or not: what a person's action re-reads."""
        ...

    async def cancel(self, reference: str, key: str) -> Cancelled:
        """Cancel ``reference``; the same ``key`` again changes nothing and answers the same."""
        ...


@dataclass(frozen=True, slots=True)
class Provider:
    name: str                    # the module's name; what EFFECTS__<EFFECT>__PROVIDER names
    effect: Effect               # the pipeline's effect it serves (app/pipeline/steps.py)
    contract: Contract           # what it does with a call made twice
    build: Callable[[aiohttp.ClientSession, ResolvedEffect], object] = field(repr=False)
    # The URL paths its client puts a token in (``/v1/sms/{client_ref}``): a trace shows the braces, never
    # the token (``app.observability.tracing``). Matched at the end of a request's path.
    token_paths: tuple[str, ...] = ()
    # Whether a deployment may switch its lookup off (``EFFECTS__<EFFECT>__LOOKUP=false``): its contract is then none.
    lookup_optional: bool = False
    # What lists the provider's records by time range and cancels one (see the module's docstring); None: it cannot.
    listing: Callable[[aiohttp.ClientSession, ResolvedEffect], Listing] | None = field(default=None, repr=False)
    # How long it keeps an idempotency key (see the module's docstring); None: for ever. Declared by every
    # provider, never defaulted: a wrong "for ever" sends a second effect after a late replay.
    keys_kept_for: timedelta | None = field(kw_only=True)

    def key_horizon(self, settings: ResolvedEffect) -> float | None:
        """How long the deployed provider keeps a key, in seconds: the deployment's setting, else the
        declaration; None for ever."""
        seconds = settings.keys_kept_for_seconds
        if seconds is None:
            return None if self.keys_kept_for is None else self.keys_kept_for.total_seconds()
        return None if seconds == float("inf") else seconds

    def contract_for(self, settings: ResolvedEffect) -> Contract:
        """The contract as deployed: a lookup switched off leaves none."""
        if self.contract is Contract.LOOKUP and self.lookup_optional and not settings.lookup:
            return Contract.NONE
        return self.contract
