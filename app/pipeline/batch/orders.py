"""The orders of a batch, each on its own from its first try to its records' end: those no earlier batch
holds start together (one T1); the others once their earlier batch is done with them (the order gate).
An order's records from the first one whose provider's breaker is open are held before their T1, the
records before it go on at once. Each part of an order is finished as soon as its results are in
(``finishing``); the batch's dead letters go out in groups meanwhile (``dead_letters``)."""

from __future__ import annotations

import asyncio

import app.pipeline.batch.dead_letters as dead_letters
import app.pipeline.batch.holds as holds
from app.pipeline.batch.finishing import finish_part
from app.pipeline.batch.first_try import Starter
from app.pipeline.batch.gate import Place
from app.pipeline.batch.reading import Read
from app.pipeline.batch.state import Batch, Item


async def work(batch: Batch, read: Read, places: dict[str, Place]) -> None:
    """Every order of ``read`` and its loose letters, while the letters are sent as they come."""
    batch.letters = dead_letters.group(producers=len(read.orders) + (1 if read.loose else 0))
    async with asyncio.TaskGroup() as both:
        both.create_task(dead_letters.deliver(batch))
        both.create_task(_orders_and_loose(batch, read, places))


async def _orders_and_loose(batch: Batch, read: Read, places: dict[str, Place]) -> None:
    try:
        async with asyncio.TaskGroup() as tasks:
            if read.loose:
                tasks.create_task(dead_letters.send_loose(batch, read.loose))
            starter = Starter(batch, tasks)
            free: list[Item] = []
            opened = holds.open_effects(batch)
            for order, items in read.orders.items():
                earlier = places[order][0]
                results, held = None, None
                if earlier is None:
                    now, held = holds.split(batch, items, opened)
                    free.extend(now)
                    results = starter.results_of(order) if now else None
                tasks.create_task(_order(batch, items, places[order], results, held, starter))
            if free:
                tasks.create_task(starter.run(free))
    finally:
        batch.letters.close()


async def _order(batch: Batch, items: list[Item], place: Place, results: asyncio.Future | None,
                 held: list[Item] | None, starter: Starter) -> None:
    """One order of the batch, from its first try to its records' end; then the order's records in
    a later batch may start."""
    earlier, mine = place
    try:
        if not await _order_work(batch, items, earlier, results, held, starter):
            batch.letters.leave()
    finally:
        batch.crew.gate.leave(items[0].event.order_no, mine)


async def _order_work(batch: Batch, items: list[Item], earlier: asyncio.Event | None,
                      results: asyncio.Future | None, held: list[Item] | None, starter: Starter) -> bool:
    """The order's work; whether its last part sent letters (it is then done with the letters group)."""
    order = items[0].event.order_no
    now = items[:len(items) - len(held)] if held else items
    if earlier is not None:
        batch.report.order_waits += 1
        await holds.behind(batch, order, earlier, len(items))
        now, held = holds.split(batch, items, holds.open_effects(batch))
        if now:
            results = starter.results_of(order)
            starter.later(now)
    sent = False
    if now:
        assert results is not None
        sent = await finish_part(batch, now, items, results, last=not held)
    if not held:
        return sent
    kept = await holds.hold(batch, held)
    holds.release(batch, len(held))
    if not kept:            # given up by a rebalance while a person's hold lasted: its new owner works them
        batch.tell([item.index for item in held])
        return sent
    starter.fresh(order)
    results = starter.results_of(order)
    starter.later(held)
    return await finish_part(batch, held, items, results, last=True)
