"""The chaos run: its own Kafka broker and MariaDB, the fake APIs with their faults, three
real workers, a storm of faults while the records are produced, the drain, the manifest,
and the checker's verdict.

    .venv/bin/python -m harness.chaos.driver --mode long --seed 7      # make chaos
    .venv/bin/python -m harness.chaos.driver --mode short              # what make test runs
    .venv/bin/python -m harness.chaos.driver --mode long --cluster     # make chaos CLUSTER=1
    .venv/bin/python -m harness.chaos.driver --mode long --db-failover async   # make chaos DB_FAILOVER=async
    .venv/bin/python -m harness.chaos.driver --mode defaults           # make chaos MODE=defaults
    .venv/bin/python -m harness.chaos.driver --mode long --outbox at-least-once   # make chaos OUTBOX=at-least-once
    .venv/bin/python -m harness.chaos.driver --mode upgrade        # make chaos MODE=upgrade

``--cluster`` runs the storm on three KRaft nodes over SASL_SSL, each behind a proxy of the
test (``harness.chaos.brokers``), with the cluster's faults on top: the busiest partition's
leader SIGKILLed twice, the active controller once, the workers cut from the brokers.

``--db-failover semisync|async`` runs the database as a primary and its GTID replica
(``harness.chaos.failover``), semi-synchronous (AFTER_SYNC) or asynchronous, and fails over once
in the middle of the storm; after the drain the dead primary's data directory is started again
to count what the failover lost (``failover`` in the manifest and the report).

Everything lands in ``.cache/chaos/runs/<UTC time>-<mode>-seed<N>/``: ``driver.log`` (what
happened when), ``manifest.json`` (what the checker reads), ``report.json`` (its verdict
and the run's timings), the workers' logs, and the broker's and the database's logs.
Everything the run starts is stopped when it ends, however it ends; the data of the broker
and the database go with it, and only the newest ``KEEP_RUNS`` run folders are kept.

``--outbox at-least-once|exactly-once`` has an order service write the records into its transactional
outbox, relayed by Debezium in Kafka Connect (``harness.chaos.outbox``), with or without Connect's
exactly-once support; Connect is SIGKILLed and started again while the storm blows, and the workers
read the outbox's envelope (``EVENT_ENVELOPE=outbox``).

``--mode defaults`` runs the workers with every setting at its default, as a user does, through
a storm of what a user meets (``storm.PROFILES["defaults"]``), and the report gives how long each
cancelled order waited for its SMS (``harness.chaos.latency``; every run's report has it).

``--mode upgrade`` (and ``upgrade-short``, what ``make test`` runs) is a rolling upgrade under load and
its rollback (``harness.chaos.upgrade``): the workers start on the previous release on a database at
its schema, the current code's migrations run online mid-run, each worker is replaced by the current
code one at a time (SIGTERM), then each by the previous release again; the report gives every
replacement's replay window and how long the group took to settle.

``--sabotage crash`` (a worker dies behind the test's back) and ``--sabotage no-drain``
(every worker stops before the drain) show that the run can fail.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from app.adapters.effects import registry
from app.adapters.kafka import ops as kafka_ops
from app.adapters.kafka.topics import topic_specs
from app.pipeline.steps import PIPELINES
from app.settings import Settings
from demo.fakes import registry as fake_registry
from harness import preload as preload_module
from harness.chaos import evidence, latency
from harness.chaos import manifest as manifests
from harness.chaos import outbox as outboxes
from harness.chaos.brokers import SecureCluster, SingleBroker
from harness.chaos.drain import DrainTimeout, read_backlog, wait_settled
from harness.chaos.failover import MODES as FAILOVER_MODES
from harness.chaos.failover import ReplicatedMariaDB
from harness.chaos.fleet import Fleet
from harness.chaos.producer import SteadyProducer
from harness.chaos.storm import CLUSTER_PROFILES, PROFILES, Storm
from harness.chaos.upgrade import RollingUpgrade
from harness.chaos.workload import Shares, plan
from harness.fakes import FakesProcess
from harness.outbox_relay import OutboxRelay
from harness.own_servers import CHAOS, MariaDB
from harness.proxy import BlackholeProxy
from harness.releases import previous_release
from harness.services import ROOT, worker_env

GROUP = "order-event-processor"
EVENTS, DLQ = "order-event", "order-event-dlq"
PARTITIONS, DLQ_PARTITIONS = 8, 3
DATABASE = USER = "chaos"
# Documented settings (docs/configuration.md), chosen so that the run moves in seconds, not
# minutes; what each buys is said beside it. Everything else is the default.
WORKER_SETTINGS = {
    # A SIGKILLed worker's partitions move after 6 s (the least Kafka allows), not 30 s.
    "BROKER_SESSION_TIMEOUT_SECONDS": "6", "BROKER_HEARTBEAT_INTERVAL_SECONDS": "1", "BATCH_DEADLINE_SECONDS": "5",
    # A dead worker's claims are taken over after 14 s: calls of at most 1.5 s (a lookup and a
    # send: 3 s), 256 at a time, the two batches of 500 in flight in 4 rounds (12.5 s). Retries of 1.2 s in all:
    # an event that arrives before the one it needs (PAID before CREATED) holds its batch up
    # that long before it is dead-lettered for the compensator.
    "BATCH_WITHIN_SECONDS": "0.5", "EFFECT_TIMEOUT_SECONDS": "1.5", "LEASE_SECONDS": "14", "EFFECT_CONCURRENCY": "256",
    "LEASE_MARGIN_SECONDS": "0.5", "RETRY_BACKOFF_MS": "100,300,800",
    # The fake gateway hangs 2.5 s past the call's timeout before it acts: the lookup waits 5 s.
    "SMS_LOOKUP": "true", "SMS_LOOKUP_SETTLE_SECONDS": "5",
    # Dead letters are due at once and retried every second or so, up to 12 times.
    "DLQ_RETRY_AFTER_SECONDS": "1", "COMPENSATION_TIMER_SECONDS": "0.5", "COMPENSATION_BACKOFF_SECONDS": "1",
    "COMPENSATION_BACKOFF_MAX_SECONDS": "8", "COMPENSATION_MAX_ATTEMPTS": "12", "COMPENSATOR_WITHIN_SECONDS": "0.3",
    "METRICS_REFRESH_SECONDS": "5",
    # The watchdog keeps the bounds a user with the default 30 s session timeout has (30 s, then
    # a third of it: it takes them from the session timeout by default): with the 6 s above, it
    # would give up on a worker 8 s into a cut of the brokers that a user's worker rides out.
    "WATCHDOG_STALL_SECONDS": "30", "WATCHDOG_REJOIN_GRACE_SECONDS": "10",
    # So does the bound of a stop after SIGTERM (the session timeout's by default, 30 s).
    "STOP_TIMEOUT_SECONDS": "30",
}
KEEP_RUNS = 30
CONNECT_KILLS = 5                      # with an outbox upstream: Connect SIGKILLed this many times


def declared_effect_steps(pipelines=PIPELINES, settings: dict[str, str] | None = None,
                          providers=None, fakes=None) -> list[dict]:
    """Every effect step the pipeline declares, with the provider, the contract and how long the provider
    keeps keys (seconds, None: for ever) as a worker started with ``settings`` deploys it (the providers'
    registry), and what the fakes' ledger records that provider's calls as (its fake's ``services``: the
    call, then its lookup), for the checker to match against what it checks."""
    effects = Settings(**{name.lower(): value for name, value in (settings or {}).items()
                          if name.upper().startswith(("EFFECTS__", "SMS_"))}).effects
    steps = []
    for type_, pipe in pipelines.items():
        for step in pipe.effects:
            try:
                provider = registry.chosen(step.effect.name, effects, providers)
            except registry.UnknownProvider:
                provider = None
            resolved = effects.effect(step.effect.name)
            contract = provider.contract_for(resolved).value if provider else None
            fake = fake_registry.of(provider.name, fakes) if provider else None
            steps.append({"event_type": type_.value, "step": step.name, "effect": step.effect.name,
                          "provider": provider.name if provider else None, "contract": contract,
                          "keys_kept_for_seconds": provider.key_horizon(resolved) if provider else None,
                          "services": list(fake.services) if fake else []})
    return steps


def fakes_config(profile, seed: int) -> dict[str, dict]:
    """How the run's fakes start (``POST /__config``): every fake the registry lists, a test's throwaway
    one too, with the profile's latency, hang and pace, each seeded by its place in the registry."""
    return {name: {"latency_ms": profile.latency_ms, "timeout_ms": profile.hang_ms, "seed": seed + i,
                   **profile.pace_every, **profile.pace.get(name, {})}
            for i, name in enumerate(fake_registry.names())}


def registry_contract(settings: dict[str, str], effect: str) -> str | None:
    """The contract a worker started with ``settings`` deploys for ``effect``."""
    return next((d["contract"] for d in declared_effect_steps(settings=settings) if d["effect"] == effect), None)


@dataclass
class Outcome:
    manifest: Path
    report_path: Path
    report: object | None           # the checker's CheckReport, None if there is no checker yet
    unexpected_exits: list[dict]
    drain_error: str | None

    @property
    def ok(self) -> bool:
        return (self.drain_error is None and not self.unexpected_exits
                and (self.report is None or bool(self.report.ok)))


class ChaosRun:
    def __init__(self, mode: str, seed: int | None = None, *, sabotage: str | None = None,
                 drain_timeout: float | None = None, cluster: bool = False, cut_forgets: bool = False,
                 db_failover: str | None = None, settings: dict[str, str] | None = None,
                 outbox: str | None = None, preload: tuple[str, ...] = ()) -> None:
        self.mode, self.cluster, self.db_failover, self.outbox = mode, cluster, db_failover, outbox
        # Modules of the caller's own (a provider with its effect's step and its fake), installed in this
        # process and in every process the run starts: the workers, the fakes, the reconcile (harness.preload).
        self.preload = tuple(preload)
        self.process_env = {**os.environ, preload_module.VARIABLE: ",".join(preload)} if preload else None
        self.profile = (CLUSTER_PROFILES if cluster else PROFILES)[mode]
        # With every setting at its default, only what wires the workers to the run is set; ``settings``
        # (``--set``) come on top: another provider for an effect, a lookup switched off.
        self.worker_settings = {**({} if self.profile.default_settings else WORKER_SETTINGS),
                                **({"EVENT_ENVELOPE": "outbox"} if outbox else {}), **(settings or {})}
        self.seed = secrets.randbelow(10**6) if seed is None else seed
        self.sabotage = sabotage
        self.drain_timeout = drain_timeout or self.profile.drain_timeout
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        _prune(CHAOS / "runs", KEEP_RUNS - 1)
        self.folder = CHAOS / "runs" / (f"{stamp}-{mode}{'-cluster' if cluster else ''}"
                                        f"{'-failover-' + db_failover if db_failover else ''}"
                                        f"{'-outbox-' + outbox if outbox else ''}-seed{self.seed}")
        (self.folder / "workers").mkdir(parents=True)
        self.started_at = time.time()
        self.at: dict[str, float] = {}          # storm_started_at, storm_ended_at, drained_at
        self.timings: dict = {}
        self.mariadb = (ReplicatedMariaDB(self.folder, db_failover, DATABASE) if db_failover
                        else MariaDB(self.folder / "mariadb"))
        self.failover: dict | None = None        # what the failover did and lost, for the manifest
        self.brokers = (SecureCluster if cluster else SingleBroker)(self.folder / "kafka")
        if cut_forgets:
            self.brokers.heal_cuts = False
        self.password = secrets.token_hex(8)
        self.proxy: BlackholeProxy | None = None
        self.fakes: FakesProcess | None = None
        self.fleet: Fleet | None = None
        self.storm: Storm | None = None
        self.relay: OutboxRelay | None = None
        self.upstream: dict | None = None       # the outbox relay's figures, for the manifest
        self.reconciled: dict | None = None     # the product's reconcile of the run, for the checker to compare
        self.upgrade: RollingUpgrade | None = None   # a rolling upgrade's steps and what they did

    def say(self, line: str) -> None:
        stamped = f"[chaos {time.time() - self.started_at:7.1f}s] {line}"
        print(stamped, flush=True)
        with open(self.folder / "driver.log", "a") as log:
            log.write(stamped + "\n")

    @staticmethod
    def rel(path: Path) -> str:
        return str(path.relative_to(ROOT))

    @property
    def mysql(self) -> dict:
        """The database directly, not through the proxy: for the drain and the checker."""
        return {"host": "127.0.0.1", "port": self.mariadb.port, "user": USER, "password": self.password,
                "database": DATABASE}

    # -- the run ------------------------------------------------------------------------
    def execute(self) -> Outcome:
        where = "three Kafka nodes over SASL_SSL" if self.cluster else "one Kafka broker"
        self.say(f"{self.mode} run on {where}, seed {self.seed}: everything goes to {self.rel(self.folder)}"
                 + (f"; with {', '.join(self.preload)} installed" if self.preload else ""))
        with preload_module.installed(self.preload):
            return self._execute()

    def _execute(self) -> Outcome:
        try:
            self.bring_up()
            shares = Shares(duplicate_within=self.profile.duplicate_within,
                            **(outboxes.SHARES if self.outbox else {}))
            workload = plan(self.seed, min_events=self.profile.min_events, min_orders=self.profile.min_orders,
                            partitions=PARTITIONS, shares=shares)
            self.start_workers()
            produced = self.blow(workload)
            backlog, drain_error = self.drain()
            if self.db_failover:
                self.examine_failover()
            self.reconciled = self.reconcile()
            return self.conclude(workload, produced, backlog, drain_error)
        finally:
            with _uninterrupted():
                self.tear_down()

    def bring_up(self) -> None:
        clock = time.monotonic()
        self.mariadb.reap_leftover()
        self.mariadb.install()
        self.timings["mariadb_first_start_seconds"] = round(self.mariadb.start(), 3)
        direct = self.mariadb.create(DATABASE, USER, self.password, migrated=not self.profile.upgrade)
        if self.profile.upgrade:
            self.upgrade = RollingUpgrade(previous_release(), kafka=self.brokers.connection(), group=GROUP,
                                          topic=EVENTS, partitions=PARTITIONS, mysql=self.mysql, url=direct,
                                          planned=self.profile.big)
            self.upgrade.prepare()
            self.say(f"the database at release {self.upgrade.previous.version}'s schema "
                     f"({self.upgrade.record['schema']['previous_head']}), by its own migrations; its workers start")
        self.timings["kafka_first_start_seconds"] = round(self.brokers.bring_up(), 3)
        settings = Settings(order_event_partitions=PARTITIONS, dlq_partitions=DLQ_PARTITIONS, mysql_url=direct,
                            topic_replication=self.brokers.nodes)
        asyncio.run(kafka_ops.create_topics(self.brokers.connection(), topic_specs(settings, events=EVENTS, dlq=DLQ)))
        self.proxy = BlackholeProxy("127.0.0.1", self.mariadb.port).start()
        # Its connections still hung at the end are cancelled when it stops: not worth a traceback.
        self.proxy._loop.call_soon_threadsafe(self.proxy._loop.set_exception_handler, lambda loop, context: None)
        self.fakes = FakesProcess(fakes_config(self.profile, self.seed), env=self.process_env)
        if self.outbox:
            self.relay = OutboxRelay(bootstrap=self.brokers.bootstrap, topic=EVENTS,
                                     exactly_once=self.outbox == "exactly-once",
                                     transaction_interval_ms=outboxes.TRANSACTION_INTERVAL_MS).start()
            self.say(f"the order service's MariaDB on {self.relay.db.port}, relayed by Debezium in Kafka Connect "
                     f"({self.outbox}) to {EVENTS}")
        self.timings["cluster_seconds"] = round(time.monotonic() - clock, 1)
        if self.db_failover:
            replication = ("semi-synchronous, AFTER_SYNC" if self.mariadb.semisync else "asynchronous")
            self.say(f"MariaDB primary on {self.mariadb.primary.port}, its GTID replica on "
                     f"{self.mariadb.replica.port} ({replication}): {self.mariadb.record['before_storm']}")
        self.say(f"MariaDB on 127.0.0.1:{self.mariadb.port} (the workers' way: the proxy on {self.proxy.port}), "
                 f"Kafka on {self.brokers.bootstrap}, fake APIs on {self.fakes.url}: up in "
                 f"{self.timings['cluster_seconds']}s")

    def start_workers(self) -> None:
        env = worker_env(**self.worker_settings, **self.brokers.worker_env(), APP_ID=GROUP,
                         TOPIC_REPLICATION=str(self.brokers.nodes),
                         MYSQL_URL=self.mariadb.url(DATABASE, USER, self.password, port=self.proxy.port),
                         ORDER_EVENT_TOPIC=EVENTS, DLQ_TOPIC=DLQ, ORDER_EVENT_PARTITIONS=str(PARTITIONS),
                         DLQ_PARTITIONS=str(DLQ_PARTITIONS), **self.fakes.env(),
                         DATA_DIR=str(self.folder / "faust"),
                         **({preload_module.VARIABLE: ",".join(self.preload)} if self.preload else {}))
        self.fleet = Fleet(env, self.folder / "workers", say=self.say)
        clock = time.monotonic()
        for slot in self.profile.slots:
            if self.upgrade is not None:
                self.fleet.runs(slot, self.upgrade.previous)
            self.fleet.start(slot)
        for incarnation in list(self.fleet.live.values()):
            incarnation.worker.wait_log("Worker ready", timeout=120)
        self.timings["workers_ready_seconds"] = round(time.monotonic() - clock, 1)
        self.fleet.scrape_every(1.0)

    def blow(self, workload) -> list[dict]:
        self.say(f"{len(self.fleet.live)} workers ready in {self.timings['workers_ready_seconds']}s; producing "
                 f"{len(workload.records)} records ({workload.count('original')} events of {len(workload.orders)} "
                 f"orders) at {self.profile.rate:g}/s")
        if self.relay is not None:
            producer = outboxes.OutboxProducer(self.relay, self.brokers.producer_options(), GROUP, workload.records,
                                               self.profile.rate, kills=CONNECT_KILLS, seed=self.seed)
        else:
            producer = SteadyProducer(self.brokers.producer_options(), EVENTS, workload.records, self.profile.rate,
                                      java=self.brokers.java_producer())
        self.storm = Storm(self.profile, self.seed, fleet=self.fleet, mariadb=self.mariadb, brokers=self.brokers,
                           proxy=self.proxy, fakes=self.fakes, producer=producer, events_topic=EVENTS, say=self.say,
                           failover=bool(self.db_failover), group=GROUP, partitions=PARTITIONS)
        self.storm.sabotage = "crash" if self.sabotage == "crash" else None
        if self.upgrade is not None:
            self.storm.steps = self.upgrade.steps(self.storm)
        if self.relay is not None:
            producer.log = lambda kind, detail=None: self.storm.log(kind, detail=detail)
        self.at["storm_started_at"] = time.time()
        produced = asyncio.run(self.storm.run())
        self.at["storm_ended_at"] = time.time()
        self.timings["storm_seconds"] = round(self.at["storm_ended_at"] - self.at["storm_started_at"], 1)
        self.say(f"the storm is over after {self.timings['storm_seconds']}s; draining")
        if self.relay is not None:
            self.upstream = producer.figures
            self.say(f"the outbox relay: {json.dumps(self.upstream)}")
        return produced

    def drain(self):
        if self.sabotage == "no-drain":
            self.say("sabotage: every worker stops before the drain")
            self.fleet.stop_all()

        def read():
            return read_backlog(self.brokers.connection(), GROUP, {EVENTS: PARTITIONS, DLQ: DLQ_PARTITIONS}, self.mysql)

        drain_error = None
        try:
            backlog, seconds = wait_settled(read, timeout=self.drain_timeout, fleet=self.fleet, say=self.say)
            self.timings["drain_seconds"] = round(seconds, 1)
            self.say(f"drained in {self.timings['drain_seconds']}s: ledger {backlog.ledger}")
        except DrainTimeout as exc:
            drain_error = f"{exc}; every worker's log is in {self.rel(self.folder / 'workers')}"
            self.say(f"DRAIN FAILED: {drain_error}")
            backlog = read()
            self.timings["drain_seconds"] = None
        self.at["drained_at"] = time.time()
        self.fleet.scrape_now()
        self.fleet.stop_scraping()
        with ThreadPoolExecutor(max_workers=4) as pool:       # SIGTERM: their last commits, in parallel
            list(pool.map(self.fleet.stop, list(self.fleet.live)))
        return backlog, drain_error

    def reconcile(self) -> dict | None:
        """The product's own reconcile of the run (``faust -A app reconcile``, as an operator runs it, on
        the database directly), every record's end exported next to the manifest: the checker compares
        them with its own verdicts, record by record (``harness.chaos.agreement``)."""
        export = self.folder / "reconcile.jsonl"
        since = datetime.fromtimestamp(self.started_at - 60, UTC).isoformat()
        until = datetime.fromtimestamp(time.time() + 60, UTC).isoformat()
        env = {**self.fleet.env, "MYSQL_URL": self.mariadb.url(DATABASE, USER, self.password)}
        clock = time.monotonic()
        try:
            done = subprocess.run(preload_module.command("faust", ["-A", "app", "reconcile", "--from", since, "--to",
                                                                   until, "--json", "--no-store", "--export",
                                                                   str(export)], env, script=True),
                                  cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
        except subprocess.TimeoutExpired as exc:
            self.say(f"THE RECONCILE DID NOT END: {exc!r}")
            return {"exit": None, "error": repr(exc), "export": None}
        seconds = round(time.monotonic() - clock, 1)
        self.timings["reconcile_seconds"] = seconds
        try:
            found = json.loads(done.stdout)
        except ValueError:
            found = {}
        else:
            (self.folder / "reconcile.json").write_text(done.stdout)
        result = {"exit": done.returncode, "export": export.name if export.exists() else None, "seconds": seconds,
                  **{k: found.get(k) for k in ("status", "records", "ends", "findings_total", "findings_by_kind",
                                               "records_per_second", "error")},
                  "findings": (found.get("findings") or [])[:20],
                  "stderr": done.stderr[-2000:] if done.returncode not in (0, 1) else None}
        self.say(f"the product's reconcile of the run (exit {done.returncode}, {seconds}s): {found.get('records')} "
                 f"records, {json.dumps({k: v for k, v in (found.get('ends') or {}).items() if v})}, "
                 f"{found.get('findings_total')} findings")
        return result

    def examine_failover(self) -> None:
        """The dead primary's data started again: what it committed that the promoted replica
        lacked. Every worker has stopped by now."""
        self.failover = {**self.mariadb.record, "faults": [f for f in self.storm.faults if f["kind"].startswith("db_")]}
        try:
            found = self.mariadb.forensics()
        except Exception as exc:          # no failover happened (the storm broke off): say so
            self.failover["error"] = repr(exc)
            self.say(f"FAILOVER NOT EXAMINED: {exc!r}")
            return
        self.failover.update(found)
        lost = found["lost"]
        self.say(f"the dead primary, started again ({found['forensic_start_seconds']}s), had what the promoted "
                 "replica lacked: " + ", ".join(f"{table} {n['missing']:,} missing, {n['behind']:,} behind"
                                               for table, n in lost.items())
                 + f"; the failover lost {lost['t_idem']['missing'] + lost['t_idem']['behind']:,} t_idem rows, "
                   f"{found['lost_transactions']:,} transactions (GTIDs {found['gtid']})")

    def conclude(self, workload, produced, backlog, drain_error) -> Outcome:
        self.timings.update({f"{name}_ready_seconds": seconds for name, seconds in self.brokers.ready_seconds().items()})
        self.timings["mariadb_ready_seconds"] = self.mariadb.ready_seconds
        content = {
            "seed": self.seed, "mode": self.mode, "cluster": self.cluster, "started_at": self.started_at, **self.at,
            "bootstrap": self.brokers.bootstrap, "kafka": self.brokers.manifest(), "mysql": self.mysql,
            "events_topic": EVENTS, "dlq_topic": DLQ,
            "group": GROUP, "partitions": PARTITIONS, "dlq_partitions": DLQ_PARTITIONS, "fakes_url": self.fakes.url,
            "sms_lookup": registry_contract(self.worker_settings, "sms") == "lookup", "produced": produced,
            "orders": {order_no: {"lifecycle": lifecycle} for order_no, lifecycle in workload.orders.items()},
            "workers": [i.entry() for i in self.fleet.history], "faults": self.storm.faults,
            "metrics": manifests.metrics(self.fleet.totals()),
            "drain": manifests.drain(backlog, self.timings["drain_seconds"]),
            "profile": vars(self.profile),
            "worker_settings": self.worker_settings, "timings": self.timings, "run_dir": self.rel(self.folder),
            "failover": self.failover, "effect_steps": declared_effect_steps(settings=self.worker_settings),
            **({"envelope": "outbox", "upstream": self.upstream} if self.outbox else {}),
            "reconcile": self.reconciled, "preload": list(self.preload),
            "upgrade": self.upgrade.record if self.upgrade is not None else None,
        }
        path = self.folder / "manifest.json"
        path.write_text(json.dumps(content, indent=1))
        self.say(f"manifest: {self.rel(path)}")
        report = self.check(path)
        sms = self.sms_latency(content)
        self.timings["total_seconds"] = round(time.time() - self.started_at, 1)
        report_path = self.folder / "report.json"
        verdict = report.as_dict() if report is not None else {"checker": None, **manifests.figures(content)}
        report_path.write_text(json.dumps({**verdict, "sms_latency": sms, "upstream": self.upstream,
                                           "timings": self.timings}, indent=1, default=str))
        self.say(f"report: {self.rel(report_path)}; timings {json.dumps(self.timings)}")
        return Outcome(path, report_path, report, [i.entry() for i in self.fleet.unexpected], drain_error)

    def sms_latency(self, content: dict) -> dict | None:
        """How long the cancelled orders waited for their SMS (``harness.chaos.latency``): a figure, no verdict."""
        try:
            found = latency.sms_latency(self.mysql, evidence.read_fakes_ledger(self.fakes.url), content["produced"],
                                        content["faults"])
        except Exception as exc:
            self.say(f"the SMS latency could not be read: {exc!r}")
            return None
        self.say("how long the cancelled orders waited for their SMS:\n" + latency.render(found))
        return found

    def check(self, path: Path):
        """The checker's verdict, or None while there is no checker."""
        try:
            from harness.chaos.checker import check
            report = check(path)
        except (ImportError, NotImplementedError) as exc:
            self.say(f"no checker yet ({exc!r}): the manifest is at {self.rel(path)}")
            return None
        try:
            from harness.chaos.report import render
            self.say("the checker's summary:\n" + render(report))
        except ImportError:
            self.say(json.dumps(report.as_dict(), indent=1, default=str))
        return report

    def tear_down(self) -> None:
        """Stop everything the run started, whatever state it is in."""
        if self.fleet is not None:
            self.fleet.stop_scraping()
            self.fleet.kill_all()
        for stop in (self.relay and self._stop_relay, self.proxy and self.proxy.stop, self.fakes and self.fakes.stop,
                     self.brokers.stop, self.mariadb.stop):
            try:
                if stop:
                    stop()
            except Exception as exc:          # stop the others anyway
                self.say(f"while stopping: {exc!r}")
        self.brokers.remove_data()
        self.mariadb.remove_data()

    def _stop_relay(self) -> None:
        """The relay stopped (its topics go with the broker's data); Connect's log kept in the run's folder."""
        log = self.relay.connect_log if self.relay.connect_dir is not None else None
        if log is not None and log.exists():
            shutil.copyfile(log, self.folder / "connect.log")
        self.relay.stop(delete_topics=False)


def run(mode: str, seed: int | None = None, *, sabotage: str | None = None,
        drain_timeout: float | None = None, cluster: bool = False, cut_forgets: bool = False,
        db_failover: str | None = None, settings: dict[str, str] | None = None, outbox: str | None = None,
        preload: tuple[str, ...] = ()) -> Outcome:
    return ChaosRun(mode, seed, sabotage=sabotage, drain_timeout=drain_timeout, cluster=cluster,
                    cut_forgets=cut_forgets, db_failover=db_failover, settings=settings, outbox=outbox,
                    preload=preload).execute()


def _prune(runs: Path, keep: int) -> None:
    """The run folders but the newest ``keep`` go (their names start with the UTC time)."""
    if runs.exists():
        for old in sorted(path for path in runs.iterdir() if path.is_dir())[:-keep or None]:
            shutil.rmtree(old, ignore_errors=True)


@contextmanager
def _uninterrupted():
    """Tear down without being cut short: a second Ctrl-C (or SIGTERM) waits until everything
    the run started is stopped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    # The run's own producer and admin clients say so every time the broker is away on purpose.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    # SIGTERM ends the run the way Ctrl-C does: through its teardown.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(prog="python -m harness.chaos.driver", description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=sorted(PROFILES), default="long")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    parser.add_argument("--sabotage", choices=["crash", "no-drain"], default=None,
                        help="make the run fail on purpose, to see that it can")
    parser.add_argument("--drain-timeout", type=float, default=None, help="seconds (default: the mode's)")
    parser.add_argument("--cluster", action="store_true",
                        help="three Kafka nodes over SASL_SSL, with leader and controller kills and a broker cut")
    parser.add_argument("--cut-forgets", action="store_true",
                        help="with --cluster: the connections the broker cut hung stay hung after it (a firewall "
                             "or NAT that dropped them); only new connections pass")
    parser.add_argument("--db-failover", choices=FAILOVER_MODES, default=None,
                        help="the database as a primary and its GTID replica (semi-synchronous AFTER_SYNC, or "
                             "asynchronous), failed over once mid-storm; what the failover lost is counted")
    parser.add_argument("--outbox", choices=outboxes.MODES, default=None,
                        help="the records written by an order service into its outbox, relayed by Debezium in Kafka "
                             "Connect (with or without Connect's exactly-once support), Connect SIGKILLed "
                             f"{CONNECT_KILLS} times; the workers read EVENT_ENVELOPE=outbox")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a worker setting on top of the mode's, e.g. EFFECTS__WAYBILL__PROVIDER=express (the "
                             "refuses-duplicates courier) or EFFECTS__SMS__LOOKUP=false (an SMS gateway without "
                             "lookup: contract none); repeatable")
    parser.add_argument("--preload", action="append", default=[], metavar="MODULE",
                        help="a module of your own installed in every process of the run first (its installed(): "
                             "e.g. a provider with its effect's step and its fake, as harness/added_provider.py); "
                             "repeatable")
    args = parser.parse_args(argv)
    if any("=" not in item for item in args.set):
        parser.error("--set takes NAME=VALUE")
    if args.cut_forgets and not args.cluster:
        parser.error("--cut-forgets needs --cluster")
    if args.cluster and args.mode not in CLUSTER_PROFILES:
        parser.error(f"--mode {args.mode} has no profile on three nodes (--cluster)")
    if args.db_failover and args.cluster:
        parser.error("--db-failover runs on the single broker (it has not been run with --cluster)")
    if PROFILES[args.mode].upgrade and (args.db_failover or args.outbox):
        parser.error(f"--mode {args.mode} runs on the single broker with one database (not with --db-failover or "
                     "--outbox)")
    if args.outbox and (args.cluster or args.db_failover):
        parser.error("--outbox runs on the single broker with one database (not with --cluster or --db-failover)")
    outcome = run(args.mode, args.seed, sabotage=args.sabotage, drain_timeout=args.drain_timeout,
                  cluster=args.cluster, cut_forgets=args.cut_forgets, db_failover=args.db_failover,
                  settings=dict(item.split("=", 1) for item in args.set), outbox=args.outbox,
                  preload=tuple(args.preload))
    if outcome.unexpected_exits:
        print(f"FAILED: workers exited without the test's doing: {json.dumps(outcome.unexpected_exits)}")
    if outcome.drain_error:
        print(f"FAILED: {outcome.drain_error}")
    if outcome.report is not None and not outcome.report.ok:
        print("FAILED: the checker found problems (see the report)")
    print(f"{'OK' if outcome.ok else 'FAILED'}: manifest {outcome.manifest.relative_to(ROOT)}, report "
          f"{outcome.report_path.relative_to(ROOT)}")
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
