"""A provider's breaker: when most recent calls of an effect failed for the provider's sake, its
calls stop for a while, so that a dead provider costs the rest of the worker nothing.

    closed --(at least MIN_CALLS requests in WINDOW_SECONDS, FAILED_SHARE of them failed)--> open
    open   --(PROBE_SECONDS later: one real call, the probe)--> closed if the provider answered,
                                                                 open again if it did not

A call fails *for the provider's sake* when it timed out, the connection failed, or the provider
answered 5xx or "busy" (the error says so: ``provider_down``). It counts *requests* (step keys), each
by how its latest call ended: a few requests the provider keeps failing, retried again and again,
are a few requests, not a dead provider. A business refusal, a 429 or a
bad receipt is an answer: the provider is up. While the breaker is open, a call of the effect is
not made: it ends ``ProviderUnavailable`` (surely not delivered). Its record waits in its order
(``app.pipeline.batch``: held before its claim, or under its claim when the breaker opened after
it), without using up a retry, until the breaker closes or lets it through as the probe; near its
batch's deadline it is dead-lettered as retriable, due after the next probe. Held records do not
count against the records in flight (up to ``BREAKER_HOLD_RECORDS``), so the other orders go on.
Calls admitted before the breaker opened end as they end; their outcomes are not counted again.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from enum import Enum

WINDOW_SECONDS = 10.0       # the calls a decision looks at: those that ended in the last 10 s
MIN_CALLS = 20              # fewer calls than this never open it (a quiet effect's two timeouts)
FAILED_SHARE = 0.5          # the share of them that failed for the provider's sake
PROBE_SECONDS = 5.0         # how long it stays open before one call tries the provider again


class Admit(Enum):
    CALL = "call"           # closed: call
    PROBE = "probe"         # open, and this call is the probe
    REFUSED = "refused"     # open: no call until the next probe


class Change(Enum):
    OPENED = "opened"
    CLOSED = "closed"


@dataclass
class Refusal:
    since: float            # when it opened (the breaker's clock)
    wait: float             # seconds until a retry may find it closed (the next probe, and its call)
    why: str
    by_person: bool = False     # a person holds the effect (app.pipeline.controls): no probe, no deadline


class Breaker:
    """One effect's breaker in this worker. ``now`` is given by the caller (a monotonic clock)."""

    def __init__(self) -> None:
        # Each recent request's latest call: key -> (when, failed), oldest first.
        self._ended: OrderedDict[str, tuple[float, bool]] = OrderedDict()
        self._failed = 0
        self.opened_at: float | None = None
        self.next_probe = 0.0
        self.probing = False
        self.last_failure = ""

    @property
    def open(self) -> bool:
        return self.opened_at is not None

    def admit(self, now: float) -> tuple[Admit, Refusal | None]:
        if self.opened_at is None:
            return Admit.CALL, None
        if not self.probing and now >= self.next_probe:
            self.probing = True
            return Admit.PROBE, None
        return Admit.REFUSED, self._refusal(now)

    def _refusal(self, now: float) -> Refusal:
        assert self.opened_at is not None
        wait = max(self.next_probe - now, 0.0) + PROBE_SECONDS
        why = (f"its provider's breaker has been open for {now - self.opened_at:.0f}s (most calls failed: "
               f"{self.last_failure}); a probe tries it again every {PROBE_SECONDS:g}s")
        return Refusal(self.opened_at, wait, why)

    def refusal(self, now: float) -> Refusal | None:
        """What :meth:`admit` would refuse now, without taking the probe: None if a call would go."""
        if self.opened_at is None or (not self.probing and now >= self.next_probe):
            return None
        return self._refusal(now)

    def health(self, now: float) -> dict:
        """What a person may know of it now: open or closed (probing: the probe's call is out), for how
        long, the next probe, and the requests of the window that ended and failed."""
        recent = [failed for at, failed in self._ended.values() if at >= now - WINDOW_SECONDS]
        state = "closed" if self.opened_at is None else "probing" if self.probing else "open"
        return {"state": state,
                "open_seconds": None if self.opened_at is None else round(now - self.opened_at, 1),
                "next_probe_seconds": None if self.opened_at is None else round(max(self.next_probe - now, 0.0), 1),
                "recent_requests": len(recent), "recent_failed": sum(recent), "window_seconds": WINDOW_SECONDS,
                "last_failure": self.last_failure or None}

    def ended(self, now: float, failed: bool | None, *, probe: bool, key: str = "", error: str = "") -> Change | None:
        """A call of request ``key`` ended: ``failed`` True for the provider's sake, False if the provider
        answered, None if no call was made after all (its lease ran short, its turn came too late)."""
        if probe:
            self.probing = False
            if failed is None:
                return None                                   # the probe was not made: the next call probes
            if failed:
                self.next_probe = now + PROBE_SECONDS
                self.last_failure = error or self.last_failure
                return None
            self.opened_at, self._failed = None, 0
            self._ended.clear()
            return Change.CLOSED
        if failed is None or self.opened_at is not None:
            return None
        earlier = self._ended.pop(key, None)
        if earlier is not None:
            self._failed -= earlier[1]
        self._ended[key] = (now, failed)
        self._failed += failed
        while self._ended:
            oldest = next(iter(self._ended.values()))
            if oldest[0] >= now - WINDOW_SECONDS:
                break
            self._failed -= self._ended.popitem(last=False)[1][1]
        if failed:
            self.last_failure = error or self.last_failure
        if len(self._ended) >= MIN_CALLS and self._failed >= FAILED_SHARE * len(self._ended):
            self.opened_at, self.next_probe = now, now + PROBE_SECONDS
            self._ended.clear()
            self._failed = 0
            return Change.OPENED
        return None
