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
             end; the steady-state rate (first to last commit seen) is printed too.
             Batch p50/p99 come from the ``order_batch_seconds`` histogram by
             linear interpolation inside buckets; DB round trips from
             ``order_db_round_trips_total`` / ``order_batches_total``; peak RSS is
             the worker's VmHWM. A metric the worker does not export shows as n/a.
             Run twice: ``c-full`` (60 % CREATED/PAID, 30 % CONFIRM with a 5 ms
             fake logistics API, 10 % duplicates) and ``c-local`` (CREATED/PAID and
             10 % duplicates: no external call).

Every run uses topics (8 partitions), consumer groups and a MariaDB scratch
database of its own, and removes them at the end (``--keep`` keeps topics and
database). Tables are emptied between rows. Results go to stdout as a markdown
table and to ``bench/results/<UTC timestamp>.json``; worker logs to ``.cache/bench/``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import shutil
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from app.adapters import kafka_ops
from app.settings import Settings
from app.topics import topic_specs
from bench import environment, report
from bench.baselines import Measurement, naive, raw_ceiling
from bench.worker import run_worker
from bench.workload import Workload, build
from tests.support.fakes import FakesProcess
from tests.support.services import ScratchDatabase, free_port, worker_env

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
LOGS = ROOT / ".cache" / "bench"
PARTITIONS = 8
DLQ_PARTITIONS = 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000, help="records per topic (default 200000)")
    parser.add_argument("--naive-events", type=int, default=20_000, help="records for the naive run (20000)")
    parser.add_argument("--skip-naive", action="store_true", help="leave out row b")
    parser.add_argument("--skip-raw", action="store_true", help="leave out row a")
    parser.add_argument("--skip-faust", action="store_true", help="leave out row f (Faust's no-op ceiling)")
    parser.add_argument("--only-local", action="store_true", help="only the local-only topic (no c-full)")
    parser.add_argument("--keep", action="store_true", help="keep the topics and the scratch database")
    parser.add_argument("--profile", action="store_true",
                        help="run the workers under pyinstrument; text reports in bench/results/")
    parser.add_argument("--latency-ms", type=float, default=5.0, help="fake logistics latency (5)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds a row may take before it is reported as timed out (600)")
    parser.add_argument("--stall", type=float, default=120.0,
                        help="seconds without a committed offset moving before (c) gives up (120)")
    args = parser.parse_args(argv)
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
    topics: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        return self.settings.kafka_bootstrap

    def group(self, row: str) -> str:
        name = f"bench-{row}-{self.tag}"
        self.groups.append(name)
        return name


def fake_config(latency_ms: float) -> dict:
    """The fakes' faults: only latency on the logistics API; the SMS gateway is not used here."""
    return {"waybill": {"latency_ms": latency_ms}}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = Settings()
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    tag = uuid.uuid4().hex[:8]
    db = scratch_database(settings.mysql_url, tag)
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
    rows: list[dict] = []
    if not ctx.args.skip_raw:
        rows.append(await row_a(ctx, ctx.workloads[main_name]))
    if not ctx.args.skip_naive:
        for name in ctx.workloads:
            rows.append(await row_b(ctx, ctx.workloads[name]))
    if not ctx.args.skip_faust:
        rows.append(await row_c(ctx, ctx.workloads["local"], row="f", app_module="bench.noop_app"))
    for name in ctx.workloads:
        rows.append(await row_c(ctx, ctx.workloads[name]))
    report.add_ratios(rows)
    print("\n" + report.table(rows))
    print(report.notes(rows))
    return {"timestamp": ctx.stamp, "args": vars(ctx.args), "environment": env,
            "workloads": {name: w.describe() for name, w in ctx.workloads.items()}, "rows": rows}


async def prepare(ctx: Context) -> None:
    """Build the workloads, create their topics and fill them."""
    names = ["local"] if ctx.args.only_local else ["full", "local"]
    for name in names:
        topic = f"bench-order-event-{name}-{ctx.tag}"
        ctx.workloads[name] = build(name, ctx.args.events, topic=topic, tag=ctx.tag)
        shape = ctx.settings.model_copy(update={"order_event_partitions": PARTITIONS, "dlq_partitions": DLQ_PARTITIONS})
        specs = topic_specs(shape, events=topic, dlq=f"bench-order-event-dlq-{name}-{ctx.tag}")
        await kafka_ops.create_topics(ctx.bootstrap, specs)
        ctx.topics += [spec.name for spec in specs]
        started = time.perf_counter()
        await kafka_ops.produce(ctx.bootstrap, topic, ctx.workloads[name].records, linger_ms=20,
                                max_batch_size=1024 * 1024)
        seconds = time.perf_counter() - started
        ctx.ends[name] = await kafka_ops.end_offsets(ctx.bootstrap, topic, PARTITIONS)
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


async def row_c(ctx: Context, workload: Workload, row: str | None = None, app_module: str = "app") -> dict:
    row = row or f"c-{workload.name}"
    print(f"{row}: faust -A {app_module} worker over {workload.topic} ...", flush=True)
    reset_state(ctx)
    group = ctx.group(f"worker-{row}")
    data_dir = tempfile.mkdtemp(prefix="bench-faust-")
    env = worker_env(order_event_topic=workload.topic, dlq_topic=f"bench-order-event-dlq-{workload.name}-{ctx.tag}",
                     app_id=group, mysql_url=ctx.db.url, logistics_url=ctx.fakes.url, sms_url=ctx.fakes.url,
                     web_port=str(free_port()), worker_id="bench", order_event_partitions=str(PARTITIONS),
                     dlq_partitions=str(DLQ_PARTITIONS), log_level="warning", data_dir=data_dir)
    profile = RESULTS / f"profile-{ctx.stamp}-{row}.txt" if ctx.args.profile else None
    try:
        run_ = await run_worker(env, root=ROOT, log_path=LOGS / f"{ctx.stamp}-{row}.log", bootstrap=ctx.bootstrap,
                                group=group, topic=workload.topic, ends=ctx.ends[workload.name],
                                timeout=ctx.args.timeout, stall=ctx.args.stall, profile_to=profile,
                                app_module=app_module)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    checks = check_outcome(ctx, workload) if run_.error is None and app_module == "app" else {}
    return report.worker_row(row, workload, run_, checks, profile.relative_to(ROOT) if profile else None)


async def _guard(measurement):
    """Await a baseline; a timeout or failure becomes the row's error instead of ending the run."""
    try:
        return await measurement
    except Exception as exc:  # noqa: BLE001 -- reported in the table
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
    """After (c): did every order end where its lifecycle leads, with one waybill per confirmed order?"""
    final = len(workload.lifecycle)            # CREATED=1, PAID=2, CONFIRMED=3
    statuses = {int(r["status"]): int(r["n"])
                for r in ctx.db.query("SELECT status, COUNT(*) AS n FROM t_order GROUP BY status")}
    with urllib.request.urlopen(f"{ctx.fakes.url}/__ledger", timeout=60) as resp:
        waybills = json.loads(resp.read())["counts"]["waybills"]
    expected_waybills = workload.orders if "ORDER_CONFIRM" in workload.lifecycle else 0
    ok = statuses == {final: workload.orders} and waybills == expected_waybills
    return {"ok": ok, "orders_by_status": statuses, "expected_orders": {final: workload.orders},
            "waybills": waybills, "expected_waybills": expected_waybills}


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
        except Exception as exc:  # noqa: BLE001 -- cleanup must go on
            print(f"cleanup of {what} failed: {exc!r}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
