"""The holds: while a provider's breaker is open, an order's records from the first one that needs it
wait before their T1 (unclaimed, nothing spent) until the breaker closes, or lets one of them through
to probe it, or their batch's deadline is near; at most ``BatchPolicy.hold_records`` in all, past that
they go on and meet the breaker (dead-lettered ``provider_unavailable``). A record of an order held in
an earlier batch waits behind it (the order gate) and counts as held meanwhile.

An effect a person holds (``app.pipeline.controls``) holds its records the same way, but without a
probe and without the deadline: they wait until the hold ends, then go on in their order with a fresh
deadline, and nothing is dead-lettered for the hold. Past ``hold_records`` they are held all the same:
the worker then takes no new batch (the feed counts what is held past the bound as in flight), so its
partitions wait in the broker rather than in memory. A held record whose partition was revoked (given
up by the rebalance) leaves the hold unworked, never acked: its new owner reads it again, and holds it.
"""

from __future__ import annotations

import asyncio

from app.pipeline.batch.state import Batch, Item
from app.pipeline.errors import EffectHeld, PipelineError, ProviderUnavailable
from app.pipeline.steps import PIPELINES

HOLD_MARGIN_SECONDS = 1.0      # held records go on this long before their batch's deadline
BEHIND_LOOK_SECONDS = 0.5      # how often records behind an order of an earlier batch look whether it is held


def open_effects(batch: Batch) -> frozenset[str]:
    """The effects held now: those a person holds, and those whose breaker is open (none of these when
    the batch holds nothing for a breaker)."""
    limits = getattr(batch.crew.processor, "limits", None)
    if limits is None:
        return frozenset()
    by_person = held_by_person(batch)
    if batch.crew.policy.hold_records <= 0:
        return by_person
    return by_person | frozenset(limits.open_breakers())


def held_by_person(batch: Batch) -> frozenset[str]:
    controls = getattr(getattr(batch.crew.processor, "limits", None), "controls", None)
    return controls.held() if controls is not None else frozenset()


def split(batch: Batch, items: list[Item], opened: frozenset[str]) -> tuple[list[Item], list[Item] | None]:
    """The order's records to start now, and those to hold (from its first record that needs an
    effect whose breaker is open); none held past ``hold_records`` held in all."""
    if not opened:
        return items, None
    by_person = held_by_person(batch)
    for at, item in enumerate(items):
        needs = {step.effect.name for step in PIPELINES[item.event.type].effects}
        if needs & opened:
            if not needs & by_person and batch.crew.holds.records + len(items) - at > batch.crew.policy.hold_records:
                return items, None           # too many held: they go on, and meet the breaker
            batch.count_held(len(items) - at)
            return items[:at], items[at:]
    return items, None


def waits(batch: Batch, error: PipelineError) -> bool:
    """Whether a record refused by an open breaker waits for it (instead of its dead letter at once); one
    refused by a person's hold always does."""
    return isinstance(error, EffectHeld) or (isinstance(error, ProviderUnavailable) and
                                             batch.crew.policy.hold_records > 0)


def until(batch: Batch) -> float:
    """When held records go on (on the batch's clock)."""
    return batch.deadline - min(HOLD_MARGIN_SECONDS, batch.crew.policy.deadline / 4)


async def hold(batch: Batch, held: list[Item], count: int = 0) -> bool:
    """Until no effect these records need is held by a person (then with a fresh deadline), and every
    one has its breaker closed, or lets one of them through to probe it, or their batch's deadline is
    near: they then go on (and meet the breaker if it is still open: dead-lettered as
    ``provider_unavailable``). ``count``: more records to count as held meanwhile (the order's records
    waiting with them). False when the records were given up while a person's hold lasted (their
    partition revoked): they are not worked here."""
    limits = batch.crew.processor.limits
    effects = sorted({step.effect.name for item in held for step in PIPELINES[item.event.type].effects})
    batch.report.held += len(held)
    order = held[0].event.order_no
    holding = batch.crew.holds
    holding.orders[order] += 1
    batch.count_held(count)
    mine = held_by_person(batch).intersection(effects)
    holding.by_effect.update({effect: len(held) for effect in mine})
    try:
        if mine and limits.controls is not None:
            if not await limits.controls.until_released(mine, given_up=lambda: not batch.ours(held)):
                return False
            batch.deadline = max(batch.deadline, batch.crew.clock.now() + batch.crew.policy.deadline)
        go_on = until(batch)
        for effect in effects:
            if limits.breaker_open(effect):
                await limits.until_it_may_call(effect, go_on)
        return True
    finally:
        holding.by_effect.subtract({effect: len(held) for effect in mine})
        batch.count_held(-count)
        holding.orders[order] -= 1
        if not holding.orders[order]:
            del holding.orders[order]


def release(batch: Batch, n: int) -> None:
    """``n`` of the batch's held records go on."""
    batch.count_held(-n)


async def behind(batch: Batch, order: str, earlier: asyncio.Event, n: int) -> None:
    """Wait for the earlier batch to be done with the order; its ``n`` records here count as held
    while the order is held there (waiting for its provider's breaker)."""
    counted = False
    holding = batch.crew.holds.orders
    try:
        while not earlier.is_set():
            held_there = order in holding
            if held_there != counted:
                batch.count_held(n if held_there else -n)
                counted = held_there
            if not holding and not open_effects(batch):
                await earlier.wait()          # nothing held, no provider down: the common case
                break
            try:
                await asyncio.wait_for(earlier.wait(), BEHIND_LOOK_SECONDS)
            except TimeoutError:
                pass
    finally:
        if counted:
            batch.count_held(-n)
