"""The capacity model, the retention's dates and the partition plan: pure arithmetic."""

from __future__ import annotations

from datetime import date, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.adapters.mysql.partitions import CATCH_ALL, Partition, month_name, month_start, plan
from app.pipeline.capacity import Inputs, budget
from app.pipeline.errors import BeyondDedupRetention
from app.pipeline.retention import Retention

BASE = dict(rate=520.0, peak_rate=1500.0, worker_max_rate=20_000.0, partitions=48, workers=16, retention_days=90,
            commit_interval=2.8, commit_every=10_000, max_poll_records=500, batch_size=500, batch_within=1.0,
            keys_per_event=2, row_bytes=250, offsets_retention_days=7, outage_sla_days=14, dead_letter_days=30)


def test_the_replay_window_follows_the_commit_interval_the_batch_and_the_rate():
    b = budget(Inputs(**BASE))
    # A worker's share of the peak, 93.75/s, fills a batch of 94 in 1 s; 2.8 s of acks are 3 whole
    # batches; and the batch in flight.
    assert b.w_kill == 3 * 94 + 94
    assert b.w_kill_backlog == 10_500 + 500                 # commit_every (passed by a batch) caps 20,000/s x 2.8 s
    assert b.w_kill_all == 16 * b.w_kill
    at_1000 = budget(Inputs(**{**BASE, "peak_rate": 1000, "workers": 1}))
    assert at_1000.w_kill == 6 * 500 + 500                  # 2,800 acked events are 6 whole batches of 500
    fast = budget(Inputs(**{**BASE, "peak_rate": 16 * 5000}))
    assert fast.w_kill == 10_500 + 500
    assert budget(Inputs(**{**BASE, "commit_interval": 1.0})).w_kill < b.w_kill


def test_rows_count_every_key_of_the_retention_plus_a_month_and_retention_covers_every_way_back():
    b = budget(Inputs(**BASE))
    assert b.rows == 520 * 86_400 * 2 * (90 + 31)
    assert b.bytes == b.rows * 250
    assert b.retention_needed_days == 60 and b.retention_ok         # max(7, 14, 30) x 2
    short = budget(Inputs(**{**BASE, "retention_days": 45}))
    assert not short.retention_ok
    assert short.rows < b.rows


def test_the_cutoff_refuses_exactly_the_orders_older_than_the_retention():
    retention = Retention(90, today=lambda: date(2026, 11, 30))
    assert retention.cutoff() == date(2026, 9, 1)
    assert retention.refusal("ORD-20260901-A", date(2026, 9, 1)) is None
    refused = retention.refusal("ORD-20260831-A", date(2026, 8, 31))
    assert isinstance(refused, BeyondDedupRetention) and not refused.retriable
    assert refused.reason == "beyond_dedup_retention" and "2026-09-01" in str(refused)


def months(first: date, count: int) -> list[Partition]:
    parts = [Partition("p_before", first)]
    for i in range(count):
        m = month_start(first, i)
        parts.append(Partition(month_name(m), month_start(m, 1)))
    return parts + [Partition(CATCH_ALL, None)]


def test_the_plan_adds_the_missing_months_ahead_and_drops_the_months_past_the_retention():
    today = date(2026, 11, 30)
    retention = Retention(90, today=lambda: today)
    parts = months(date(2025, 11, 1), 14)                      # p202511 .. p202612
    changes = plan(parts, today=today, ahead=3, drop_before=retention.drop_before())
    assert changes.add == [date(2027, 1, 1), date(2027, 2, 1)]         # December is there; January, February
    assert changes.drop == ["p_before"] + [f"p{m}" for m in ("202511", "202512", "202601", "202602", "202603",
                                                             "202604", "202605", "202606", "202607")]
    assert "p202608" not in changes.drop                       # holds 2026-08-31, the day before the cutoff
    settled = months(date(2026, 8, 1), 8)                      # p202608 .. p202703
    assert plan(settled, today=today, ahead=3, drop_before=retention.drop_before()).add == []


def test_months_roll_over_the_year():
    assert month_start(date(2026, 12, 15), 1) == date(2027, 1, 1)
    assert month_start(date(2026, 1, 31), -1) == date(2025, 12, 1)
    assert month_name(date(2027, 1, 1)) == "p202701"


def test_a_table_without_its_catch_all_partition_is_an_error():
    with pytest.raises(ValueError, match="MAXVALUE"):
        plan(months(date(2026, 1, 1), 3)[:-1], today=date(2026, 2, 1), ahead=1, drop_before=date(2025, 1, 1))


@given(today=st.dates(date(2024, 1, 1), date(2030, 12, 31)), days=st.integers(1, 400),
       first=st.dates(date(2023, 1, 1), date(2030, 12, 31)), count=st.integers(1, 40), ahead=st.integers(1, 6))
def test_a_dropped_partition_only_ever_holds_refused_dates_and_today_always_has_a_month(today, days, first, count,
                                                                                         ahead):
    retention = Retention(days, today=lambda: today)
    parts = months(month_start(first), count)
    changes = plan(parts, today=today, ahead=ahead, drop_before=retention.drop_before())
    for part in parts:
        if part.name in changes.drop:
            last_day = part.below - timedelta(days=1)
            assert retention.refusal("ORD-X", last_day) is not None, (part, retention.cutoff())
    bounds = sorted([p.below for p in parts if p.below and p.name not in changes.drop]
                    + [month_start(m, 1) for m in changes.add])
    assert bounds and bounds[-1] >= month_start(today, ahead + 1)     # current month and `ahead` more are ready
    assert any(b > today for b in bounds)
