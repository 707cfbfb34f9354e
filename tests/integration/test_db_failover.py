"""A database failover under load: real workers reach a MariaDB primary through a TCP proxy the
test owns; mid-storm the primary is SIGKILLed, its GTID replica promoted, and the proxy moved to it
(``harness.mariadb_pair``, ``harness.proxy``). The workers wait out the outage (the
dead connections, then the replica still read-only) and finish on the new primary.

With semi-synchronous replication (``AFTER_SYNC``) nothing the old primary committed is lost:
every ``t_idem`` row it had, the promoted replica has, and every effect happens once. With
asynchronous replication the last acknowledged transactions are lost when the replica is behind;
the test makes it fall behind as a loaded one does (its I/O thread stopped during the storm), and
counts the ``t_idem`` rows lost. Some of them belong to events whose offsets were committed: those
are never delivered again, so the test does what the docs tell an operator (stop the workers,
rewind the group, start them); the workers' first connection to the promoted replica opened a
recovery window by itself, and derived tokens make the replay ask the same questions: every
effect still happens once. The workers survive either way, every order ends where its events take
it, and nothing is dead-lettered for a read-only server or a dead connection.

Each failover runs once per module (a fixture), and the tests ask what it left behind.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import pytest

from app.adapters.kafka.topics import topic_specs
from app.adapters.mysql.engine import create_engine
from app.adapters.mysql.leases import MySqlLeases
from app.adapters.mysql.store import MySqlStore
from app.pipeline.errors import StoreUnavailable
from app.pipeline.outage import OutageGuard
from harness.events import event, order_no, record
from harness.fakes import FakesProcess
from harness.mariadb_pair import MariaDBPair, seq_no
from harness.proxy import BlackholeProxy
from harness.services import (
    Worker,
    caught_up,
    create_topics,
    delete_topics,
    produce,
    rewind_group,
    wait_for,
    worker_env,
)

DATABASE, USER, PASSWORD = "idem_failover", "idem", "idem"
PARTITIONS = 4
CONFIRMED_ORDERS, CANCELLED_ORDERS = 120, 40
CONFIRMED, CANCELLED = 3, 4
MANUAL = 4                 # t_compensation.status: a person must decide
TYPES = ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM", "ORDER_CANCEL")
IDEM_KEY = ("biz_key", "part_date")
IDEM_STATE = ("biz_key", "part_date", "attempt", "status")
# Not the record's fault: a failover must never dead-letter anything for these.
INFRA_REASONS = {"store_error", "store_unavailable", "internal_error"}
WORKER_SETTINGS = {"DB_STATEMENT_TIMEOUT_SECONDS": "2", "DB_TRANSACTION_TIMEOUT_SECONDS": "4",
                   "DB_LOCK_WAIT_TIMEOUT_SECONDS": "1", "DB_POOL_TIMEOUT_SECONDS": "2",
                   "DB_CONNECT_TIMEOUT_SECONDS": "2", "BATCH_SIZE": "20", "BATCH_WITHIN_SECONDS": "0.2",
                   "RETRY_BACKOFF_MS": "50,100,200", "BROKER_SESSION_TIMEOUT_SECONDS": "10",
                   "BROKER_HEARTBEAT_INTERVAL_SECONDS": "1", "BATCH_DEADLINE_SECONDS": "8",
                   "DLQ_SEND_TIMEOUT_SECONDS": "10", "INFRA_RETRY_BUDGET_SECONDS": "60",
                   # The recovery window the failover opens holds a fresh SMS back for the settle
                   # (dead-lettered, then run by the compensator): seconds here, not the default 30.
                   "SMS_LOOKUP_SETTLE_SECONDS": "2", "DLQ_RETRY_AFTER_SECONDS": "1",
                   "COMPENSATION_TIMER_SECONDS": "0.5", "COMPENSATION_BACKOFF_SECONDS": "1",
                   "COMPENSATION_BACKOFF_MAX_SECONDS": "2"}
FAKES = {"waybill": {"latency_ms": 30}, "sms": {"latency_ms": 30}}


@dataclass
class Failover:
    """What one failover under load left behind."""

    semisync: bool
    confirmed: list[str] = field(default_factory=list)     # orders created, paid and confirmed: a waybill each
    cancelled: list[str] = field(default_factory=list)     # orders created and cancelled: an SMS each
    done_at_kill: int = 0                                  # t_idem rows done when the primary died
    keys_first_wave: int = 0                               # t_idem rows of the events sent before it died
    keys_total: int = 0                                    # t_idem rows of the whole run
    lag_at_kill: dict = field(default_factory=dict)        # the replica's lag just before the kill
    most_not_received: int = 0                             # the most transactions it trailed by in the storm
    semisync_fell_back: int | None = None                  # times the primary stopped waiting for the replica
    windows: list = field(default_factory=list)            # t_recovery_window rows on the new primary
    rewound: bool = False                                  # the group was rewound after the failover
    lost_rows: set = field(default_factory=set)            # t_idem rows the old primary had, the replica not
    lost_updates: set = field(default_factory=set)         # ... or further along there (attempt, status)
    gtid_gap: int | None = None                            # old primary's last GTID minus the replica's when promoted
    statuses: dict = field(default_factory=dict)           # order -> t_order.status on the new primary
    dead_letters: list = field(default_factory=list)       # t_compensation rows of the run
    ledger: dict = field(default_factory=dict)             # the fake services' calls
    workers_alive: bool = False
    seconds: dict = field(default_factory=dict)            # time of each phase

    def report(self) -> str:
        mode = "semi-sync AFTER_SYNC" if self.semisync else "async"
        return (f"failover ({mode}): {len(self.lost_rows)} t_idem rows lost, {len(self.lost_updates)} updates lost "
                f"({'the group rewound, ' if self.rewound else ''}{len(self.windows)} recovery window(s) opened) "
                f"(GTID gap {self.gtid_gap}) of {self.keys_total} rows, {self.done_at_kill} done at the kill; the replica "
                f"trailed by at most {self.most_not_received} transactions in the storm, {self.lag_at_kill} at the "
                f"kill; dead letters {dict(Counter(d['reason'] for d in self.dead_letters))}; seconds {self.seconds}")


class Rig:
    """The failover's world: a primary and its replica, the proxy the workers reach the database
    through, the fake logistics API and SMS gateway, topics of its own and two workers."""

    def __init__(self, settings, semisync: bool) -> None:
        self.settings = settings
        suffix = uuid.uuid4().hex[:8]
        self.events, self.dlq = f"test-failover-{suffix}", f"test-failover-dlq-{suffix}"
        self.group = f"test-failover-{suffix}"
        self.name = f"failover-{'semisync' if semisync else 'async'}-{suffix}"
        self.pair = MariaDBPair(semisync=semisync)
        self.proxy: BlackholeProxy | None = None
        self.fakes: FakesProcess | None = None
        self.workers: list[Worker] = []
        self._logged: list[int] = []

    def start(self) -> Rig:
        specs = topic_specs(self.settings.model_copy(update={"order_event_partitions": PARTITIONS}),
                            events=self.events, dlq=self.dlq)
        asyncio.run(create_topics(self.settings, specs))
        self.pair.start()
        self.pair.create_database(DATABASE, USER, PASSWORD)
        self.proxy = BlackholeProxy("127.0.0.1", self.pair.primary.port).start()
        self.fakes = FakesProcess(FAKES)
        url = f"mysql+aiomysql://{USER}:{PASSWORD}@127.0.0.1:{self.proxy.port}/{DATABASE}"
        self.envs = []
        for name in ("a", "b"):
            env = worker_env(MYSQL_URL=url, WORKER_ID=f"{self.name}-{name}", ORDER_EVENT_TOPIC=self.events,
                             DLQ_TOPIC=self.dlq, APP_ID=self.group, ORDER_EVENT_PARTITIONS=str(PARTITIONS),
                             **self.fakes.env(), **WORKER_SETTINGS)
            self.envs.append(env)
        self.start_workers()
        return self

    def start_workers(self, generation: str = "") -> None:
        self.workers = [Worker(env, f"{env['WORKER_ID']}{generation}").start() for env in self.envs]
        for worker in self.workers:              # both in the storm, not one joining after it
            worker.wait_log("Worker ready", timeout=120)

    def rewind(self) -> None:
        """What the docs tell an operator after an async failover: stop the workers, put the
        group's offsets back (here: to the beginning), start them again."""
        for worker in self.workers:
            assert worker.stop() == 0
        asyncio.run(rewind_group(self.settings, self.group, self.events, PARTITIONS))
        self.start_workers("-after-rewind")

    def stop(self) -> None:
        for worker in self.workers:
            if worker.alive:
                worker.kill()
                worker.wait_exit(30)
        if self.fakes is not None:
            self.fakes.stop()
        if self.proxy is not None:
            self.proxy.stop()
        self.pair.stop()
        asyncio.run(delete_topics(self.settings, [self.events, self.dlq]))

    def produce(self, docs: list[dict]) -> None:
        asyncio.run(produce(self.settings, self.events, [record(d) for d in docs]))

    def wait(self, predicate, what: str, timeout: float = 60.0, interval: float = 0.25):
        return wait_for(predicate, timeout=timeout, interval=interval, what=what, workers=self.workers)

    def mark_logs(self) -> None:
        self._logged = [len(w.logs()) for w in self.workers]

    def every_worker_logged(self, needle: str) -> bool:
        """Every worker logged ``needle`` since :meth:`mark_logs`."""
        return all(needle in w.logs()[at:] for w, at in zip(self.workers, self._logged))

    def caught_up(self) -> bool:
        return caught_up(self.settings, self.events, self.group, PARTITIONS)


def run_failover(settings, semisync: bool) -> Failover:
    """Orders in flight; SIGKILL the primary; more events; promote the replica and move the proxy
    (with semi-sync the proxy moves first: the workers meet the replica still read-only); the
    workers finish. Then the old primary is started again to count what the replica lacked."""
    run = Failover(semisync)
    run.confirmed = [order_no(prefix="FOV") for _ in range(CONFIRMED_ORDERS)]
    run.cancelled = [order_no(prefix="FOX") for _ in range(CANCELLED_ORDERS)]
    docs = [event(o, t) for o in run.confirmed for t in ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM")]
    docs += [event(o, t) for o in run.cancelled for t in ("ORDER_CREATED", "ORDER_CANCEL")]
    docs.sort(key=lambda d: (d["order_no"][-6:], TYPES.index(d["type"])))      # orders interleaved, each in order
    first_wave, second_wave = docs[: len(docs) * 2 // 3], docs[len(docs) * 2 // 3:]
    run.keys_first_wave, run.keys_total = _keys(first_wave), _keys(docs)
    clock = Phases(run.seconds)
    rig = Rig(settings, semisync)
    pair = rig.pair
    try:
        rig.start()
        clock.lap("start")

        rig.produce(first_wave)

        def under_way() -> int:
            # How far the replica trails while the storm runs: what an async failover could lose.
            run.most_not_received = max(run.most_not_received, pair.lag()["not_received"] or 0)
            done = pair.primary.query(f"SELECT COUNT(*) AS n FROM `{DATABASE}`.t_idem WHERE status = 2")[0]["n"]
            return done if done >= run.keys_first_wave // 4 else 0

        if not semisync:
            # A loaded replica falls behind: what it has not received when the primary dies is lost.
            rig.wait(under_way, "the storm under way", timeout=120, interval=0.05)
            pair.replica.execute("STOP SLAVE IO_THREAD")
            behind = pair.primary.query(f"SELECT COUNT(*) AS n FROM `{DATABASE}`.t_idem WHERE status = 2")[0]["n"]
            rig.wait(lambda: pair.primary.query(f"SELECT COUNT(*) AS n FROM `{DATABASE}`.t_idem WHERE status = 2")
                     [0]["n"] >= behind + 40, "more work done that the replica does not receive", timeout=120,
                     interval=0.05)
        run.done_at_kill = rig.wait(under_way, "the storm under way", timeout=120, interval=0.05)
        clock.lap("storm")
        run.lag_at_kill = pair.lag()
        run.semisync_fell_back = pair.semisync_fell_back() if semisync else None
        rig.mark_logs()
        pair.kill_primary()
        rig.produce(second_wave)                 # the events go on arriving while there is no database
        rig.wait(lambda: rig.every_worker_logged("database unavailable"), "every worker waiting for the database")
        keep = ((DATABASE, "t_idem", IDEM_KEY), (DATABASE, "t_idem", IDEM_STATE))
        if semisync:
            rig.proxy.retarget("127.0.0.1", pair.replica.port)
            rig.wait(lambda: rig.every_worker_logged("database is read-only"),
                     "every worker waiting for the read-only replica")
            positions = pair.promote(keep=keep)
        else:
            positions = pair.promote(keep=keep)
            rig.proxy.retarget("127.0.0.1", pair.replica.port)
        clock.lap("failover")

        rig.wait(rig.caught_up, "every event handled and committed", timeout=120)
        if not semisync:
            rig.rewind()
            run.rewound = True
            rig.wait(rig.caught_up, "every event handled again and committed", timeout=120)
        unsettled = f"SELECT COUNT(*) AS n FROM `{DATABASE}`.t_compensation WHERE status IN (1, 2)"
        rig.wait(lambda: pair.replica.query(unsettled)[0]["n"] == 0, "every dead letter settled", timeout=120)
        clock.lap("finish")
        run.workers_alive = all(w.alive for w in rig.workers)
        orders = run.confirmed + run.cancelled
        marks = ", ".join(["%s"] * len(orders))
        run.statuses = {row["order_no"]: row["status"] for row in pair.replica.query(
            f"SELECT order_no, status FROM `{DATABASE}`.t_order WHERE order_no IN ({marks})", *orders)}
        run.dead_letters = pair.replica.query(
            f"SELECT src_partition, src_offset, order_no, reason, message, status FROM `{DATABASE}`.t_compensation "
            "WHERE src_topic = %s", rig.events)
        run.ledger = rig.fakes.ledger()
        run.windows = pair.replica.query(f"SELECT opened_by, reason, ended_at FROM `{DATABASE}`.t_recovery_window")

        pair.restart_old_primary()
        run.lost_rows = pair.missing_on_replica(DATABASE, "t_idem", IDEM_KEY)
        run.lost_updates = lost_updates(pair)
        written, applied = seq_no(pair.primary.variable("gtid_binlog_pos")), seq_no(positions["replica_applied"])
        run.gtid_gap = None if written is None or applied is None else written - applied
        clock.lap("count")
        run.seconds["total"] = clock.total()
        print(run.report())
        return run
    finally:
        rig.stop()


class Phases:
    """Seconds per phase, into ``seconds``."""

    def __init__(self, seconds: dict) -> None:
        self.seconds = seconds
        self.started = self.mark = time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.seconds[name] = round(now - self.mark, 1)
        self.mark = now

    def total(self) -> float:
        return round(time.monotonic() - self.started, 1)


def lost_updates(pair: MariaDBPair) -> set[tuple]:
    """t_idem rows further along on the old primary than on the replica when it was promoted (or
    missing there): a lower attempt there, or the same attempt still pending. The replica may also
    be ahead (semi-sync: a transaction it acknowledged that the old primary's recovery rolled back);
    that loses nothing."""
    theirs = {row[:2]: row for row in pair.at_promotion[(DATABASE, "t_idem", IDEM_STATE)]}
    lost = set()
    for row in pair.rows(pair.primary, DATABASE, "t_idem", IDEM_STATE):
        replica_row = theirs.get(row[:2])
        if replica_row is None or replica_row[2:] < row[2:]:   # (attempt, status): pending 1 < done 2, failed 3
            lost.add(row)
    return lost


def _keys(docs: list[dict]) -> int:
    """The t_idem rows of ``docs``: a local step each, and a CONFIRM's waybill or a CANCEL's SMS."""
    return sum(2 if d["type"] in ("ORDER_CONFIRM", "ORDER_CANCEL") else 1 for d in docs)


@pytest.fixture(scope="module")
def semisync_failover(settings) -> Failover:
    return run_failover(settings, semisync=True)


@pytest.fixture(scope="module")
def async_failover(settings) -> Failover:
    return run_failover(settings, semisync=False)


def assert_survived(run: Failover) -> None:
    """The workers lived through it, every order ended where its events take it, and nothing was
    dead-lettered for the database's sake."""
    assert run.workers_alive
    assert run.done_at_kill < run.keys_first_wave, "the primary died after the work was done: no storm to fail over"
    assert {o: run.statuses.get(o) for o in run.confirmed} == {o: CONFIRMED for o in run.confirmed}
    assert {o: run.statuses.get(o) for o in run.cancelled} == {o: CANCELLED for o in run.cancelled}
    assert [d for d in run.dead_letters if d["reason"] in INFRA_REASONS] == []
    assert [d for d in run.dead_letters if d["status"] == MANUAL] == [], "left for a person"


def assert_effects_once(run: Failover) -> None:
    waybills, sms = run.ledger["waybills"], run.ledger["sms"]
    assert {o: len(waybills.get(o, [])) for o in run.confirmed} == {o: 1 for o in run.confirmed}
    assert {o: len(sms.get(o, [])) for o in run.cancelled} == {o: 1 for o in run.cancelled}
    assert not any(waybills.get(o) for o in run.cancelled) and not any(sms.get(o) for o in run.confirmed)


def test_a_semisync_failover_loses_no_row_and_every_effect_happens_once(semisync_failover, record_property):
    run = semisync_failover
    record_property("failover", run.report())
    assert run.semisync_fell_back == 0, "the primary stopped waiting for the replica: the run was not semi-sync"
    assert run.lost_rows == set() and run.lost_updates == set()
    assert run.gtid_gap is not None and run.gtid_gap <= 0
    assert_survived(run)
    # Nothing was lost, but the workers cannot know it: the window holds fresh SMS back for the settle.
    assert {d["reason"] for d in run.dead_letters} <= {"effect_outcome_unknown"}
    assert_effects_once(run)
    assert_window_opened_by_a_worker(run)


def assert_window_opened_by_a_worker(run: Failover) -> None:
    """The first connection to the promoted replica found another server than the store recorded."""
    [window] = run.windows
    assert window["opened_by"].startswith("worker:") and window["ended_at"] is None
    assert "the store's database server changed" in window["reason"]


def test_an_async_failover_is_survived_and_its_losses_counted(async_failover, record_property):
    run = async_failover
    record_property("failover", run.report())
    record_property("lost_t_idem_rows", len(run.lost_rows))
    assert run.lost_rows, "the replica was not behind: the failover lost nothing, and tests nothing"
    assert_window_opened_by_a_worker(run)
    assert_survived(run)


def test_an_async_failover_still_makes_every_effect_once(async_failover):
    """Rows lost, the group rewound: derived tokens and the recovery window keep every effect single."""
    assert_effects_once(async_failover)


def test_a_write_refused_by_a_read_only_replica_is_waited_out_until_it_is_promoted(settings):
    """The store against a real read-only server: an outage to wait out, not a refusal to dead-letter."""
    with MariaDBPair(semisync=False) as pair:
        pair.create_database(DATABASE, USER, PASSWORD)

        async def check() -> None:
            engine = create_engine(settings, url=pair.url(pair.replica, DATABASE, USER, PASSWORD), pool_size=1)
            leases = MySqlLeases(MySqlStore(engine))
            try:
                with pytest.raises(StoreUnavailable, match="read-only"):
                    await leases.acquire("failover-test", "me", 10)
                waits: list[float] = []

                async def promote_while_waiting(seconds: float) -> None:
                    waits.append(seconds)
                    pair.promote()

                guard = OutageGuard(30, sleep=promote_while_waiting)
                assert await guard(lambda: leases.acquire("failover-test", "me", 10)) is True
                assert len(waits) == 1
            finally:
                await engine.dispose()

        asyncio.run(check())
        assert pair.replica.query(f"SELECT owner FROM `{DATABASE}`.t_lease")[0]["owner"] == "me"
