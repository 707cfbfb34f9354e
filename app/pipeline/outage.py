"""Waiting out an unreachable database, within a budget of wall-clock time.

Everything that runs through one :class:`OutageGuard` shares its budget: 64 records
waiting at once for a 5 s outage is a 5 s outage, not 64 x 5 s. Once the database has
been unreachable for ``budget`` seconds, :class:`Fatal`: the worker stops without
acknowledging what it holds, and Kafka delivers it again.

A database that answers, slowly (:class:`DatabaseSlow`: this worker's heartbeats land, too late
for a call to be safe), is waited out without spending the budget: every worker of the group
meets the same database, and stopping them all, again after each restart, would take the whole
group out for something that only slows it down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from app.pipeline.errors import Fatal, StoreUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")


class OutageGuard:
    def __init__(self, budget: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.budget = budget
        self.waited = 0.0                   # wall clock the database was unreachable, in all
        self._clock = clock
        self._sleep = sleep
        self._since: float | None = None

    async def __call__(self, work: Callable[[], Awaitable[T]]) -> T:
        """Run one database step; wait out an unreachable database, within the budget."""
        delay = 0.5
        while True:
            try:
                result = await work()
            except StoreUnavailable as exc:
                if exc.spends_budget:
                    wait = min(delay, self._failed(exc))
                    log.warning("database unavailable (%s); waiting %.1fs", exc, wait)
                else:
                    self._recovered()          # it answers: whatever outage came before is over
                    wait = delay
                    log.warning("database slow (%s); waiting %.1fs", exc, wait)
                await self._sleep(wait)
                delay = min(delay * 2, 10.0)
                continue
            self._recovered()
            return result

    def _failed(self, exc: Exception) -> float:
        """Seconds left of the budget; :class:`Fatal` when none are."""
        now = self._clock()
        if self._since is None:
            self._since = now
        down = now - self._since
        if down >= self.budget:
            self.waited += down
            raise Fatal(f"database unavailable for {down:.0f}s: {exc}") from exc
        return self.budget - down

    def _recovered(self) -> None:
        if self._since is not None:
            self.waited += self._clock() - self._since
            self._since = None
