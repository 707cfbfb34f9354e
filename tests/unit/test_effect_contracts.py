"""The effects' clients are held to their providers' contracts at start-up."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.adapters.effects import EffectClients, LookupOutsideContract, MissingEffectClient
from app.bootstrap import EFFECT_CLIENTS
from app.pipeline.steps import ISSUE_WAYBILL, SEND_SMS, Contract
from app.settings import Settings


class Offering:
    """A client; ``lookup``: whether the deployed service offers a lookup."""

    def __init__(self, lookup: bool) -> None:
        self.lookup_enabled = lookup
        self.lookup_settle_seconds = 30.0

    async def call(self, job):
        raise NotImplementedError


def test_a_lookup_contract_with_the_lookup_offered_is_asked_about():
    clients = EffectClients({"waybill": Offering(False), "sms": Offering(True)}, required=[ISSUE_WAYBILL, SEND_SMS])
    assert clients.verifiable == {"sms": 30.0}


def test_a_lookup_contract_whose_service_offers_none_is_for_a_person():
    clients = EffectClients({"waybill": Offering(False), "sms": Offering(False)}, required=[ISSUE_WAYBILL, SEND_SMS])
    assert clients.verifiable == {}


@pytest.mark.parametrize("contract", [Contract.REPLAYS, Contract.REFUSES_DUPLICATES, Contract.NONE])
def test_a_lookup_offered_outside_the_contract_is_refused_at_start_up(contract):
    effect = replace(SEND_SMS, contract=contract)
    with pytest.raises(LookupOutsideContract, match=f"sms offer a lookup, but the effect's contract \\({contract.value}\\)"):
        EffectClients({"sms": Offering(True)}, required=[effect])


def test_an_effect_without_a_client_is_refused_at_start_up():
    with pytest.raises(MissingEffectClient, match="waybill"):
        EffectClients({"sms": Offering(True)}, required=[ISSUE_WAYBILL, SEND_SMS])


@pytest.mark.parametrize("lookup", [True, False])
def test_the_shipped_clients_keep_their_effects_contracts(lookup):
    settings = Settings(sms_lookup=lookup)
    clients = EffectClients({name: make(None, settings) for name, make in EFFECT_CLIENTS.items()})
    assert clients.verifiable == ({"sms": settings.effects.sms_lookup_settle_seconds} if lookup else {})
