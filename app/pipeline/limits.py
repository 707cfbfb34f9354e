"""Provider limits: how fast, and how many at once, each effect's provider is called.

Per effect, a deployment may set:

* a rate, ``EFFECTS__<EFFECT>__CALLS_PER_SECOND``, for the whole consumer group: each worker
  takes its share, the rate over the live members (``t_worker`` heartbeats, counted with every
  heartbeat: a member that joins or dies changes every worker's share within a heartbeat or two);
* a concurrency, ``EFFECTS__<EFFECT>__CONCURRENCY``: calls of the effect in flight in this worker,
  under ``EFFECT_CONCURRENCY`` for all effects;
* and whatever the provider says: a 429 with ``Retry-After`` holds every call of the effect in
  this worker until then (the provider counts the account's calls, not this call's).

A call takes its slot and its turn *before* its claim's lease is checked (the processor's
``call_needs``): a call that waited here never starts with its lease run short.

The rate is spaced, not bucketed: the worker's calls of an effect start at least ``1 / rate``
apart, with a burst of ``BURST_SECONDS`` of the rate when the effect was idle. A provider that
counts calls per second (a fixed window, or a bucket of a second) sees at most the rate in any
second, plus the burst.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

from app.pipeline.breaker import PROBE_SECONDS, Admit, Breaker, Change, Refusal
from app.pipeline.controls import Controls

BURST_SECONDS = 0.05        # calls allowed back to back after an idle spell: 50 ms of the rate
HELD_LOOK_SECONDS = 30.0    # a letter of a held effect is looked at again this long after (no redrive counted)


@dataclass(frozen=True)
class Turn:
    """A call's turn: the seconds it ``waited`` for it, and ``later`` (seconds) when it has none
    before its caller's deadline and must not be made now."""

    waited: float
    later: float | None = None


@dataclass(frozen=True)
class EffectLimit:
    """One effect's limits as set: ``calls_per_second`` for the group (0: none), ``concurrency``
    in this worker (0: only ``EFFECT_CONCURRENCY``)."""

    calls_per_second: float = 0.0
    concurrency: int = 0


class _Pace:
    """One effect's pacing in this worker: its turns, its slots, and the provider's "not before"."""

    def __init__(self, limit: EffectLimit, members: int) -> None:
        self.limit = limit
        self.slots = asyncio.Semaphore(limit.concurrency) if limit.concurrency > 0 else None
        self.next_turn = 0.0         # monotonic time of the next call's turn (the rate)
        self.not_before = 0.0        # the provider's Retry-After, for every call of the effect
        self.breaker = Breaker()
        self.changed = asyncio.Event()   # set (and replaced) when a probe ended or the breaker moved
        self.probe_let_until = 0.0       # the held work let through to probe: no other before this
        self.rate = 0.0
        self.share(members)

    def share(self, members: int) -> None:
        self.rate = self.limit.calls_per_second / max(members, 1)

    def turn(self, now: float, not_after: float | None = None) -> float:
        """The time this call may start; takes the turn, unless it would be past ``not_after``."""
        start = max(now, self.not_before)
        if self.rate > 0:
            start = max(start, self.next_turn - BURST_SECONDS)
        if not_after is not None and start > not_after:
            return start                            # not taken: the caller will not wait for it
        if self.rate > 0:
            self.next_turn = max(self.next_turn, start) + 1.0 / self.rate
        return start


class ProviderLimits:
    """Every effect's pace in this worker (:class:`EffectLimit` per effect name)."""

    def __init__(self, limits: Mapping[str, EffectLimit] | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._limits = dict(limits or {})
        self._paces: dict[str, _Pace] = {}
        self._members = 1
        self._clock, self._sleep = clock, sleep
        # What people hold (app.pipeline.controls): a held effect is refused as an open breaker is,
        # without a probe. None: nobody holds anything (the tests of the limits alone).
        self.controls: Controls | None = None

    @property
    def members(self) -> int:
        return self._members

    def set_members(self, members: int) -> None:
        """The consumer group's live members (at least this one): each worker's share of a rate."""
        self._members = max(int(members), 1)
        for pace in self._paces.values():
            pace.share(self._members)

    def share(self, effect: str) -> float:
        """This worker's calls per second of ``effect`` (0: no rate set)."""
        return self._pace(effect).rate

    def hold(self, effect: str, seconds: float) -> None:
        """The provider said "not yet" (429, ``Retry-After``): no call of ``effect`` for ``seconds``."""
        pace = self._pace(effect)
        pace.not_before = max(pace.not_before, self._clock() + max(seconds, 0.0))

    def held(self, effect: str) -> Refusal | None:
        """The refusal of a call of ``effect`` a person holds (None: not held)."""
        controls = self.controls
        if controls is None or not controls.is_held(effect):
            return None
        hold = controls.hold_of(effect)
        why = f"{effect} is held by {hold.held_by}: {hold.reason}" if hold else f"{effect} is held by a person"
        return Refusal(self._clock(), HELD_LOOK_SECONDS, why, by_person=True)

    def admit(self, effect: str) -> tuple[Admit, Refusal | None]:
        """Whether a call of ``effect`` may go to its provider (``app.pipeline.breaker``), or a person
        holds it."""
        if (held := self.held(effect)) is not None:
            return Admit.CALL, held
        breaker = self._pace(effect).breaker
        return (Admit.CALL, None) if breaker.opened_at is None else breaker.admit(self._clock())

    def unpaced(self, effect: str) -> bool:
        """True when a call of ``effect`` has nothing to wait for: no rate, no concurrency limit, no
        "not yet" of its provider in force (then :meth:`call` would return at once)."""
        pace = self._pace(effect)
        return pace.rate <= 0 and pace.slots is None and (pace.not_before == 0.0 or pace.not_before <= self._clock())

    def ended(self, effect: str, failed: bool | None, *, probe: bool, key: str = "",
              error: str = "") -> Change | None:
        """A call of ``effect`` (request ``key``) that its breaker admitted ended (``Breaker.ended``)."""
        pace = self._pace(effect)
        change = pace.breaker.ended(self._clock(), failed, probe=probe, key=key, error=error)
        if probe or change is not None:
            pace.changed.set()
            pace.changed = asyncio.Event()
        return change

    def breaker_open(self, effect: str) -> bool:
        paces = self._paces.get(effect)
        return paces is not None and paces.breaker.opened_at is not None

    async def until_it_may_call(self, effect: str, until: float) -> bool:
        """Work held while ``effect``'s breaker is open waits here: True once the breaker is closed, or
        for the one caller let through to make the probe (one per ``PROBE_SECONDS``: the others wait
        for what it finds); False at ``until`` (this clock), the breaker still open."""
        pace = self._pace(effect)
        breaker = pace.breaker
        while True:
            now = self._clock()
            if breaker.opened_at is None:
                return True
            if not breaker.probing and now >= breaker.next_probe and now >= pace.probe_let_until:
                pace.probe_let_until = now + PROBE_SECONDS
                return True
            if now >= until:
                return False
            wake = min(until, max(breaker.next_probe, pace.probe_let_until, now + 0.05))
            changed = asyncio.ensure_future(pace.changed.wait())
            timer = asyncio.ensure_future(self._sleep(wake - now))
            try:
                await asyncio.wait((changed, timer), return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()
                timer.cancel()

    def refusal(self, effect: str) -> Refusal | None:
        """Whether a call of ``effect`` would be refused now by a person's hold or its breaker (the probe
        is not taken)."""
        return self.held(effect) or self._pace(effect).breaker.refusal(self._clock())

    def open_breakers(self) -> list[str]:
        return sorted(name for name, pace in self._paces.items() if pace.breaker.open)

    def health(self, effects: Iterable[str]) -> list[dict]:
        """Each of ``effects`` as this worker knows its provider: its breaker (``Breaker.health``), the
        seconds its provider's "not yet" still holds its calls, and this worker's share of its rate."""
        now = self._clock()
        return [{"effect": name, **self._pace(name).breaker.health(now), "not_before_seconds": round(
                     max(self._pace(name).not_before - now, 0.0), 1), "calls_per_second": self.share(name) or None}
                for name in sorted(effects)]

    def wait_for(self, effect: str) -> float:
        """How long a call of ``effect`` made now would wait for the provider's "not before"."""
        return max(self._pace(effect).not_before - self._clock(), 0.0)

    @asynccontextmanager
    async def call(self, effect: str, not_after: float | None = None) -> AsyncIterator[Turn]:
        """A slot and a turn for one call of ``effect``. The :class:`Turn` says how long they took, and
        whether the call may go: not when its turn would come after ``not_after`` (the caller's
        deadline), which it then does not wait for."""
        pace = self._pace(effect)
        started = self._clock()
        if pace.slots is None:
            later = await self._turn(pace, not_after)
            yield Turn(self._clock() - started, later)
            return
        async with pace.slots:
            later = await self._turn(pace, not_after)
            yield Turn(self._clock() - started, later)

    async def _turn(self, pace: _Pace, not_after: float | None) -> float | None:
        """None once the call may start; else the seconds until its turn, past ``not_after``."""
        while True:
            now = self._clock()
            start = pace.turn(now, not_after)
            if start <= now:
                return None
            if not_after is not None and start > not_after:
                return start - now
            await self._sleep(start - now)
            if self._clock() >= pace.not_before:    # a 429 while this call slept: wait for it too
                return None

    def _pace(self, effect: str) -> _Pace:
        pace = self._paces.get(effect)
        if pace is None:
            pace = self._paces[effect] = _Pace(self._limits.get(effect, EffectLimit()), self._members)
        return pace

