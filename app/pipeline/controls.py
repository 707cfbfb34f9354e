"""What people hold and pause, as this worker last read it: the operator controls.

A person **holds an effect** across the whole group (the SMS gateway's maintenance from 02:00 to
03:00, a courier's account being migrated): from a time (or now) until a time (the hold then ends by
itself) or until a person releases it (its planned end is then when they expect to, and a hold past
it alerts). While an effect is held, every worker treats it as it treats a provider whose breaker is
open, without the probe and without the deadline: a record that needs the effect waits before its
claim (no try spent), the order's earlier records and every other order go on, the compensator's
drain and bulk jobs leave the effect's letters for later, and nothing is dead-lettered for it. When
the hold ends, the held records go on in their order, at the provider's pace.

A person **pauses a partition** of the input (a poisoned stretch upstream, an order that must not
move while support looks at it): no worker hands out a record of it until a person resumes it; the
records already being worked finish.

Both are rows in the database (``t_effect_hold``, ``t_partition_pause``), so they reach every worker,
survive restarts and reach workers that start later: each worker reads them every
``CONTROLS_REFRESH_SECONDS`` into one :class:`Controls` (the database's clock decides whether a hold
has begun or ended, so workers agree). Nothing here reads or writes anything: the adapters do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class Hold:
    """One hold of an effect, and how it stands by the database's clock as it was read."""

    id: int
    effect: str
    starts_at: datetime
    ends_at: datetime           # its planned end: it ends then by itself if ``auto_release``
    auto_release: bool
    reason: str
    held_by: str
    active: bool                # begun, not ended, not released
    overdue_seconds: float = 0.0    # an active hold past its planned end (a person must end it): by how much

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True, slots=True)
class Pause:
    """One partition of the input paused by a person."""

    id: int
    topic: str
    partition: int
    reason: str
    paused_by: str
    paused_at: datetime

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


class Controls:
    """The holds and pauses in force, as this worker last read them (:meth:`update`); what the batch
    handler, the compensator, the bulk jobs and the consumer ask."""

    def __init__(self) -> None:
        self.holds: tuple[Hold, ...] = ()          # not released: active ones and those to come
        self.pauses: tuple[Pause, ...] = ()
        self.read = False                          # read at least once
        self._held: frozenset[str] = frozenset()
        self._paused: frozenset[tuple[str, int]] = frozenset()
        self._changed = asyncio.Event()
        self.on_change: list[Callable[[Controls], None]] = []     # told after every change (the consumer's pauses)

    def update(self, holds: Iterable[Hold], pauses: Iterable[Pause]) -> bool:
        """What was read now; whether what is held or paused changed."""
        self.holds, self.pauses, self.read = tuple(holds), tuple(pauses), True
        held = frozenset(hold.effect for hold in self.holds if hold.active)
        paused = frozenset((pause.topic, pause.partition) for pause in self.pauses)
        if held == self._held and paused == self._paused:
            return False
        self._held, self._paused = held, paused
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        for tell in self.on_change:
            tell(self)
        return True

    def held(self) -> frozenset[str]:
        """The effects held now."""
        return self._held

    def is_held(self, effect: str) -> bool:
        return effect in self._held

    def is_paused(self, topic: str, partition: int) -> bool:
        return (topic, partition) in self._paused

    def paused(self) -> frozenset[tuple[str, int]]:
        return self._paused

    def hold_of(self, effect: str) -> Hold | None:
        """The active hold of ``effect`` that ends last (several may overlap)."""
        active = [hold for hold in self.holds if hold.active and hold.effect == effect]
        return max(active, key=lambda hold: hold.ends_at) if active else None

    async def changed(self, timeout: float | None = None) -> bool:
        """Wait until what is held or paused changes (True), or ``timeout`` seconds (False)."""
        event = self._changed
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def until_released(self, effects: Iterable[str], *, given_up: Callable[[], bool] = lambda: False,
                             look_every: float = 0.5) -> bool:
        """Wait while any of ``effects`` is held: True once none is, False when ``given_up()`` says the
        waiting work is no longer this worker's (its partition revoked, the worker stopping)."""
        wanted = frozenset(effects)
        while wanted & self._held:
            if given_up():
                return False
            await self.changed(look_every)
        return not given_up()


MAX_HOLD_SECONDS = 7 * 24 * 3600.0      # a hold longer than a week is a decision, not maintenance


def hold_window(now: datetime, *, start: datetime | None, end: datetime | None,
                hours: float | None) -> tuple[float, float]:
    """When a hold asked for begins and how long it lasts, as ``(seconds from now, seconds)``: from
    ``start`` (None: now) to ``end``, or for ``hours``. ValueError says what is wrong."""
    begins = max((start - now).total_seconds(), 0.0) if start is not None else 0.0
    if (end is None) == (hours is None):
        raise ValueError("say when the hold ends (its planned end, a time) or how long it lasts (hours), one of them")
    lasts = (end - now).total_seconds() - begins if end is not None else float(hours or 0) * 3600
    if lasts <= 0:
        raise ValueError("the hold must end after it begins (and after now)")
    if lasts > MAX_HOLD_SECONDS:
        raise ValueError(f"a hold lasts at most {MAX_HOLD_SECONDS / 86400:g} days: end it and hold again if "
                         "the provider stays away that long")
    return begins, lasts
