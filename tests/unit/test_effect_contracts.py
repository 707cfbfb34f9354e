"""The effects' clients are held to their providers' contracts at start-up, and one registry of
provider modules is what every part of the house reads."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from pydantic import ValidationError

from app.adapters.effects import EffectClients, LookupOutsideContract, MissingEffectClient, registry
from app.adapters.effects.provider import Provider
from app.bootstrap import EFFECT_CLIENTS
from app.pipeline.events import EventType
from app.pipeline.steps import ISSUE_WAYBILL, PIPELINES, SEND_SMS, Contract, Effect, EffectStep
from app.settings import Settings
from demo.fakes import registry as fakes
from demo.fakes.fake import Fake
from harness.chaos import rules
from harness.chaos.driver import declared_effect_steps


class Offering:
    """A client of a given contract; ``lookup``: whether it can look a call up."""

    def __init__(self, contract: Contract, lookup: bool = True) -> None:
        self.contract = contract
        if lookup:
            self.lookup_settle_seconds = 30.0

    async def call(self, job):
        raise NotImplementedError

    async def lookup(self, job):
        raise NotImplementedError


def test_a_lookup_contract_is_asked_about_and_the_others_are_not():
    clients = EffectClients({"waybill": Offering(Contract.REPLAYS), "sms": Offering(Contract.LOOKUP)},
                            required=[ISSUE_WAYBILL, SEND_SMS])
    assert clients.verifiable == {"sms": 30.0}
    assert clients.contracts == {"waybill": Contract.REPLAYS, "sms": Contract.LOOKUP}


def test_a_client_that_declares_no_contract_is_taken_as_none():
    class Bare:
        async def call(self, job):
            raise NotImplementedError

    clients = EffectClients({"waybill": Bare(), "sms": Offering(Contract.NONE)}, required=[ISSUE_WAYBILL, SEND_SMS])
    assert clients.contracts == {"waybill": Contract.NONE, "sms": Contract.NONE} and clients.verifiable == {}


def test_a_lookup_contract_without_a_lookup_is_refused_at_start_up():
    with pytest.raises(LookupOutsideContract, match="sms declare the contract lookup but have no lookup"):
        EffectClients({"sms": Offering(Contract.LOOKUP, lookup=False)}, required=[SEND_SMS])


def test_an_effect_without_a_client_is_refused_at_start_up():
    with pytest.raises(MissingEffectClient, match="waybill"):
        EffectClients({"sms": Offering(Contract.LOOKUP)}, required=[ISSUE_WAYBILL, SEND_SMS])


@pytest.mark.parametrize(("settings", "contracts"), [
    ({}, {"waybill": Contract.REPLAYS, "sms": Contract.LOOKUP}),
    ({"sms_lookup": False}, {"waybill": Contract.REPLAYS, "sms": Contract.NONE}),
    ({"effects__sms__lookup": False}, {"waybill": Contract.REPLAYS, "sms": Contract.NONE}),
    ({"effects__waybill__provider": "express", "effects__waybill__key_id": "m",
      "effects__waybill__secret": "s"}, {"waybill": Contract.REFUSES_DUPLICATES, "sms": Contract.LOOKUP}),
])
def test_the_shipped_clients_say_the_contract_the_deployment_has(settings, contracts):
    effects = Settings(**settings).effects
    clients = EffectClients({name: make(None, effects) for name, make in EFFECT_CLIENTS.items()})
    assert clients.contracts == contracts
    assert clients.verifiable == ({"sms": 30.0} if contracts["sms"] is Contract.LOOKUP else {})
    assert {name: contract for name, (_, contract) in registry.deployed(effects).items()} == contracts


def test_a_provider_the_effect_does_not_have_is_refused():
    with pytest.raises(registry.UnknownProvider, match="EFFECTS__WAYBILL__PROVIDER='fax' is no provider of waybill: "
                                                       "one of waybill, express"):
        registry.chosen("waybill", Settings(effects__waybill__provider="fax").effects)


# -- a throwaway effect, added as the docs' recipe says: every place sees it ------------------

PARCEL = Effect("parcel_locker", done="locker_booked", request=lambda event, order: {"order_no": order.order_no})


class LockerClient:
    contract = Contract.REFUSES_DUPLICATES

    def __init__(self, settings):
        self.settings = settings

    async def call(self, job):
        raise NotImplementedError


LOCKER = Provider("locker", PARCEL, Contract.REFUSES_DUPLICATES, lambda session, s: LockerClient(s),
                  keys_kept_for=timedelta(hours=36))
LOCKER_FAKE = Fake("locker", "parcel_locker", lambda fakes: [], services=("locker", "locker_lookup"),
                   settings={"KEY_ID": "demo"})


def test_a_new_effect_is_seen_by_every_place_that_reads_the_registry():
    providers = (*registry.PROVIDERS, LOCKER)
    confirm = PIPELINES[EventType.CONFIRM]
    pipelines = {**PIPELINES, EventType.CONFIRM: replace(confirm, effects=(*confirm.effects,
                                                                           EffectStep("book_locker", PARCEL)))}
    effects_used = [step.effect for pipe in pipelines.values() for step in pipe.effects]
    settings = Settings(effects__parcel_locker__url="http://lockers:81", effects__parcel_locker__timeout_seconds=1.5)

    # bootstrap: a client for it, built from its nested settings
    factories = registry.client_factories(effects_used, providers)
    client = factories["parcel_locker"](None, settings.effects)
    assert isinstance(client, LockerClient)
    assert (client.settings.url, client.settings.timeout_seconds) == ("http://lockers:81", 1.5)
    # the pipeline's decisions: its contract and how long its provider keeps keys, through the port
    port = EffectClients({n: f(None, settings.effects) for n, f in factories.items()}, required=effects_used)
    assert port.contracts["parcel_locker"] is Contract.REFUSES_DUPLICATES
    assert port.horizons["parcel_locker"] == 36 * 3600
    # the demo fakes (its fake declared beside the others): the settings that send a worker's calls of it there
    sent = fakes.worker_settings("http://fakes", effects_used, (*fakes.FAKES, LOCKER_FAKE))
    assert (sent["EFFECTS__PARCEL_LOCKER__URL"], sent["EFFECTS__PARCEL_LOCKER__KEY_ID"]) == ("http://fakes", "demo")
    # the lease check: its lookup counts like any other
    assert "parcel_locker" in Settings(effects__parcel_locker__lookup=True).effects.lookups()
    # the chaos checker: told its provider and contract, and refusing it until it has a check
    steps = declared_effect_steps(pipelines, providers=providers, fakes=(*fakes.FAKES, LOCKER_FAKE))
    [locker] = [d for d in steps if d["effect"] == "parcel_locker"]
    assert (locker["provider"], locker["contract"], locker["keys_kept_for_seconds"], locker["services"]) == (
        "locker", "refuses_duplicates", 36 * 3600, ["locker", "locker_lookup"])
    assert rules.unchecked_effects(steps) == []     # an idempotent contract: held to it by the checker's own rule


def test_the_fakes_serve_every_shipped_effect():
    urls = fakes.worker_settings("http://fakes")
    for name in {step.effect.name for pipe in PIPELINES.values() for step in pipe.effects}:
        assert urls[f"EFFECTS__{name.upper()}__URL"] == "http://fakes"


def test_every_provider_has_its_fake_and_every_fake_plays_a_provider_of_its_effect():
    """The demo and the tests can deploy every provider; a fake names its provider (it does not import
    it: it keeps the contract as the provider's documentation has it), so the names are held here."""
    providers = {p.name: p.effect.name for p in registry.PROVIDERS}
    assert {f.provider: f.effect for f in fakes.FAKES} == providers
    assert all(f.services and len(set(f.services)) == len(f.services) for f in fakes.FAKES)
    assert len({s for f in fakes.FAKES for s in f.services}) == sum(len(f.services) for f in fakes.FAKES)


def test_each_provider_says_how_long_it_keeps_keys_and_a_deployment_may_say_its_own():
    def port(**settings) -> EffectClients:
        effects = Settings(**settings).effects
        return EffectClients({name: make(None, effects) for name, make in EFFECT_CLIENTS.items()})

    assert all(isinstance(p.keys_kept_for, timedelta) for p in registry.PROVIDERS)     # none keeps them for ever
    assert port().horizons == {"waybill": 86400.0, "sms": 7 * 86400.0}
    assert port(effects__waybill__keys_kept_for_seconds="3600").horizons["waybill"] == 3600.0
    assert "waybill" not in port(effects__waybill__keys_kept_for_seconds="forever").horizons
    express = port(effects__waybill__provider="express", effects__waybill__key_id="m", effects__waybill__secret="s")
    assert express.horizons["waybill"] == 72 * 3600.0
    assert express.askable == {"waybill": 30.0, "sms": 30.0} and express.verifiable == {"sms": 30.0}
    for nonsense in ("0", "-5", "a day"):
        with pytest.raises(ValidationError, match="keys_kept_for_seconds"):
            Settings(effects__waybill__keys_kept_for_seconds=nonsense)


def test_make_run_sends_a_worker_to_the_fakes_but_keeps_what_the_environment_sets(monkeypatch):
    from demo.fakes.__main__ import unset_settings

    for name in fakes.worker_settings("http://fakes"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("SMS_URL", raising=False)
    assert unset_settings("http://fakes:8901") == fakes.worker_settings("http://fakes:8901")
    monkeypatch.setenv("LOGISTICS_URL", "http://mine:1")          # the waybill's URL under its older name
    monkeypatch.setenv("EFFECTS__SMS__URL", "http://mine:2")
    found = unset_settings("http://fakes:8901")
    assert "EFFECTS__WAYBILL__URL" not in found and "EFFECTS__SMS__URL" not in found
    assert found["EFFECTS__WAYBILL__KEY_ID"] == "demo-merchant"     # what the express fake needs, for its provider
