"""Rows of the result (plain dicts, as they go into the JSON) and their markdown rendering."""

from __future__ import annotations

import argparse
from pathlib import Path

from app.adapters.kafka.connection import KafkaConnection
from app.settings import Settings
from bench.baselines import Measurement
from bench.worker import WorkerRun
from bench.workload import Workload

DESIGNS = {
    "a": "raw aiokafka consume + commit (ceiling)",
    "b": "naive: one transaction per event",
    "b-full": "naive: one transaction per event, full mix",
    "b-local": "naive: one transaction per event, local-only mix",
    "c-full": "pipeline worker, full mix",
    "c-local": "pipeline worker, local-only mix",
    "c-local-48": "pipeline worker, local-only mix, 48 partitions",
    "f": "Faust's own ceiling: the worker's Faust setup, take_events(), a no-op agent",
    "g-empty": "pipeline worker, waybill + SMS mix, t_idem empty",
}
COLUMNS = ("run", "events", "steady events/s", "clocked events/s", "worker CPU µs / event", "DB round trips / event",
           "DB round trips / batch (c)", "p50 batch ms", "p99 batch ms", "peak RSS MB", "ratio (steady)")


def baseline_row(m: Measurement, workload: Workload, row: str | None = None) -> dict:
    return {"row": row or m.name, "design": DESIGNS[row or m.name], "workload": workload.name, "topic": workload.topic,
            "events": m.events, "seconds": m.seconds, "seconds_with_join": m.seconds_with_join,
            "events_per_second": m.events_per_second,
            # Its clock starts with the first records: no group join in it, already a steady rate.
            "steady_events_per_second": m.events_per_second,
            "db_round_trips": m.db_round_trips,
            "db_round_trips_per_event": m.db_round_trips / m.events if m.db_round_trips and m.events else None,
            "extra": m.extra}


def worker_row(row: str, workload: Workload, run: WorkerRun, checks: dict, profile: Path | None,
               design: str | None = None) -> dict:
    metrics = run.metrics
    trips = metrics.get("db_round_trips")
    return {"row": row, "design": design or DESIGNS[row], "workload": workload.name, "topic": workload.topic,
            "events": run.events, "seconds": run.seconds, "events_per_second": run.events_per_second,
            "steady_events_per_second": run.steady_events_per_second,
            "startup_seconds": run.startup_seconds, "first_commit_seconds": run.first_commit_seconds,
            "db_round_trips_per_event": trips / run.events if trips is not None and run.events else None,
            "db_round_trips_per_batch": metrics.get("db_round_trips_per_batch"),
            "batch_ms_p50": metrics.get("batch_ms_p50"), "batch_ms_p99": metrics.get("batch_ms_p99"),
            "peak_rss_mb": run.peak_rss_mb,
            "steady_cpu_seconds": run.steady_cpu_seconds, "steady_events": run.steady_events,
            "cpu_us_per_event": run.cpu_us_per_event, "commits": run.commits, "metrics": metrics, "checks": checks,
            "error": run.error,
            "log": run.log, "profile": str(profile) if profile else None}


def add_ratios(rows: list[dict]) -> None:
    """c/a for every c row; c/b where b ran over the same mix; c/f; b/a; g/g-empty for the g row
    after the pre-fill. On steady rates: a clock that includes the group join makes a fast row look slow."""
    by_name = {row["row"]: row for row in rows}
    a, f, g_empty = by_name.get("a", {}), by_name.get("f", {}), by_name.get("g-empty", {})
    naive = {row.get("workload"): row for row in rows if row["row"].startswith("b")}
    steady = "steady_events_per_second"
    for row in rows:
        ratios = {}
        rate = row.get(steady)
        if row["row"] == "a" and rate:
            ratios["a/a"] = 1.0
        if row["row"] != "a" and rate and a.get(steady):
            ratios[f"{row['row'][0]}/a"] = rate / a[steady]
        b = naive.get(row.get("workload"), {})
        if row["row"].startswith("c") and rate and b.get(steady):
            ratios["c/b"] = rate / b[steady]
        if row["row"].startswith("c") and rate and f.get(steady):
            ratios["c/f"] = rate / f[steady]
        local = by_name.get("c-local", {})
        if row["row"] == "c-local-48" and row.get("cpu_us_per_event") and local.get("cpu_us_per_event"):
            ratios["CPU/event vs c-local"] = row["cpu_us_per_event"] / local["cpu_us_per_event"]
        if row["row"] == "c-local" and row.get("cpu_us_per_event") and f.get("cpu_us_per_event"):
            ratios["CPU/event vs f"] = row["cpu_us_per_event"] / f["cpu_us_per_event"]
        if row["row"].startswith("g-") and row["row"] != "g-empty" and rate and g_empty.get(steady):
            ratios["g/g-empty"] = rate / g_empty[steady]
            if row.get("events_per_second") and g_empty.get("events_per_second"):
                row["clocked_ratio_to_empty"] = row["events_per_second"] / g_empty["events_per_second"]
        row["ratios"] = ratios


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        ratio = ", ".join(f"{name} {value:.3g}" for name, value in row.get("ratios", {}).items() if name != "a/a")
        ratio = "1 (ceiling)" if "a/a" in row.get("ratios", {}) else ratio
        cells = [row["row"], _num(row.get("events"), 0),
                 "FAILED" if row.get("error") else _num(row.get("steady_events_per_second"), 0),
                 "FAILED" if row.get("error") else _num(row.get("events_per_second"), 0),
                 _num(row.get("cpu_us_per_event"), 1),
                 _num(row.get("db_round_trips_per_event"), 2), _num(row.get("db_round_trips_per_batch"), 1),
                 _num(row.get("batch_ms_p50"), 1), _num(row.get("batch_ms_p99"), 1),
                 _num(row.get("peak_rss_mb"), 0), ratio or "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def notes(rows: list[dict]) -> str:
    lines = ["", "Notes:"]
    for row in rows:
        name = row["row"]
        if row.get("error"):
            lines.append(f"- {name}: FAILED: {row['error']}" + (f" (log {row['log']})" if row.get("log") else ""))
        if name == "a" and not row.get("error"):
            lines.append(f"- a: {row['seconds']:.2f}s from the first records; {row['seconds_with_join']:.2f}s "
                         "with the group join")
        elif name.startswith("b") and not row.get("error"):
            extra = row["extra"]
            lines.append(f"- {name}: {row['seconds']:.2f}s; {extra['duplicates']} duplicates skipped, "
                         f"{extra['waybill_calls']} inline waybill calls; {row['db_round_trips']} round trips")
        elif name.startswith("c") or name == "f" or name.startswith("g-"):
            lines.append(_worker_note(row))
    lines.append("- steady (the headline): a and b from the first records to the last commit; f, c and g from the "
                 "first commit seen to the last one below 95 % of the records (the commits after it wait for "
                 "Faust's commit timer once the fetches run dry). clocked: c and f from /health answering to committed == end "
                 "offsets (includes the group join and up to one 2.8 s commit interval). Batch p50/p99: linear "
                 "interpolation inside order_batch_seconds buckets. Worker CPU / event: the worker process's "
                 "user + system time (all threads) over the same window, over the events committed in it.")
    return "\n".join(lines)


def _worker_note(row: dict) -> str:
    m, checks = row.get("metrics", {}), row.get("checks") or {}
    parts = [f"startup (spawn -> /health) {_num(row.get('startup_seconds'), 1)}s",
             f"first commit after {_num(row.get('first_commit_seconds'), 1)}s",
             f"clock {_num(row.get('seconds'), 1)}s",
             f"steady {_num(row.get('steady_events_per_second'), 0)} ev/s",
             f"worker CPU {_num(row.get('steady_cpu_seconds'), 2)}s over {_num(row.get('steady_events'), 0)} events "
             f"({_num(row.get('cpu_us_per_event'), 1)} µs each)",
             f"{_num(m.get('batches'), 0)} batches of {_num(m.get('events_per_batch'), 0)} events",
             f"outcomes {m.get('events_by_outcome') or 'n/a'}"]
    if m.get("dead_letters_by_reason"):
        parts.append(f"dead letters {m['dead_letters_by_reason']}")
    if checks:
        parts.append("check ok" if checks["ok"] else
                     f"CHECK FAILED: orders {checks['orders_by_status']} (expected {checks['expected_orders']}), "
                     f"waybills {checks['waybills']} (expected {checks['expected_waybills']}), "
                     f"SMS {checks.get('sms')} (expected {checks.get('expected_sms')})")
    if "g/g-empty" in row.get("ratios", {}):
        parts.append(f"vs g-empty: steady {row['ratios']['g/g-empty']:.3f}, "
                     f"clocked {_num(row.get('clocked_ratio_to_empty'), 3)}")
    if m.get("error"):
        parts.append(f"metrics unreadable: {m['error']}")
    parts.append(f"log {row['log']}")
    if row.get("profile"):
        parts.append(f"profile {row['profile']}")
    return f"- {row['row']}: " + "; ".join(parts)


def environment_text(env: dict, args: argparse.Namespace, settings: Settings) -> str:
    packages = ", ".join(f"{name} {version}" for name, version in env["packages"].items())
    return "\n".join([
        "Environment:",
        f"- CPUs: {env['cpu_count']} ({env['cpus_usable']} usable), {env['cpu_model'] or 'model unknown'}",
        f"- Python {env['python']} on {env['platform']}",
        f"- Kafka {env['kafka']} at {KafkaConnection.from_settings(settings.kafka).describe()}; MariaDB {env['mariadb']}",
        f"- {packages}",
        f"- load average before the run: {env.get('loadavg', 'n/a')}",
        f"- workload: {args.events} events per topic, naive prefix {args.naive_events}, "
        f"fake logistics latency {args.latency_ms:g} ms, batch size {settings.batches.size}, "
        f"commit interval {settings.kafka.commit_interval_seconds:g}s",
        *([] if args.skip_growth else [
            f"- growth rows: t_idem pre-filled with {args.growth_rows:,} done rows, a ledger of "
            f"{args.growth_ledger_rows:,} rows, each operation timed {args.growth_repeat} times"]),
        "",
    ])


def _num(value: float | int | None, digits: int) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}"
