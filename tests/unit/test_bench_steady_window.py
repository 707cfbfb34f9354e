"""The benchmark's steady window: from the first commit to the last one made while records flowed."""

from bench.worker import steady_window

EVENTS = 200_000


def rate(window) -> float:
    first, end = window
    return (end[1] - first[1]) / (end[0] - first[0])


def test_the_commit_timer_after_the_work_ran_dry_is_left_out():
    # Commits by count every ~10,400 records at 25,000 events/s; the last one by count at 94.3 %,
    # then nothing until the commit timer ticks 2.6 s later with the topic done.
    commits = [(1.42 + i * 0.416, 10_478 + i * 10_400) for i in range(18)] + [(11.19, 199_983), (14.02, 200_000)]
    assert commits[17][1] < 0.95 * EVENTS
    window = steady_window(commits, EVENTS)
    assert window == (commits[0], commits[17])
    assert 24_500 < rate(window) < 25_500


def test_a_commit_by_count_past_the_share_does_not_end_the_window():
    commits = [(1.0, 10_000), (2.0, 100_000), (3.0, 185_000), (3.2, 195_000), (6.0, 200_000)]
    assert steady_window(commits, EVENTS) == ((1.0, 10_000), (3.0, 185_000))


def test_a_run_with_no_commit_between_the_first_and_the_share_ends_at_the_first_past_it():
    commits = [(1.0, 180_000), (2.0, 195_000), (5.0, 200_000)]
    assert steady_window(commits, EVENTS) == ((1.0, 180_000), (2.0, 195_000))
    assert steady_window([(1.0, 200_000)], EVENTS) is None
    assert steady_window([(1.0, 10_000), (1.0, 200_000)], EVENTS) is None
