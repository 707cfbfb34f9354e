"""Three brokers of our own, replication 3, min.insync.replicas 2: the worker checks its topics
at start-up, a dead letter sent while its partition's leader dies is retried and written once,
and with two of the three brokers down the worker commits nothing it could not write and goes
on when one comes back.

One cluster for the module (harness.kafka_cluster), started once; a test that leaves a
node down has it started again before the next test. The shared broker is never touched.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest

from app.adapters.kafka import ops as kafka_ops
from app.adapters.kafka.dlq import KafkaDeadLetterSink
from app.pipeline.ports import DeadLetter, SourceRecord
from harness.events import LIFECYCLE, event, order_no, record
from harness.fakes import FakesProcess
from harness.kafka_cluster import KafkaCluster
from harness.replicated import CommitWatch, Supervisor, letter_origins, own_configs, read_to_end
from harness.services import ROOT, wait_for, worker_env

RISK = "may not survive the loss of a broker"
SEND_BOUND_SECONDS = 30.0            # DLQ_SEND_TIMEOUT_SECONDS' default: what a publish may take


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = KafkaCluster(tmp_path_factory.mktemp("replicated") / "kafka", nodes=3).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def whole(cluster):
    """The module's cluster with every node running (a test before may have left one down)."""
    for node_id, node in cluster.nodes.items():
        if not node.alive:
            cluster.start_node(node_id)
    return cluster


@dataclass
class Pair:
    """An ``order-event`` / dead-letter topic pair on the cluster, and a consumer group."""

    cluster: KafkaCluster
    suffix: str
    partitions: int = 2
    dlq_partitions: int = 3

    @property
    def events(self) -> str:
        return f"replicated-order-event-{self.suffix}"

    @property
    def dlq(self) -> str:
        return f"replicated-order-event-dlq-{self.suffix}"

    @property
    def group(self) -> str:
        return f"replicated-group-{self.suffix}"

    def env(self) -> dict[str, str]:
        return {**self.cluster.env(), "ORDER_EVENT_TOPIC": self.events, "DLQ_TOPIC": self.dlq, "APP_ID": self.group,
                "ORDER_EVENT_PARTITIONS": str(self.partitions), "DLQ_PARTITIONS": str(self.dlq_partitions),
                "KAFKA_STARTUP_WAIT_SECONDS": "120"}


def create_topics(cluster: KafkaCluster, replication: int, **sizes: int) -> Pair:
    """A fresh pair, made the way an operator makes them: ``python -m app.admin create-topics``."""
    pair = Pair(cluster, f"r{replication}-{time.monotonic_ns() % 10**9}", **sizes)
    done = subprocess.run([sys.executable, "-m", "app.admin", "create-topics"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=worker_env(**pair.env(), TOPIC_REPLICATION=str(replication)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"created {pair.events}" in done.stdout and f"created {pair.dlq}" in done.stdout, done.stdout
    return pair


def committed_to_end(pair: Pair) -> bool:
    bootstrap = pair.cluster.bootstrap()
    ends = asyncio.run(kafka_ops.end_offsets(bootstrap, pair.events, pair.partitions))
    return asyncio.run(kafka_ops.committed_offsets(bootstrap, pair.group, pair.events, pair.partitions)) == ends


# -- 1. start-up: replication checked ------------------------------------------------------------

def test_topics_made_for_three_brokers_are_replicated_and_a_worker_on_weaker_ones_warns_or_refuses(
        whole, spawn_worker):
    strong = create_topics(whole, replication=3)
    weak = create_topics(whole, replication=1)
    bootstrap = whole.bootstrap()
    found = asyncio.run(kafka_ops.durability(bootstrap, [strong.events, strong.dlq, weak.events]))
    for topic in (strong.events, strong.dlq):
        assert (found[topic].replication, found[topic].min_insync, found[topic].unclean_election) == (3, 2, False)
        # These brokers default to min.insync.replicas=2; a production cluster may default to 1.
        assert asyncio.run(own_configs(bootstrap, topic)).get("min.insync.replicas") == "2", (
            f"{topic} has min.insync.replicas=2 only from the brokers' default, not of its own")
    assert found[weak.events].replication == 1

    quiet = spawn_worker(strong, "replicated")
    warned = spawn_worker(weak, "unreplicated")
    refused = spawn_worker(weak, "required", KAFKA_REQUIRE_REPLICATION="true", APP_ID=f"{weak.group}-required")

    assert refused.wait_exit(120) == 78, f"expected exit 78; log {refused.log_path}"
    assert (f"cannot start: topic {weak.events} has replication factor 1 (< 3)" in refused.logs()
            and RISK in refused.logs() and "(KAFKA_REQUIRE_REPLICATION=true)" in refused.logs()), refused.log_path
    warned.wait_log(RISK, timeout=120)
    assert f"topic {weak.events} has replication factor 1 (< 3)" in warned.logs()
    warned.wait_log("consuming ", timeout=120)          # a warning, not a refusal
    quiet.wait_log("consuming ", timeout=120)
    assert RISK not in quiet.logs() and "replication could not be read" not in quiet.logs(), quiet.log_path


# -- 2. a dead letter through a leader change ------------------------------------------------------

@dataclass
class Publish:
    started: float
    ended: float
    serials: list[int]
    error: str | None = None


@dataclass
class LetterStream:
    """Dead letters published one publish after another through ``KafkaDeadLetterSink``, by a few
    senders at once, in a thread of their own; each letter's serial is its ``dlq.original.offset``."""

    bootstrap: str
    topic: str
    senders: int = 3
    per_publish: int = 10
    publishes: list[Publish] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stopping = threading.Event()
        self._serial = iter(range(10**9))
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="letters", daemon=True)

    @property
    def acked(self) -> int:
        return sum(len(p.serials) for p in self.publishes if p.error is None)

    def start(self) -> LetterStream:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(SEND_BOUND_SECONDS * 3)
        assert not self._thread.is_alive(), "a publish did not return"

    def _letter(self, serial: int) -> DeadLetter:
        source = SourceRecord(topic="order-event", partition=0, offset=serial, timestamp_ms=int(time.time() * 1000),
                              key=f"ORD-{serial}".encode(), value=json.dumps({"serial": serial}).encode())
        return DeadLetter(record=source, reason="effect_rejected", message="sent through a leader change",
                          retriable=False, attempts=1, first_failure_at=datetime.now(UTC),
                          worker_id="leader-change")

    async def _run(self) -> None:
        sink = KafkaDeadLetterSink(self.bootstrap, self.topic, "leader-change", timeout_seconds=SEND_BOUND_SECONDS)
        await sink.start()
        try:
            await asyncio.gather(*(self._send(sink) for _ in range(self.senders)))
        finally:
            await sink.stop()

    async def _send(self, sink: KafkaDeadLetterSink) -> None:
        while not self._stopping.is_set():
            serials = [next(self._serial) for _ in range(self.per_publish)]
            started = time.monotonic()
            try:
                await sink.publish([self._letter(serial) for serial in serials])
                error = None
            except Exception as exc:                   # the worker would stop here (exit 70)
                error = repr(exc)
            self.publishes.append(Publish(started, time.monotonic(), serials, error))
            await asyncio.sleep(0.01)                   # leave the brokers some CPU


def test_a_dead_letter_sent_while_its_leader_is_killed_is_retried_within_its_bound_and_never_lost(whole):
    pair = create_topics(whole, replication=3)
    victim = whole.leader_of(pair.dlq, 0)
    controller = whole.active_controller()
    led = sorted(p for (_, p), d in whole.partitions([pair.dlq]).items() if d["leader"] == victim)
    stream = LetterStream(whole.bootstrap(), pair.dlq).start()
    try:
        wait_for(lambda: stream.acked >= 300, timeout=60, what="letters flowing")
        killed_at, at_kill = time.monotonic(), stream.acked
        whole.kill(victim)

        def moved() -> bool:
            leaders = {p: d["leader"] for (_, p), d in whole.partitions([pair.dlq]).items()}
            return all(leaders[p] in whole.nodes and leaders[p] != victim for p in led)

        whole.wait_for(moved, timeout=60, what=f"new leaders of {pair.dlq} {led}")
        failover = time.monotonic() - killed_at
        mark = at_failover = stream.acked
        wait_for(lambda: stream.acked >= mark + 300, timeout=60, what="letters acked by the new leaders")
        rejoin = whole.start_node(victim)
        mark = stream.acked
        wait_for(lambda: stream.acked >= mark + 300, timeout=60, what="letters acked with the node back")
    finally:
        stream.stop()

    failed = [p for p in stream.publishes if p.error is not None]
    assert not failed, f"{len(failed)} publishes failed, first: {failed[0].error}"
    slowest = max(p.ended - p.started for p in stream.publishes)
    assert slowest < SEND_BOUND_SECONDS
    # Each publish holds letters for every partition (random keys): one sent between the kill and
    # the new leaders could only be acknowledged after a retry, and its wait is the failover a
    # sender sees.
    across = [p for p in stream.publishes if p.ended > killed_at and p.started < killed_at + failover]
    assert across, "no publish was sent while the leader changed: nothing was retried"
    stall = max(p.ended - p.started for p in across)

    acked = Counter(s for p in stream.publishes for s in p.serials)
    found = Counter(offset for _, offset in letter_origins(
        asyncio.run(read_to_end(whole.bootstrap(), pair.dlq, pair.dlq_partitions))))
    missing = sorted(set(acked) - set(found))
    duplicates = sum(n - 1 for n in found.values())
    print(f"\nleader change: node {victim} led {pair.dlq} {led} (active controller: node {controller}); "
          f"new leaders seen after {failover:.1f}s, "
          f"publishes sent meanwhile waited up to {stall:.1f}s; "
          f"node back in every ISR after {rejoin:.1f}s; {len(stream.publishes)} publishes, {len(acked)} letters "
          f"acked ({at_kill} before the kill, {at_failover} when the new leaders were seen), "
          f"{sum(found.values())} found, {len(missing)} missing, {duplicates} duplicates; {len(across)} "
          f"publishes sent during the change")
    assert not missing, f"{len(missing)} acknowledged letters are not on {pair.dlq}: {missing[:10]}"
    assert set(found) == set(acked), "letters on the topic that no publish sent"
    assert duplicates == 0, f"{duplicates} letters written twice (the producer is idempotent)"


# -- 3. two of three brokers down ---------------------------------------------------------------

ORDERS = 32
SLOW = {"BATCH_SIZE": "6", "BATCH_WITHIN_SECONDS": "0.3", "EFFECT_CONCURRENCY": "1", "EFFECT_TIMEOUT_SECONDS": "1", "RETRY_BACKOFF_MS": "50,100,200",
        "BROKER_COMMIT_INTERVAL_SECONDS": "0.5", "BROKER_SESSION_TIMEOUT_SECONDS": "10",
        "BROKER_HEARTBEAT_INTERVAL_SECONDS": "1", "BATCH_DEADLINE_SECONDS": "8", "DLQ_SEND_TIMEOUT_SECONDS": "8",
        "COMPENSATOR_ENABLED": "false", "KAFKA_REQUIRE_REPLICATION": "true"}


@pytest.fixture
def rejecting_fakes():
    """Logistics that takes its time, so work is in flight when the brokers die, and refuses
    the orders a test names (each of their CONFIRMs becomes a dead letter)."""
    made: list[FakesProcess] = []

    def make(rejected: list[str]) -> FakesProcess:
        made.append(FakesProcess({"waybill": {"latency_ms": 250, "reject_orders": rejected}}))
        return made[-1]

    yield make
    for fakes in made:
        fakes.stop()


def test_with_two_of_three_brokers_down_nothing_unsafe_is_committed_and_the_worker_goes_on_when_one_returns(
        whole, spawn_worker, scratch_db, rejecting_fakes):
    # One partition: the orders are worked in the order produced, one waybill call at a time, each
    # taking at least the fake's latency, so the refused ones (the second half) are met at least
    # 11 calls after the kill is decided, whatever the machine's speed.
    pair = create_topics(whole, replication=3, partitions=1)
    orders = [order_no(prefix="TWODOWN") for _ in range(ORDERS)]
    rejected = orders[ORDERS // 2::4]               # met after the brokers die
    docs = [event(o, t) for o in orders for t in LIFECYCLE]
    placed = asyncio.run(kafka_ops.produce(whole.bootstrap(), pair.events, [record(d) for d in docs]))
    needs_letter = {placed[i] for i, d in enumerate(docs) if d["order_no"] in rejected and d["type"] == "ORDER_CONFIRM"}
    fakes = rejecting_fakes(rejected)
    receipts = lambda: scratch_db.scalar("SELECT COUNT(*) FROM t_waybill_receipt WHERE order_no LIKE %s",  # noqa: E731
                                         orders[0][:13] + "TWODOWN%")
    letters_ledgered = lambda: scratch_db.scalar(  # noqa: E731
        "SELECT COUNT(*) FROM t_compensation WHERE src_topic = %s", pair.events)

    env = {**SLOW, **fakes.env()}
    supervisor = Supervisor(lambda n: spawn_worker(pair, f"run{n}", **env)).start()
    watch = CommitWatch(whole.bootstrap(), pair.group, pair.events, pair.partitions, pair.dlq, pair.dlq_partitions,
                        needs_letter).start()
    try:
        wait_for(lambda: receipts() >= 5, timeout=120, what="waybills under way")
        assert letters_ledgered() == 0 and receipts() < ORDERS - len(rejected), "too late: make the work slower"
        survivor = whole.leader_of(pair.events, 0)
        down = [n for n in whole.nodes if n != survivor]
        for node_id in down:
            whole.kill(node_id)
        killed_at = time.monotonic()
        work_at_kill = receipts()
        # The worker goes on with what it has fetched until it needs a dead letter written.
        wait_for(lambda: letters_ledgered() > 0, timeout=120, what="a dead letter met while two brokers are down")
        wait_for(lambda: supervisor.exits, timeout=120, what="the worker stopping on a letter it cannot write")
        stopped_after = supervisor.exits[0][0] - killed_at
        back_started = time.monotonic()
        rejoin = whole.start_node(down[0])
        back_at = time.monotonic()
        wait_for(lambda: committed_to_end(pair), timeout=180, what="every event committed after a node returned")
        went_on = time.monotonic() - back_at
        last = supervisor.stop()
    finally:
        watch.stop()
    assert last.stop(60) == 0, f"graceful stop failed; log {last.log_path}"

    first = supervisor.workers[0]
    codes = [code for _, code in supervisor.exits]
    ledger = fakes.ledger()
    good = [o for o in orders if o not in rejected]
    letters = Counter(letter_origins(asyncio.run(read_to_end(whole.bootstrap(), pair.dlq, pair.dlq_partitions))))
    print(f"\ntwo of three down: node {survivor} kept, {work_at_kill} of {len(good)} waybills done at the kill; "
          f"first exit {codes[0]} {stopped_after:.1f}s after it, exits {codes}; node {down[0]} back in every ISR "
          f"after {rejoin:.1f}s, every event committed {went_on:.1f}s after that; {len(needs_letter)} letters "
          f"needed, {sum(letters.values())} on the topic ({sum(letters.values()) - len(letters)} duplicates); "
          f"{sum(c['service'] == 'waybill' for c in ledger['calls'])} waybill calls for {len(good)} orders; commit "
          f"polls answered while down {sum(killed_at < at < back_started for at, _ in watch.reads)}, "
          f"unanswered {watch.unreadable}")

    # Nothing acknowledged that was not safe: no commit past a record whose dead letter was not on
    # the topic, and, read while the two were down (when the cluster answered at all), no commit moved.
    assert not watch.violations, watch.violations[:5]
    during = {json.dumps(offsets) for at, offsets in watch.reads if killed_at < at < back_started}
    assert len(during) <= 1, f"commits moved while two of three brokers were down: {sorted(during)}"
    assert codes[0] == 70 and "stopping the worker without committing" in first.logs(), first.log_path

    # Exactly once in effect: one waybill per order that was not refused, none for the others; one
    # ledger row and at least one letter per refused CONFIRM.
    assert [len(ledger["waybills"].get(o, [])) for o in good] == [1] * len(good)
    assert all(not ledger["waybills"].get(o) for o in rejected)
    marks = ", ".join(["%s"] * len(orders))
    status = {r["order_no"]: r["status"] for r in scratch_db.query(
        f"SELECT order_no, status FROM t_order WHERE order_no IN ({marks})", *orders)}
    assert status == {o: 3 for o in orders}          # confirmed (a refused waybill is the letter's)
    ledgered = scratch_db.query("SELECT src_partition, src_offset FROM t_compensation WHERE src_topic = %s",
                                pair.events)
    assert sorted((r["src_partition"], r["src_offset"]) for r in ledgered) == sorted(needs_letter)
    assert set(letters) == needs_letter, f"dead letters missing: {sorted(needs_letter - set(letters))}"

    # A worker (re)started while the brokers are down is a broker outage, not a setting to fix:
    # 70 (or 69, no broker answered in time) tells its supervisor to try again; 78 says a restart
    # cannot help.
    refusals = [line for w in supervisor.workers for line in w.logs().splitlines() if "(exit 78)" in line]
    assert set(codes) <= {69, 70}, f"exits {codes} while the brokers were down: {refusals[:3]}"
