"""A provider added by a module of its own (``harness/added_provider.py``: an effect, its step, its
provider and its fake, nothing else touched) is seen by every place that must know while it is
installed, and by none once it is not. The chaos storm then faults it and the checker judges it:
``tests/chaos/test_a_provider_added.py``."""

from __future__ import annotations

import asyncio

from app.adapters.effects import EffectClients, registry
from app.pipeline.steps import Contract, effects_used
from app.settings import Settings
from demo.fakes import registry as fakes
from demo.fakes.server import FakeServices
from harness import added_provider as loyalty
from harness.chaos import rules
from harness.chaos.driver import declared_effect_steps, fakes_config
from harness.chaos.storm import PROFILES, Storm


class Configured:
    """What the storm asks of the fakes, kept."""

    def __init__(self) -> None:
        self.asked: list[dict] = []

    def configure(self, config: dict) -> None:
        self.asked.append(config)


def storm(configured: Configured) -> Storm:
    profile = PROFILES["short"].__class__(**{**vars(PROFILES["short"]), "api_503_seconds": 0})
    return Storm(profile, 7, fleet=None, mariadb=None, brokers=None, proxy=None, fakes=configured, producer=None,
                 events_topic="order-event", say=lambda line: None)


def seen() -> dict[str, bool]:
    """Whether each place that must know a provider knows the loyalty one."""
    effects = Settings(effects__points__url="http://fakes:1").effects
    factories = registry.client_factories()
    served = {route.resource.canonical for route in FakeServices().app().router.routes() if route.resource}
    configured = Configured()
    asyncio.run(storm(configured).apis_503())
    steps = declared_effect_steps()
    return {
        "the pipeline's steps": "points" in effects_used(),
        "the worker's clients": "points" in factories
                                and isinstance(factories["points"](None, effects), loyalty.LoyaltyClient),
        "the settings sending a worker to the fakes": "EFFECTS__POINTS__URL" in fakes.worker_settings("http://f"),
        "the fakes' app": loyalty.CREDITS in served and "loyalty" in FakeServices().faults,
        "the storm's fault targets": "loyalty" in storm(Configured()).fault_targets()
                                    and all("loyalty" in asked for asked in configured.asked),
        "the chaos run's fakes": "loyalty" in fakes_config(PROFILES["short"], 7),
        "the checker's manifest": any(d["effect"] == "points" for d in steps),
    }


def test_every_place_that_must_know_sees_a_provider_added_by_a_module_of_its_own():
    assert [place for place, knows in seen().items() if knows] == []
    with loyalty.installed():
        assert [place for place, knows in seen().items() if not knows] == []
        # the pipeline's decisions: its contract and key horizon, through the port
        port = EffectClients({name: make(None, Settings(effects__points__url="http://f").effects)
                              for name, make in registry.client_factories().items()})
        assert (port.contracts["points"], port.horizons["points"]) == (Contract.REPLAYS, 30 * 86400.0)
        # the checker: told its step, provider, contract and its calls' services; holds it by its contract
        [points] = [d for d in declared_effect_steps() if d["effect"] == "points"]
        assert points == {"event_type": "ORDER_PAID", "step": "credit_points", "effect": "points",
                          "provider": "loyalty", "contract": "replays", "keys_kept_for_seconds": 30 * 86400.0,
                          "services": ["loyalty"]}
        assert rules.unchecked_effects(declared_effect_steps()) == []
        assert "loyalty" in rules.known_services(declared_effect_steps())
        # the chaos run's fakes: seeded after the shipped ones, which keep the seeds they had
        assert [c["seed"] for c in fakes_config(PROFILES["short"], 7).values()] == [7, 8, 9, 10]
    assert [place for place, knows in seen().items() if knows] == []

