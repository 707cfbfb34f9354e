"""What a provider module declares: the effect it serves, its contract, how its client is built,
and what its fake needs. Every provider module has one :class:`Provider` (``PROVIDER``), listed
once in :mod:`app.adapters.effects.registry`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import aiohttp

from app.pipeline.model import EffectJob
from app.pipeline.steps import Contract, Effect
from app.settings.effects import ResolvedEffect


def where(job: EffectJob) -> str:
    """How a client's messages begin: ``<effect> for <order>``. Error groups read the effect from it
    (``app.compensation.fingerprints``), so it is the effect's name, whatever the provider."""
    return f"{job.effect.name} for {job.order_no}"


@dataclass(frozen=True, slots=True)
class Provider:
    name: str                    # the module's name; what EFFECTS__<EFFECT>__PROVIDER names
    effect: Effect               # the pipeline's effect it serves (app/pipeline/steps.py)
    contract: Contract           # what it does with a call made twice
    build: Callable[[aiohttp.ClientSession, ResolvedEffect], object] = field(repr=False)
    # What the fakes' ledger (app/demo/fakes.py) records its calls as: the call, then the lookup if any.
    services: tuple[str, ...] = ()
    # Settings (the part after EFFECTS__<EFFECT>__) a worker needs to use the provider's fake, beside its URL.
    fake_settings: Mapping[str, str] = field(default_factory=dict)
    # Whether a deployment may switch its lookup off (``EFFECTS__<EFFECT>__LOOKUP=false``): its contract is then none.
    lookup_optional: bool = False

    def contract_for(self, settings: ResolvedEffect) -> Contract:
        """The contract as deployed: a lookup switched off leaves none."""
        if self.contract is Contract.LOOKUP and self.lookup_optional and not settings.lookup:
            return Contract.NONE
        return self.contract
