"""What a fake provider module declares (``FAKE``), listed once in :mod:`demo.fakes.registry`: the
provider it plays, its routes on the fakes' app, what the ledger records its calls as, and what a
worker needs to call it besides its URL (an account of the fake's, for a provider that signs).

A fake names its provider and effect rather than importing them: it keeps the provider's contract
as the provider's documentation has it, written apart from the client (the express fake checks
signatures with its own code), so that a client's mistake is not the fake's too. A unit test holds
the names to the providers' registry (``tests/unit/test_effect_contracts.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from demo.fakes.server import FakeServices


@dataclass(frozen=True)
class Fake:
    provider: str                # the provider module it plays (``Provider.name``); its faults' name in /__config
    effect: str                  # the effect that provider serves (``Effect.name``): where the ledger files its effects
    # Its routes on the fakes' app, handlers that use the shared machinery (faults, ledger) of ``FakeServices``.
    routes: Callable[[FakeServices], list[web.RouteDef]] = field(repr=False)
    # What the ledger records its calls as: the call first, then its lookup if it has one.
    services: tuple[str, ...] = ()
    # Settings (the part after EFFECTS__<EFFECT>__) a worker needs to call this fake, beside its URL.
    settings: Mapping[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.provider
