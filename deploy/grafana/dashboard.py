"""The Grafana dashboard of the order-event processor, as code (grafana-foundation-sdk).

Run it to rewrite the committed JSON that Grafana provisions (docker-compose.yml mounts it):

    .venv/bin/python deploy/grafana/dashboard.py

tests/unit/test_grafana_dashboard.py regenerates it and fails when the committed file differs, and
tests/integration/test_observability_queries.py runs every panel's query on a real Prometheus.

The gauges read from the database or the broker (t_idem, t_compensation, the consumer lag) are
exported with the same value by every worker: they are aggregated with max, never summed. The
counters and histograms are each worker's own: they are summed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableOption

UID = "order-event-processor"
OUTPUT = Path(__file__).resolve().parent / "dashboards" / f"{UID}.json"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"


def query(expr: str, legend: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).datasource(DATASOURCE)


def graph(title: str, description: str, unit: str, *queries: prometheus.Dataquery,
          width: int = 12) -> timeseries.Panel:
    panel = (timeseries.Panel().title(title).description(description).unit(unit).datasource(DATASOURCE)
             .height(8).span(width).fill_opacity(10))
    for ref, q in zip("ABCDEFGH", queries):
        panel = panel.with_target(q.ref_id(ref))
    return panel


def single(title: str, description: str, unit: str, q: prometheus.Dataquery, width: int = 6) -> stat.Panel:
    return (stat.Panel().title(title).description(description).unit(unit).datasource(DATASOURCE)
            .height(8).span(width).with_target(q.ref_id("A")))


def quantiles(metric: str, by: str = "") -> list[prometheus.Dataquery]:
    group = f"{by}, le" if by else "le"
    legend = f"{{{{{by}}}}} " if by else ""
    return [query(f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket[{RATE}])))", f"{legend}p{name}")
            for q, name in ((0.5, "50"), (0.99, "99"))]


def build() -> dash.Dashboard:
    board = (
        dash.Dashboard("Order event processor").uid(UID).tags(["order-event-processor"])
        .description("Throughput, latency, lag, external calls, dead letters, the compensation queue and the "
                     "dedup store (docs, Operations: Dashboard).")
        .refresh("30s").time("now-3h", "now").timezone("utc")
        .with_variable(dash.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
                       .current(VariableOption(selected=True, text="Prometheus", value="prometheus")))

        .with_row(dash.Row("Throughput and latency"))
        .with_panel(graph(
            "Events by outcome", "order_events_total: events consumed from order-event, per second, summed over "
            "the workers.", "ops",
            query(f"sum by (outcome) (rate(order_events_total[{RATE}]))", "{{outcome}}")))
        .with_panel(graph(
            "Batch latency", "order_batch_seconds: wall time of one batch, p50 and p99 over every worker.", "s",
            *quantiles("order_batch_seconds")))
        .with_panel(graph(
            "Consumer lag by partition", "order_kafka_consumer_lag: records of order-event not committed yet, "
            "read from the broker; every worker exports the same value, so max.", "short",
            query("max by (topic, partition) (order_kafka_consumer_lag)", "{{topic}} {{partition}}"), width=24))

        .with_row(dash.Row("External calls"))
        .with_panel(graph(
            "External call latency", "order_effect_call_seconds: p50 and p99 of each effect's calls (SMS lookups "
            "as sms_lookup).", "s", *quantiles("order_effect_call_seconds", "effect")))
        .with_panel(graph(
            "External call errors by effect", "order_effect_calls_total: calls whose result is an error reason "
            "(not ok; an SMS lookup's found and not_found are answers, not errors), per second.", "ops",
            query(f'sum by (effect, result) (rate(order_effect_calls_total{{result!~"ok|found|not_found"}}[{RATE}]))',
                  "{{effect}} {{result}}")))

        .with_row(dash.Row("Dead letters and compensation"))
        .with_panel(graph(
            "Dead letters by reason", "order_dead_letters_total: records sent to the dead-letter topic, per "
            "second.", "ops",
            query(f"sum by (reason) (rate(order_dead_letters_total[{RATE}]))", "{{reason}}")))
        .with_panel(graph(
            "Compensation queue by status", "order_compensation_rows: unsettled dead letters of the group "
            "(open, retrying, manual); the same on every worker, so max.", "short",
            query("max by (status) (order_compensation_rows)", "{{status}}")))
        .with_panel(graph(
            "Oldest dead letter", "Age of the oldest open or retrying dead letter, of the oldest one waiting for a "
            "person (manual), and COMPENSATION_SLA_SECONDS, the CompensationSlaBreached threshold.", "s",
            query("max(order_compensation_oldest_open_age_seconds)", "oldest open or retrying"),
            query("max(order_compensation_oldest_manual_age_seconds)", "oldest manual"),
            query("max(order_compensation_sla_seconds)", "SLA"), width=24))

        .with_row(dash.Row("Operator controls"))
        .with_panel(graph(
            "Effects held by a person", "order_effect_held: 1 while a person holds the effect group-wide (GET "
            "/controls/); order_effect_hold_overdue_seconds: how long a hold is past its planned end "
            "(EffectHoldOverdue). Every worker exports what it read, so max.", "short",
            query("max by (effect) (order_effect_held)", "{{effect}} held"),
            query("max by (effect) (order_effect_hold_overdue_seconds)", "{{effect}} overdue (s)")))
        .with_panel(graph(
            "Records held, by effect", "order_records_held_by_effect: records the workers keep in memory for a "
            "held effect (a person's hold or an open breaker), before their claim; summed over the workers. "
            "Past BREAKER_HOLD_RECORDS a worker stops reading the partitions it fills.", "short",
            query("sum by (effect) (order_records_held_by_effect)", "{{effect}}")))
        .with_panel(graph(
            "Partitions paused by a person", "order_partition_paused: 1 while a person pauses the partition of "
            "the input (its lag is paused, not stuck). Every worker exports what it read, so max.", "short",
            query("max by (topic, partition) (order_partition_paused)", "{{topic}} {{partition}}"), width=24))

        .with_row(dash.Row("Dedup store (t_idem)"))
        .with_panel(graph(
            "Stuck pending rows by step", "order_idem_stuck_rows: pending rows older than STUCK_PENDING_SECONDS, "
            "and order_idem_over_attempt_cap_rows: those claimed IDEM_MAX_ATTEMPTS times (GET /idem/stuck/).",
            "short",
            query("max by (step) (order_idem_stuck_rows)", "{{step}}"),
            query("max(order_idem_over_attempt_cap_rows)", "over the attempt cap")))
        .with_panel(single(
            "Capacity watermark", "order_idem_capacity_watermark: t_idem rows / the capacity budget "
            "(IdemCapacityWatermarkHigh above 0.8).", "percentunit",
            query("max(order_idem_capacity_watermark)", "watermark")))
        .with_panel(single(
            "Partitions ahead", "order_idem_partitions_ahead: monthly t_idem partitions after the current month "
            "(IdemPartitionsRunningOut below 1).", "short",
            query("min(order_idem_partitions_ahead)", "months ahead")))

        .with_row(dash.Row("Reconciliation"))
        .with_panel(graph(
            "Reconcile findings by kind", "order_reconcile_findings: what the group's latest completed reconcile "
            "run found (unaccounted, stuck, receipt_mismatch, ledger_without_record, provider); the same on every "
            "worker, so max. ReconcileFindings above 0.", "short",
            query("max by (kind) (order_reconcile_findings)", "{{kind}}")))
        .with_panel(single(
            "Since the last reconcile", "Seconds since the latest reconcile run completed "
            "(order_reconcile_last_run_timestamp_seconds; ReconcileNotRunning past an hour).", "s",
            query("time() - max(order_reconcile_last_run_timestamp_seconds)", "since the last run")))
        .with_panel(single(
            "Reconciled up to", "How far behind now the latest completed run's range ended "
            "(order_reconcile_last_range_end_timestamp_seconds): RECONCILE_LAG_SECONDS and the run's age.", "s",
            query("time() - max(order_reconcile_last_range_end_timestamp_seconds)", "behind now")))
    )
    return board


def numbered(board: dash.Dashboard):
    """The built dashboard, its panels and rows numbered 1, 2, ... in order (the builder leaves every id 0)."""
    model = board.build()
    for number, panel in enumerate(model.panels or [], start=1):
        panel.id_val = number
    return model


def render() -> str:
    """The dashboard's JSON as committed: keys sorted, two-space indent, a final newline."""
    return json.dumps(numbered(build()), cls=JSONEncoder, sort_keys=True, indent=2) + "\n"


def main() -> int:
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(render())
    print(f"wrote {OUTPUT.relative_to(Path.cwd()) if OUTPUT.is_relative_to(Path.cwd()) else OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
