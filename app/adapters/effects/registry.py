"""Every provider module, listed once: what bootstrap, the lease check, the chaos run and the
stale-effect advice read to know the effects and their providers.

An effect is served by one provider per deployment: ``EFFECTS__<EFFECT>__PROVIDER`` names it,
else the first provider listed for the effect here. A new provider is its module
(``app/adapters/effects/<name>.py`` with a ``PROVIDER``) and one line in :data:`PROVIDERS`
(the docs' Architecture page); its fake, for the demo and the tests, is declared outside the
product (``demo/fakes/registry.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import aiohttp

from app.adapters.effects import Client, express, sms, waybill
from app.adapters.effects.provider import Provider
from app.pipeline.steps import Contract, Effect, effects_used
from app.settings.effects import EffectsSettings

PROVIDERS: tuple[Provider, ...] = (waybill.PROVIDER, express.PROVIDER, sms.PROVIDER)

ClientFactory = Callable[[aiohttp.ClientSession, EffectsSettings], Client]


class UnknownProvider(ValueError):
    """``EFFECTS__<EFFECT>__PROVIDER`` names no provider of the effect."""


def providers_of(effect: str, providers: Iterable[Provider] | None = None) -> list[Provider]:
    return [p for p in (PROVIDERS if providers is None else providers) if p.effect.name == effect]


def chosen(effect: str, settings: EffectsSettings, providers: Iterable[Provider] | None = None) -> Provider:
    """The provider that serves ``effect`` in this deployment."""
    offered = providers_of(effect, providers)
    if not offered:
        raise UnknownProvider(f"no provider module serves the effect {effect!r} (app/adapters/effects/registry.py)")
    name = settings.effect(effect).provider
    if name is None:
        return offered[0]
    for provider in offered:
        if provider.name == name:
            return provider
    raise UnknownProvider(f"EFFECTS__{effect.upper()}__PROVIDER={name!r} is no provider of {effect}: one of "
                          f"{', '.join(p.name for p in offered)}")


def client_factories(effects: Iterable[Effect] | None = None,
                     providers: Iterable[Provider] | None = None) -> dict[str, ClientFactory]:
    """For every effect a pipeline declares, what builds its client from the effects' settings."""
    listed = tuple(PROVIDERS if providers is None else providers)

    def factory(name: str) -> ClientFactory:
        def make(session: aiohttp.ClientSession, settings: EffectsSettings) -> Client:
            provider, resolved = chosen(name, settings, listed), settings.effect(name)
            client: Client = provider.build(session, resolved)   # type: ignore[assignment]
            # What the pipeline reads of its key horizon (EffectClients.horizons): the provider's, as deployed.
            client.keys_kept_for = provider.key_horizon(resolved)     # type: ignore[attr-defined]
            return client
        return make

    names = [e.name for e in (effects_used().values() if effects is None else effects)]
    return {name: factory(name) for name in names if providers_of(name, listed)}


def deployed(settings: EffectsSettings, effects: Iterable[Effect] | None = None,
             providers: Iterable[Provider] | None = None) -> dict[str, tuple[Provider, Contract]]:
    """Each effect's provider and contract as this deployment has them."""
    listed = tuple(PROVIDERS if providers is None else providers)
    found = {}
    for effect in (effects_used().values() if effects is None else effects):
        provider = chosen(effect.name, settings, listed)
        found[effect.name] = (provider, provider.contract_for(settings.effect(effect.name)))
    return found


def token_paths(providers: Iterable[Provider] | None = None) -> tuple[str, ...]:
    """Every URL path a provider's client puts a token in (``Provider.token_paths``), for the traces."""
    return tuple(path for p in (PROVIDERS if providers is None else providers) for path in p.token_paths)


@contextmanager
def added(*providers: Provider) -> Iterator[None]:
    """``providers`` listed too while the block runs: a provider declared outside this package (a test's
    throwaway one; a process of a test's enters it for its whole life: ``harness.preload``). Every
    function here reads :data:`PROVIDERS` when it is called."""
    global PROVIDERS
    before = PROVIDERS
    PROVIDERS = (*PROVIDERS, *providers)
    try:
        yield
    finally:
        PROVIDERS = before
