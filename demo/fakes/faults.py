"""What a fake provider does wrong on purpose: one :class:`Faults` per fake, set through
``POST /__config`` (or ``python -m demo.fakes --config``), by the fake's name::

    {"waybill": {"latency_ms": 5, "fail_next": 2, "fail_status": 503,
                 "timeout_next": 1, "reset_next": 1, "reject_orders": ["ORD-..."],
                 "fail_orders": ["ORD-..."], "ignore_idempotency_key": false,
                 "fail_rate": 0.02, "timeout_rate": 0.01, "reset_rate": 0.02, "seed": 7},
     "sms": {...}}

``reject_orders`` answer 422 (a business refusal) for those orders, every time; ``fail_orders``
answer ``fail_status`` for them, every time; ``hang_orders`` hang ``timeout_ms`` for those orders,
every time, and then do the work (a slow call for one order while the others go on);
``held_orders`` hold calls for those orders until the order leaves the set (a later
``POST /__config`` without it), then do the work (a gate a test opens when it is ready, not after a
time); ``echo_orders`` answer 422 repeating the request back (its JSON, and the
``Idempotency-Key``), as UTF-8 without escapes and as a form-encoded trace, the way a service that
quotes what it refused does (personal data and tokens in a message: what a viewer must not see).
``conflict_next`` answers 409 ("this idempotency key is still in progress") without doing the
work; ``redirect_next`` does the work, then answers ``303 See Other`` pointing at ``/__gone``,
which answers 404; ``waybill_no_override`` (any JSON value) replaces the waybill number in the
answer, to play a service that breaks its own contract; ``cancel_answer_override`` does the same to
a cancel's answer (the cancel is done, the answer names another waybill); ``lookup_fail_next``
answers a lookup 503 while it counts down.

``forget_keys_after_seconds`` (0: never) plays a provider that keeps an idempotency key for a while
only: a key (a reference) first taken longer ago than that is new to it again, so a call with it
makes a second effect (the express courier no longer refuses it as a duplicate). Its records stay:
the listing and the lookups still find the first one.

``fail_next``/``timeout_next``/``reset_next`` count down per call. A *timeout* sleeps ``timeout_ms``
before answering (and then does the work, for a caller that may have given up); a *reset* does the
work (issues the waybill, sends the SMS) and then drops the connection without a response: the
caller cannot know it succeeded.

``fail_rate``/``timeout_rate``/``reset_rate`` (0 to 1) are the same faults at random, each call
drawing once per rate that is set, from a generator seeded with ``seed`` (set ``seed`` again to
start its sequence over). The draws are reproducible; which call meets which draw is not, since
calls race each other. A countdown still in progress wins over its rate.

A provider's pace: ``latency_median_ms`` and ``latency_sigma`` draw each call's latency from a
lognormal distribution (median 100, sigma 0.8: mean about 138 ms, p99 about 640 ms), added to
``latency_ms``; ``timeout_rate`` with ``timeout_ms`` makes a share of calls hang;
``calls_per_second`` answers ``429`` with ``Retry-After`` (whole seconds) to calls above that rate
(a bucket holding one second's calls); ``outage_seconds`` starts an outage now, for that long, in
which every call hangs ``timeout_ms`` and then answers 503 without doing anything.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field

PACE = ("latency_median_ms", "latency_sigma", "calls_per_second", "outage_seconds", "forget_keys_after_seconds")


@dataclass
class Faults:
    latency_ms: float = 0.0
    fail_next: int = 0
    fail_status: int = 503
    timeout_next: int = 0
    timeout_ms: float = 60_000.0
    reset_next: int = 0
    reject_orders: set[str] = field(default_factory=set)
    fail_orders: set[str] = field(default_factory=set)
    echo_orders: set[str] = field(default_factory=set)
    hang_orders: set[str] = field(default_factory=set)
    held_orders: set[str] = field(default_factory=set)
    ignore_idempotency_key: bool = False
    conflict_next: int = 0
    redirect_next: int = 0
    waybill_no_override: object = None
    cancel_answer_override: object = None
    lookup_fail_next: int = 0
    forget_keys_after_seconds: float = 0.0
    fail_rate: float = 0.0
    timeout_rate: float = 0.0
    reset_rate: float = 0.0
    seed: int | None = None
    # A provider's pace (see the module's docstring).
    latency_median_ms: float = 0.0
    latency_sigma: float = 0.0
    calls_per_second: float = 0.0
    outage_seconds: float = 0.0
    _rng: random.Random = field(default_factory=random.Random, repr=False)
    _outage_until: float = field(default=0.0, repr=False)
    _tokens: float = field(default=0.0, repr=False)
    _tokens_at: float = field(default=0.0, repr=False)

    def update(self, changes: dict) -> None:
        for name, value in changes.items():
            if name.startswith("_") or not hasattr(self, name):
                raise ValueError(f"unknown fault setting {name!r}")
            if name.endswith("_rate") and not 0 <= float(value) <= 1:
                raise ValueError(f"{name} must be between 0 and 1, got {value!r}")
            if name in PACE and float(value) < 0:
                raise ValueError(f"{name} must not be negative, got {value!r}")
            setattr(self, name, set(value) if name.endswith("_orders") else value)
            if name == "seed":
                self._rng.seed(value)
            elif name == "outage_seconds":
                self._outage_until = time.monotonic() + float(value)
            elif name == "calls_per_second":
                self._tokens, self._tokens_at = float(value), time.monotonic()

    def forgotten(self, taken_at: float | None) -> bool:
        """Whether a key taken at ``taken_at`` (None: never) is new to the provider again."""
        forget = self.forget_keys_after_seconds
        return taken_at is not None and forget > 0 and time.time() - taken_at > forget

    def latency(self) -> float:
        """This call's latency in seconds: ``latency_ms``, plus a lognormal draw when a median is set."""
        ms = self.latency_ms
        if self.latency_median_ms:
            ms += self._rng.lognormvariate(math.log(self.latency_median_ms), self.latency_sigma)
        return ms / 1000

    def in_outage(self) -> bool:
        return time.monotonic() < self._outage_until

    def retry_after(self) -> int | None:
        """None when the call is within ``calls_per_second`` (a bucket of one second's calls,
        refilled at that rate); else the whole seconds after which one is, for ``Retry-After``."""
        rate = self.calls_per_second
        if not rate:
            return None
        now = time.monotonic()
        self._tokens = min(float(rate), self._tokens + (now - self._tokens_at) * rate)
        self._tokens_at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return None
        return max(1, math.ceil((1 - self._tokens) / rate))

    def take(self, countdown: str, rate: str) -> bool:
        """Whether this call meets the fault: its countdown first, else a draw at its rate."""
        if getattr(self, countdown) > 0:
            setattr(self, countdown, getattr(self, countdown) - 1)
            return True
        chance = getattr(self, rate)
        return chance > 0 and self._rng.random() < chance
