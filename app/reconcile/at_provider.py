"""What a person's compensation of a reconcile case asks the provider, at the moment they act.

A case was filed by a run that may be hours old; since then the courier may have cancelled our
receipt's waybill, or someone the extra. So before a cancel the order's waybills are read again
(:meth:`AtProvider.of_order`; ``app.reconcile.cases.compensation_refused`` judges them), and the
cancel's answer must name the waybill asked for (:meth:`AtProvider.cancel`): an answer about
another one is not taken as done (:class:`AnswerMismatch`). Between the read and the cancel is one
HTTP round trip; a change at the provider inside it is not seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.adapters.effects import http_session
from app.adapters.effects.provider import Issued, Listing
from app.adapters.effects.registry import chosen

if TYPE_CHECKING:
    from app.settings import Settings


class NotCancellable(Exception):
    """This deployment cannot cancel at the provider a case names."""


class AnswerMismatch(Exception):
    """The provider answered a cancel about another waybill than the one asked for."""


@dataclass(frozen=True)
class AtProvider:
    """The provider of one case's effect, as this deployment reaches it, and the case's cancel key."""

    settings: Settings
    effect: str
    provider: str
    key: str

    def _listing(self, session) -> Listing:
        make = chosen(self.effect, self.settings.effects).listing
        assert make is not None                 # at_provider() refused a provider without one
        return make(session, self.settings.effects.effect(self.effect))

    async def of_order(self, order_no: str) -> list[Issued]:
        """Every waybill the provider lists for ``order_no`` now."""
        async with http_session(1) as session:
            return await self._listing(session).of_order(order_no)

    async def cancel(self, reference: str) -> str:
        """Cancel ``reference`` under the case's key; what the provider answered, for the audit."""
        async with http_session(1) as session:
            done = await self._listing(session).cancel(reference, self.key)
        if done.reference != reference:
            raise AnswerMismatch(f"{self.provider} answered the cancel of {reference} about {done.reference[:64]}: "
                                 f"not taken as done; the case stays open: look {reference} up at the provider "
                                 "before anything else")
        when = done.cancelled_at.isoformat() if done.cancelled_at else "at a time it does not say"
        by = "this case's key" if done.key == self.key else "another key (cancelled before this case asked)"
        return f"{self.provider} cancelled {reference} {when}, under {by} (...{self.key[-4:]})"


def at_provider(settings: Settings, effect: str, provider_name: str, key: str) -> AtProvider:
    """The provider of a case (``provider_name``'s ``effect``) as this deployment reaches it, or
    :class:`NotCancellable` when this deployment's provider of the effect is another or cannot cancel."""
    provider = chosen(effect, settings.effects)
    if provider.name != provider_name or provider.listing is None:
        raise NotCancellable(f"the case is about {provider_name}'s {effect}; this deployment's provider of it is "
                             f"{provider.name}, which " + ("cannot cancel" if provider.listing is None else
                                                           "did not issue it"))
    return AtProvider(settings, effect, provider_name, key)
