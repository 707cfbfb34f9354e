"""The background work a worker's stop waits for: a drain round of the compensator, a bulk job's chunk,
an advance of the store's watermark. The runtime closes its HTTP sessions and its engines only once
the rounds in flight have finished (a redrive cut short by a closed session failed with "Session is
closed" and left its dead letter for a person, its step pending), and no round starts once it is
stopping. The timers are handed this, not the runtime."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class RuntimeStopping(Exception):
    """Background work asked for after the runtime began to stop."""


class BackgroundWork:
    def __init__(self) -> None:
        self._stopping = False
        self._working = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def stopping(self) -> bool:
        return self._stopping

    @contextlib.asynccontextmanager
    async def working(self) -> AsyncIterator[None]:
        """One round of background work, which :meth:`stop` waits for; refused once stopping."""
        if self._stopping:
            raise RuntimeStopping("the worker is stopping: no new background work")
        self._working += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._working -= 1
            if not self._working:
                self._idle.set()

    async def stop(self) -> None:
        """No round starts from now on; returns once the rounds in flight have finished (their calls end
        within a lease; STOP_TIMEOUT_SECONDS bounds the whole stop)."""
        self._stopping = True
        await self._idle.wait()
