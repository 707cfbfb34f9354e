"""The order gate: an order's records in batches in flight at once are worked one batch after
another, in the order the batches came.

An order's records in a later batch start only once the earlier batch is done with that order (its
records there finished). Their claims are this worker's (the same owner), so without the wait the
later batch would take the earlier one's pending claim for its own and call the effect a second time.
Other orders of the two batches do not wait for each other. An order's events are in one partition
when producers key by order, but not always (a topic given more partitions, a producer with another
key).
"""

from __future__ import annotations

import asyncio

Place = tuple[asyncio.Event | None, asyncio.Event]      # the earlier batch's turn (None: none), this one's


class OrderGate:
    def __init__(self) -> None:
        self._last: dict[str, asyncio.Event] = {}      # order -> set when its latest holder is done

    def enter(self, orders: list[str]) -> dict[str, Place]:
        """For each order: the event of the batch before this one that holds it (None: none does), and
        this batch's, to set by :meth:`leave`."""
        places: dict[str, Place] = {}
        last = self._last
        for order in orders:
            mine = asyncio.Event()
            places[order] = (last.get(order), mine)
            last[order] = mine
        return places

    def leave(self, order: str, mine: asyncio.Event) -> None:
        mine.set()
        if self._last.get(order) is mine:
            del self._last[order]
