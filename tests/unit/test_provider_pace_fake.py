"""The fakes' provider pace (``demo.fakes.faults.Faults``): the benchmark's provider with a
lognormal tail, a rate limit answering 429 and an outage must be the provider it says it is."""

from __future__ import annotations

import statistics

import pytest

from demo.fakes.faults import Faults


def test_latency_is_lognormal_around_its_median():
    faults = Faults()
    faults.update({"latency_median_ms": 100, "latency_sigma": 0.8, "seed": 1})
    draws = sorted(faults.latency() * 1000 for _ in range(20_000))
    assert 95 < statistics.median(draws) < 105
    assert 130 < statistics.fmean(draws) < 145                  # e^(sigma^2 / 2) x the median: 137.7
    assert 560 < draws[int(len(draws) * 0.99)] < 720            # e^(2.326 sigma) x the median: 643


def test_without_a_median_the_latency_is_the_fixed_one():
    faults = Faults()
    faults.update({"latency_ms": 5})
    assert faults.latency() == 0.005


def test_calls_above_the_rate_are_told_when_to_come_back(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr("demo.fakes.faults.time.monotonic", lambda: now[0])
    faults = Faults()
    faults.update({"calls_per_second": 10})
    assert [faults.retry_after() for _ in range(10)] == [None] * 10      # one second's calls at once
    assert faults.retry_after() == 1
    now[0] += 0.1                                                        # one call's worth refilled
    assert faults.retry_after() is None and faults.retry_after() == 1
    now[0] += 5
    assert sum(faults.retry_after() is None for _ in range(20)) == 10    # the bucket holds one second


def test_an_outage_lasts_as_long_as_it_was_set_for(monkeypatch):
    now = [50.0]
    monkeypatch.setattr("demo.fakes.faults.time.monotonic", lambda: now[0])
    faults = Faults()
    assert not faults.in_outage()
    faults.update({"outage_seconds": 60})
    now[0] += 59.9
    assert faults.in_outage()
    now[0] += 0.2
    assert not faults.in_outage()


@pytest.mark.parametrize("name", ["latency_median_ms", "calls_per_second", "outage_seconds"])
def test_a_negative_pace_is_refused(name):
    with pytest.raises(ValueError, match=name):
        Faults().update({name: -1})


def test_a_provider_that_forgets_keys_forgets_them_after_its_time(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr("demo.fakes.faults.time.time", lambda: now[0])
    faults = Faults()
    assert not faults.forgotten(900.0)                       # 0: it never forgets
    faults.update({"forget_keys_after_seconds": 60})
    assert not faults.forgotten(None) and not faults.forgotten(940.0)
    assert faults.forgotten(939.0)
    with pytest.raises(ValueError, match="must not be negative"):
        faults.update({"forget_keys_after_seconds": -1})
