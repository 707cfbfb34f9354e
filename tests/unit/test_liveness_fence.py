"""A worker's own fence: a call starts only while no other worker may take it for dead before the
call ends, and never under a claim made before a gap in its heartbeats."""

from __future__ import annotations

from app.pipeline.liveness_fence import SelfFence, incarnation_of


def test_the_process_of_an_owner():
    assert incarnation_of("host-12/main/0a1b2c3d4e5f") == "host-12/0a1b2c3d4e5f"
    assert incarnation_of("host-12/compensator/0a1b2c3d4e5f#17") == "host-12/0a1b2c3d4e5f"
    assert incarnation_of("pod/with/slashes/bulk/run1") == "pod/with/slashes/run1"
    assert [incarnation_of(o) for o in (None, "", "w1", "w1/x", "/main/x", "w/main/")] == [None] * 6


def test_no_call_before_the_first_heartbeat_got_through():
    assert "not reached" in SelfFence(15).refusal(claimed_at=0, needs=5, now=0)


def test_a_call_starts_only_if_it_ends_before_anybody_may_take_the_worker_for_dead():
    fence = SelfFence(15)
    fence.beat(sent=100.0, acked=100.1)
    assert fence.refusal(claimed_at=101, needs=5, now=109.4) is None           # ends at 114.4 < 114.5
    assert "got through 9.6s ago" in fence.refusal(claimed_at=101, needs=5, now=109.6)
    fence.beat(sent=110.0, acked=110.2)                                        # in time: nothing lost
    assert fence.refusal(claimed_at=101, needs=5, now=111) is None


def test_a_gap_in_the_heartbeats_forbids_every_claim_made_before_it():
    fence = SelfFence(15)
    fence.beat(sent=100.0, acked=100.1)
    fence.beat(sent=114.0, acked=114.6)          # 14.6 s after the last one was sent: it may have been taken
    assert "long enough" in fence.refusal(claimed_at=105, needs=5, now=115)
    assert fence.refusal(claimed_at=114.6, needs=5, now=115) is None           # a claim made since is its own


def test_heartbeats_that_land_late_say_the_database_answers_slowly_not_that_it_is_gone():
    fence = SelfFence(dead_after=15)
    fence.beat(sent=100.0, acked=111.0)            # a beat 11 s on its way: a slow commit
    assert fence.refusal(111.0, needs=5.0, now=111.0) is not None   # 11 s old + a 5 s call: not safe
    assert fence.answering(111.0) and fence.answering(125.9)
    assert not fence.answering(126.0)              # nothing landed for 15 s: gone, not slow


def test_waiting_for_a_slow_database_spends_no_budget_and_an_outage_after_it_counts_from_its_own_start():
    import asyncio

    from app.pipeline.errors import DatabaseSlow, Fatal, StoreUnavailable
    from app.pipeline.outage import OutageGuard

    now = [0.0]

    async def sleep(seconds: float) -> None:
        now[0] += seconds

    guard = OutageGuard(20.0, clock=lambda: now[0], sleep=sleep)
    failures = iter([StoreUnavailable("down")] * 3 + [DatabaseSlow("slow")] * 40 + [StoreUnavailable("down")] * 2)

    async def work() -> str:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return "done"

    assert asyncio.run(guard(work)) == "done"       # 40 slow waits of up to 10 s: far past the budget, no Fatal
    assert now[0] > 200

    always_down = OutageGuard(20.0, clock=lambda: now[0], sleep=sleep)

    async def down() -> str:
        raise StoreUnavailable("down")

    try:
        asyncio.run(always_down(down))
    except Fatal:
        pass
    else:
        raise AssertionError("an outage past the budget must stop the worker")
