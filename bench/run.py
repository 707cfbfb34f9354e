"""``python -m bench.run``: throughput of the order-event processor against real
Kafka and MariaDB, next to two reference points, in one run.

What each row measures (events/s = events / seconds on the row's clock):

a  ceiling   a raw aiokafka consumer that consumes the pre-filled topic and commits,
             nothing else (``getmany(max_records=500)``, one commit per getmany).
             Clock: first records received -> last commit returned.
b  naive     (b-full, b-local: once per mix)
             the usual baseline: one event at a time, one transaction each
             (claim ODKU into t_idem, work on t_order, mark done, COMMIT; for
             ORDER_CONFIRM an inline waybill call between claim and done), over
             the first ``--naive-events`` records. Same clock as (a).
             DB round trips = statements + commits, counted by the benchmark.
f  Faust     ``faust -A bench.noop_app worker``: the worker's Faust setup (uvloop,
   ceiling   batch-level monitor, raw serializers, take_events(500), concurrency 1)
             with an agent that does nothing, over the local-only topic. Same
             clock as (c). The ratio c/f says how much of Faust's own ceiling
             the pipeline keeps.
c  pipeline  one ``faust -A app worker -l warn`` process, over the whole topic.
             Clock: the worker's /health first answers -> the group's committed
             offsets equal the end offsets (polled every 100 ms). The clock
             includes the group join and up to one commit interval (2.8 s) at the
             end; the steady-state rate (first commit seen -> the last one before
             the commit that completes the topic) is printed too.
             Batch p50/p99 come from the ``order_batch_seconds`` histogram by
             linear interpolation inside buckets; DB round trips from
             ``order_db_round_trips_total`` / ``order_batches_total``; peak RSS is
             the worker's VmHWM. A metric the worker does not export shows as n/a.
             Run twice: ``c-full`` (60 % CREATED/PAID, 30 % CONFIRM with a 5 ms
             fake logistics API, 10 % duplicates) and ``c-local`` (CREATED/PAID and
             10 % duplicates: no external call).
g  growth    cost as t_idem grows (``bench.growth``): the same worker as (c), same clocks,
             over the ``mixed`` workload (waybill and SMS calls: 60 % CREATED/PAID, 20 %
             CONFIRM, 10 % CANCEL with the fake SMS gateway at the same latency, 10 %
             duplicates), twice in one run: ``g-empty`` on an empty t_idem, then, after
             t_idem is pre-filled with ``--growth-rows`` done rows of the past 365 days
             (10 million by default; MariaDB's SEQUENCE engine, then ANALYZE TABLE; the
             server's settings as they are, the default buffer pool included), ``g-10m``
             (named after the row count). The ratio g-10m / g-empty says what the size
             costs the pipeline. At that size the stuck sweep, the gauges, the
             /compensation/ list (over a ledger of ``--growth-ledger-rows`` rows) and the
             partition drop are timed with the app's own code, and the plans of their
             statements and of a claim read are printed (EXPLAIN PARTITIONS, ANALYZE); a plan
             that reads the table instead of an index range is reported as a finding.
             ``--skip-growth`` leaves the g rows out, ``--only-growth`` runs only them.

Every row also reports the worker process's CPU time (user + system, all its threads, from
/proc/<pid>/stat) per event over the steady window. ``c-local-48`` is the local-only mix, record
for record, on a topic of 48 partitions (the seeds' count; ``--skip-wide`` leaves it out).

Every run uses topics (8 partitions, 48 for c-local-48), consumer groups and a MariaDB scratch
database of its own, and removes them at the end (``--keep`` keeps topics and
database). Tables are emptied between rows. Results go to stdout as a markdown
table and to ``bench/results/<UTC timestamp>.json``; worker logs to ``.cache/bench/``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import json
import shutil
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from app.adapters.kafka import ops as kafka_ops
from app.adapters.kafka.connection import KafkaConnection
from app.adapters.kafka.topics import topic_specs
from app.settings import Settings
from bench import environment, growth, report
from bench.baselines import Measurement, naive, raw_ceiling
from bench.worker import run_worker
from bench.workload import Workload, build
from harness.fakes import FakesProcess, every_fake
from harness.services import ScratchDatabase, free_port, worker_env

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
LOGS = ROOT / ".cache" / "bench"
PARTITIONS = 8
WIDE_PARTITIONS = 48        # the seeds' topic: row c-local-48
DLQ_PARTITIONS = 3
WIDE = f"local-{WIDE_PARTITIONS}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000, help="records per topic (default 200000)")
    parser.add_argument("--naive-events", type=int, default=20_000, help="records for the naive run (20000)")
    parser.add_argument("--skip-naive", action="store_true", help="leave out row b")
    parser.add_argument("--skip-raw", action="store_true", help="leave out row a")
    parser.add_argument("--skip-faust", action="store_true", help="leave out row f (Faust's no-op ceiling)")
    parser.add_argument("--only-local", action="store_true", help="only the local-only topic (no c-full)")
    parser.add_argument("--skip-wide", action="store_true",
                        help=f"leave out row c-local-{WIDE_PARTITIONS} (the local-only mix on {WIDE_PARTITIONS} partitions)")
    parser.add_argument("--keep", action="store_true", help="keep the topics and the scratch database")
    parser.add_argument("--profile", action="store_true",
                        help="run the workers under pyinstrument; text reports in bench/results/")
    parser.add_argument("--latency-ms", type=float, default=5.0, help="fake logistics latency (5)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds a row may take before it is reported as timed out (600)")
    parser.add_argument("--stall", type=float, default=120.0,
                        help="seconds without a committed offset moving before (c) gives up (120)")
    parser.add_argument("--skip-growth", action="store_true", help="leave out rows g (cost as t_idem grows)")
    parser.add_argument("--only-growth", action="store_true", help="only rows g (no a, b, f, c)")
    parser.add_argument("--growth-rows", type=int, default=10_000_000,
                        help="done rows pre-filled into t_idem before the second g row (10000000)")
    parser.add_argument("--growth-ledger-rows", type=int, default=1_000_000,
                        help="t_compensation rows behind the timed /compensation/ list (1000000)")
    parser.add_argument("--growth-repeat", type=int, default=20,
                        help="tries of each timed operation at size (20)")
    args = parser.parse_args(argv)
    if args.skip_growth and args.only_growth:
        parser.error("--skip-growth and --only-growth exclude each other")
    if args.growth_rows < 1 or args.growth_repeat < 1 or args.growth_ledger_rows < 0:
        parser.error("--growth-rows and --growth-repeat must be positive, --growth-ledger-rows not negative")
    if args.profile and importlib.util.find_spec("pyinstrument") is None:
        parser.error("--profile needs pyinstrument (pip install -e '.[bench]')")
    return args


@dataclass
class Context:
    args: argparse.Namespace
    settings: Settings
    stamp: str
    tag: str
    db: ScratchDatabase
    fakes: FakesProcess
    workloads: dict[str, Workload] = field(default_factory=dict)
    ends: dict[str, dict[int, int]] = field(default_factory=dict)
    partitions: dict[str, int] = field(default_factory=dict)      # by workload name; PARTITIONS if absent
    topics: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)

    @property
    def bootstrap(self) -> KafkaConnection:
        """The brokers, with the settings' security (KAFKA_SECURITY_PROTOCOL, ...)."""
        return KafkaConnection.from_settings(self.settings.kafka)

    def group(self, row: str) -> str:
        name = f"bench-{row}-{self.tag}"
        self.groups.append(name)
        return name


def fake_config(latency_ms: float) -> dict:
    """The fakes' faults: only latency, the same on every fake provider (only the g rows' mix sends
    SMS)."""
    return every_fake({"latency_ms": latency_ms})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = Settings()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    tag = uuid.uuid4().hex[:8]
    db = scratch_database(settings.database.url, tag)
    try:
        fakes = FakesProcess(fake_config(args.latency_ms))
    except BaseException:
        db.drop()
        raise
    ctx = Context(args, settings, stamp, tag, db, fakes)
    try:
        document = asyncio.run(run(ctx))
    finally:
        cleanup(ctx)
    path = RESULTS / f"{stamp}.json"
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")
    print(f"\nresults: {path.relative_to(ROOT)}")
    return 1 if any(row.get("error") for row in document["rows"]) else 0


def scratch_database(base_url: str, tag: str) -> ScratchDatabase:
    """A fresh database ``<base>_bench_<tag>``, migrated to head with alembic."""
    db = ScratchDatabase(base_url, label=f"bench_{tag}")
    try:
        return db.create()
    except BaseException:
        db.drop()
        raise


async def run(ctx: Context) -> dict:
    env = environment.describe(ctx.db.scalar("SELECT VERSION()"))
    print(report.environment_text(env, ctx.args, ctx.settings), flush=True)
    await prepare(ctx)
    main_name = "local" if ctx.args.only_local else "full"
    mixes = [name for name in ("full", "local", WIDE) if name in ctx.workloads]
    rows: list[dict] = []
    if not ctx.args.only_growth:
        if not ctx.args.skip_raw:
            rows.append(await row_a(ctx, ctx.workloads[main_name]))
        if not ctx.args.skip_naive:
            for name in mixes:
                if name != WIDE:
                    rows.append(await row_b(ctx, ctx.workloads[name]))
        if not ctx.args.skip_faust:
            rows.append(await row_c(ctx, ctx.workloads["local"], row="f", app_module="bench.noop_app"))
        for name in mixes:
            rows.append(await row_c(ctx, ctx.workloads[name]))
    growth_doc = None
    if not ctx.args.skip_growth:
        growth_rows, growth_doc = await rows_g(ctx, ctx.workloads["mixed"])
        rows += growth_rows
    report.add_ratios(rows)
    print("\n" + report.table(rows))
    print(report.notes(rows))
    if growth_doc is not None:
        print(growth.render(growth_doc))
    return {"timestamp": ctx.stamp, "args": vars(ctx.args), "environment": env,
            "workloads": {name: w.describe() for name, w in ctx.workloads.items()}, "rows": rows,
            "growth": growth_doc}


async def prepare(ctx: Context) -> None:
    """Build the workloads, create their topics and fill them."""
    names = [] if ctx.args.only_growth else ["local"] if ctx.args.only_local else ["full", "local"]
    if not ctx.args.only_growth and not ctx.args.skip_wide:
        names.append(WIDE)
    if not ctx.args.skip_growth:
        names.append("mixed")
    for name in names:
        topic = f"bench-order-event-{name}-{ctx.tag}"
        if name == WIDE:
            # The local-only mix, record for record, on the seeds' partition count.
            ctx.workloads[name] = dataclasses.replace(ctx.workloads["local"], name=name, topic=topic)
            ctx.partitions[name] = WIDE_PARTITIONS
        else:
            ctx.workloads[name] = build(name, ctx.args.events, topic=topic, tag=ctx.tag)
        partitions = ctx.partitions.get(name, PARTITIONS)
        shape = ctx.settings.model_copy(update={"order_event_partitions": partitions, "dlq_partitions": DLQ_PARTITIONS})
        specs = topic_specs(shape, events=topic, dlq=f"bench-order-event-dlq-{name}-{ctx.tag}")
        await kafka_ops.create_topics(ctx.bootstrap, specs)
        ctx.topics += [spec.name for spec in specs]
        started = time.perf_counter()
        await kafka_ops.produce(ctx.bootstrap, topic, ctx.workloads[name].records, linger_ms=20,
                                max_batch_size=1024 * 1024)
        seconds = time.perf_counter() - started
        ctx.ends[name] = await kafka_ops.end_offsets(ctx.bootstrap, topic, partitions)
        print(f"filled {topic}: {sum(ctx.ends[name].values())} records in {seconds:.1f}s", flush=True)


async def row_a(ctx: Context, workload: Workload) -> dict:
    print("a: raw consume + commit ...", flush=True)
    total = sum(ctx.ends[workload.name].values())
    return _measured(await _guard(raw_ceiling(ctx.bootstrap, workload.topic, total, ctx.group("raw"),
                                              timeout=ctx.args.timeout)), "a", workload)


async def row_b(ctx: Context, workload: Workload) -> dict:
    print(f"b: naive, one transaction per event, {ctx.args.naive_events} events ...", flush=True)
    reset_state(ctx)
    count = min(ctx.args.naive_events, sum(ctx.ends[workload.name].values()))
    result = await _guard(naive(ctx.bootstrap, workload.topic, count, ctx.group("naive"), mysql_url=ctx.db.url,
                                logistics_url=ctx.fakes.url, timeout=ctx.args.timeout))
    return _measured(result, "b", workload, row=f"b-{workload.name}")


async def row_c(ctx: Context, workload: Workload, row: str | None = None, app_module: str = "app", *,
                reset: bool = True, extra_env: dict[str, str] | None = None, design: str | None = None) -> dict:
    """One worker over ``workload``'s topic; ``reset=False`` keeps the tables as they are
    (the g rows empty them themselves, keeping the pre-fill)."""
    row = row or f"c-{workload.name}"
    print(f"{row}: faust -A {app_module} worker over {workload.topic} ...", flush=True)
    if reset:
        reset_state(ctx)
    group = ctx.group(f"worker-{row}")
    data_dir = tempfile.mkdtemp(prefix="bench-faust-")
    env = worker_env(order_event_topic=workload.topic, dlq_topic=f"bench-order-event-dlq-{workload.name}-{ctx.tag}",
                     app_id=group, mysql_url=ctx.db.url, **ctx.fakes.env(),
                     web_port=str(free_port()), worker_id="bench",
                     order_event_partitions=str(ctx.partitions.get(workload.name, PARTITIONS)),
                     dlq_partitions=str(DLQ_PARTITIONS), log_level="warning", data_dir=data_dir,
                     **(extra_env or {}))
    profile = RESULTS / f"profile-{ctx.stamp}-{row}.txt" if ctx.args.profile else None
    try:
        run_ = await run_worker(env, root=ROOT, log_path=LOGS / f"{ctx.stamp}-{row}.log", bootstrap=ctx.bootstrap,
                                group=group, topic=workload.topic, ends=ctx.ends[workload.name],
                                timeout=ctx.args.timeout, stall=ctx.args.stall, profile_to=profile,
                                app_module=app_module)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    checks = check_outcome(ctx, workload) if run_.error is None and app_module == "app" else {}
    return report.worker_row(row, workload, run_, checks, profile.relative_to(ROOT) if profile else None,
                             design=design)


# The workers of the g rows keep every pre-filled month: the partition maintenance they run
# 5 s after start drops months older than IDEM_RETENTION_DAYS (90 by default).
GROWTH_ENV = {"idem_retention_days": "400"}


async def rows_g(ctx: Context, workload: Workload) -> tuple[list[dict], dict]:
    """g-empty; t_idem pre-filled; g-<rows>; then the operations at that size (``bench.growth``)."""
    args, url = ctx.args, ctx.db.url
    label = f"g-{growth.human(args.growth_rows)}"
    doc: dict = {"growth_rows": args.growth_rows, "ledger_rows": args.growth_ledger_rows, "repeat": args.growth_repeat,
                 "worker_env": {k.upper(): v for k, v in GROWTH_ENV.items()},
                 "buffer_pool_bytes": ctx.db.scalar("SELECT @@innodb_buffer_pool_size")}
    reset_state(ctx)
    doc["partitions"] = growth.restore_partitions(url)     # the c rows' workers dropped months past 90 days
    rows = [await row_c(ctx, workload, row="g-empty", extra_env=GROWTH_ENV,
                        design="pipeline worker, waybill + SMS mix, t_idem empty")]
    if not growth.sequence_engine(url):
        doc["error"] = "MariaDB's SEQUENCE engine is not available (SELECT * FROM seq_1_to_3 failed): no pre-fill"
        print(f"{label}: {doc['error']}", flush=True)
        return rows, doc
    reset_state(ctx)
    today = datetime.now(UTC).date()
    print(f"{label}: pre-filling t_idem with {args.growth_rows:,} done rows of the past 365 days ...", flush=True)
    doc["prefill"] = growth.prefill(url, args.growth_rows, today)
    doc["size_after_prefill"] = growth.table_size(url, exact_rows=args.growth_rows)
    print(f"  pre-filled in {doc['prefill']['seconds']:.1f}s; "
          f"{doc['size_after_prefill']['bytes_per_row']:.0f} bytes per row", flush=True)
    rows.append(await row_c(ctx, workload, row=label, reset=False, extra_env=GROWTH_ENV,
                            design=f"pipeline worker, waybill + SMS mix, t_idem pre-filled with "
                                   f"{args.growth_rows:,} done rows"))
    written = sum(n * growth_rows_per_order(cycle) for cycle, n in workload.lifecycles.items())
    doc["size_after_run"] = growth.table_size(url, exact_rows=args.growth_rows + written)
    doc["size_after_run"]["rows_written_by_run"] = written
    print(f"{label}: operations at {args.growth_rows:,} rows ...", flush=True)
    try:
        doc["operations"] = await growth.operations(
            url, ctx.settings, group=ctx.groups[-1], today=today, ledger_rows=args.growth_ledger_rows,
            repeat=args.growth_repeat, prefill_rows=args.growth_rows, claim_records=workload.records)
        dropped = sum(d["rows"] for d in doc["operations"].get("drops", []))
        doc["size_after_drops"] = growth.table_size(
            url, exact_rows=args.growth_rows + written + growth.STUCK_ROWS - dropped)
    except Exception as exc:
        doc["operations_error"] = f"{exc.__class__.__name__}: {exc}"
        print(f"{label}: operations failed: {doc['operations_error']}", file=sys.stderr, flush=True)
    return rows, doc


def growth_rows_per_order(lifecycle: tuple[str, ...]) -> int:
    """t_idem rows one order of ``lifecycle`` leaves: each event's local step and its effect steps."""
    from app.pipeline.events import EventType
    from app.pipeline.steps import PIPELINES
    return sum(1 + len(PIPELINES[EventType(t)].effects) for t in lifecycle)


async def _guard(measurement):
    """Await a baseline; a timeout or failure becomes the row's error instead of ending the run."""
    try:
        return await measurement
    except Exception as exc:
        return exc


def _measured(result: Measurement | Exception, kind: str, workload: Workload, row: str | None = None) -> dict:
    if isinstance(result, Exception):
        return {"row": row or kind, "workload": workload.name, "topic": workload.topic,
                "error": f"{result.__class__.__name__}: {result}"}
    return report.baseline_row(result, workload, row=row)


def reset_state(ctx: Context) -> None:
    """Empty every table (alembic's bookkeeping aside) and the fakes' ledger, then re-apply the latency."""
    for row in ctx.db.query("SHOW TABLES"):
        table = next(iter(row.values()))
        if table != "alembic_version":
            ctx.db.query(f"TRUNCATE TABLE `{table}`")
    _post(f"{ctx.fakes.url}/__reset", {})
    _post(f"{ctx.fakes.url}/__config", fake_config(ctx.args.latency_ms))


def check_outcome(ctx: Context, workload: Workload) -> dict:
    """After (c) and (g): did every order end where its lifecycle leads (CREATED=1, PAID=2,
    CONFIRMED=3, CANCELLED=4), with one waybill per confirmed order and one SMS per cancelled one?"""
    statuses = {int(r["status"]): int(r["n"])
                for r in ctx.db.query("SELECT status, COUNT(*) AS n FROM t_order GROUP BY status")}
    with urllib.request.urlopen(f"{ctx.fakes.url}/__ledger", timeout=60) as resp:
        counts = json.loads(resp.read())["counts"]
    expected = workload.expected_orders()
    expected_waybills = workload.expected_calls("ORDER_CONFIRM")
    expected_sms = workload.expected_calls("ORDER_CANCEL")
    ok = statuses == expected and counts["waybills"] == expected_waybills and counts["sms"] == expected_sms
    return {"ok": ok, "orders_by_status": statuses, "expected_orders": expected,
            "waybills": counts["waybills"], "expected_waybills": expected_waybills,
            "sms": counts["sms"], "expected_sms": expected_sms}


def _post(url: str, body: dict) -> None:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=30).read()


def cleanup(ctx: Context) -> None:
    """Stop the fakes; unless --keep, delete topics, groups and the scratch database. Best effort."""
    steps = [("fake services", ctx.fakes.stop)]
    if not ctx.args.keep:
        steps += [("topics", lambda: asyncio.run(kafka_ops.delete_topics(ctx.bootstrap, ctx.topics))
                   if ctx.topics else None),
                  ("consumer groups", lambda: asyncio.run(kafka_ops.delete_groups(ctx.bootstrap, ctx.groups))),
                  ("scratch database", ctx.db.drop)]
    else:
        print(f"kept: topics {', '.join(ctx.topics)}; database {ctx.db.name}")
    for what, step in steps:
        try:
            step()
        except Exception as exc:
            print(f"cleanup of {what} failed: {exc!r}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
