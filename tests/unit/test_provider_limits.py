"""Provider limits as pure rules: a rate's spacing and burst, a worker's share of a group's rate,
a provider's "not yet" held for every call of its effect, a concurrency bound; a 429's
Retry-After read as providers write it; and a record answered "not yet" waiting in phase 2
without using up its retries."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from app.adapters.effects import RETRY_AFTER_DEFAULT, RETRY_AFTER_MAX, rate_limited
from app.pipeline.errors import RateLimited
from app.pipeline.limits import BURST_SECONDS, EffectLimit, ProviderLimits


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def paced(limits: dict[str, EffectLimit]) -> tuple[ProviderLimits, Clock]:
    clock = Clock()
    return ProviderLimits(limits, clock=clock, sleep=clock.sleep), clock


async def starts(limits: ProviderLimits, clock: Clock, effect: str, n: int) -> list[float]:
    times = []
    for _ in range(n):
        async with limits.call(effect):
            times.append(clock.now)
    return times


def within_rate(times: list[float], rate: float) -> bool:
    """No stretch of calls comes faster than the rate, but for the burst: a call may start up to
    BURST_SECONDS before its turn."""
    return all(j - i <= rate * (times[j] - times[i]) + 1 + BURST_SECONDS * rate + 1e-9
               for i in range(len(times)) for j in range(i + 1, len(times)))


async def test_calls_are_spaced_at_the_rate_after_a_small_burst():
    limits, clock = paced({"waybill": EffectLimit(calls_per_second=100)})
    times = await starts(limits, clock, "waybill", 30)
    burst = int(BURST_SECONDS * 100)
    assert times[:burst + 1] == pytest.approx([100.0] * (burst + 1))               # 50 ms of the rate at once
    gaps = [b - a for a, b in zip(times[burst + 1:], times[burst + 2:])]
    assert gaps == pytest.approx([0.01] * len(gaps))                  # then one call per 1 / rate
    assert within_rate(times, 100)


async def test_an_effect_without_a_rate_is_not_held_and_others_keep_their_own():
    limits, clock = paced({"waybill": EffectLimit(calls_per_second=1)})
    assert await starts(limits, clock, "sms", 50) == [100.0] * 50
    times = await starts(limits, clock, "waybill", 4)
    assert [b - a for a, b in zip(times[1:], times[2:])] == pytest.approx([1.0, 1.0])
    assert within_rate(times, 1)


async def test_a_worker_takes_its_share_of_the_group_rate():
    limits, clock = paced({"waybill": EffectLimit(calls_per_second=30)})
    limits.set_members(3)
    assert limits.share("waybill") == 10
    times = await starts(limits, clock, "waybill", 6)
    assert [b - a for a, b in zip(times[1:], times[2:])] == pytest.approx([0.1] * 4)
    assert within_rate(times, 10)
    limits.set_members(0)                                              # never fewer than this worker
    assert limits.share("waybill") == 30


async def test_not_yet_holds_every_call_of_the_effect_until_then():
    limits, clock = paced({})
    limits.hold("waybill", 2.5)
    assert limits.wait_for("waybill") == 2.5 and limits.wait_for("sms") == 0
    assert await starts(limits, clock, "waybill", 2) == [102.5, 102.5]
    limits.hold("waybill", 1.0)
    limits.hold("waybill", 0.2)                                        # a shorter hold does not shorten it
    assert await starts(limits, clock, "waybill", 1) == [103.5]


async def test_a_concurrency_limit_bounds_the_calls_in_flight():
    limits = ProviderLimits({"waybill": EffectLimit(concurrency=3)})
    running = peak = 0

    async def one() -> None:
        nonlocal running, peak
        async with limits.call("waybill"):
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            running -= 1

    await asyncio.gather(*(one() for _ in range(20)))
    assert peak == 3


@pytest.mark.parametrize(("said", "wait"), [
    ("3", 3.0), ("0.5", 0.5), ("", RETRY_AFTER_DEFAULT), ("soon", RETRY_AFTER_DEFAULT), ("-4", 0.0),
    ("86400", RETRY_AFTER_MAX), ("nan", RETRY_AFTER_DEFAULT)])
def test_retry_after_is_read_as_seconds(said, wait):
    error = rate_limited("waybill of X", {"Retry-After": said} if said else {})
    assert isinstance(error, RateLimited) and error.not_delivered and error.retriable
    assert error.wait_seconds == wait
    assert "429" in str(error) and "waybill of X" in str(error)


def test_retry_after_is_read_as_an_http_date():
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=20), usegmt=True)
    assert 17 <= rate_limited("x", {"Retry-After": when}).wait_seconds <= 20


async def test_a_turn_past_the_callers_deadline_is_not_waited_for_nor_taken():
    limits, clock = paced({"waybill": EffectLimit(calls_per_second=1)})
    await starts(limits, clock, "waybill", 2)          # at 100 and 100.95: the next turn is at 101.95
    async with limits.call("waybill", not_after=101.5) as turn:
        assert turn.later == pytest.approx(1.0) and clock.now == pytest.approx(100.95)    # told, not slept
    async with limits.call("waybill", not_after=103) as turn:
        assert turn.later is None and clock.now == pytest.approx(101.95)  # the turn was still free


def test_the_health_of_every_effect_names_its_breaker_and_the_providers_not_yet():
    limits = ProviderLimits({"waybill": EffectLimit(calls_per_second=4)})
    limits.hold("sms", 30)
    health = {h["effect"]: h for h in limits.health(["waybill", "sms"])}
    assert list(health) == ["sms", "waybill"] and health["waybill"]["state"] == "closed"
    assert health["waybill"]["calls_per_second"] == 4 and health["sms"]["calls_per_second"] is None
    assert 29 <= health["sms"]["not_before_seconds"] <= 30 and health["waybill"]["not_before_seconds"] == 0
