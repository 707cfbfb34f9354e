"""Work that is better done in groups: a T3 for the calls that finished meanwhile, a ledger write
and a send for the dead letters of several orders."""

from __future__ import annotations

import asyncio
import time


class Group:
    """Things waiting to be done together: :meth:`next` hands out what was added, once it holds
    ``size`` of them, or ``after`` seconds after the first of them was added, or once every one of
    the ``producers`` has added its part (or left without one), or once closed; ``None`` when
    closed and empty. One reader: a group is worked while the next one fills."""

    def __init__(self, size: int, after: float, producers: int = 0) -> None:
        self.size, self.after = size, after
        self.producers = producers          # who may still add: none left, no reason to wait
        self._items: list = []
        self._count = 0
        self._first = 0.0
        self._closed = False
        self._changed = asyncio.Event()

    def add(self, item, count: int, *, last: bool = True) -> None:
        """A producer's part (its last one unless ``last`` is False)."""
        if not self._items:
            self._first = time.monotonic()
        self._items.append(item)
        self._count += count
        if last:
            self.producers -= 1
        self._changed.set()

    def leave(self) -> None:
        """A producer that will add nothing."""
        self.producers -= 1
        self._changed.set()

    def close(self) -> None:
        self._closed = True
        self._changed.set()

    async def next(self) -> list | None:
        while True:
            if self._items and (self._closed or self._count >= self.size or self.producers <= 0):
                break
            if not self._items:
                if self._closed:
                    return None
                self._changed.clear()
                await self._changed.wait()
                continue
            left = self._first + self.after - time.monotonic()
            if left <= 0:
                break
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                pass
        taken, self._items, self._count = self._items, [], 0
        return taken
