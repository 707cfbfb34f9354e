"""``python -m bench.tracing_cost``: what tracing costs the worker, rows c-full and c-local of
``bench.run`` three times each: tracing off (no OTEL_* exporter: the default), at 1 % sampling and at
100 %, spans exported over OTLP/HTTP to a real Jaeger (the all-in-one program the tracing test runs,
on this machine: it takes its share of the CPU, as a collector on the same host would).

The records carry no trace context, as the bench's producer writes them: each record starts a trace
of its own, kept with the sampler's ratio (``parentbased_traceidratio``; a producer that samples its
own traces decides for its records instead). Same clocks as ``bench.run``'s c rows: the steady-state
rate beside the clocked one, CPU per event over the steady window, batch p50/p99. Spans the SDK's
batch processor dropped (its queue, ``OTEL_BSP_MAX_QUEUE_SIZE``, full) are counted from the worker's
log. Results: stdout and ``bench/results/tracing-<UTC timestamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import uuid
from datetime import UTC, datetime
from pathlib import Path

from app.settings import Settings
from bench import report
from bench.run import RESULTS, Context, cleanup, fake_config, parse_args, prepare, row_c, scratch_database
from harness.fakes import FakesProcess
from harness.jaeger import Jaeger

SAMPLING = {"off": None, "1%": "0.01", "100%": "1.0"}
SUFFIX = {"off": "", "1%": "-1pct", "100%": "-100pct"}        # each row a consumer group of its own


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tracing_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000, help="records per topic (default 100000)")
    parser.add_argument("--latency-ms", type=float, default=5.0, help="fake logistics latency (5)")
    own = parser.parse_args(argv)
    args = parse_args(["--events", str(own.events), "--latency-ms", str(own.latency_ms), "--skip-naive",
                       "--skip-raw", "--skip-faust", "--skip-wide", "--skip-growth"])
    settings = Settings()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    tag = uuid.uuid4().hex[:8]
    db = scratch_database(settings.database.url, tag)
    fakes = FakesProcess(fake_config(args.latency_ms))
    ctx = Context(args, settings, stamp, tag, db, fakes)
    jaeger = Jaeger(Path(tempfile.mkdtemp(prefix="bench-jaeger-"))).start()
    try:
        rows = asyncio.run(_rows(ctx, jaeger))
    finally:
        jaeger.stop()
        cleanup(ctx)
    print("\n" + table(rows))
    path = RESULTS / f"tracing-{stamp}.json"
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"timestamp": stamp, "events": own.events, "rows": rows}, indent=2, default=str) + "\n")
    print(f"\nresults: {path.relative_to(RESULTS.parents[1])}")
    return 1 if any(row.get("error") for row in rows) else 0


async def _rows(ctx: Context, jaeger: Jaeger) -> list[dict]:
    await prepare(ctx)
    rows = []
    for name in ("full", "local"):
        for label, ratio in SAMPLING.items():
            env = {} if ratio is None else jaeger.worker_env(OTEL_TRACES_SAMPLER="parentbased_traceidratio",
                                                              OTEL_TRACES_SAMPLER_ARG=ratio)
            env.pop("OTEL_BSP_SCHEDULE_DELAY", None)          # the SDK's default (5 s), as users run it
            row = await row_c(ctx, ctx.workloads[name], row=f"c-{name}{SUFFIX[label]}", extra_env=env,
                              design=f"{report.DESIGNS[f'c-{name}']}, tracing {label}")
            row["tracing"] = label
            row["dropped_span_warnings"] = _dropped(row.get("log"))
            rows.append(row)
            print(f"  c-{name} tracing {label}: {row.get('steady_events_per_second') or 0:,.0f} events/s steady, "
                  f"{row.get('cpu_us_per_event') or 0:,.0f} µs CPU/event", flush=True)
    return rows


def _dropped(log: str | None) -> int | None:
    if not log:
        return None
    try:
        text = Path(log).read_text(errors="replace")
    except OSError:
        return None
    return text.count("Queue is full, likely spans will be dropped")


def table(rows: list[dict]) -> str:
    head = ("| row | tracing | events/s (clocked) | events/s (steady) | CPU µs/event | batch p50 ms | batch p99 ms "
            "| peak RSS MB |\n|---|---|---|---|---|---|---|---|")
    lines = [head]
    for row in rows:
        lines.append(f"| {row['row']} | {row['tracing']} | {_f(row, 'events_per_second')} | "
                     f"{_f(row, 'steady_events_per_second')} | {_f(row, 'cpu_us_per_event')} | "
                     f"{_f(row, 'batch_ms_p50', '.1f')} | {_f(row, 'batch_ms_p99', '.1f')} | {_f(row, 'peak_rss_mb')} |")
    return "\n".join(lines)


def _f(row: dict, key: str, fmt: str = ",.0f") -> str:
    value = row.get(key)
    return "n/a" if value is None else format(value, fmt)


if __name__ == "__main__":
    sys.exit(main())
