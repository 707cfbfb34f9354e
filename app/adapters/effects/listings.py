"""The providers' own records as the reconcile reaches them (``app.reconcile.ports``): over a run,
each effect's provider and what lists its records, on the run's HTTP session; at a person's action
on a case, the provider of the case's effect, on a session of its own for each call (one connection:
a person's click is never a slot of the order agent's pool).

Both are the deployment's provider of the effect (``EFFECTS__<EFFECT>__PROVIDER``,
:func:`~app.adapters.effects.registry.chosen`); one whose module declares no ``listing`` cannot
list nor cancel, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp

from app.adapters.effects import http_session
from app.adapters.effects.provider import Cancelled, Issued, Listing
from app.adapters.effects.registry import chosen
from app.pipeline.steps import effects_used
from app.settings.effects import EffectsSettings


def listings(settings: EffectsSettings, session: aiohttp.ClientSession) -> dict[str, tuple[str, Listing | None]]:
    """Each effect a pipeline declares: the name of its provider in this deployment, and what lists that
    provider's records over ``session`` (None: it cannot)."""
    found: dict[str, tuple[str, Listing | None]] = {}
    for effect in effects_used().values():
        provider = chosen(effect.name, settings)
        make = provider.listing
        found[effect.name] = (provider.name, None if make is None else make(session, settings.effect(effect.name)))
    return found


@dataclass(frozen=True, slots=True)
class AtProvider:
    """The deployment's provider of ``effect``, asked at the moment a person acts."""

    settings: EffectsSettings
    effect: str
    name: str
    can_cancel: bool

    def _listing(self, session: aiohttp.ClientSession) -> Listing:
        make = chosen(self.effect, self.settings).listing
        if make is None:
            raise LookupError(f"{self.name} lists nothing of what it did for {self.effect}: it cannot be asked")
        return make(session, self.settings.effect(self.effect))

    async def of_order(self, order_no: str) -> list[Issued]:
        """Every waybill the provider lists for ``order_no`` now."""
        async with http_session(1) as session:
            return await self._listing(session).of_order(order_no)

    async def cancel(self, reference: str, key: str) -> Cancelled:
        """Cancel ``reference`` under ``key``: the provider's answer, as it gave it."""
        async with http_session(1) as session:
            return await self._listing(session).cancel(reference, key)


def at_provider(settings: EffectsSettings, effect: str) -> AtProvider:
    """This deployment's provider of ``effect``, reached one call at a time."""
    provider = chosen(effect, settings)
    return AtProvider(settings, effect, provider.name, provider.listing is not None)
