"""This process's heartbeat in ``t_worker``, sent on its own until the process stops: what other
claimants read of it, and the statements, are ``app.adapters.mysql.workers``'s.

A beat starts every ``every`` seconds whether the ones before it have landed or not, each on a
connection of its own (the heartbeat's pool holds :func:`beats_in_flight` of them), each bounded
by ``WORKER_DEAD_AFTER_SECONDS``: past that it could keep nothing open. So a beat stuck on a
connection that a cut or a restart left hung costs nothing (the next one starts on a fresh
connection two seconds later), and on a database that is slow, not gone, beats land one after
another, each a few seconds late, instead of each being given up at its interval: the fence
(``app.pipeline.liveness_fence``) then goes by how late they land, and the worker slows down with
the database instead of refusing every claim as if it were gone.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from app.adapters.mysql.workers import beat, live_members, prune, stopped
from app.pipeline.liveness_fence import SelfFence

if TYPE_CHECKING:
    from app.adapters.mysql.store import MySqlStore

log = logging.getLogger(__name__)
MAX_IN_FLIGHT = 8               # beats at once, at most: connections of the heartbeat's pool


def beats_in_flight(every: float, dead_after: float) -> int:
    """How many beats may be on their way at once: enough for one every ``every`` seconds to land
    as late as ``dead_after`` (a slower database stops the worker's calls anyway), at most
    :data:`MAX_IN_FLIGHT`."""
    return max(1, min(MAX_IN_FLIGHT, math.ceil(dead_after / every)))


class Heartbeat:
    """This process's heartbeat, every ``every`` seconds until it stops; each one that gets through
    feeds the process's ``SelfFence`` (a call starts only while it is recent)."""

    def __init__(self, store: MySqlStore, incarnation: str, worker_id: str, fence: SelfFence, *, every: float,
                 clock: Callable[[], float] = time.monotonic,
                 on_members: Callable[[int], None] | None = None) -> None:
        self.store, self.incarnation, self.worker_id = store, incarnation, worker_id
        self.fence, self.every, self.clock = fence, every, clock
        self.on_members = on_members    # told the live members at each beat (the provider limits' shares)
        self.in_flight = beats_in_flight(every, fence.dead_after)
        self._task: asyncio.Task | None = None
        self._beats: set[asyncio.Task] = set()
        self._failing = False
        self._crowded = False

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
        loop = asyncio.get_running_loop()
        while True:
            if len(self._beats) < self.in_flight:
                self._crowded = False
                task = loop.create_task(self.beat_once(), name="heartbeat-beat")
                self._beats.add(task)
                task.add_done_callback(self._beats.discard)
            elif not self._crowded:
                self._crowded = True
                log.warning("%d heartbeats are on their way to the database at once and none has landed: the next "
                            "waits for one of them", len(self._beats))
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
        pending = list(self._beats)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        try:
            await self.store.in_transaction(lambda tx: stopped(tx._exec, self.incarnation))
        except Exception as exc:
            log.warning("this worker's stop could not be recorded (its claims end with its heartbeat): %r", exc)
