"""A worker through broker crashes: SIGKILL the broker, start it again, how long until it consumes?

    python -m bench.broker_bounce --trials 10 [--down 5,40] [--rekill 0.5,2] [--move] [--cap 120]
    python -m bench.broker_bounce --sigterm killed|stopped [--trials 3]
    ... [--env WATCHDOG_ENABLED=false]          (any setting of the worker)

One Kafka node of its own (free ports, a small heap, ``harness.own_servers.Kafka``), a scratch
database on the shared MariaDB, one ``faust -A app worker`` and a producer that writes an
``ORDER_CREATED`` (a local step only, no fake services needed) every 50 ms, retrying through
the outage. Each trial:

    SIGKILL the broker -> wait ``--down`` s -> start it again (timed until it answers)
    -> clock starts -> poll t_idem's done rows every 0.2 s -> the first row done after the
    restart stops the clock ("consumes again"); ``--cap`` s without one: stuck.

``--rekill``: the broker is killed again that long after it answered (while the worker looks
the coordinator up and rejoins). ``--move``: it comes back on its other client port, as a pod
comes back with a new IP; the clients bootstrap from both ports.

A worker that exits during a trial is started again at once, as ``restart: on-failure`` does,
and the clock goes on. A worker stuck for the whole cap is SIGKILLed and a fresh one started,
so every trial starts from a healthy worker. Per trial the report gives the time, and the count of the worker's log lines that
tell the coordinator loop ("marking coordinator dead", "Heartbeat session expired") and of
the watchdog's own lines.

``--sigterm killed``: the broker is SIGKILLed (gone), then the worker gets SIGTERM;
``--sigterm stopped``: the broker is SIGSTOPped (hung: connections stay open, nothing
answers). Reported: the seconds from SIGTERM to the worker's exit, and its exit code.

Results go to stdout as JSON lines and to ``bench/results/bounce-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaProducer

from app.adapters.kafka import ops as kafka_ops
from app.adapters.kafka.topics import topic_specs
from app.settings import Settings
from harness.events import event, order_no, record
from harness.own_servers import Kafka
from harness.services import ROOT, ScratchDatabase, Worker, free_port, worker_env

HOME = ROOT / ".cache" / "broker-bounce"
RESULTS = ROOT / "bench" / "results"
LOOP_LINES = ("marking coordinator dead", "Marking the coordinator dead", "Heartbeat session expired",
              "Group Coordinator Request failed")
WATCHDOG_LINES = ("watchdog:",)


class OwnKafka(Kafka):
    """The chaos suite's single node, with its pid file in its own folder (a chaos run may be on)."""

    name = "kafka"

    def __init__(self, home: Path) -> None:
        super().__init__(home)
        self.pid_file = home.parent / f"{home.name}.pid"
        self.other_port = free_port()

    @property
    def both(self) -> str:
        """Both client ports the node may listen on (``move``), as a bootstrap list."""
        return ",".join(f"127.0.0.1:{p}" for p in sorted((self.port, self.other_port)))

    def move(self) -> None:
        """Listen on (and advertise) the other client port from the next start: a broker that comes
        back at another address, as a pod does with a new IP."""
        text = self.properties.read_text()
        text = text.replace(f"127.0.0.1:{self.port}\n", f"127.0.0.1:{self.other_port}\n")
        text = text.replace(f"127.0.0.1:{self.port},", f"127.0.0.1:{self.other_port},")
        self.properties.write_text(text)
        self.port, self.other_port = self.other_port, self.port

    def freeze(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)


class Producer(threading.Thread):
    """One event every ``interval`` s, for ever, through outages (a failed send is dropped)."""

    def __init__(self, bootstrap: str, topic: str, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.interval = bootstrap, topic, interval
        self.sent = 0
        self.failed = 0
        self._stop = threading.Event()

    def run(self) -> None:
        asyncio.run(self._produce())

    def stop(self) -> None:
        self._stop.set()

    async def _produce(self) -> None:
        while not self._stop.is_set():
            producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, request_timeout_ms=5000,
                                        linger_ms=0, acks="all")
            try:
                await asyncio.wait_for(producer.start(), 10)
                while not self._stop.is_set():
                    key, value = record(event(order_no(prefix="BNC"), "ORDER_CREATED"))
                    await asyncio.wait_for(producer.send_and_wait(self.topic, value, key=key), 10)
                    self.sent += 1
                    await asyncio.sleep(self.interval)
            except Exception:
                self.failed += 1
                await asyncio.sleep(0.5)
            finally:
                try:
                    await asyncio.wait_for(producer.stop(), 5)
                except Exception:
                    pass


@dataclass
class Trial:
    n: int
    down_seconds: float
    broker_start_seconds: float
    consumed_again_seconds: float | None      # None: nothing consumed for the whole cap (stuck)
    loop_lines: int                           # the coordinator loop's log lines during the trial
    watchdog_lines: int
    rekill_after: float | None = None         # the broker was killed again this long after it answered
    worker_exits: list[int] = field(default_factory=list)   # workers that left during the trial (restarted)
    restarted_worker: bool = False            # stuck for the whole cap: SIGKILLed, a fresh one started


@dataclass
class Rig:
    """The broker, the database, the topics, the producer and the worker of one run."""

    session_timeout: float
    extra_env: dict[str, str] = field(default_factory=dict)
    move: bool = False               # each restart on the other client port (clients bootstrap from both)

    def __post_init__(self) -> None:
        HOME.mkdir(parents=True, exist_ok=True)
        self.kafka = OwnKafka(HOME / f"kafka-{uuid.uuid4().hex[:6]}")
        self.settings = Settings()
        self.db = ScratchDatabase(self.settings.database.url, label=f"bounce_{uuid.uuid4().hex[:6]}")
        suffix = uuid.uuid4().hex[:6]
        self.topic, self.dlq, self.group = f"bounce-{suffix}", f"bounce-dlq-{suffix}", f"bounce-{suffix}"
        self.worker: Worker | None = None
        self.logs: list[Path] = []
        self.producer: Producer | None = None

    def start(self) -> None:
        self.kafka.reap_leftover()
        self.kafka.install()
        self.kafka.start()
        specs = topic_specs(self.settings.model_copy(update={"order_event_partitions": 4, "dlq_partitions": 1}),
                            events=self.topic, dlq=self.dlq)
        asyncio.run(kafka_ops.create_topics(self.kafka.bootstrap, specs))
        self.db.create()
        self.producer = Producer(self.bootstrap, self.topic)
        self.producer.start()
        self.start_worker()

    def start_worker(self) -> None:
        """A worker, and wait until it consumes."""
        self.spawn_worker()
        self.wait_consuming(self.done(), cap=120, supervise=True)

    def spawn_worker(self) -> None:
        env = worker_env(KAFKA_BROKER=";".join(f"kafka://{hp}" for hp in self.bootstrap.split(",")), MYSQL_URL=self.db.url,
                         ORDER_EVENT_TOPIC=self.topic, DLQ_TOPIC=self.dlq, APP_ID=self.group,
                         ORDER_EVENT_PARTITIONS="4", DLQ_PARTITIONS="1", WORKER_ID=f"bounce-{uuid.uuid4().hex[:6]}",
                         BROKER_SESSION_TIMEOUT_SECONDS=str(self.session_timeout),
                         BATCH_DEADLINE_SECONDS=str(min(15.0, self.session_timeout / 2)),
                         PYTHONFAULTHANDLER="1", **self.extra_env)
        self.worker = Worker(env, "bounce").start()
        self.logs.append(self.worker.log_path)

    @property
    def bootstrap(self) -> str:
        return self.kafka.both if self.move else self.kafka.bootstrap

    def done(self) -> int:
        return int(self.db.scalar("SELECT COUNT(*) FROM t_idem WHERE status = 2") or 0)

    def wait_consuming(self, since: int, cap: float, *, supervise: bool = False) -> tuple[float | None, list[int]]:
        """Seconds until t_idem has more done rows than ``since`` (None after ``cap``), and the exit
        codes of workers that left meanwhile: with ``supervise`` each is started again at once, as
        ``restart: on-failure`` would."""
        started, exits = time.monotonic(), []
        while time.monotonic() - started < cap:
            if self.done() > since:
                return time.monotonic() - started, exits
            if not self.worker.alive:
                exits.append(self.worker.proc.returncode)
                if not supervise:
                    return None, exits
                self.spawn_worker()
            time.sleep(0.2)
        return None, exits

    def stop(self) -> None:
        if self.producer:
            self.producer.stop()
        if self.worker and self.worker.alive:
            self.worker.kill()
            self.worker.wait_exit(30)
        if self.kafka.alive:
            try:
                self.kafka.thaw()
            except OSError:
                pass
        self.kafka.stop()
        self.db.drop()


def count_lines(text: str, needles: tuple[str, ...]) -> int:
    return sum(1 for line in text.splitlines() if any(n in line for n in needles))


def bounce(rig: Rig, trials: int, downs: list[float], cap: float, rekills: list[float]) -> list[Trial]:
    results = []
    for n in range(1, trials + 1):
        down = downs[(n - 1) % len(downs)]
        rekill = rekills[(n - 1) % len(rekills)] if rekills else None
        first, mark = rig.worker, len(rig.worker.logs())
        rig.kafka.kill()
        if rig.move:
            rig.kafka.move()
        time.sleep(down)
        took = rig.kafka.start()
        if rekill is not None:
            # Killed again while the worker looks the coordinator up and rejoins.
            time.sleep(rekill)
            rig.kafka.kill()
            time.sleep(down)
            took = rig.kafka.start()
        since = rig.done()
        again, exits = rig.wait_consuming(since, cap, supervise=True)
        text = first.logs()[mark:] + ("" if rig.worker is first else rig.worker.logs())
        trial = Trial(n, down, round(took, 2), None if again is None else round(again, 2),
                      count_lines(text, LOOP_LINES), count_lines(text, WATCHDOG_LINES), rekill, exits)
        if again is None:
            rig.worker.kill()
            rig.worker.wait_exit(30)
            rig.start_worker()
            trial.restarted_worker = True
        print(json.dumps(asdict(trial)), flush=True)
        results.append(trial)
    return results


def sigterm(rig: Rig, trials: int, how: str, cap: float) -> list[dict]:
    results = []
    for n in range(1, trials + 1):
        if how == "killed":
            rig.kafka.kill()
        else:
            rig.kafka.freeze()
        time.sleep(2)
        sent = time.monotonic()
        rig.worker.kill(signal.SIGTERM)
        try:
            code = rig.worker.wait_exit(cap)
        except Exception:
            code = None
            rig.worker.kill()
            rig.worker.wait_exit(30)
        result = {"n": n, "broker": how, "sigterm_to_exit_seconds": round(time.monotonic() - sent, 2)
                  if code is not None else None, "exit": code}
        print(json.dumps(result), flush=True)
        results.append(result)
        if how == "killed":
            rig.kafka.start()
        else:
            rig.kafka.thaw()
        rig.start_worker()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--down", default="5", help="seconds the broker stays dead; a list (5,20,40) cycles")
    parser.add_argument("--rekill", default="", help="kill the broker again this long after it answered "
                                                     "(a list cycles; empty: no second kill)")
    parser.add_argument("--move", action="store_true", help="the broker comes back on its other client port "
                                                             "each time (clients bootstrap from both)")
    parser.add_argument("--cap", type=float, default=120.0, help="seconds before a trial counts as stuck")
    parser.add_argument("--session-timeout", type=float, default=30.0)
    parser.add_argument("--sigterm", choices=("killed", "stopped"))
    parser.add_argument("--env", action="append", default=[], help="NAME=value for the worker")
    args = parser.parse_args()
    os.environ.setdefault("KAFKA_HEAP_OPTS", "-Xms128m -Xmx384m")
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)     # the producer's own outage, every retry
    rig = Rig(args.session_timeout, dict(item.split("=", 1) for item in args.env), args.move)
    started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    try:
        rig.start()
        if args.sigterm:
            results = sigterm(rig, args.trials, args.sigterm, args.cap)
        else:
            results = [asdict(t) for t in bounce(rig, args.trials, [float(d) for d in args.down.split(',')], args.cap,
                                                     [float(r) for r in args.rekill.split(',') if r])]
    finally:
        rig.stop()
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"bounce-{started}.json"
    out.write_text(json.dumps({"args": vars(args), "trials": results}, indent=2))
    print(f"written {out.relative_to(ROOT)}; worker logs " + " ".join(str(p.relative_to(ROOT)) for p in rig.logs))


if __name__ == "__main__":
    main()
