"""``python -m bench.scale_step``: what one step of an autoscaler costs the consumer group.

A worker (A) works a pre-filled topic of the ``full`` mix (8 partitions) against the fake
waybill API at a real provider's pace (row p of ``bench.provider_pace``: lognormal latency,
median 100 ms, 1 % of calls hanging past the client's timeout), so calls are in flight whenever
the group rebalances. Once A commits, a second worker (B) joins the group (a scale-up step);
once the group settled, B is stopped with SIGTERM (a scale-down step). Each worker's own
histogram ``order_kafka_rebalance_seconds`` (Faust's rebalance start -> assignment done: the time
its partitions were not read) gives the pause of each step for A, and B's join. Repeated
``--trials`` times, each on an empty store and a new group. Also reported: A's peak RSS (VmHWM).

The autoscaling section of docs/deploying-kubernetes.md cites its results.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from app.adapters.kafka import ops as kafka_ops
from app.adapters.kafka.connection import KafkaConnection
from app.adapters.kafka.ops import CommittedOffsets, admin
from app.adapters.kafka.topics import topic_specs
from app.settings import Settings
from bench.provider_pace import ROWS, _start_afresh
from bench.run import DLQ_PARTITIONS, LOGS, PARTITIONS, RESULTS, ROOT, _post, scratch_database
from bench.worker import peak_rss_mb, stop, worker_command
from bench.workload import build
from harness.fakes import FakesProcess
from harness.services import free_port, worker_env


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.scale_step", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=60_000, help="records in the topic (60000)")
    parser.add_argument("--trials", type=int, default=3, help="join-and-leave trials (3)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds a trial may take (180)")
    return parser.parse_args(argv)


async def rebalances(http: aiohttp.ClientSession, port: str) -> tuple[float, float]:
    """(count, seconds summed) of a worker's order_kafka_rebalance_seconds; (0, 0) before it answers."""
    try:
        async with http.get(f"http://127.0.0.1:{port}/metrics", timeout=aiohttp.ClientTimeout(total=5)) as resp:
            text = await resp.text()
    except (TimeoutError, aiohttp.ClientError):
        return 0.0, 0.0
    found = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
             if s.name in ("order_kafka_rebalance_seconds_count", "order_kafka_rebalance_seconds_sum")}
    return found.get("order_kafka_rebalance_seconds_count", 0.0), found.get("order_kafka_rebalance_seconds_sum", 0.0)


async def until(what: str, predicate, deadline: float, *procs: subprocess.Popen):
    while True:
        value = await predicate()
        if value:
            return value
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"a worker exited ({proc.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within the trial's timeout")
        await asyncio.sleep(0.1)


async def trial(n: int, args, settings: Settings, db, fakes: FakesProcess, topic: str, dlq: str, stamp: str,
                tag: str) -> dict:
    _start_afresh(db, fakes)
    _post(f"{fakes.url}/__config", ROWS["p"])
    group = f"bench-scale-{n}-{tag}"
    data = tempfile.mkdtemp(prefix="bench-faust-")
    envs = {name: worker_env(order_event_topic=topic, dlq_topic=dlq, app_id=group, mysql_url=db.url, **fakes.env(),
                             web_port=str(free_port()), worker_id=f"bench-{name}", log_level="warning",
                             order_event_partitions=str(PARTITIONS), dlq_partitions=str(DLQ_PARTITIONS),
                             data_dir=f"{data}/{name}") for name in ("a", "b")}
    deadline = time.monotonic() + args.timeout
    logs = {name: open(LOGS / f"{stamp}-scale-{n}-{name}.log", "ab") for name in envs}
    procs: dict[str, subprocess.Popen] = {}
    try:
        async with aiohttp.ClientSession() as http, admin(KafkaConnection.from_settings(settings.kafka)) as client:
            committed = CommittedOffsets(client, group, topic)
            a, b = envs["a"]["WEB_PORT"], envs["b"]["WEB_PORT"]
            procs["a"] = subprocess.Popen(worker_command(None), cwd=ROOT, env=envs["a"], stdout=logs["a"],
                                          stderr=subprocess.STDOUT)

            async def a_commits():
                return sum(o for o in (await committed.read()).values() if o > 0) > 0

            await until("A's first commit", a_commits, deadline, procs["a"])
            base = await until("A's join", lambda: _counted(http, a, 1), deadline, procs["a"])
            procs["b"] = subprocess.Popen(worker_command(None), cwd=ROOT, env=envs["b"], stdout=logs["b"],
                                          stderr=subprocess.STDOUT)
            joined = await until("the rebalance B's join made", lambda: _counted(http, a, 2), deadline, *procs.values())
            b_join = await until("B's join", lambda: _counted(http, b, 1), deadline, *procs.values())
            stop(procs["b"])
            left = await until("the rebalance B's leaving made", lambda: _counted(http, a, 3), deadline, procs["a"])
            return {"trial": n, "join_pause_a": joined[1] - base[1], "join_b": b_join[1],
                    "leave_pause_a": left[1] - joined[1], "b_exit": procs["b"].returncode,
                    "peak_rss_mb_a": peak_rss_mb(procs["a"].pid)}
    finally:
        for proc in procs.values():
            stop(proc)
        for log in logs.values():
            log.close()
        shutil.rmtree(data, ignore_errors=True)


async def _counted(http: aiohttp.ClientSession, port: str, count: int):
    seen = await rebalances(http, port)
    return seen if seen[0] >= count else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = Settings()
    stamp, tag = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"), uuid.uuid4().hex[:8]
    LOGS.mkdir(parents=True, exist_ok=True)
    db = scratch_database(settings.database.url, tag)
    fakes = FakesProcess()
    topic, dlq = f"bench-scale-{tag}", f"bench-scale-dlq-{tag}"
    bootstrap = KafkaConnection.from_settings(settings.kafka)
    rows = []
    try:
        shape = settings.model_copy(update={"order_event_partitions": PARTITIONS, "dlq_partitions": DLQ_PARTITIONS})
        asyncio.run(kafka_ops.create_topics(bootstrap, topic_specs(shape, events=topic, dlq=dlq)))
        workload = build("full", args.events, topic=topic, tag=tag)
        asyncio.run(kafka_ops.produce(bootstrap, topic, workload.records, linger_ms=20, max_batch_size=1 << 20))
        for n in range(1, args.trials + 1):
            rows.append(asyncio.run(trial(n, args, settings, db, fakes, topic, dlq, stamp, tag)))
            r = rows[-1]
            print(f"trial {n}: join: A paused {r['join_pause_a']:.2f} s (B's own join {r['join_b']:.2f} s); "
                  f"leave: A paused {r['leave_pause_a']:.2f} s (B exit {r['b_exit']}); A's peak RSS "
                  f"{r['peak_rss_mb_a']:.0f} MiB", flush=True)
    finally:
        fakes.stop()
        try:
            asyncio.run(kafka_ops.delete_topics(bootstrap, [topic, dlq]))
        except Exception as exc:
            print(f"cleanup of topics failed: {exc!r}", file=sys.stderr)
        db.drop()
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"scale-{stamp}.json"
    path.write_text(json.dumps({"timestamp": stamp, "args": vars(args), "trials": rows}, indent=2) + "\n")
    print(f"results: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
