"""Workers that heal themselves: through broker SIGKILLs they consume again, while they cannot
work /readyz says why, and SIGTERM with the broker gone ends within STOP_TIMEOUT_SECONDS. (The
exit 70 of a worker that a broker answers but that still cannot work: tests/unit/test_liveness.py
and ``python -m bench.broker_bounce --move``.)

A single KRaft node of the module's own (harness.kafka_cluster), killed and started again;
the shared broker is never touched. Session timeouts are short (6 s, the least the settings
allow) so the watchdog's stall, which follows it, is too: unhealthy after 6 s; the grace before
the exit is 20 s, so /readyz (whose own Kafka check may take 10 s with the broker gone) is asked
while the worker is still there to answer.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
import uuid

import pytest

from app.adapters.kafka import ops as kafka_ops
from app.adapters.kafka.topics import topic_specs
from app.settings import Settings
from harness.events import event, order_no, record
from harness.kafka_cluster import KafkaCluster
from harness.services import Worker, wait_for, worker_env

SESSION = 6                    # BROKER_SESSION_TIMEOUT_SECONDS: the watchdog's stall and grace too
STOP_BOUND = 10                # STOP_TIMEOUT_SECONDS
CAP = 120                      # generous caps on condition waits, never a timing goal


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    cluster = KafkaCluster(tmp_path_factory.mktemp("self-healing") / "kafka", nodes=1).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def running(broker):
    """The module's broker, started again if a test before left it dead."""
    if not broker.nodes[1].alive:
        broker.start_node(1)
    return broker


class Group:
    """A topic pair on the broker, a consumer group, and its workers, restarted like a supervisor would."""

    def __init__(self, broker: KafkaCluster, db, name: str, **overrides: str) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.broker, self.db, self.name = broker, db, name
        self.topic, self.dlq = f"heal-{suffix}", f"heal-dlq-{suffix}"
        settings = Settings().model_copy(update={"order_event_partitions": 2, "dlq_partitions": 1})
        asyncio.run(kafka_ops.create_topics(broker.bootstrap(), topic_specs(settings, events=self.topic,
                                                                            dlq=self.dlq)))
        self.env = {**broker.env(), "MYSQL_URL": db.url, "ORDER_EVENT_TOPIC": self.topic, "DLQ_TOPIC": self.dlq,
                    "APP_ID": f"heal-{suffix}", "ORDER_EVENT_PARTITIONS": "2", "DLQ_PARTITIONS": "1",
                    "BROKER_SESSION_TIMEOUT_SECONDS": str(SESSION), "BROKER_HEARTBEAT_INTERVAL_SECONDS": "1",
                    "BATCH_DEADLINE_SECONDS": "5", "STOP_TIMEOUT_SECONDS": str(STOP_BOUND),
                    "WATCHDOG_REJOIN_GRACE_SECONDS": "20",
                    "PYTHONFAULTHANDLER": "1", **overrides}
        self.orders: list[str] = []
        self.workers: list[Worker] = []
        self.exits: list[int] = []

    def start_worker(self) -> Worker:
        env = worker_env(**self.env, WORKER_ID=f"{self.name}-{len(self.workers)}")
        worker = Worker(env, f"{self.name}-{len(self.workers)}").start()
        self.workers.append(worker)
        return worker

    @property
    def worker(self) -> Worker:
        return self.workers[-1]

    def supervise(self) -> None:
        """``restart: on-failure``: a worker that left is replaced at once."""
        if not self.worker.alive:
            self.exits.append(self.worker.proc.returncode)
            self.start_worker()

    def produce(self, count: int = 5) -> None:
        docs = [event(order_no(prefix="HEAL"), "ORDER_CREATED") for _ in range(count)]
        self.orders += [d["order_no"] for d in docs]
        asyncio.run(kafka_ops.produce(self.broker.bootstrap(), self.topic, [record(d) for d in docs]))

    def done(self) -> int:
        marks = ", ".join(["%s"] * len(self.orders))
        return self.db.scalar(f"SELECT COUNT(*) FROM t_order WHERE order_no IN ({marks})", *self.orders)

    def consumes(self, what: str) -> None:
        """Produce, and wait (supervising) until every order produced so far is recorded."""
        self.produce()

        def all_done() -> bool:
            self.supervise()
            return self.done() == len(self.orders)

        wait_for(all_done, timeout=CAP, interval=0.5, what=what)

    def readyz(self) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.worker.web_port}/readyz", timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())
        except OSError:
            return 0, {}

    def stop(self) -> None:
        for worker in self.workers:
            if worker.alive:
                worker.kill()
                worker.wait_exit(30)


@pytest.fixture
def group(running, scratch_db, request):
    made: list[Group] = []

    def make(**overrides: str) -> Group:
        made.append(Group(running, scratch_db, request.node.name[:40], **overrides))
        return made[-1]

    yield make
    for g in made:
        g.stop()


def test_a_worker_consumes_again_after_each_broker_sigkill_and_restart(running, group):
    g = group()
    g.start_worker()
    g.consumes("the first orders recorded")
    for bounce in range(3):
        running.kill(1)
        running.start_node(1)
        g.consumes(f"orders produced after broker restart {bounce + 1} recorded")
    assert all(code == 70 for code in g.exits), f"workers left otherwise than through the watchdog: {g.exits}"


def test_readyz_says_why_while_the_broker_is_gone_and_the_worker_consumes_again_when_it_is_back(running, group):
    g = group()
    g.start_worker()
    g.consumes("the first orders recorded")
    running.kill(1)

    def consumer_unhealthy():
        status, body = g.readyz()
        reason = body.get("checks", {}).get("consumer", "")
        return status == 503 and "heartbeat" in reason and reason
    reason = wait_for(consumer_unhealthy, timeout=CAP, what="/readyz naming the failed heartbeats",
                      workers=[g.worker])
    assert "no successful heartbeat for" in reason
    # No broker answers at all: a fresh worker could do no better, so this one stays.
    wait_for(lambda: "no broker of KAFKA_BROKER answers" in g.readyz()[1].get("checks", {}).get("consumer", ""),
             timeout=CAP, what="/readyz saying no broker answers", workers=[g.worker])
    assert "forcing a rejoin" in g.worker.logs()

    running.start_node(1)
    g.consumes("orders recorded once the broker is back")
    wait_for(lambda: g.readyz()[0] == 200, timeout=CAP, what="/readyz 200 again", workers=[g.worker])


def test_sigterm_with_the_broker_gone_ends_the_worker_within_the_stop_bound(running, group):
    # The watchdog is off here: the bound, not the watchdog, must end the worker.
    g = group(WATCHDOG_ENABLED="false")
    g.start_worker()
    g.consumes("the first orders recorded")
    running.kill(1)
    wait_for(lambda: g.readyz()[1].get("checks", {}).get("kafka") == "unreachable", timeout=CAP,
             what="the worker sees the broker gone", workers=[g.worker])
    sent = time.monotonic()
    g.worker.kill(15)
    code = g.worker.wait_exit(STOP_BOUND + 20)
    took = time.monotonic() - sent
    assert code in (0, 70), g.worker.logs()[-3000:]
    assert took < STOP_BOUND + 10, f"SIGTERM took {took:.1f} s"
