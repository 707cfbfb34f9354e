"""This process's heartbeat in ``t_worker``, sent on its own until the process stops: what other
claimants read of it, and the statements, are ``app.adapters.mysql.workers``'s."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from app.adapters.mysql.workers import beat, live_members, prune, stopped
from app.pipeline.liveness_fence import SelfFence

if TYPE_CHECKING:
    from app.adapters.mysql.store import MySqlStore

log = logging.getLogger(__name__)


class Heartbeat:
    """This process's heartbeat, every ``every`` seconds until it stops; each one that gets through
    feeds the process's ``SelfFence`` (a call starts only while it is recent)."""

    def __init__(self, store: MySqlStore, incarnation: str, worker_id: str, fence: SelfFence, *, every: float,
                 clock: Callable[[], float] = time.monotonic,
                 on_members: Callable[[int], None] | None = None) -> None:
        self.store, self.incarnation, self.worker_id = store, incarnation, worker_id
        self.fence, self.every, self.clock = fence, every, clock
        self.on_members = on_members    # told the live members at each beat (the provider limits' shares)
        self._task: asyncio.Task | None = None
        self._failing = False

    async def beat_once(self) -> bool:
        sent = self.clock()
        async def beat_and_count(tx) -> int | None:
            await beat(tx._exec, self.incarnation, self.worker_id)
            return await live_members(tx._exec, self.fence.dead_after) if self.on_members is not None else None

        try:
            members = await self.store.in_transaction(beat_and_count)
        except Exception as exc:
            if not self._failing:
                log.warning("this worker's heartbeat did not reach the database (%r): once it is %gs old, the worker "
                            "starts no call, and other workers take its claims over", exc, self.fence.dead_after)
            self._failing = True
            return False
        if self._failing:
            log.info("this worker's heartbeat reaches the database again")
        self._failing = False
        self.fence.beat(sent, self.clock())
        if members is not None and self.on_members is not None:
            self.on_members(members)
        return True

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="heartbeat")

    async def _run(self) -> None:
        beats = 0
        while True:
            await self.beat_once()
            beats += 1
            if beats % max(int(3600 / self.every), 1) == 0:
                try:
                    await self.store.in_transaction(lambda tx: prune(tx._exec))
                except Exception as exc:
                    log.warning("old heartbeats could not be pruned: %r", exc)
            await asyncio.sleep(self.every)

    async def stop(self) -> None:
        """No more heartbeats; the process says it stopped (its claims are free at once)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        try:
            await self.store.in_transaction(lambda tx: stopped(tx._exec, self.incarnation))
        except Exception as exc:
            log.warning("this worker's stop could not be recorded (its claims end with its heartbeat): %r", exc)
