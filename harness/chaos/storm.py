"""The storm: everything that goes wrong while the records are produced.

    all along      a random worker SIGKILLed every few seconds, started again a second later;
                   the APIs fail at random (every fake the registry lists): 5xx before doing
                   the work, the reply lost after doing it (reset), a hang past the client's
                   timeout, and latency
    once each      a worker added, a worker removed (SIGTERM): rebalances
                   MariaDB SIGKILLed and started again on the same data and port
                   the Kafka broker SIGKILLed and started again on the same data and port
                   the database's network cut (the proxy blackholes: connections hang)
                   every fake API answers 503 (and its lookup)

On the three-node cluster (``--cluster``) the single broker's restart gives way to:

    twice          the leader of the busiest partition of ``order-event`` (the most records
                   acknowledged so far) SIGKILLed, and started again once another node leads
                   the partition
    once           the active controller (the KRaft quorum's leader) SIGKILLed, and started
                   again once another node is the active controller
    once           the workers' connections to the brokers cut (a proxy per node blackholes
                   the workers' listener: connections hang, they are not refused; when the
                   partition heals what was held goes through); the run's producer, on a
                   listener of its own, goes on

With ``--db-failover semisync|async`` (``harness.chaos.failover``: the database is a primary and
its GTID replica) one more, in the middle slot, a seeded few seconds into it:

    once           the primary SIGKILLed while it commits (with ``async``, its replica stopped
                   receiving a seeded 3-8 s before, and the primary has committed at least 50
                   transactions since: the failover loses what it acknowledged meanwhile),
                   the replica promoted once it applied all it received, the proxy moved to it
                   (every open connection closed); then a worker must open a recovery window by
                   itself; with ``async`` also what the docs ask of an operator: the workers
                   stopped (SIGTERM), the group rewound on ``order-event`` to before the replica
                   fell behind, less the group's lag then and a margin, the workers started again;
                   the fault ends when the group has read past where it was before the rewind

The big faults take slots spread over the production time, in an order the seed picks; each
begins when its slot comes and the one before has ended, so their windows never overlap. The
short profile (``make test``) keeps every kind of fault, with an 8 s cut and an 8 s 503 window;
the long one (``make chaos``) cuts the database (and, on the cluster, the brokers) for 20 s and
answers 503 for 30 s; the short cluster profile keeps the broker faults, once each (the
single-broker short run has the others). Every fault is logged with its wall-clock time (and
the node it hit) for the manifest.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

from app.adapters.kafka import ops as kafka_ops
from demo.fakes import registry as fake_registry
from harness.chaos.failover import rewind_group
from harness.chaos.fleet import Fleet
from harness.chaos.producer import SteadyProducer
from harness.fakes import FakesProcess
from harness.own_servers import MariaDB
from harness.proxy import BlackholeProxy

SLOTS = ("w1", "w2", "w3")
EXTRA = "w4"
FOREVER = 10**9
SINGLE = ("restart_mariadb", "restart_kafka", "cut_database", "apis_503")
CLUSTER = ("restart_mariadb", "cut_database", "apis_503", "kill_leader", "kill_leader", "kill_controller",
           "cut_brokers")
GATE_AFTER = 0.04                        # the producer waits this share of the records past a big fault's slot
BETWEEN = 3.0                            # seconds between the end of a big fault and the next one
# The drain's bound (a bound, not a wait: it ends as soon as the run settles). A compensator
# SIGKILLed holding claims on dead letters leaves them "retrying" until the claim's lease ends,
# LEASE_SECONDS + INFRA_RETRY_BUDGET_SECONDS + 3 x DB_TRANSACTION_TIMEOUT_SECONDS (14 + 60 + 90 s
# with the run's settings); then another worker redrives them. The short run's bound outlasts it.
SHORT_DRAIN = 200
# The failover: how long before the kill the async replica stops receiving (with semisync, how
# long into its slot the primary dies); then, within a bound, until the kill strikes a primary at
# work: with async one that committed UNREPLICATED transactions the replica never got, with
# semisync one committing COMMITTING a second (right after the database cut the workers may write
# nothing for tens of seconds); how long a worker may take to open the recovery window; how far
# before the oldest record the group had not committed when the replica fell behind the operator
# rewinds it (record timestamps are the producer's clock, the same machine's); how long the
# replay may take to read past where the group was when the workers stopped: the failover ends
# then, as an operator's watch of the lag does, so the next big fault does not stall the replay
# while dead letters of events that met the lost rows use up their redrives.
FAILOVER_LEAD = (3.0, 8.0)
UNREPLICATED, COMMITTING, AT_WORK_WAIT = 50, 5, 90.0
WINDOW_WAIT = 120.0
REWIND_MARGIN = 10.0
REPLAY_WAIT = 180.0


@dataclass(frozen=True)
class Profile:
    name: str
    min_events: int
    min_orders: int
    rate: float                          # records per second
    kill_every: tuple[float, float] | None   # seconds between two kills, uniformly drawn (None: no kills)
    cut_seconds: float                   # the database's network cut
    api_503_seconds: float
    drain_timeout: float
    duplicate_within: int                # records between an event and its duplicate, at most
    restart_after: float = 1.0           # a killed worker is started again this long after
    big: tuple[str, ...] = SINGLE        # the big faults, once each (a name twice: twice)
    # The workers' slots; whether a worker is added and one removed; whether the big faults come in
    # an order the seed picks or in the order named (a rolling upgrade's steps); the share of the
    # production time they are spread over.
    slots: tuple[str, ...] = SLOTS
    scale: bool = True
    shuffle: bool = True
    window: tuple[float, float] = (0.15, 0.84)
    # A rolling upgrade (``harness.chaos.upgrade``): the workers start on the previous release, on a
    # database at its schema; the big faults name the upgrade's steps.
    upgrade: bool = False
    api_rates: dict = field(default_factory=lambda: {"fail_rate": 0.02, "reset_rate": 0.02, "timeout_rate": 0.01})
    # The fakes the rates apply to, by name; None: every fake the registry lists (``demo.fakes.registry``),
    # a test's throwaway one too.
    faulty: tuple[str, ...] | None = None
    # The workers' settings: the run's own, chosen to move in seconds (``driver.WORKER_SETTINGS``),
    # or every one at its default, as a user runs them.
    default_settings: bool = False
    hang_ms: float = 2500                # a "timeout" of the fake APIs: past the client's timeout
    latency_ms: float = 5
    # Every fake's pace from the start, and a fake's own on top, by name (``demo/fakes/faults.py``).
    pace_every: dict = field(default_factory=dict)
    pace: dict = field(default_factory=dict)


PROFILES = {
    "long": Profile("long", min_events=50_000, min_orders=10_000, rate=250, kill_every=(6, 12), cut_seconds=20,
                    api_503_seconds=30, drain_timeout=600, duplicate_within=2000),
    "short": Profile("short", min_events=3_400, min_orders=1_000, rate=45, kill_every=(7, 11), cut_seconds=8,
                     api_503_seconds=8, drain_timeout=SHORT_DRAIN, duplicate_within=300),
}
# What a user meets with every setting at its default (``make chaos MODE=defaults``): 5,000 orders
# over three workers, about twelve SIGKILLs, MariaDB and the broker SIGKILLed once each, the SMS
# gateway losing 2 % of its replies and hanging past the client's 3 s timeout on 1 % of its calls,
# both services answering in 100 ms; the report gives how long each cancelled order waited for its
# SMS (``harness.chaos.latency``).
PROFILES["defaults"] = Profile("defaults", min_events=0, min_orders=5_000, rate=50, kill_every=(18, 26),
                               cut_seconds=0, api_503_seconds=0, drain_timeout=1_800, duplicate_within=600,
                               big=("restart_mariadb", "restart_kafka"),
                               api_rates={"reset_rate": 0.02, "timeout_rate": 0.01}, faulty=("sms",),
                               default_settings=True, hang_ms=5_000, latency_ms=100)
TAIL = {"latency_median_ms": 100, "latency_sigma": 0.8}
# The long run at a real provider's pace (``make chaos MODE=pace``): every API answers after a
# lognormal latency (median 100 ms, sigma 0.8: a long tail), 1 % of calls hang 5 s, past the
# client's 3 s timeout, and the waybill API answers 429 above 150 calls/s; a slow call holds up
# only its order, so this is the run where records of one partition finish out of order.
PROFILES["pace"] = Profile("pace", min_events=30_000, min_orders=6_000, rate=150, kill_every=(6, 12), cut_seconds=20,
                           api_503_seconds=30, drain_timeout=900, duplicate_within=2000, hang_ms=5_000, latency_ms=0,
                           pace_every=TAIL, pace={"waybill": {"calls_per_second": 150}},
                           api_rates={"fail_rate": 0.02, "reset_rate": 0.02, "timeout_rate": 0.01})
# A rolling upgrade under load and its rollback (``harness.chaos.upgrade``): the previous release's
# workers, the current code's migrations online, each worker replaced by the current code one at a
# time, then each replaced by the previous release again. ``make test`` runs the short one: two
# workers, a few hundred orders, the APIs' random faults and nothing else, so that each replacement's
# figures are its own; ``make chaos MODE=upgrade`` the long one: three workers, the storm (kills all
# along, paused while a worker is replaced, and the single broker's big faults between the steps).
UPGRADE = ("migrate_online", "upgrade_worker", "upgrade_worker", "roll_back_worker", "roll_back_worker")
# Its last step must still meet input after the one before it let the input flow (a replacement takes
# 10-20 s, and its input flows past the next gates): the last gate leaves a third of the records.
PROFILES["upgrade-short"] = Profile("upgrade-short", min_events=0, min_orders=400, rate=10, kill_every=None,
                                    cut_seconds=0, api_503_seconds=0, drain_timeout=SHORT_DRAIN,
                                    duplicate_within=200, big=UPGRADE, slots=("w1", "w2"), scale=False,
                                    shuffle=False, window=(0.1, 0.6), upgrade=True)
PROFILES["upgrade"] = Profile("upgrade", min_events=0, min_orders=4_000, rate=50, kill_every=(8, 14), cut_seconds=20,
                              api_503_seconds=30, drain_timeout=600, duplicate_within=1000,
                              big=("restart_mariadb", "migrate_online", "upgrade_worker", "cut_database",
                                   "upgrade_worker", "upgrade_worker", "restart_kafka", "roll_back_worker",
                                   "apis_503", "roll_back_worker", "roll_back_worker"),
                              scale=False, shuffle=False, window=(0.08, 0.75), upgrade=True)
# --cluster: three faults more in the long run, so it produces more slowly to give each its slot.
CLUSTER_PROFILES = {
    "long": Profile("long", min_events=50_000, min_orders=10_000, rate=200, kill_every=(6, 12), cut_seconds=20,
                    api_503_seconds=30, drain_timeout=600, duplicate_within=2000, big=CLUSTER),
    "short": Profile("short", min_events=2_700, min_orders=800, rate=40, kill_every=(7, 11), cut_seconds=8,
                     api_503_seconds=8, drain_timeout=SHORT_DRAIN, duplicate_within=300,
                     big=("kill_leader", "kill_controller", "cut_brokers")),
}


class Storm:
    def __init__(self, profile: Profile, seed: int, *, fleet: Fleet, mariadb: MariaDB, brokers,
                 proxy: BlackholeProxy, fakes: FakesProcess, producer: SteadyProducer, events_topic: str,
                 say=print, failover: bool = False, group: str | None = None, partitions: int | None = None,
                 steps: dict | None = None) -> None:
        """``brokers``: a ``harness.chaos.brokers`` SingleBroker or SecureCluster. ``failover``:
        ``mariadb`` is a ``harness.chaos.failover.ReplicatedMariaDB`` to fail over once (the
        rewind then needs the workers' ``group`` and the events topic's ``partitions``).
        ``steps``: big faults of the caller's by name (a rolling upgrade's), beside the storm's own."""
        self.profile, self.fleet, self.mariadb, self.brokers = profile, fleet, mariadb, brokers
        self.events_topic = events_topic
        self.proxy, self.fakes, self.producer, self.say = proxy, fakes, producer, say
        self.rng = random.Random(seed * 7919 + 1)
        self.faults: list[dict] = []
        self.busy: set[str] = set()          # slots a fault is working on right now
        self.ending = asyncio.Event()
        # Worker starts and the broker faults stay apart: a worker started while the broker is
        # down, or killed under it while it starts, exits at once (1: aiokafka's producer cannot
        # bootstrap, and Faust does not retry at start-up); on the cluster, one started while a
        # node is down or the brokers are cut may be refused by its first connection check (a
        # proxy of a dead node closes the TLS handshake). A supervisor would start it again
        # until the brokers answer; the storm waits for them instead, and a broker fault waits
        # until no worker is starting.
        self.broker_up = asyncio.Event()
        self.starting = 0
        self.sabotage: str | None = None     # "crash": one worker dies of something the test did not do
        self.failover, self.group, self.partitions = failover, group, partitions
        self.failover_rng = random.Random(seed * 7919 + 2)
        self.paused = False                  # no kill, no scale-down: the operator has the workers
        self.steps = steps or {}

    def log(self, kind: str, worker: str | None = None, detail: str | None = None, **more) -> None:
        self.faults.append({"at": time.time(), "kind": kind, "worker": worker, "detail": detail, **more})
        self.say(f"{kind}{' ' + worker if worker else ''}{': ' + detail if detail else ''}")

    # -- the run ------------------------------------------------------------------------
    async def run(self) -> list[dict]:
        """Produce every record while the faults happen; return the manifest's ``produced``."""
        seconds = len(self.producer.records) / self.profile.rate
        big = [self.steps.get(name) or getattr(self, name) for name in self.profile.big]
        if self.profile.shuffle:
            self.rng.shuffle(big)
        if self.failover:
            big.insert(len(big) // 2, self.fail_over_database)
        # A cut database keeps the workers busy after it is restored (their hung statements time
        # out after DB_STATEMENT_TIMEOUT_SECONDS, 15 s): the slots are far enough apart for the
        # next fault to meet work in flight, not a backlog.
        plan = [(0.08 * seconds, self.add_worker), (0.92 * seconds, self.remove_worker)] if self.profile.scale else []
        first, last = self.profile.window
        slots = [first + (last - first) * i / max(len(big) - 1, 1) for i in range(len(big))]
        # A big fault that begins late (the one before took long: a node's restart under load) must
        # still meet records in flight: the producer waits a little past each fault's slot until
        # the fault has begun.
        gates = [asyncio.Event() for _ in big]
        count = len(self.producer.records)
        self.producer.gates = [(min(count - 1, int((f + GATE_AFTER) * count)), gate) for f, gate in zip(slots, gates)]
        plan.append((0.0, lambda: self._one_after_another(
            [(f * seconds, fault) for f, fault in zip(slots, big)], gates)))
        if self.sabotage == "crash":
            plan.append((0.5 * seconds, self.crash_a_worker))
        faulty = self.fault_targets()
        self.log("api_faults_on", detail=", ".join(f"{k} {v}" for k, v in self.profile.api_rates.items())
                 + f" on {', '.join(faulty)}")
        await self._configure({name: self.profile.api_rates for name in faulty})
        self.broker_up.set()
        producing = asyncio.create_task(self.producer.run())
        started = time.monotonic()
        faults = [asyncio.create_task(self._at(started + at, fault)) for at, fault in plan]
        kills = asyncio.create_task(self.kill_now_and_then())
        watching = asyncio.create_task(self.watch())
        try:
            produced = await producing
            await asyncio.gather(*faults)
            self.ending.set()
            await kills
        finally:
            self.ending.set()
            for task in (producing, *faults, kills, watching):
                task.cancel()
            await asyncio.gather(producing, *faults, kills, watching, return_exceptions=True)
        await self._configure({name: {rate: 0 for rate in self.profile.api_rates} for name in faulty})
        self.log("api_faults_off")
        return produced

    def fault_targets(self) -> tuple[str, ...]:
        """The fakes the random faults strike: the profile's, else every fake the registry lists."""
        return self.profile.faulty or fake_registry.names()

    async def _at(self, when: float, fault) -> None:
        await asyncio.sleep(max(0.0, when - time.monotonic()))
        await fault()

    async def _one_after_another(self, plan: list[tuple[float, object]], gates: list[asyncio.Event]) -> None:
        """Each big fault at its slot (seconds after the start), or when the one before has ended;
        its gate lets the producer go on as it begins."""
        began = time.monotonic()
        try:
            for (at, fault), gate in zip(plan, gates):
                await asyncio.sleep(max(0.0, began + at - time.monotonic()))
                gate.set()
                await fault()
                await asyncio.sleep(BETWEEN)
        finally:
            for gate in gates:
                gate.set()

    async def watch(self) -> None:
        """Supervise: a worker that exited without the test's doing is started again."""
        while True:
            for exited in await asyncio.to_thread(self.fleet.watch, False):
                self.busy.add(exited.slot)
                try:
                    await self.start_worker(exited.slot)
                finally:
                    self.busy.discard(exited.slot)
            await asyncio.sleep(0.5)

    async def start_worker(self, slot: str):
        """Start the slot's worker once the broker is up, and wait until its clients have
        reached the broker (or it is gone). Joining the group may take much longer (the
        group waits for the batches in flight): that is not waited for."""
        while True:
            await self.broker_up.wait()
            if self.broker_up.is_set():       # still: nothing ran between the wait and here
                break
        self.starting += 1
        try:
            started = await asyncio.to_thread(self.fleet.start, slot)
            try:
                await asyncio.to_thread(started.worker.wait_log, "Discovered coordinator", 120)
            except AssertionError as exc:     # it exited while starting: the supervisor's business
                self.say(f"worker {started.id} did not start: {exc}")
            return started
        finally:
            self.starting -= 1

    # -- kills all along ----------------------------------------------------------------
    async def kill_now_and_then(self) -> None:
        if self.profile.kill_every is None:
            return
        while True:
            try:
                await asyncio.wait_for(self.ending.wait(), self.rng.uniform(*self.profile.kill_every))
                return
            except TimeoutError:
                pass
            slots = sorted(set(self.fleet.live) - self.busy)
            if slots and not self.paused:
                await self.kill_and_restart(self.rng.choice(slots))

    async def kill_and_restart(self, slot: str) -> None:
        self.busy.add(slot)
        try:
            killed = await asyncio.to_thread(self.fleet.kill, slot)
            self.log("kill_worker", killed.id, f"exit {killed.returncode}")
            await asyncio.sleep(self.profile.restart_after)
            started = await self.start_worker(slot)
            self.log("start_worker", started.id)
        finally:
            self.busy.discard(slot)

    # -- once each ----------------------------------------------------------------------
    async def add_worker(self) -> None:
        self.busy.add(EXTRA)
        try:
            started = await self.start_worker(EXTRA)
            self.log("add_worker", started.id)
        finally:
            self.busy.discard(EXTRA)

    async def remove_worker(self) -> None:
        while self.paused:
            await asyncio.sleep(0.2)
        slots = sorted(set(self.fleet.live) - self.busy)
        slot = self.rng.choice(slots)
        self.busy.add(slot)
        try:
            stopped = await asyncio.to_thread(self.fleet.stop, slot)
            self.log("remove_worker", stopped.id, f"SIGTERM, exit {stopped.returncode}")
        finally:
            self.busy.discard(slot)

    async def restart_mariadb(self) -> None:
        await self._restart(self.mariadb, "mariadb")

    async def restart_kafka(self) -> None:
        await self._restart(self.brokers, "kafka")

    async def _restart(self, server, kind: str) -> None:
        if kind == "kafka":
            await self._hold_worker_starts()
        await asyncio.to_thread(server.kill)
        self.log(f"{kind}_kill", detail="SIGKILL")
        took = await asyncio.to_thread(server.start)
        self.log(f"{kind}_start", detail=f"answered {took:.2f}s after its start")
        self.broker_up.set()

    async def _hold_worker_starts(self) -> None:
        self.broker_up.clear()
        while self.starting:
            await asyncio.sleep(0.1)

    # -- the cluster's faults -------------------------------------------------------------
    def busiest_partition(self) -> int:
        """The partition of the events topic with the most records acknowledged so far."""
        counts = self.producer.acked_on
        return min(counts, key=lambda p: (-counts[p], p)) if counts else 0

    async def kill_leader(self) -> None:
        partition = self.busiest_partition()
        node = await asyncio.to_thread(self.brokers.leader_of, self.events_topic, partition)
        await self._kill_node(node, "leader", f"leader of {self.events_topic}[{partition}], the busiest "
                                               f"({self.producer.acked_on[partition]:,} records acknowledged there)",
                              lambda: self.brokers.leader_of(self.events_topic, partition) != node,
                              f"another leader of {self.events_topic}[{partition}]", partition=partition)

    async def kill_controller(self) -> None:
        node = await asyncio.to_thread(self.brokers.active_controller)
        await self._kill_node(node, "controller", "the active controller",
                              lambda: self.brokers.active_controller() != node, "another active controller")

    async def _kill_node(self, node: int, role: str, what: str, moved, moved_what: str, **more) -> None:
        """SIGKILL ``node``; once ``moved()`` (another node took its role), start it again on its
        data; it counts as back once it is in the ISR of every partition it holds."""
        await self._hold_worker_starts()
        clock = time.monotonic()
        await asyncio.to_thread(self.brokers.kill_node, node)
        self.log(f"{role}_kill", detail=f"node {node}, {what}: SIGKILL", node=node, **more)
        try:
            await asyncio.to_thread(self.brokers.wait_for, moved, timeout=120, what=moved_what)
            moved_after = time.monotonic() - clock
            took = await asyncio.to_thread(self.brokers.start_node, node)
        finally:
            self.broker_up.set()
        self.log(f"{role}_start", detail=f"node {node}: {moved_what} {moved_after:.1f}s after the kill; started "
                                         f"again, in every ISR {took:.1f}s after its start", node=node, **more)

    async def cut_brokers(self) -> None:
        await self._hold_worker_starts()
        try:
            self.brokers.cut()
            after = ("the partition heals" if getattr(self.brokers, "heal_cuts", True)
                     else "it ends, and those it hung stay hung for good")
            self.log("broker_cut", detail=f"{self.profile.cut_seconds:g}s: the workers' connections to every "
                                          f"broker hang, new ones hang, until {after} (the producer's "
                                          "listener is not cut)")
            await asyncio.sleep(self.profile.cut_seconds)
            self.brokers.restore()
            self.log("broker_restore")
        finally:
            self.broker_up.set()

    async def cut_database(self) -> None:
        self.proxy.blackhole()
        self.log("db_cut", detail=f"{self.profile.cut_seconds:g}s: open connections hang, new ones hang")
        await asyncio.sleep(self.profile.cut_seconds)
        self.proxy.restore()
        self.log("db_restore")

    # -- the database's failover ----------------------------------------------------------
    async def fail_over_database(self) -> None:
        db = self.mariadb
        lead = self.failover_rng.uniform(*FAILOVER_LEAD)
        behind_at, committed = None, None
        if not db.semisync:
            behind = await asyncio.to_thread(db.fall_behind)
            behind_at = time.time()
            committed = await kafka_ops.committed_offsets(self.brokers.connection(), self.group, self.events_topic,
                                                          self.partitions)
            self.log("db_replica_behind", detail=f"the replica's IO thread stopped at {behind['replica_received']}; "
                                                 f"the primary dies {lead:.1f}s later", positions=behind,
                     committed=committed)
        await asyncio.sleep(lead)
        waited = await self._primary_at_work()
        before = await asyncio.to_thread(db.kill_primary)
        semisync = before.get("semisync") or {}
        self.log("db_primary_kill", detail=f"SIGKILL ({waited:.1f}s after the lead, for a primary at work); its "
                                           f"binary log at {before['primary_binlog']}, the replica received "
                                           f"{before['replica_received']}"
                                           + (f"; semi-sync {semisync.get('status')}, {semisync.get('yes_tx')} "
                                              f"commits acknowledged, {semisync.get('no_tx')} not, fell back "
                                              f"{semisync.get('no_times')}x" if db.semisync else ""),
                 positions=before)
        promoted = await asyncio.to_thread(db.promote)
        self.log("db_promote", detail=f"the replica applied all it received ({promoted['replica_applied']}) in "
                                      f"{promoted['seconds']}s; RESET SLAVE ALL, read_only=OFF", promoted=promoted)
        await asyncio.to_thread(self.proxy.retarget, "127.0.0.1", db.port)
        self.log("db_retarget", detail=f"the proxy forwards to the promoted replica (port {db.port}); every "
                                       "connection open through it closed")
        window = await self._window_opened()
        if window is None:
            self.log("db_window_missing", detail=f"no worker opened a recovery window within {WINDOW_WAIT:g}s")
        else:
            self.log("db_window_opened", detail=f"window {window['id']} opened by {window['opened_by']}",
                     window={**window, "opened_at": str(window["opened_at"])})
        if not db.semisync:
            rewound = await self._rewind_after(behind_at, committed)
            await self._replayed(rewound["committed_before"])

    async def _primary_at_work(self) -> float:
        """Seconds waited until the primary is at work (a bound, not a goal): see UNREPLICATED."""
        db, clock = self.mariadb, time.monotonic()
        last = await asyncio.to_thread(db.written)
        while time.monotonic() - clock < AT_WORK_WAIT:
            if not db.semisync and await asyncio.to_thread(db.unreplicated) >= UNREPLICATED:
                break
            await asyncio.sleep(1.0)
            now = await asyncio.to_thread(db.written)
            if db.semisync and now - last >= COMMITTING:
                break
            last = now
        return time.monotonic() - clock

    async def _window_opened(self) -> dict | None:
        """The recovery window a worker opened when it found the promoted replica."""
        deadline = time.monotonic() + WINDOW_WAIT
        while time.monotonic() < deadline:
            try:
                opened = [w for w in await asyncio.to_thread(self.mariadb.windows)
                          if w["opened_by"].startswith("worker:")]
            except Exception:             # the promoted server restarting: look again
                opened = []
            if opened:
                return opened[0]
            await asyncio.sleep(0.2)
        return None

    async def _rewind_after(self, behind_at: float, committed: dict[int, int]) -> dict:
        """What the docs ask of an operator after a failover that may have lost rows whose
        records were committed: stop the workers, rewind the group to before the replica fell
        behind, less the group's lag at that moment and a margin, start them again."""
        self.paused = True
        slots: list[str] = []
        try:
            while self.busy:                  # a kill or a start in progress ends first
                await asyncio.sleep(0.2)
            slots = sorted(self.fleet.live)
            self.busy.update(slots)
            # One after another: a worker stopping while another's stop rebalances the group can
            # be caught in that rebalance until its stop bound runs out (exit 70).
            stopped = [await asyncio.to_thread(self.fleet.stop, slot) for slot in slots]
            self.log("db_workers_stopped", detail=", ".join(f"{i.id} exit {i.returncode}" for i in stopped))
            sent = {ack[:2]: self.producer.sent_at[i] for i, ack in enumerate(self.producer.acked) if ack}
            oldest = min([sent[(p, offset)] for p, offset in committed.items() if (p, offset) in sent]
                         + [behind_at])
            to = oldest - REWIND_MARGIN
            rewound = await rewind_group(self.brokers.connection(), self.group, self.events_topic,
                                         self.partitions, int(to * 1000))
            covered = all(rewound["committed_after"][p] <= offset for p, offset in committed.items())
            self.log("db_group_rewound", detail=f"{self.events_topic} rewound to {behind_at - to:.1f}s before the "
                                                f"replica fell behind ({behind_at - oldest:.1f}s of the group's lag "
                                                f"then, {REWIND_MARGIN:g}s of margin): {rewound['records']:,} "
                                                "records to read again"
                                                + ("" if covered else "; NOT back to the offsets committed then"),
                     rewind={**rewound, "to": to, "lag_seconds": round(behind_at - oldest, 1),
                             "margin_seconds": REWIND_MARGIN, "covered": covered})
            for slot in slots:
                started = await self.start_worker(slot)
                self.log("start_worker", started.id)
            return rewound
        finally:
            self.busy.difference_update(slots)
            self.paused = False

    async def _replayed(self, before: dict[int, int]) -> None:
        """Wait (a bound) until the group has committed past where it was when the workers stopped."""
        clock = time.monotonic()
        behind: dict[int, int] = dict(before)
        while time.monotonic() - clock < REPLAY_WAIT:
            try:
                now = await kafka_ops.committed_offsets(self.brokers.connection(), self.group, self.events_topic,
                                                        self.partitions)
                behind = {p: offset - now[p] for p, offset in before.items() if now[p] < offset}
            except Exception:                 # the broker busy or away: look again
                pass
            if not behind:
                self.log("db_replayed", detail=f"the group committed past where it was before the rewind "
                                               f"{time.monotonic() - clock:.1f}s after the workers started again")
                return
            await asyncio.sleep(1.0)
        self.log("db_replay_slow", detail=f"after {REPLAY_WAIT:g}s the group is still behind where it was "
                                          f"before the rewind: {behind}")

    async def apis_503(self) -> None:
        """Every fake the registry lists answers 503, its lookup too if it has one."""
        names = fake_registry.names()
        await self._configure({name: {"fail_next": FOREVER, "fail_status": 503, "lookup_fail_next": FOREVER}
                               for name in names})
        self.log("api_503_on", detail=f"{self.profile.api_503_seconds:g}s, every fake API and its lookup: "
                                      f"{', '.join(names)}")
        await asyncio.sleep(self.profile.api_503_seconds)
        await self._configure({name: {"fail_next": 0, "lookup_fail_next": 0} for name in names})
        self.log("api_503_off")

    async def crash_a_worker(self) -> None:
        """Sabotage, to see the run fail: a worker dies and the test does not say it did it."""
        slot = sorted(set(self.fleet.live) - self.busy)[0]
        self.fleet.live[slot].worker.proc.kill()
        self.say(f"sabotage: worker {self.fleet.live[slot].id} killed behind the test's back")

    async def _configure(self, config: dict) -> None:
        await asyncio.to_thread(self.fakes.configure, config)
