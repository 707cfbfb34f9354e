"""``python -m bench.provider_pace``: one worker against a provider at a real provider's pace.

Every other row of ``make bench`` calls a fake that answers in 5 ms. Here the waybill API of
the fakes (``demo.fakes.faults``: its pace settings) answers as real ones do, and one
``faust -A app worker`` with the defaults works a pre-filled topic of the ``full`` mix (60 %
CREATED/PAID, 30 % CONFIRM with a waybill call, 10 % duplicates):

p  tail      each call's latency lognormal, median 100 ms and sigma 0.8 (mean about 138 ms,
             p99 about 640 ms); 1 % of calls hang 5 s, past the client's timeout
             (``EFFECT_TIMEOUT_SECONDS``, 3 s).
q  limited   the same, and the provider answers 429 with ``Retry-After`` above 300 calls/s.
o  outage    5 ms calls, but from the worker's start every call hangs for 60 s (past the
             client's timeout, then 503 without doing anything); then the provider is back.
r  429s      5 ms calls, and a limit of 100 calls/s, far under what a worker asks at that
             pace: the worker learns the limit from the provider's 429s alone.
R  told      the same, the worker told the limit (``EFFECTS__WAYBILL__CALLS_PER_SECOND`` = 95).
l  latency   row p's provider, but the records produced while the worker runs, at ``--rate``
             events/s (1,000 by default, about 40 % of what row p's worker does): each event's
             latency from its send to its last step settled (``t_idem.gmt_modified``).

Reported per row:

* calls/s: the waybill calls the provider saw, at steady state (between the 5th and 95th
  percentile of their arrival times), and against the *bound*: ``EFFECT_CONCURRENCY`` over the
  mean latency, a hung call counted at the client's timeout (row p's figure for p and q);
* accepted calls/s (not answered 429 nor met by the outage), clocked over the worker's run, and
  for the rows with a limit (r, R) against it; the bound of rows r and R is the limit;
* the 429s, and the dead letters by reason: a dead letter a limit caused is a defect;
* events/s: the worker's steady rate over the whole topic (``bench.worker``), and for row o
  the events of effect-free types (CREATED, PAID) settled while the outage lasted, per second
  (from ``t_idem``'s ``gmt_modified`` of their local steps), next to the seconds from the
  outage's end until every offset was committed.

A pre-filled topic measures what a worker can do when the provider is its limit; row l
measures what an event waits below that: p50, p99 and the largest latency from send to settled
of every event that is not a duplicate (a duplicate settles nothing of its own).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from datetime import UTC, datetime

from aiokafka import AIOKafkaProducer

from app.adapters.kafka import ops as kafka_ops
from app.adapters.kafka.connection import KafkaConnection, connection_of
from app.adapters.kafka.topics import topic_specs
from app.pipeline.events import decode
from app.pipeline.plan import step_keys
from app.pipeline.states import LedgerStatus
from app.settings import Settings
from bench.run import DLQ_PARTITIONS, LOGS, PARTITIONS, RESULTS, ROOT, _post, scratch_database
from bench.worker import run_worker, stop, worker_command
from bench.workload import build
from harness.fakes import FakesProcess
from harness.services import free_port, worker_env

HANG_MS = 5_000
LIMIT = 100         # rows r and R: a provider that grants 100 calls/s, far under a worker's pace at 5 ms
TAIL = {"latency_median_ms": 100, "latency_sigma": 0.8, "timeout_rate": 0.01, "timeout_ms": HANG_MS}
ROWS = {
    "p": {"waybill": dict(TAIL)},
    "q": {"waybill": {**TAIL, "calls_per_second": 300}},
    "o": {"waybill": {"latency_ms": 5, "timeout_ms": 60_000, "outage_seconds": 60}},
    "r": {"waybill": {"latency_ms": 5, "calls_per_second": LIMIT}},
    "R": {"waybill": {"latency_ms": 5, "calls_per_second": LIMIT}},
    "l": {"waybill": dict(TAIL)},
}
# The worker's settings of a row, on top of the defaults and --set: row R tells the worker the
# provider's limit (a little under it), row r leaves it to the provider's 429s.
ROW_SETTINGS = {"R": {"EFFECTS__WAYBILL__CALLS_PER_SECOND": str(LIMIT * 0.95)}}
OUTAGE_SECONDS = 60.0
EFFECT_FREE_STEPS = ("create_order", "mark_paid")       # the local steps of CREATED and PAID


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.provider_pace", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000, help="records in the topic (20000)")
    parser.add_argument("--rows", default="p,q,o,r,R,l", help="which rows, comma-separated (p,q,o,r,R,l)")
    parser.add_argument("--rate", type=float, default=1000.0, help="row l: events produced per second (1000)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a row may take (900)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a worker setting on top of the defaults, e.g. EFFECT_CONCURRENCY=128")
    args = parser.parse_args(argv)
    unknown = set(args.rows.split(",")) - set(ROWS)
    if unknown:
        parser.error(f"unknown rows {sorted(unknown)}; use some of {', '.join(ROWS)}")
    return args


def mean_latency(pace: dict, timeout: float) -> float:
    """A call's mean seconds at this pace, a hung call counted at the client's timeout."""
    median, sigma = pace.get("latency_median_ms", 0) / 1000, pace.get("latency_sigma", 0.0)
    answered = pace.get("latency_ms", 0) / 1000 + (median * math.exp(sigma ** 2 / 2) if median else 0.0)
    hang = pace.get("timeout_rate", 0.0)
    return (1 - hang) * answered + hang * min(timeout, pace.get("timeout_ms", 0) / 1000)


def steady_rate(times: list[float]) -> float | None:
    """Calls per second between the 5th and 95th percentile of their arrival times."""
    if len(times) < 20:
        return None
    times = sorted(times)
    lo, hi = int(len(times) * 0.05), int(len(times) * 0.95)
    return (hi - lo) / (times[hi] - times[lo]) if times[hi] > times[lo] else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = Settings()
    stamp, tag = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"), uuid.uuid4().hex[:8]
    db = scratch_database(settings.database.url, tag)
    fakes = FakesProcess()
    topic, dlq = f"bench-pace-{tag}", f"bench-pace-dlq-{tag}"
    bootstrap = KafkaConnection.from_settings(settings.kafka)
    workload = build("full", args.events, topic=topic, tag=tag)
    rows = []
    try:
        shape = settings.model_copy(update={"order_event_partitions": PARTITIONS, "dlq_partitions": DLQ_PARTITIONS})
        asyncio.run(kafka_ops.create_topics(bootstrap, topic_specs(shape, events=topic, dlq=dlq)))
        asyncio.run(kafka_ops.produce(bootstrap, topic, workload.records, linger_ms=20, max_batch_size=1 << 20))
        ends = asyncio.run(kafka_ops.end_offsets(bootstrap, topic, PARTITIONS))
        extra = dict(item.split("=", 1) for item in args.set)
        for name in args.rows.split(","):
            row = _latency_row if name == "l" else _row
            rows.append(asyncio.run(row(name, args, settings, db, fakes, workload, ends, dlq, stamp, tag, extra)))
            print(render_latency([rows[-1]]) if name == "l" else render([rows[-1]]), flush=True)
    finally:
        fakes.stop()
        try:
            asyncio.run(kafka_ops.delete_topics(bootstrap, [topic, dlq]))
        except Exception as exc:
            print(f"cleanup of topics failed: {exc!r}", file=sys.stderr)
        db.drop()
    print("\n" + render([r for r in rows if r["row"] != "l"]))
    if any(r["row"] == "l" for r in rows):
        print("\n" + render_latency([r for r in rows if r["row"] == "l"]))
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"pace-{stamp}.json"
    path.write_text(json.dumps({"timestamp": stamp, "args": vars(args), "rows": rows}, indent=2, default=str) + "\n")
    print(f"\nresults: {path.relative_to(ROOT)}")
    return 1 if any(row.get("error") for row in rows) else 0


async def _row(name: str, args, settings: Settings, db, fakes: FakesProcess, workload, ends, dlq: str,
               stamp: str, tag: str, extra: dict) -> dict:
    print(f"{name}: one worker, provider {ROWS[name]['waybill']} ...", flush=True)
    _start_afresh(db, fakes)
    group = f"bench-pace-{name}-{tag}"
    data_dir = tempfile.mkdtemp(prefix="bench-faust-")
    env = worker_env(order_event_topic=workload.topic, dlq_topic=dlq, app_id=group, mysql_url=db.url, **fakes.env(),
                     web_port=str(free_port()), worker_id="bench", order_event_partitions=str(PARTITIONS),
                     dlq_partitions=str(DLQ_PARTITIONS), log_level="warning", data_dir=data_dir,
                     **{k.lower(): v for k, v in {**ROW_SETTINGS.get(name, {}), **extra}.items()})
    _post(f"{fakes.url}/__config", ROWS[name])
    configured = time.time()
    try:
        run = await run_worker(env, root=ROOT, log_path=LOGS / f"{stamp}-pace-{name}.log", bootstrap=KafkaConnection.from_settings(settings.kafka),
                               group=group, topic=workload.topic, ends=ends, timeout=args.timeout, stall=args.timeout)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    ledger = json.loads(urllib.request.urlopen(f"{fakes.url}/__ledger", timeout=60).read())
    calls = [c["at"] for c in ledger["calls"] if c["service"] == "waybill"]
    limited, met = ledger["rate_limited"].get("waybill", 0), ledger["outage_calls"].get("waybill", 0)
    concurrency = int(extra.get("EFFECT_CONCURRENCY", settings.effects.concurrency))
    timeout = float(extra.get("EFFECT_TIMEOUT_SECONDS", settings.effects.timeout_seconds))
    limit = ROWS[name]["waybill"].get("calls_per_second")
    bound = concurrency / mean_latency(ROWS["p" if name == "q" else name]["waybill"], timeout)
    if limit and name != "q":
        bound = min(bound, limit)      # the provider's limit is the bound
    letters = {r["reason"]: int(r["n"]) for r in db.query(
        "SELECT reason, COUNT(*) AS n FROM t_compensation GROUP BY reason")}
    rate = steady_rate(calls)
    doc = {"row": name, "provider": ROWS[name]["waybill"], "events": run.events, "seconds": run.seconds,
           "steady_events_per_second": run.steady_events_per_second, "calls": len(calls),
           "calls_per_second": rate, "bound_calls_per_second": bound,
           "of_bound": rate / bound if rate and name != "o" else None,
           "accepted_calls": len(calls) - limited - met, "rate_limited": limited, "outage_calls": met,
           "accepted_calls_per_second": (len(calls) - limited - met) / run.seconds if run.seconds else None,
           "waybills": ledger["counts"]["waybills"], "expected_waybills": workload.expected_calls("ORDER_CONFIRM"),
           "dead_letters": letters, "error": run.error, "log": run.log, "commits": run.commits}
    if limit:
        doc["of_limit"] = doc["accepted_calls_per_second"] / limit if run.seconds else None
    if name == "o":
        ended = configured + OUTAGE_SECONDS
        [found] = db.query(
            "SELECT COUNT(*) AS n, UNIX_TIMESTAMP(MIN(gmt_modified)) AS first, UNIX_TIMESTAMP(MAX(gmt_modified)) AS last "
            "FROM t_idem WHERE step IN (%s, %s) AND status = 2 "
            "AND gmt_modified BETWEEN FROM_UNIXTIME(%s) AND FROM_UNIXTIME(%s)", *EFFECT_FREE_STEPS, configured, ended)
        # Per second while the worker worked in the outage: a topic worked off before the outage
        # ends would otherwise be divided by seconds in which nothing was left to do.
        span = float(found["last"] or 0) - float(found["first"] or 0)
        doc["effect_free_events_per_second_in_outage"] = int(found["n"]) / span if span > 0 else None
        healthy_at = configured + (run.startup_seconds or 0.0)
        doc["drain_seconds_after_outage"] = (healthy_at + run.seconds - ended) if run.seconds else None
        doc["letters_settled_seconds_after_outage"] = await _letters_settled(env, db, ended, args.timeout, stamp)
    return doc


def _start_afresh(db, fakes: FakesProcess) -> None:
    """Empty every table but the migrations' and reset the fakes: each row starts from nothing."""
    for row in db.query("SHOW TABLES"):
        table = next(iter(row.values()))
        if table != "alembic_version":
            db.query(f"TRUNCATE TABLE `{table}`")
    _post(f"{fakes.url}/__reset", {})


async def _latency_row(name: str, args, settings: Settings, db, fakes: FakesProcess, workload, ends, dlq: str,
                       stamp: str, tag: str, extra: dict) -> dict:
    """Row l: the workload produced at ``args.rate`` while one worker runs; each event's latency."""
    print(f"{name}: one worker, provider {ROWS[name]['waybill']}, {args.rate:,.0f} events/s produced ...", flush=True)
    _start_afresh(db, fakes)
    _post(f"{fakes.url}/__config", ROWS[name])
    bootstrap = KafkaConnection.from_settings(settings.kafka)
    topic, group = f"bench-pace-lat-{tag}", f"bench-pace-{name}-{tag}"
    shape = settings.model_copy(update={"order_event_partitions": PARTITIONS, "dlq_partitions": DLQ_PARTITIONS})
    await kafka_ops.create_topics(bootstrap, topic_specs(shape, events=topic, dlq=f"{dlq}-lat"))
    data_dir = tempfile.mkdtemp(prefix="bench-faust-")
    port = free_port()
    env = worker_env(order_event_topic=topic, dlq_topic=f"{dlq}-lat", app_id=group, mysql_url=db.url, **fakes.env(),
                     web_port=str(port), worker_id="bench", order_event_partitions=str(PARTITIONS),
                     dlq_partitions=str(DLQ_PARTITIONS), log_level="warning", data_dir=data_dir,
                     **{k.lower(): v for k, v in extra.items()})
    doc: dict = {"row": name, "provider": ROWS[name]["waybill"], "rate": args.rate, "events": len(workload.records),
                 "error": None}
    with open(LOGS / f"{stamp}-pace-{name}.log", "ab") as log:
        proc = subprocess.Popen(worker_command(None), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + args.timeout
            while not _answers(f"http://127.0.0.1:{port}/health"):
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError("the worker did not start")
                await asyncio.sleep(0.2)
            sent = await _paced_produce(bootstrap, topic, workload.records, args.rate)
            ends: dict[int, int] = {}
            for _, partition, offset in sent:
                ends[partition] = max(ends.get(partition, 0), offset + 1)
            while await kafka_ops.committed_offsets(bootstrap, group, topic, PARTITIONS) != \
                    {p: ends.get(p, 0) for p in range(PARTITIONS)}:
                if proc.poll() is not None or time.time() > deadline:
                    doc["error"] = "the worker did not commit every record in time"
                    break
                await asyncio.sleep(0.5)
        finally:
            stop(proc)
            shutil.rmtree(data_dir, ignore_errors=True)
            try:
                await kafka_ops.delete_topics(bootstrap, [topic, f"{dlq}-lat"])
            except Exception as exc:
                print(f"cleanup of topics failed: {exc!r}", file=sys.stderr)
    settled = {r["biz_key"]: float(r["at"]) for r in db.query(
        "SELECT biz_key, UNIX_TIMESTAMP(gmt_modified) AS at FROM t_idem WHERE status = 2")}
    latencies, unsettled = event_latencies(workload.records, [at for at, _, _ in sent], settled)

    def share(q: float) -> float | None:
        return latencies[min(int(len(latencies) * q), len(latencies) - 1)] if latencies else None

    letters = {r["reason"]: int(r["n"]) for r in db.query(
        "SELECT reason, COUNT(*) AS n FROM t_compensation GROUP BY reason")}
    doc.update({"measured": len(latencies), "unsettled": unsettled, "latency_p50": share(0.5),
                "latency_p99": share(0.99), "latency_max": latencies[-1] if latencies else None,
                "dead_letters": letters})
    return doc


def event_latencies(records, sent_at: list[float], settled: dict[str, float]) -> tuple[list[float], int]:
    """Each event's seconds from its send to its last step settled, sorted, and how many events have
    a step not settled. A duplicate (its first step key seen before) settles nothing of its own."""
    latencies, seen, unsettled = [], set(), 0
    for (key, value), at in zip(records, sent_at):
        keys = step_keys(decode(key, value, max_bytes=1 << 22))
        if keys[0] in seen:
            continue
        seen.add(keys[0])
        if all(k in settled for k in keys):
            latencies.append(max(settled[k] for k in keys) - at)
        else:
            unsettled += 1
    return sorted(latencies), unsettled


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).read()
        return True
    except OSError:
        return False


async def _paced_produce(bootstrap: KafkaConnection, topic: str, records, rate: float) -> list[tuple[float, int, int]]:
    """Send ``records`` at ``rate`` per second (in ticks of 10 ms), an order's records to one partition;
    each record's send time (``time.time()``), partition and offset."""
    producer = AIOKafkaProducer(acks="all", enable_idempotence=True, linger_ms=2,
                                **connection_of(bootstrap).client_options())
    await producer.start()
    try:
        started = time.monotonic()
        pending: list[tuple[float, asyncio.Future]] = []
        for i, (key, value) in enumerate(records):
            due = started + i / rate
            if (wait := due - time.monotonic()) > 0.01:
                await asyncio.sleep(wait)
            pending.append((time.time(), await producer.send(topic, value=value, key=key)))
        return [(at, meta.partition, meta.offset) for at, meta in
                zip([at for at, _ in pending], await asyncio.gather(*(f for _, f in pending)))]
    finally:
        await producer.stop()


async def _letters_settled(env: dict, db, ended: float, timeout: float, stamp: str) -> float | None:
    """The seconds from the outage's end until the compensator of a worker (started again) has
    settled every dead letter the outage caused; None if it did not within ``timeout``."""
    unsettled = f"SELECT COUNT(*) FROM t_compensation WHERE status IN ({int(LedgerStatus.OPEN)}, {int(LedgerStatus.RETRYING)})"
    if not int(db.scalar(unsettled) or 0):
        return 0.0
    data_dir = tempfile.mkdtemp(prefix="bench-faust-")
    with open(LOGS / f"{stamp}-pace-o-letters.log", "ab") as log:
        proc = subprocess.Popen(worker_command(None), cwd=ROOT, env={**env, "DATA_DIR": data_dir},
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + timeout
            while time.time() < deadline:
                if not int(db.scalar(unsettled) or 0):
                    return max(time.time() - ended, 0.0)
                await asyncio.sleep(1)
            return None
        finally:
            stop(proc)
            shutil.rmtree(data_dir, ignore_errors=True)


def render(rows: list[dict]) -> str:
    def f(value, fmt="{:,.0f}"):
        return "n/a" if value is None else fmt.format(value)

    lines = ["| row | events/s (steady) | calls/s (steady) | accepted calls/s (clocked) | bound | of bound | 429s | "
             "dead letters | effect-free ev/s in outage | drain after outage | letters settled after outage |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        letters = ", ".join(f"{k} {v}" for k, v in sorted(r["dead_letters"].items())) or "0"
        lines.append(f"| {r['row']} | {f(r['steady_events_per_second'])} | {f(r['calls_per_second'])} | "
                     f"{f(r.get('accepted_calls_per_second'))} | "
                     f"{f(r['bound_calls_per_second'])} | {f(r.get('of_bound'), '{:.2f}')} | {r['rate_limited']:,} | "
                     f"{letters} | {f(r.get('effect_free_events_per_second_in_outage'))} | "
                     f"{f(r.get('drain_seconds_after_outage'), '{:.1f} s')} | "
                     f"{f(r.get('letters_settled_seconds_after_outage'), '{:.0f} s')} |")
    return "\n".join(lines)


def render_latency(rows: list[dict]) -> str:
    lines = ["| row | produced ev/s | events measured | p50 | p99 | max | unsettled | dead letters |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        letters = ", ".join(f"{k} {v}" for k, v in sorted(r.get("dead_letters", {}).items())) or "0"
        ms = [("n/a" if r.get(k) is None else f"{r[k] * 1000:,.0f} ms") for k in ("latency_p50", "latency_p99",
                                                                               "latency_max")]
        lines.append(f"| {r['row']} | {r['rate']:,.0f} | {r.get('measured', 0):,} | {ms[0]} | {ms[1]} | {ms[2]} | "
                     f"{r.get('unsettled', 'n/a')} | {letters} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
