"""The committed Grafana dashboard is what its generator (deploy/grafana/dashboard.py) writes, and it
reads the gauges every worker exports alike with max, never with a sum."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "deploy" / "grafana" / "dashboard.py"
COMMITTED = ROOT / "deploy" / "grafana" / "dashboards" / "order-event-processor.json"
# The gauges read from the database or the broker (app/timers/gauges.py): the same value on every worker.
SHARED_GAUGES = ("order_kafka_consumer_lag", "order_compensation_", "order_idem_stuck_rows",
                 "order_idem_over_attempt_cap_rows", "order_idem_capacity_watermark", "order_idem_partitions_ahead",
                 "order_idem_rows_estimated", "order_recovery_window_open", "order_effect_held",
                 "order_effect_hold_overdue_seconds", "order_partition_paused")


def generator():
    spec = importlib.util.spec_from_file_location("grafana_dashboard", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def panel_queries(board: dict) -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in board["panels"] for target in panel.get("targets", [])]


def test_the_committed_dashboard_is_what_the_generator_writes():
    module = generator()
    assert module.OUTPUT == COMMITTED
    assert COMMITTED.read_text() == module.render(), (
        "deploy/grafana/dashboards/order-event-processor.json differs from its generator: "
        "run .venv/bin/python deploy/grafana/dashboard.py and commit the result")


def test_every_panel_asks_the_chosen_prometheus():
    board = json.loads(COMMITTED.read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert len(panels) >= 10
    for panel in panels:
        assert panel["targets"], panel["title"]
        for item in [panel, *panel["targets"]]:
            assert item["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
    ids = [p["id"] for p in board["panels"]]
    assert len(set(ids)) == len(ids), "panel ids must be unique"


def test_shared_gauges_are_aggregated_with_max_or_min():
    for title, expr in panel_queries(json.loads(COMMITTED.read_text())):
        if any(gauge in expr for gauge in SHARED_GAUGES):
            assert re.match(r"^(max|min)( by \([a-z, ]+\))? ?\(order_[a-z_]+(\{[^}]*\})?\)$", expr), (title, expr)


def test_the_dashboard_shows_every_metric_it_promises():
    exprs = " ".join(expr for _, expr in panel_queries(json.loads(COMMITTED.read_text())))
    for metric in ("order_events_total", "order_batch_seconds_bucket", "order_kafka_consumer_lag",
                   "order_effect_call_seconds_bucket", "order_effect_calls_total", "order_dead_letters_total",
                   "order_compensation_rows", "order_compensation_oldest_open_age_seconds",
                   "order_compensation_oldest_manual_age_seconds", "order_idem_stuck_rows",
                   "order_idem_capacity_watermark", "order_effect_held", "order_records_held_by_effect",
                   "order_partition_paused"):
        assert metric in exprs, metric
