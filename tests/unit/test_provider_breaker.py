"""A provider's breaker as a pure rule (``app.pipeline.breaker``): when it opens, what it refuses,
how its probe closes it, and what it never counts."""

from __future__ import annotations

import itertools

from app.pipeline.breaker import FAILED_SHARE, MIN_CALLS, PROBE_SECONDS, WINDOW_SECONDS, Admit, Breaker, Change

_keys = itertools.count()


def fail(breaker: Breaker, n: int, now: float, failed: bool = True) -> list[Change | None]:
    """``n`` requests of their own ended."""
    return [breaker.ended(now, failed, probe=False, key=f"k{next(_keys)}", error="no answer within 3s")
            for _ in range(n)]


def test_it_opens_when_most_recent_calls_failed_for_the_providers_sake():
    b = Breaker()
    assert fail(b, MIN_CALLS - 1, 10.0) == [None] * (MIN_CALLS - 1)     # too few calls to judge
    assert b.admit(10.0) == (Admit.CALL, None)
    assert fail(b, 1, 10.0) == [Change.OPENED]
    admit, refusal = b.admit(11.0)
    assert admit is Admit.REFUSED and refusal is not None
    assert refusal.wait == PROBE_SECONDS - 1 + PROBE_SECONDS and "no answer within 3s" in refusal.why


def test_answers_keep_it_closed_and_old_failures_are_forgotten():
    b = Breaker()
    answered = int(MIN_CALLS * (1 - FAILED_SHARE)) + 1
    fail(b, answered, 0.0, failed=False)
    assert set(fail(b, MIN_CALLS - answered, 0.0)) == {None}             # under the share: closed
    fail(b, MIN_CALLS, WINDOW_SECONDS + 1)                               # the earlier ones left the window
    assert b.open


def test_calls_not_made_are_not_counted():
    b = Breaker()
    assert set(b.ended(0.0, None, probe=False, key=f"n{i}") for i in range(MIN_CALLS * 2)) == {None}
    assert not b.open


def test_one_probe_at_a_time_closes_it_when_the_provider_answers():
    b = Breaker()
    fail(b, MIN_CALLS, 0.0)
    assert b.admit(PROBE_SECONDS - 0.1)[0] is Admit.REFUSED
    assert b.admit(PROBE_SECONDS)[0] is Admit.PROBE
    assert b.admit(PROBE_SECONDS)[0] is Admit.REFUSED                    # the probe is in flight
    assert b.ended(PROBE_SECONDS + 3, True, probe=True) is None          # it failed: open, next probe later
    assert b.admit(PROBE_SECONDS + 4)[0] is Admit.REFUSED
    assert b.admit(2 * PROBE_SECONDS + 3)[0] is Admit.PROBE
    assert b.ended(2 * PROBE_SECONDS + 3.1, False, probe=True) is Change.CLOSED
    assert b.admit(2 * PROBE_SECONDS + 4) == (Admit.CALL, None)
    assert not fail(b, MIN_CALLS - 1, 20.0)[-1]                         # a fresh window after it closed


def test_a_probe_not_made_leaves_the_next_call_to_probe():
    b = Breaker()
    fail(b, MIN_CALLS, 0.0)
    assert b.admit(PROBE_SECONDS)[0] is Admit.PROBE
    assert b.ended(PROBE_SECONDS, None, probe=True) is None              # its lease ran short: not called
    assert b.admit(PROBE_SECONDS)[0] is Admit.PROBE


def test_outcomes_of_calls_admitted_before_it_opened_do_not_count_again():
    b = Breaker()
    fail(b, MIN_CALLS, 0.0)
    assert set(fail(b, 50, 1.0, failed=False)) == {None} and b.open      # only a probe closes it


def test_asking_whether_it_would_refuse_never_takes_the_probe():
    b = Breaker()
    assert b.refusal(0.0) is None
    fail(b, MIN_CALLS, 0.0)
    assert b.refusal(1.0) is not None and b.refusal(1.0).wait == PROBE_SECONDS - 1 + PROBE_SECONDS
    assert b.refusal(PROBE_SECONDS) is None                               # a call now would be the probe
    assert b.admit(PROBE_SECONDS)[0] is Admit.PROBE                        # and still is
    assert b.refusal(PROBE_SECONDS) is not None                           # while it is in flight


def test_a_few_requests_failing_again_and_again_are_not_a_dead_provider():
    """Five requests the provider keeps answering 503, each retried many times: five requests."""
    b = Breaker()
    for attempt in range(MIN_CALLS):
        for key in ("a", "b", "c", "d", "e"):
            assert b.ended(float(attempt) / 10, True, probe=False, key=key) is None
    assert not b.open
    assert fail(b, MIN_CALLS - 5, 3.0)[-1] is Change.OPENED           # with 15 more, 20 requests failed


def test_its_health_says_what_a_person_needs_open_or_closed_for_how_long_and_the_recent_failures():
    b = Breaker()
    fail(b, 3, 0.0, failed=False)
    fail(b, 2, 1.0)
    health = b.health(2.0)
    assert (health["state"], health["recent_requests"], health["recent_failed"]) == ("closed", 5, 2)
    assert health["open_seconds"] is None and health["last_failure"] == "no answer within 3s"
    assert b.health(WINDOW_SECONDS + 5)["recent_requests"] == 0                 # out of the window
    fail(b, MIN_CALLS, 20.0)
    opened = b.health(23.0)
    assert (opened["state"], opened["open_seconds"], opened["next_probe_seconds"]) == ("open", 3.0, PROBE_SECONDS - 3)
    assert b.admit(20.0 + PROBE_SECONDS)[0] is Admit.PROBE
    assert b.health(20.0 + PROBE_SECONDS)["state"] == "probing"
