"""The processor's orchestration on the in-memory store, without MariaDB: the scenario
table of ``tests/support/scenarios.py`` (the same table runs on MariaDB in
``tests/integration/test_store_scenarios.py``)."""

from __future__ import annotations

import asyncio
from dataclasses import asdict

import pytest

from tests.support.memory_store import MemoryStore
from tests.support.scenarios import SCENARIOS, Harness, MemoryEffects


class MemoryHarness(Harness):
    def __init__(self) -> None:
        self.store = MemoryStore()
        self.effects = MemoryEffects(self.wait)

    def clock(self):
        return lambda: self.store.now

    async def pass_time(self, seconds: float) -> None:
        self.store.now += seconds
        await asyncio.sleep(0)

    async def wait(self, seconds: float) -> None:
        until = self.store.now + seconds
        while self.store.now < until:
            await asyncio.sleep(0)

    def idem(self, key: str) -> dict | None:
        row = self.store.state.idem.get(key)
        return None if row is None else asdict(row)

    def order(self, order: str) -> dict | None:
        found = self.store.state.orders.get(order)
        return None if found is None else asdict(found)

    def receipt(self, order: str) -> dict | None:
        return self.store.state.receipts.get(order)

    def ledger(self, topic: str) -> list[dict]:
        return [row for k, row in self.store.state.ledger.items() if k[1] == topic]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
async def test_scenario_on_the_memory_store(scenario):
    await scenario(MemoryHarness())
