"""The watchdog's decision (app.pipeline.liveness): when a worker is unhealthy, when it rejoins, when it exits."""

from __future__ import annotations

from app.pipeline.liveness import Action, Bounds, Observation, Watch

BOUNDS = Bounds(stall_seconds=30, rejoin_grace_seconds=30, join_seconds=300)


def seen(*, member=True, heartbeat_ok_at=0.0, position=100, lag=0, busy=False, joining=None) -> Observation:
    return Observation(member=member, heartbeat_ok_at=heartbeat_ok_at, position=position, lag=lag,
                       batch_in_flight=busy, joining_for=joining)


def run(watch: Watch, observations: list[tuple[float, Observation]]):
    return [watch.observe(obs, now) for now, obs in observations]


def test_a_member_that_heartbeats_and_fetches_is_healthy():
    watch = Watch(BOUNDS, now=0)
    verdicts = run(watch, [(t, seen(heartbeat_ok_at=t, position=100 + t, lag=5)) for t in range(0, 120, 3)])
    assert all(v.healthy and v.action is Action.NONE for v in verdicts)


def test_no_heartbeat_for_the_stall_forces_one_rejoin_then_exits_after_the_grace():
    watch = Watch(BOUNDS, now=0)
    verdicts = {t: watch.observe(seen(heartbeat_ok_at=0.0), t) for t in range(0, 70)}
    assert all(verdicts[t].healthy for t in range(0, 30))
    assert not verdicts[30].healthy and verdicts[30].action is Action.REJOIN
    assert verdicts[30].check == "heartbeat" and "no successful heartbeat for 30 s" in verdicts[30].reason
    assert [t for t, v in verdicts.items() if v.action is Action.REJOIN] == [30]
    assert all(verdicts[t].action is Action.NONE and not verdicts[t].healthy for t in range(31, 60))
    assert verdicts[60].action is Action.EXIT


def test_a_rejoin_that_works_makes_the_worker_healthy_and_rearms_the_watchdog():
    watch = Watch(BOUNDS, now=0)
    assert watch.observe(seen(heartbeat_ok_at=0.0), 0).healthy
    assert watch.observe(seen(heartbeat_ok_at=0.0), 30).action is Action.REJOIN
    assert watch.observe(seen(member=False, heartbeat_ok_at=0.0), 35).action is Action.NONE   # rejoining
    assert watch.observe(seen(heartbeat_ok_at=40.0), 40).healthy                              # joined
    # A second failure later is met with a rejoin again, not an exit.
    assert watch.observe(seen(heartbeat_ok_at=40.0), 70).action is Action.REJOIN


def test_no_assignment_for_the_stall_is_unhealthy():
    watch = Watch(BOUNDS, now=0)
    assert watch.observe(seen(member=False), 29).healthy
    verdict = watch.observe(seen(member=False), 30)
    assert verdict.check == "membership" and verdict.action is Action.REJOIN


def test_the_heartbeat_clock_starts_at_the_join_not_at_an_old_heartbeat():
    watch = Watch(BOUNDS, now=0)
    watch.observe(seen(member=False), 10)
    # Joined at 20: the last heartbeat noted (at 0) is older than the stall, but the join counts.
    assert watch.observe(seen(heartbeat_ok_at=0.0), 20).healthy
    assert watch.observe(seen(heartbeat_ok_at=0.0), 49).healthy
    assert watch.observe(seen(heartbeat_ok_at=0.0), 50).check == "heartbeat"


def test_lag_without_fetch_progress_is_unhealthy_but_not_while_a_batch_is_in_flight():
    watch = Watch(BOUNDS, now=0)
    verdicts = {t: watch.observe(seen(heartbeat_ok_at=t, position=100, lag=7, busy=t < 40), t) for t in range(0, 80)}
    assert all(verdicts[t].healthy for t in range(0, 69))          # busy until 39, then 30 s of stall allowed
    assert verdicts[69].check == "fetch" and "lag of 7" in verdicts[69].reason


def test_no_lag_means_nothing_to_fetch_not_a_stall():
    watch = Watch(BOUNDS, now=0)
    assert all(watch.observe(seen(heartbeat_ok_at=t, position=100, lag=0), t).healthy for t in range(0, 200, 5))


def test_a_moving_position_is_progress_even_backwards_after_a_seek():
    watch = Watch(BOUNDS, now=0)
    for t, position in [(0, 100), (25, 90), (50, 91), (75, 92)]:
        assert watch.observe(seen(heartbeat_ok_at=t, position=position, lag=10), t).healthy


def test_a_join_the_group_holds_is_no_failure_until_the_rebalance_timeout():
    watch = Watch(BOUNDS, now=0)
    assert watch.observe(seen(heartbeat_ok_at=0.0), 0).healthy
    # Another member finishes a long batch: our join waits, heartbeats stopped, old assignment kept.
    assert all(watch.observe(seen(heartbeat_ok_at=0.0, joining=t - 10), t).healthy for t in range(10, 300))
    assert watch.observe(seen(heartbeat_ok_at=300.0), 300).healthy                 # joined at last
    verdict = watch.observe(seen(member=False, joining=300), 610)
    assert verdict.check == "membership" and "a join has waited 300 s" in verdict.reason


def test_joins_that_fail_at_once_do_not_reset_the_membership_clock():
    # faust-streaming#594: "(Re-)joining group" then "Marking the coordinator dead", over and over.
    watch = Watch(BOUNDS, now=0)
    verdicts = [watch.observe(seen(member=False, joining=0.01 if t % 2 else None), t) for t in range(0, 31)]
    assert verdicts[-1].check == "membership" and verdicts[-1].action is Action.REJOIN


def test_joins_that_fail_at_once_do_not_reset_the_heartbeat_clock_of_a_member():
    watch = Watch(BOUNDS, now=0)
    verdicts = [watch.observe(seen(heartbeat_ok_at=0.0, joining=0.01 if t % 3 == 0 else None), t)
                for t in range(0, 32)]
    assert any(v.check == "heartbeat" and v.action is Action.REJOIN for v in verdicts)


def test_no_exit_while_no_broker_answers_and_the_grace_counts_from_when_one_does():
    watch = Watch(BOUNDS, now=0)
    assert watch.observe(seen(heartbeat_ok_at=0.0), 0).healthy
    assert watch.observe(seen(heartbeat_ok_at=0.0), 30).action is Action.REJOIN
    gone = [watch.observe(Observation(True, 0.0, 100, 0, False, bootstrap_answers=False), t) for t in range(31, 200)]
    assert all(not v.healthy and v.action is Action.NONE and "no broker" in v.reason for v in gone)
    back = {t: watch.observe(seen(heartbeat_ok_at=0.0), t) for t in range(200, 240)}
    assert [t for t, v in back.items() if v.action is Action.EXIT] == list(range(229, 240))
