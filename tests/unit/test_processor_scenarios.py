"""The processor's orchestration on the in-memory store, without MariaDB: the scenario
table of ``harness/scenarios.py`` (the same table runs on MariaDB in
``tests/integration/test_store_scenarios.py``)."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import asdict

import pytest

from app.pipeline.liveness_fence import incarnation_of
from harness.memory_store import MemoryStore
from harness.scenarios import SCENARIOS, Harness, MemoryEffects


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

    def backup(self, order: str):
        state = self.store.state
        return order, copy.deepcopy(({k: r for k, r in state.idem.items() if k.startswith(f"{order}:")},
                                     state.orders.get(order), state.receipts.get(order)))

    def restore(self, backup) -> None:
        order, (rows, found, receipt) = backup
        state = self.store.state
        for k in [k for k in state.idem if k.startswith(f"{order}:")]:
            del state.idem[k]
        state.idem.update(copy.deepcopy(rows))
        for table, value in ((state.orders, found), (state.receipts, receipt)):
            table.pop(order, None)
            if value is not None:
                table[order] = copy.deepcopy(value)

    def open_recovery_window(self, age: float = 0.0) -> None:
        self.store.state.recovery_opened = self.store.now - age

    def end_recovery_window(self) -> None:
        self.store.state.recovery_opened = None

    def beat(self, p) -> None:
        self.store.state.heartbeats[incarnation_of(p.owner)] = self.store.now
        p.fence.beat(self.store.now, self.store.now)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
async def test_scenario_on_the_memory_store(scenario):
    await scenario(MemoryHarness())
