"""Every provider module, listed once: what bootstrap, the lease check, the demo fakes, the chaos
run and the stale-effect advice read to know the effects and their providers.

An effect is served by one provider per deployment: ``EFFECTS__<EFFECT>__PROVIDER`` names it,
else the first provider listed for the effect here. A new provider is its module
(``app/adapters/effects/<name>.py`` with a ``PROVIDER``) and one line in :data:`PROVIDERS`
(the docs' Architecture page).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

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


def fake_settings(url: str, effects: Iterable[Effect] | None = None,
                  providers: Iterable[Provider] | None = None) -> dict[str, str]:
    """The settings that send every effect to the fakes at ``url`` (``app/demo/fakes.py``), whichever
    of its providers a deployment picks: each effect's URL, and the fake accounts of the providers
    that sign."""
    listed = tuple(PROVIDERS if providers is None else providers)
    found: dict[str, str] = {}
    for effect in (effects_used().values() if effects is None else effects):
        prefix = f"EFFECTS__{effect.name.upper()}__"
        found[f"{prefix}URL"] = url
        for provider in providers_of(effect.name, listed):
            found.update({f"{prefix}{key}": value for key, value in provider.fake_settings.items()})
    return found


def services(providers: Iterable[Provider] | None = None) -> Mapping[str, tuple[str, ...]]:
    """What the fakes' ledger records each provider's calls as, by provider name."""
    return {p.name: p.services for p in (PROVIDERS if providers is None else providers)}


def token_paths(providers: Iterable[Provider] | None = None) -> tuple[str, ...]:
    """Every URL path a provider's client puts a token in (``Provider.token_paths``), for the traces."""
    return tuple(path for p in (PROVIDERS if providers is None else providers) for path in p.token_paths)
