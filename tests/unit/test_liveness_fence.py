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
