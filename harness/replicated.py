"""What tests on a replicated cluster (``harness.kafka_cluster``) ask besides the cluster's
own state: a topic read to its end, the configs a topic was given itself, a supervisor that
restarts a worker as an orchestrator would, and a watch that checks every commit of a group
against the dead letters it needs.

Everything here talks to the cluster with clients of its own, so a test can use it while the
cluster is losing and regaining nodes: a call that finds no broker raises, or times out, and the
caller decides whether that is an answer.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from app.adapters.kafka import ops as kafka_ops
from harness.services import Worker

TOPIC_CONFIG = 1        # DescribeConfigs (v1+) config_source: set on the topic itself


async def read_to_end(kafka: str, topic: str, partitions: int, *, isolation_level: str = "read_committed",
                      timeout: float = 60.0) -> list:
    """Every record of ``topic`` from its start to the end offsets it had when asked (a topic
    without transactions: its records' offsets run without gaps up to the end)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka, group_id=None, enable_auto_commit=False,
                                auto_offset_reset="earliest", isolation_level=isolation_level,
                                request_timeout_ms=10_000)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        reached = {tp: 0 for tp in tps}
        records: list = []
        deadline = time.monotonic() + timeout
        while any(reached[tp] < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic} not read to its end {ends} within {timeout:g}s (at {reached})")
            for tp, items in (await consumer.getmany(timeout_ms=500)).items():
                records.extend(items)
                reached[tp] = items[-1].offset + 1
        return records
    finally:
        await consumer.stop()


async def own_configs(kafka: str, topic: str) -> dict[str, str]:
    """The configs set on ``topic`` itself, not inherited from a broker's settings or Kafka's
    defaults (a cluster whose brokers default to a config hides whether the topic has it)."""
    async with kafka_ops.admin(kafka) as client:
        [response] = await client.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    if response.API_VERSION < 1:
        raise AssertionError("DescribeConfigs v0 does not say where a config comes from")
    found = {}
    for _code, _message, _type, _name, entries, *_ in response.resources:
        for name, value, _read_only, source, *_ in entries:
            if source == TOPIC_CONFIG:
                found[name] = value
    return found


def letter_origins(records) -> list[tuple[int, int]]:
    """(original partition, original offset) of each dead letter, from its ``dlq.`` headers."""
    origins = []
    for rec in records:
        headers = {k: v.decode() for k, v in rec.headers}
        origins.append((int(headers["dlq.original.partition"]), int(headers["dlq.original.offset"])))
    return origins


class Supervisor:
    """Starts a worker and, whenever it exits, a fresh one at once, as an orchestrator does with
    a process that stopped (exit 70: stopped without committing, by design). Keeps each exit."""

    def __init__(self, spawn: Callable[[int], Worker]) -> None:
        self._spawn = spawn
        self.workers: list[Worker] = []
        self.exits: list[tuple[float, int]] = []        # (monotonic time, exit code)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="supervisor", daemon=True)

    @property
    def current(self) -> Worker:
        return self.workers[-1]

    def start(self) -> Supervisor:
        self.workers.append(self._spawn(0))
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                code = self.current.proc.wait(0.2)
            except subprocess.TimeoutExpired:
                continue
            self.exits.append((time.monotonic(), code))
            if not self._stopping.is_set():
                self.workers.append(self._spawn(len(self.workers)))

    def stop(self) -> Worker:
        """No more restarts; returns the worker running now (the caller stops it)."""
        self._stopping.set()
        self._thread.join(30)
        return self.current


@dataclass
class CommitWatch:
    """Polls a group's committed offsets of a topic; whenever they move, reads the dead-letter
    topic and checks that every record below them that needs a dead letter has one there.

    A worker writes a record's dead letter, acknowledged, before it may commit past the record;
    so once a commit is seen, the letter must already be readable. A violation is a record the
    group has committed past whose letter the topic does not hold (yet)."""

    kafka: str
    group: str
    topic: str
    partitions: int
    dlq: str
    dlq_partitions: int
    needs_letter: set[tuple[int, int]]                    # (partition, offset) of records that must be dead-lettered
    reads: list[tuple[float, dict[int, int]]] = field(default_factory=list)  # (monotonic time asked, offsets)
    unreadable: int = 0                                   # polls that got no answer (no coordinator, no quorum)
    violations: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="commit-watch", daemon=True)

    def start(self) -> CommitWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(60)

    async def _run(self) -> None:
        last: dict[int, int] | None = None
        while not self._stopping.is_set():
            asked = time.monotonic()
            try:
                committed = await asyncio.wait_for(
                    kafka_ops.committed_offsets(self.kafka, self.group, self.topic, self.partitions), 10)
                self.reads.append((asked, committed))
                if committed != last:
                    letters = set(letter_origins(await asyncio.wait_for(
                        read_to_end(self.kafka, self.dlq, self.dlq_partitions), 20)))
                    self._check(committed, letters)
                    last = committed
            except Exception:          # the cluster cannot answer now: try again
                self.unreadable += 1
            await asyncio.sleep(0.5)

    def _check(self, committed: dict[int, int], letters: set[tuple[int, int]]) -> None:
        for partition, offset in sorted(self.needs_letter):
            if offset < committed.get(partition, 0) and (partition, offset) not in letters:
                self.violations.append(f"committed {committed} past {self.topic}[{partition}]@{offset}, "
                                       f"whose dead letter is not on {self.dlq}")
