"""``python -m bench.online_migration``: the migrations since the first release applied while workers write.

A scratch database at the first release's revision, ``t_idem`` pre-filled with ``--rows`` done rows
(10 million) over the 365 days before today, spread over its monthly partitions as real months
(``bench.growth.prefill``); ``--workers`` workers of the first release (``harness.releases``: what
runs while the new release's migration is applied) consume a steady ``--rate`` events a second
(the waybill and SMS mix, fakes at 5 ms) from 8 partitions, each logging every batch it finishes
(``bench.batch_log``). Then, one after the other, each with a window before and after:

* ``online``: every migration since the release (``alembic upgrade`` to each in turn), timed;
* ``up and down x20`` (``--cycles``): to head and back 20 times, a second apart: an instant change
  takes milliseconds and most fall between two batches, so the stall one causes shows over many;
* ``held, server's timeout``: the same behind a transaction held open on ``t_idem`` for ``--hold``
  seconds, with ``MIGRATION_LOCK_WAIT_SECONDS=0`` (the server's ``lock_wait_timeout``, a day):
  what every migration did before the migrations set it;
* ``held, 2 s``: the same with ``MIGRATION_LOCK_WAIT_SECONDS`` as configured (2 by default);
* ``inplace index`` (``--skip-inplace`` leaves it out): what a future migration that builds an index
  on ``t_idem`` costs, ``ALTER TABLE ... ADD INDEX ..., ALGORITHM=INPLACE, LOCK=NONE``, then its drop.

The schema goes back to the release's revision between them (timed too). Reported per window: the
batches that ran in it, records per second, p50, p99 and the longest batch (ms); the statements
seen waiting for a metadata lock at once; each migration's time. The JSON goes to
``bench/results/migration-<time>.json``; the scratch database is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import threading
import time
import uuid
from argparse import Namespace
from contextlib import closing
from datetime import UTC, date, datetime
from pathlib import Path

from aiokafka import AIOKafkaProducer
from alembic import command
from alembic.config import Config
from sqlalchemy import event
from sqlalchemy.engine import Engine

from app.adapters.kafka import ops as kafka_ops
from app.adapters.kafka.topics import topic_specs
from app.settings import Settings
from bench import batch_log
from bench.growth.prefill import prefill, sequence_engine
from bench.workload import build
from harness.fakes import FakesProcess, every_fake
from harness.migration_rules import since_release
from harness.releases import Release, release, releases
from harness.services import ROOT, ScratchDatabase, Worker, connect, wait_for, worker_env

RESULTS = Path(__file__).with_name("results")
PARTITIONS = 8
INDEX = "idx_bench_outcome_modified"


class ReleaseWorker(Worker):
    """A worker of an earlier release: its own virtualenv and source tree."""

    def __init__(self, env: dict[str, str], name: str, release: Release) -> None:
        super().__init__(env, name)
        self.release = release

    def start(self) -> ReleaseWorker:
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([str(self.release.faust), "-A", "app", "worker", "-l", "info"],
                                     cwd=self.release.src, env=self.release.env(self.env), stdout=self._log,
                                     stderr=subprocess.STDOUT)
        return self


class Producer(threading.Thread):
    """``rate`` records a second, in tenths of a second, until stopped."""

    def __init__(self, bootstrap: str, topic: str, records: list[tuple[bytes, bytes]], rate: int) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.records, self.rate = bootstrap, topic, records, rate
        self.sent = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        asyncio.run(self._produce())

    async def _produce(self) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all", linger_ms=5)
        await producer.start()
        try:
            tick, step = time.monotonic(), max(1, self.rate // 10)
            while not self.stopping.is_set() and self.sent < len(self.records):
                for key, value in self.records[self.sent:self.sent + step]:
                    await producer.send(self.topic, value=value, key=key)
                self.sent = min(self.sent + step, len(self.records))
                tick += step / self.rate
                await asyncio.sleep(max(0.0, tick - time.monotonic()))
            await producer.flush()
        finally:
            await producer.stop()


class LockWaits(threading.Thread):
    """Samples how many statements of the database wait for a metadata lock at once."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.samples: list[tuple[float, int]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        with closing(connect(self.url)) as conn, conn.cursor() as cur:
            while not self.stopping.wait(0.2):
                cur.execute("SELECT COUNT(*) n FROM information_schema.PROCESSLIST WHERE DB = DATABASE() "
                            "AND STATE LIKE 'Waiting for table metadata lock%%'")
                self.samples.append((time.time(), int(cur.fetchone()["n"])))

    def most(self, since: float, until: float) -> int:
        return max((n for t, n in self.samples if since <= t <= until), default=0)


ALTERS: list[float] = []         # every ALTER TABLE a migration ran in this process: its own seconds


@event.listens_for(Engine, "before_cursor_execute")
def _alter_began(conn, cursor, statement, parameters, context, executemany) -> None:
    if statement.lstrip()[:5].upper() == "ALTER":
        conn.info["alter_began"] = time.monotonic()


@event.listens_for(Engine, "after_cursor_execute")
def _alter_ended(conn, cursor, statement, parameters, context, executemany) -> None:
    began = conn.info.pop("alter_began", None) if statement.lstrip()[:5].upper() == "ALTER" else None
    if began is not None:
        ALTERS.append(round(time.monotonic() - began, 4))


def migrate(url: str, revision: str, *, down: bool = False, lock_wait_seconds: int | None = None) -> float:
    """``alembic upgrade`` (or downgrade) to ``revision`` in this process: the command's seconds
    (its ALTER statements' own go to ``ALTERS``)."""
    config = Config(str(ROOT / "alembic.ini"))
    config.cmd_opts = Namespace(x=[f"url={url}"] + ([] if lock_wait_seconds is None
                                                    else [f"lock_wait_seconds={lock_wait_seconds}"]))
    started = time.monotonic()
    (command.downgrade if down else command.upgrade)(config, revision)
    return round(time.monotonic() - started, 3)


def _spread(values: list[float]) -> dict:
    ordered = sorted(values)
    return {"min": ordered[0], "median": ordered[len(ordered) // 2], "max": ordered[-1]} if ordered else {}


class Run:
    def __init__(self, db: ScratchDatabase, workers: list[Worker], waits: LockWaits, base: str,
                 revisions: list[str], window: float) -> None:
        self.db, self.workers, self.waits = db, workers, waits
        self.base, self.revisions, self.window = base, revisions, window
        self.marks: list[dict] = []

    def scenario(self, name: str, change) -> dict:
        """``window`` seconds, ``change()``, ``window`` seconds. ``change`` returns its figures, and
        under ``"intervals"`` the moments the schema changed, if not the whole of it."""
        before = time.time()
        self._sleep(self.window)
        began, alters = time.time(), len(ALTERS)
        figures = change()
        ended = time.time()
        figures["alter_statement_seconds"] = _spread(ALTERS[alters:])
        self._sleep(self.window)
        intervals = figures.pop("intervals", [(began, ended)])
        mark = {"name": name, "before": (before, began), "during": (began, ended), "intervals": intervals,
                "after": (ended, time.time()), **figures}
        self.marks.append(mark)
        print(f"  {name}: {json.dumps(figures)}", flush=True)
        return mark

    def online(self) -> dict:
        return {"migrations": {rev: migrate(self.db.url, rev) for rev in self.revisions}}

    def cycles(self, count: int) -> dict:
        """Up to head and back ``count`` times, a second apart: an instant change takes milliseconds,
        and most of them fall between two batches; many of them show what one that does not costs."""
        intervals, up, down = [], [], []
        for _ in range(count):
            for seconds, down_too in ((up, False), (down, True)):
                started = time.time()
                seconds.append(migrate(self.db.url, self.base if down_too else "head", down=down_too))
                intervals.append((started, time.time()))
                self._sleep(1.0)
        return {"cycles": count, "up_seconds": _spread(up), "down_seconds": _spread(down), "intervals": intervals}

    def held(self, hold: float, lock_wait_seconds: int) -> dict:
        """The migrations behind a transaction that holds ``t_idem`` open for ``hold`` seconds."""
        holder = connect(self.db.url)
        with holder.cursor() as cur:
            cur.execute("START TRANSACTION")
            cur.execute("SELECT COUNT(*) FROM t_idem WHERE biz_key = 'bench-holder'")
        done: dict = {}
        thread = threading.Thread(target=lambda: done.update(
            seconds=migrate(self.db.url, "head", lock_wait_seconds=lock_wait_seconds)), daemon=True)
        thread.start()
        time.sleep(hold)
        holder.rollback()
        holder.close()
        thread.join(600)
        return {"held_seconds": hold, "lock_wait_seconds": lock_wait_seconds, "migration_seconds": done.get("seconds")}

    def inplace_index(self) -> dict:
        seconds = {}
        for what, statement in (("add", f"ALTER TABLE t_idem ADD INDEX {INDEX} (outcome, gmt_modified), "
                                        "ALGORITHM=INPLACE, LOCK=NONE"),
                                ("drop", f"ALTER TABLE t_idem DROP INDEX {INDEX}, ALGORITHM=INPLACE, LOCK=NONE")):
            started = time.monotonic()
            with closing(connect(self.db.url)) as conn, conn.cursor() as cur:
                cur.execute(statement)
            seconds[what] = round(time.monotonic() - started, 3)
        return {"index_seconds": seconds}

    def back_to_release(self) -> float:
        seconds = migrate(self.db.url, self.base, down=True)
        self._sleep(self.window / 2)
        return seconds

    def _sleep(self, seconds: float) -> None:
        """Wait, and stop the run if a worker exited meanwhile."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
            for worker in self.workers:
                if not worker.alive:
                    raise RuntimeError(f"worker {worker.name} exited ({worker.proc.returncode}); "
                                       f"log {worker.log_path}")

    def report(self) -> list[dict]:
        """Each scenario's batches: those that ran while the schema changed, those that finished
        before it began, those that began after it ended."""
        done = [b for worker in self.workers for b in batch_log.batches(worker.log_path)]
        rows = []
        for mark in self.marks:
            row = {k: v for k, v in mark.items() if k not in ("before", "during", "intervals", "after")}
            (since, began), (ended, until) = mark["before"], mark["after"]
            row["before"] = batch_log.stats([b for b in done if since <= b.end < began], since, began)
            during = {id(b): b for start, end in mark["intervals"] for b in batch_log.in_window(done, start, end)}
            row["during"] = batch_log.stats(list(during.values()), *mark["during"])
            row["during"]["records_per_second"] = batch_log.stats(          # every batch of the span
                batch_log.in_window(done, *mark["during"]), *mark["during"])["records_per_second"]
            row["during"]["changing_seconds"] = round(sum(end - start for start, end in mark["intervals"]), 3)
            row["after"] = batch_log.stats([b for b in done if ended < b.start <= until], ended, until)
            row["most_waiting_for_a_metadata_lock"] = self.waits.most(*mark["during"])
            row["dead_letters"] = self.db.scalar(
                "SELECT COUNT(*) FROM t_compensation WHERE first_failure_at BETWEEN "
                "CONVERT_TZ(FROM_UNIXTIME(%s), @@session.time_zone, '+00:00') AND "
                "CONVERT_TZ(FROM_UNIXTIME(%s), @@session.time_zone, '+00:00')", since, until)
            rows.append(row)
        return rows


def run(settings: Settings, rows: int, rate: int, workers: int, window: float, hold: float, inplace: bool,
        cycles: int) -> dict:
    base, revisions = since_release()
    first = release(*releases()[0])     # the first release's workers, on the schema its migrations left
    db = ScratchDatabase(settings.database.url, label=f"bench_mig_{uuid.uuid4().hex[:6]}").create(migrated=False)
    suffix = uuid.uuid4().hex[:8]
    topic, dlq, group = f"bench-mig-{suffix}", f"bench-mig-dlq-{suffix}", f"bench-mig-{suffix}"
    fakes = procs = producer = waits = None
    try:
        migrate(db.url, base)
        if not sequence_engine(db.url):
            raise SystemExit("the pre-fill needs MariaDB's SEQUENCE engine (seq_1_to_N)")
        filled = prefill(db.url, rows, date.today())
        asyncio.run(kafka_ops.create_topics(settings.kafka.bootstrap, topic_specs(
            Settings(order_event_partitions=PARTITIONS), events=topic, dlq=dlq)))
        fakes = FakesProcess(every_fake({"latency_ms": 5}))
        env = dict(MYSQL_URL=db.url, ORDER_EVENT_TOPIC=topic, DLQ_TOPIC=dlq, APP_ID=group,
                   ORDER_EVENT_PARTITIONS=str(PARTITIONS), SLOW_BATCH_SECONDS="0.0001", IDEM_RETENTION_DAYS="3650",
                   RECONCILE_EVERY_SECONDS="0", **fakes.env())
        procs = [ReleaseWorker(worker_env(WORKER_ID=f"mig-{suffix}-{i}", **env), f"bench-mig-{i}", first).start()
                 for i in range(workers)]
        records = build("mixed", rate * int(14 * window + 4 * hold + 4 * cycles + 900), topic=topic, tag=suffix[:4]).records
        producer = Producer(settings.kafka.bootstrap, topic, records, rate)
        producer.start()
        waits = LockWaits(db.url)
        waits.start()
        wait_for(lambda: all(batch_log.batches(w.log_path) for w in procs), timeout=180, interval=1.0,
                 what="every worker finishing batches", workers=procs)
        time.sleep(window / 2)
        bench = Run(db, procs, waits, base, revisions, window)
        downgrades = []
        bench.scenario("online", bench.online)
        downgrades.append(bench.back_to_release())
        if cycles:
            bench.scenario(f"up and down x{cycles}", lambda: bench.cycles(cycles))
        bench.scenario("held, server's timeout", lambda: bench.held(hold, 0))
        downgrades.append(bench.back_to_release())
        wait = settings.database.migration_lock_wait_seconds
        bench.scenario(f"held, {wait} s", lambda: bench.held(hold, wait))
        if inplace:
            bench.scenario("inplace index", bench.inplace_index)
        scenarios = bench.report()
        dead_letters = db.scalar("SELECT COUNT(*) FROM t_compensation")
    finally:
        for thread in (producer, waits):
            if thread is not None:
                thread.stopping.set()
                thread.join(30)
        for worker in procs or []:
            worker.stop()
        if fakes is not None:
            fakes.stop()
        asyncio.run(kafka_ops.delete_topics(settings.kafka.bootstrap, [topic, dlq]))
        db.drop()
    return {"rows": rows, "prefill": filled, "rate": rate, "workers": workers, "worker_release": release.version,
            "window_seconds": window, "base": base, "revisions": revisions, "scenarios": scenarios,
            "downgrade_seconds": downgrades, "events_sent": producer.sent if producer else 0,
            "dead_letters": dead_letters, "worker_logs": [str(w.log_path.relative_to(ROOT)) for w in procs or []]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.online_migration", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="t_idem rows pre-filled (10,000,000)")
    parser.add_argument("--rate", type=int, default=300, help="events a second produced (300)")
    parser.add_argument("--workers", type=int, default=2, help="workers of the first release (2)")
    parser.add_argument("--window", type=float, default=30.0, help="seconds before and after each change (30)")
    parser.add_argument("--hold", type=float, default=20.0, help="seconds the long transaction stays open (20)")
    parser.add_argument("--cycles", type=int, default=20, help="times up to head and back, to sample stalls (20)")
    parser.add_argument("--skip-inplace", action="store_true", help="leave out the INPLACE index build")
    args = parser.parse_args(argv)
    result = run(Settings(), args.rows, args.rate, args.workers, args.window, args.hold, not args.skip_inplace,
                 args.cycles)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"migration-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["scenarios"], indent=1))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
