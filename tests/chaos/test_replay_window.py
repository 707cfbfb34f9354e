"""The replay window W, measured against the capacity model (app.pipeline.capacity).

A real worker processes a steady stream of CREATED/PAID events (Kafka and MySQL only,
no external calls). Mid-stream it is stopped, a second worker drains the topic, and W is
the second worker's ``order_events_replayed_total``: the events the first one had done in
t_idem whose offsets it had not committed.

    SIGKILL   0 < W <= min(r x commit interval, commit every), in whole batches, + the batch in flight
    SIGTERM   W = 0: the batch in flight finishes and the acknowledged offsets are committed

The kill is timed against the commits the broker shows: it lands ``KILL_PHASE`` of a commit
interval after one, so thousands of acknowledged offsets are uncommitted. W grows a whole
batch at a time (500 events every 0.5 s at 1,000 events/s), so a kill in the first batch
period after a commit (up to 0.5 s of every 2.8 s) finds nothing done past the committed
offsets: W = 0 there is right, not a miss, and a kill timed at random would see it up to
one time in six.

Each W is checked twice more: against the events the producer placed at or past the
committed offsets and that t_idem held done before the second worker started (exactly W),
and against end minus committed offsets at the kill (at least W). Each run appends a line
to replay-window.jsonl.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
import urllib.request
from dataclasses import dataclass, field

import pytest
from aiokafka import AIOKafkaProducer

from app.adapters.kafka import ops as kafka_ops
from app.adapters.kafka.topics import EVENT_MAX_MESSAGE_BYTES
from app.pipeline.capacity import Inputs, budget, window
from app.pipeline.events import decode
from app.pipeline.plan import keys_per_event, step_keys
from harness.events import event, order_no, record
from harness.services import LOGS, caught_up, wait_for

RATE = 1_000                 # events/s asked of the producer
CHUNK = 20                   # events per tick: 10 orders, CREATED then PAID (same key, same partition)
STEADY_SECONDS = 8.0         # streaming before the kill: the worker keeps up and commits a few times
MIN_COMMITS = 3
KILL_PHASE = 0.75            # of a commit interval after a commit the broker shows
POLL_SECONDS = 0.05
# Only what makes the second worker take over in seconds instead of 30 (session timeout after
# a SIGKILL; a batch's deadline must stay under it, and no record retries here). The settings W
# depends on (commit interval and count, batch size and window) stay at their defaults, and the
# bound is computed from them.
ENV = {"BROKER_SESSION_TIMEOUT_SECONDS": "6", "BROKER_HEARTBEAT_INTERVAL_SECONDS": "1",
       "BATCH_DEADLINE_SECONDS": "5"}


@dataclass
class Run:
    """What the stream and the stop left behind."""
    docs: list[dict] = field(default_factory=list)
    placed: list[tuple[int, int]] = field(default_factory=list)      # (partition, offset) of each doc
    sent_at: list[tuple[float, int]] = field(default_factory=list)   # (monotonic time, events sent so far)
    commits: list[tuple[float, int]] = field(default_factory=list)   # (seen at, sum of committed offsets)
    stopped_at: float = 0.0
    committed: dict[int, int] = field(default_factory=dict)          # right after the stop
    end: dict[int, int] = field(default_factory=dict)                # right after the stop

    def rate(self, since: float | None = None) -> float:
        """Events/s sent from ``since`` (default: the first tick) until the stop."""
        ticks = [(t, n) for t, n in self.sent_at if t <= self.stopped_at and (since is None or t >= since)]
        (t0, n0), (t1, n1) = ticks[0], ticks[-1]
        return (n1 - n0) / (t1 - t0)


async def stream(settings, topic: str, prefix: str, run: Run, stop: asyncio.Event) -> None:
    """Fresh orders, CREATED then PAID, ``CHUNK`` events every ``CHUNK / RATE`` seconds on
    one idempotent acks=all producer (kafka_ops.produce's settings; one producer for the
    whole stream, since starting one per tick would cost more than a tick)."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap, acks="all", enable_idempotence=True,
                                linger_ms=5, max_request_size=EVENT_MAX_MESSAGE_BYTES)
    await producer.start()
    pending = []
    try:
        tick, t0, k = CHUNK / RATE, time.monotonic(), 0
        while not stop.is_set():
            await asyncio.sleep(max(0.0, t0 + k * tick - time.monotonic()))
            for _ in range(CHUNK // 2):
                o = order_no(prefix=prefix)
                for doc in (event(o, "ORDER_CREATED"), event(o, "ORDER_PAID")):
                    key, value = record(doc)
                    run.docs.append(doc)
                    pending.append(await producer.send(topic, value=value, key=key))
            run.sent_at.append((time.monotonic(), len(run.docs)))
            k += 1
        run.placed = [(m.partition, m.offset) for m in await asyncio.gather(*pending)]
    finally:
        await producer.stop()


async def stream_then_stop(settings, pair, worker, kind: str, prefix: str) -> Run:
    """Stream; once the worker has committed a few times, stop it ``KILL_PHASE`` of a commit
    interval after a commit; read the offsets; end the stream."""
    run, stop = Run(), asyncio.Event()
    producing = asyncio.create_task(stream(settings, pair.events, prefix, run, stop))
    interval = settings.kafka.commit_interval_seconds
    try:
        async with kafka_ops.admin(settings.kafka.bootstrap) as client:
            offsets = kafka_ops.CommittedOffsets(client, pair.group, pair.events)
            started, last = time.monotonic(), 0
            deadline = started + STEADY_SECONDS + 4 * interval
            while True:
                await asyncio.sleep(POLL_SECONDS)
                assert not producing.done(), producing.exception()
                assert worker.alive, f"worker exited early; log {worker.log_path}"
                total = sum((await offsets.read()).values())
                now = time.monotonic()
                if total != last:
                    run.commits.append((now, total))
                    last = total
                since = now - run.commits[-1][0] if run.commits else 0.0
                if (now - started >= STEADY_SECONDS and len(run.commits) >= MIN_COMMITS
                        and KILL_PHASE * interval <= since < KILL_PHASE * interval + 2 * POLL_SECONDS):
                    break
                assert now < deadline, f"no commit to time the stop by ({len(run.commits)} seen); " \
                                       f"log {worker.log_path}"
            run.stopped_at = time.monotonic()
            if kind == "sigkill":
                worker.kill(signal.SIGKILL)
                assert await asyncio.to_thread(worker.wait_exit, 30) == -signal.SIGKILL
            else:
                assert await asyncio.to_thread(worker.stop, 60) == 0, f"unclean stop; log {worker.log_path}"
            # The first worker is gone: what it committed is final, and nothing it processed is
            # past these end offsets (read after its exit, so they can only be larger).
            run.committed = await offsets.read()
            run.committed = {p: run.committed.get(p, 0) for p in range(pair.partitions)}
        run.end = await kafka_ops.end_offsets(settings.kafka.bootstrap, pair.events, pair.partitions)
    finally:
        stop.set()
        await producing
    return run


def replayed(worker) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{worker.web_port}/metrics", timeout=10).read().decode()
    found = re.search(r"^order_events_replayed_total (\S+)$", text, re.M)
    assert found, "no order_events_replayed_total sample in /metrics"
    return float(found.group(1))


def done(db, keys: list[str]) -> set[str]:
    found: set[str] = set()
    for i in range(0, len(keys), 2000):
        part = keys[i:i + 2000]
        marks = ", ".join(["%s"] * len(part))
        found |= {r["biz_key"] for r in db.query(
            f"SELECT biz_key FROM t_idem WHERE status = 2 AND biz_key IN ({marks})", *part)}
    return found


def model(settings, rate: float, partitions: int):
    """The capacity model with the worker's own settings, one worker at the measured rate."""
    inputs = Inputs(rate=rate, peak_rate=rate, worker_max_rate=rate, partitions=partitions, workers=1,
                    retention_days=settings.operations.idem_retention_days,
                    commit_interval=settings.kafka.commit_interval_seconds,
                    commit_every=settings.kafka.commit_every, max_poll_records=settings.kafka.max_poll_records,
                    batch_size=settings.batches.size, batch_within=settings.batches.within_seconds,
                    keys_per_event=keys_per_event(), row_bytes=settings.operations.capacity_row_bytes,
                    offsets_retention_days=settings.operations.kafka_offsets_retention_days,
                    outage_sla_days=settings.operations.capacity_outage_sla_days, dead_letter_days=0)
    return budget(inputs).w_kill, window(inputs, rate)


@pytest.mark.parametrize("kind", ["sigkill", "sigterm"])
def test_replay_window_after_a_stop_mid_stream(kind, settings, topics, spawn_worker, scratch_db):
    pair = topics(partitions=4)
    first = spawn_worker(pair, "w1", **ENV)
    first.wait_log("Worker ready", timeout=60)

    run = asyncio.run(stream_then_stop(settings, pair, first, kind, prefix=f"RW{kind[3:].upper()}"))
    keys = [step_keys(decode(*record(d), max_bytes=1 << 20))[0] for d in run.docs]
    # Before the second worker starts: what the first one left done, beyond and within its commits.
    beyond = [k for k, (p, o) in zip(keys, run.placed) if o >= run.committed[p]]
    within = [k for k, (p, o) in zip(keys, run.placed) if o < run.committed[p]]
    expected = len(done(scratch_db, beyond))
    assert len(done(scratch_db, within)) == len(within), "offsets committed for events not done"

    second = spawn_worker(pair, "w2", **ENV)
    wait_for(lambda: caught_up(settings, pair.events, pair.group, pair.partitions), timeout=60,
             what="the second worker drained the topic", workers=[second])
    w = replayed(second)
    assert len(done(scratch_db, keys)) == len(keys), "events lost"
    orders = {d["order_no"] for d in run.docs}
    marks = ", ".join(["%s"] * len(orders))
    assert scratch_db.scalar(f"SELECT COUNT(*) FROM t_order WHERE status = 2 AND order_no IN ({marks})",
                             *orders) == len(orders)
    second.stop()

    rate, recent = run.rate(), run.rate(since=run.stopped_at - settings.kafka.commit_interval_seconds)
    bound, (acked, in_flight) = model(settings, rate, pair.partitions)
    uncommitted = sum(run.end.values()) - sum(run.committed.values())
    figures = {"kill": kind, "rate": round(rate, 1), "rate_last_interval": round(recent, 1), "W": w,
               "W_from_t_idem": expected, "bound": bound, "bound_acked": acked, "bound_in_flight": in_flight,
               "end_minus_committed": uncommitted, "committed": run.committed, "end": run.end,
               "events": len(run.docs), "commits_seen": len(run.commits),
               "stop_after_commit_s": round(run.stopped_at - run.commits[-1][0], 3)}
    print(f"\nreplay window: {json.dumps(figures)}")
    LOGS.mkdir(parents=True, exist_ok=True)
    with open(LOGS / "replay-window.jsonl", "a") as out:
        out.write(json.dumps(figures) + "\n")

    assert abs(recent - rate) <= 0.1 * rate, f"the stream was not steady: {recent:.0f}/s lately, {rate:.0f}/s overall"
    assert w == expected, f"W = {w:g} replayed, but t_idem held {expected} done events past the committed offsets"
    assert w <= uncommitted
    if kind == "sigterm":
        assert w == 0, f"a clean stop replayed {w:g} events"
    else:
        assert 0 < w <= bound, f"W = {w:g} outside (0, {bound}] at {rate:.0f} events/s"
