"""The pace benchmark's arithmetic: the bound it holds the worker to, and its steady rate."""

from __future__ import annotations

import pytest

from bench.provider_pace import LIMIT, ROW_SETTINGS, ROWS, TAIL, mean_latency, steady_rate


def test_the_bound_counts_a_hung_call_at_the_clients_timeout():
    # 99 % of calls at the lognormal's mean (100 ms x e^0.32 = 137.7 ms), 1 % at the 3 s timeout.
    assert mean_latency(TAIL, 3.0) == pytest.approx(0.99 * 0.13771 + 0.01 * 3.0, rel=1e-3)
    assert 64 / mean_latency(TAIL, 3.0) == pytest.approx(385, abs=1)        # the 64 in flight
    assert mean_latency({"latency_ms": 5}, 3.0) == pytest.approx(0.005)
    assert mean_latency({**TAIL, "timeout_ms": 1_000}, 3.0) == pytest.approx(0.99 * 0.13771 + 0.01, rel=1e-3)


def test_the_limited_row_is_the_tail_with_a_limit():
    assert ROWS["q"]["waybill"] == {**ROWS["p"]["waybill"], "calls_per_second": 300}


def test_the_steady_rate_leaves_out_the_start_and_the_tail():
    times = [i / 100 for i in range(1000)] + [100.0]           # 100 calls/s, then one straggler
    assert steady_rate(times) == pytest.approx(100, rel=0.02)
    assert steady_rate([1.0] * 5) is None


def test_the_rows_at_a_limit_differ_only_in_whether_the_worker_is_told_it():
    assert ROWS["r"] == ROWS["R"] and ROWS["r"]["waybill"]["calls_per_second"] == LIMIT
    assert "r" not in ROW_SETTINGS
    assert float(ROW_SETTINGS["R"]["EFFECTS__WAYBILL__CALLS_PER_SECOND"]) < LIMIT


def test_an_events_latency_runs_to_its_last_step_settled_and_a_duplicate_counts_for_nothing():
    from app.pipeline.events import decode
    from app.pipeline.plan import step_keys
    from bench.provider_pace import event_latencies
    from harness.events import event, order_no, record

    o = order_no()
    created, confirm = record(event(o, "ORDER_CREATED")), record(event(o, "ORDER_CONFIRM"))
    keys = step_keys(decode(*confirm, max_bytes=1 << 20))
    [local] = step_keys(decode(*created, max_bytes=1 << 20))
    settled = {local: 10.5, keys[0]: 11.0, keys[1]: 12.0}
    latencies, unsettled = event_latencies([created, confirm, confirm], [10.0, 10.1, 10.2], settled)
    assert latencies == pytest.approx([0.5, 1.9]) and unsettled == 0
    assert event_latencies([confirm], [10.0], {keys[0]: 11.0}) == ([], 1)
