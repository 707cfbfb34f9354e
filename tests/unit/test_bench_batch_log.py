"""The online-migration bench reads every batch from a worker's log, and a window's batch times."""

from __future__ import annotations

from datetime import datetime

from bench.batch_log import Batch, batches, in_window, stats

LOG = """\
[2026-12-07 19:02:04,757] [16635] [INFO] consuming test-order-event-7690210c as w/main/8cd4062cb764
[2026-12-07 19:02:20,292] [16635] [WARNING] slow batch: 160 records in 14331 ms (decode 1 ms, work 14329 ms)
[2026-12-07 19:02:21,000] [16635] [WARNING] slow batch: 40 records in 50 ms (decode 1 ms, work 49 ms)
[2026-12-07 19:02:21,500] [16635] [WARNING] dead-lettered x[0]@1 (deadline_exceeded): ...
"""


def test_each_batch_line_gives_when_it_ended_how_long_it_took_and_its_records(tmp_path):
    log = tmp_path / "worker.log"
    log.write_text(LOG)
    found = batches(log)
    assert [(b.records, b.seconds) for b in found] == [(160, 14.331), (40, 0.05)]
    assert found[0].end == datetime(2026, 12, 7, 19, 2, 20, 292000).timestamp()
    assert found[0].start == found[0].end - 14.331


def test_a_window_holds_every_batch_that_ran_in_it_even_partly():
    long, short, later = Batch(end=100.0, seconds=20.0, records=160), Batch(110.0, 0.1, 40), Batch(130.0, 1.0, 10)
    assert in_window([long, short, later], 85.0, 112.0) == [long, short]
    assert in_window([long, short, later], 79.0, 79.9) == []


def test_stats_give_the_rate_and_the_batch_times_in_ms():
    window = [Batch(float(i), 0.010 * i, 100) for i in range(1, 101)]
    figures = stats(window, 0.0, 100.0)
    assert figures["batches"] == 100 and figures["records_per_second"] == 100.0
    assert (figures["p50_ms"], figures["p99_ms"], figures["max_ms"]) == (510, 1000, 1000)
    assert stats([], 0.0, 1.0)["max_ms"] is None
