"""The chaos run's checker: ``check(manifest_path) -> CheckReport``.

It reads the manifest the driver wrote (harness/chaos/CONTRACT.md), then the sources
themselves: the events and dead-letter topics and the group's committed offsets
(aiokafka), the tables (PyMySQL), the fake services' ledger (urllib). It shares no code
with the pipeline: nothing from ``app/`` is imported, here or in the modules it uses
(``rules``: the rules written again; ``evidence``: the reads; ``accounting``: every record,
and how "accounted for exactly once" is established from the tables; ``orders``: every
order's state and effects).

A run is ``ok`` when every violation count is 0. ``problems`` names the first 50
violations, each with its record or order:

====================  =====================================================================
lost                  a record neither dead-lettered nor finished in ``t_idem``
acked_not_consumed    a record the producer had acknowledged that is not on the log at its
                      offset with the bytes sent, or that the group did not read past, or
                      that was read and not accounted for (``acked``)
double_accounted      a record with more than one ledger row
misaccounted          a dead letter that says the wrong thing: a malformed record with a
                      reason that does not fit, a valid event as malformed, compensated or
                      superseded while its steps say otherwise, a copy on the dead-letter
                      topic without its row, a step row of an event nobody produced
duplicate_effects     waybills, SMS, receipts or another effect beyond one per order (beyond
                      none where none is due)
replayed_past_horizon a waybill call carrying a key its provider first took longer ago than
                      it keeps keys (``keys_kept_for_seconds`` in the manifest): no replay, a
                      call the provider may take as new
missing_effects       a done step without its effect or receipt, an effect without its record
unchecked_effects     an effect the pipeline declares (``effect_steps`` in the manifest) that the
                      checker has no exactly-once check for (one of its own, or its contract's:
                      ``rules.BY_CONTRACT``), or a call in the fakes' ledger to a service neither
                      it nor the manifest knows: a new effect must come with its check
regressions           an order state that moved backwards, or is not where its events lead
pending_left          ``t_idem`` rows still pending
offsets_behind        records past the group's committed offsets
unexpected_exits      workers that exited when the test neither killed nor stopped them
unsettled             dead letters still open or retrying after the drain
manifest_mismatches   the manifest and the topic disagree
unreadable            a source the checker could not read
failover_lost         with ``--db-failover semisync``: a row the dead primary committed that
                      the promoted replica lacked, or a primary that was not waiting for its
                      replica when it died; in either mode, a failover whose loss was not
                      counted (the dead primary's data was not examined)
failover_unnoticed    after a failover, no recovery window opened by a worker (``worker:...``
                      in ``t_recovery_window``, read from the database)
failover_unfinished   after a failover, an order short of its final state until a person acts
                      (elsewhere a figure: only malformed records wait for a person there)
upgrade_replayed      in a rolling upgrade: records a worker replaced by SIGTERM had finished
                      and not committed (``harness.chaos.upgrade_check``)
upgrade_incomplete    in a rolling upgrade: a step that failed or did not happen, a worker
                      that did not exit 0 after its SIGTERM, the schema not at head at the end
upgrade_unfinished    in a rolling upgrade: an order short of its final state until a person
                      acts (elsewhere a figure)
====================  =====================================================================

What the failover lost is the driver's count (``failover`` in the manifest: it alone had the
replica's rows at the promotion and the dead primary's data directory); with ``async`` it is a
figure, not a violation: the records behind those rows must then be accounted for like any other.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pymysql

from harness.chaos import evidence
from harness.chaos.accounting import Accountant, Findings
from harness.chaos.acked import check_acked
from harness.chaos.agreement import check_agreement
from harness.chaos.orders import OrderCheck
from harness.chaos.rules import LOCAL_STEP, effect_steps, known_services, step_keys, unchecked_effects
from harness.chaos.upgrade_check import VIOLATIONS as UPGRADE_VIOLATIONS
from harness.chaos.upgrade_check import check_upgrade

VIOLATIONS = ("lost", "acked_not_consumed", "double_accounted", "misaccounted", "duplicate_effects",
              "replayed_past_horizon", "missing_effects",
              "unchecked_effects", "regressions",
              "pending_left", "offsets_behind", "unexpected_exits", "unsettled", "manifest_mismatches",
              "unreadable", "reconcile_disagrees", "failover_lost", "failover_unnoticed", "failover_unfinished",
              *UPGRADE_VIOLATIONS)
FAILOVER_VIOLATIONS = ("failover_lost", "failover_unnoticed", "failover_unfinished")   # in failover runs only
# Paired faults: the first switches a fault on, the second off; their seconds add up.
SPANS = {"cut_seconds": ("db_cut", "db_restore"), "broker_cut_seconds": ("broker_cut", "broker_restore"),
         "api_503_seconds": ("api_503_on", "api_503_off"), "api_fault_seconds": ("api_faults_on", "api_faults_off")}


@dataclass
class CheckReport:
    seed: int | None = None
    mode: str | None = None
    cluster: dict = field(default_factory=dict)      # brokers and how they were reached (no password)
    # what was produced
    events: int = 0
    originals: int = 0
    exact_duplicates: int = 0
    republished: int = 0
    malformed: int = 0
    late: int = 0
    orders: int = 0
    # how each record ended
    accounted: dict = field(default_factory=dict)
    by_kind: dict = field(default_factory=dict)
    late_outcomes: dict = field(default_factory=dict)
    # violations: each must be 0
    lost: int = 0
    acked_not_consumed: int = 0
    double_accounted: int = 0
    misaccounted: int = 0
    duplicate_effects: int = 0
    replayed_past_horizon: int = 0
    missing_effects: int = 0
    unchecked_effects: int = 0
    regressions: int = 0
    pending_left: int = 0
    offsets_behind: int = 0
    unexpected_exits: int = 0
    unsettled: int = 0
    manifest_mismatches: int = 0
    unreadable: int = 0
    failover_lost: int = 0
    failover_unnoticed: int = 0
    failover_unfinished: int = 0
    reconcile_disagrees: int = 0
    upgrade_replayed: int = 0
    upgrade_incomplete: int = 0
    upgrade_unfinished: int = 0
    # the product's reconcile of the run against the checker, record by record (None: not run)
    reconcile: dict | None = None
    # every acknowledged record: on the log with its bytes, read past, accounted
    acked: dict = field(default_factory=dict)
    # the run's figures
    kills: int = 0
    rebalances: int = 0
    restarts: dict = field(default_factory=dict)
    cut_seconds: float = 0.0
    broker_cut_seconds: float = 0.0
    api_503_seconds: float = 0.0
    api_fault_seconds: float = 0.0
    replayed: int | None = None
    rewound: int = 0                # records a rewind after a failover delivered again (not in W)
    w_per_kill: float | None = None
    w_per_kill_lower: float | None = None
    duplicates_stopped: int = 0
    claims_found_done: int | None = None
    dead_letters: dict = field(default_factory=dict)
    ledger_status: dict = field(default_factory=dict)
    compensated: int = 0
    superseded: int = 0
    manual: int = 0
    manual_by_reason: dict = field(default_factory=dict)
    discarded: int = 0
    resolved: int = 0
    unfinished_orders: int = 0
    effects: dict = field(default_factory=dict)
    injected: dict = field(default_factory=dict)     # the faults each fake injected, by kind (its ledger's)
    dead_letter_topic: dict = field(default_factory=dict)
    offsets: dict = field(default_factory=dict)
    pending_in_database: int = 0
    workers: int = 0
    unclean_stops: list = field(default_factory=list)
    wall_seconds: float | None = None
    storm_seconds: float | None = None
    drain: dict = field(default_factory=dict)
    metrics_dead_letters: dict = field(default_factory=dict)
    check_seconds: float = 0.0
    problems: list = field(default_factory=list)
    problems_total: int = 0
    # with --db-failover: the mode, what the failover lost, the window a worker opened, the rewind
    failover: dict = field(default_factory=dict)
    failover_ledger: dict = field(default_factory=dict)     # what the ledger rows the failover lost left
    # in a rolling upgrade: the migration, every replacement's replay window and seconds to settle
    upgrade: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(getattr(self, name) == 0 for name in VIOLATIONS)

    def as_dict(self) -> dict:
        return {"ok": self.ok, **asdict(self)}


def check(manifest_path) -> CheckReport:
    began = time.monotonic()
    path = Path(manifest_path)
    manifest = json.loads(path.read_text())
    findings = Findings()
    try:
        kafka = evidence.client_options(manifest)
    except (OSError, KeyError, ValueError) as exc:       # a CA file gone, a manifest without the user
        kafka = None
        findings.flag("unreadable", f"the brokers' connection settings: {exc!r}")
    events, dlq = (evidence.read_topics(kafka, manifest["events_topic"], manifest["dlq_topic"], manifest["group"])
                   if kafka is not None else (evidence.TopicRead(error="no connection"),
                                              evidence.TopicRead(error="no connection")))
    for read in (events, dlq):
        if read.error:
            findings.flag("unreadable", read.error)
    try:
        tables = evidence.read_tables(manifest["mysql"], _keys(manifest), _orders(manifest), manifest["group"],
                                      [manifest["events_topic"], manifest["dlq_topic"]])
    except pymysql.MySQLError as exc:
        findings.flag("unreadable", f"the database {manifest['mysql'].get('database')}: {exc!r}")
        tables = None
    try:
        fakes = evidence.read_fakes_ledger(manifest["fakes_url"])
    except OSError as exc:
        findings.flag("unreadable", f"the fake services' ledger at {manifest['fakes_url']}: {exc!r}")
        fakes = None
    report = CheckReport(seed=manifest.get("seed"), mode=manifest.get("mode"), cluster=_cluster(manifest),
                         injected=(fakes or {}).get("injected") or {})
    _effects_checked(manifest, fakes, findings)
    books = None
    if tables is not None:      # without the tables nothing can be accounted for: the figures alone
        books = _account(report, manifest, events, dlq, tables, fakes, findings)
    report.acked = check_acked(manifest, events, books.category if books else None, findings)
    report.reconcile = check_agreement(manifest, path.parent, books.category if books else None, findings)
    _produced(report, manifest)
    _offsets(report, manifest, events, dlq, findings)
    _workers(report, manifest, findings)
    _faults(report, manifest)
    _metrics(report, manifest)
    _failover(report, manifest, findings)
    report.upgrade = check_upgrade(manifest, tables, findings, unfinished_orders=report.unfinished_orders)
    for name in VIOLATIONS:
        setattr(report, name, findings.counts.get(name, 0))
    report.problems, report.problems_total = findings.problems, findings.total
    report.check_seconds = round(time.monotonic() - began, 1)
    return report


def _account(report: CheckReport, manifest: dict, events, dlq, tables, fakes: dict | None,
             findings: Findings) -> Accountant:
    books = Accountant(manifest, events, dlq, tables, fakes, findings)
    accounts = books.run()
    accounts.duplicates_stopped = books.duplicates_stopped(OrderCheck(books).run())
    report.accounted = {"done": accounts.accounted["done"], "stale": accounts.accounted["stale"],
                        "skipped": accounts.accounted["skipped"],
                        "dead_letter": dict(accounts.accounted["dead_letter"]),
                        "dead_letters": sum(accounts.accounted["dead_letter"].values()),
                        "lost": findings.counts["lost"]}
    report.by_kind = {kind: dict(counts) for kind, counts in accounts.by_kind.items()}
    report.late_outcomes = dict(accounts.late)
    report.dead_letters = dict(accounts.dead_letters)
    report.ledger_status = dict(accounts.ledger_status)
    for status in ("compensated", "superseded", "manual", "discarded", "resolved"):
        setattr(report, status, accounts.ledger_status.get(status, 0))
    report.manual_by_reason = dict(accounts.manual_by_reason)
    report.unfinished_orders = accounts.unfinished_orders
    report.effects = dict(accounts.effects, peak_in_flight_per_key=(fakes or {}).get("peak_in_flight_per_key"))
    report.dead_letter_topic = dict(accounts.dlq)
    report.duplicates_stopped = accounts.duplicates_stopped
    report.pending_in_database = tables.pending_anywhere
    if accounts.failover_ledger:
        report.failover_ledger = dict(accounts.failover_ledger)
    return books


def _effects_checked(manifest: dict, fakes: dict | None, findings: Findings) -> None:
    """Every effect the pipeline declares, and every service the fakes saw called, is one this
    checker holds to exactly once; anything else fails the run, loudly."""
    declared = manifest.get("effect_steps")
    if declared is None:
        findings.flag("unchecked_effects", "the manifest does not list the pipeline's effect steps "
                                           "(effect_steps): whether each is checked cannot be told")
    else:
        for why in unchecked_effects(declared):
            findings.flag("unchecked_effects", why)
    called = Counter(call.get("service") for call in (fakes or {}).get("calls", []))
    for service in sorted(set(called) - known_services(declared), key=str):
        findings.flag("unchecked_effects", f"{called[service]:,} calls to the service {service!r}, which the "
                                           "checker does not know", called[service])


def _cluster(manifest: dict) -> dict:
    """How the run's brokers were reached, for the report: never the password."""
    kafka = manifest.get("kafka") or {}
    return {"nodes": kafka.get("nodes", 1), "security_protocol": kafka.get("security_protocol", "PLAINTEXT"),
            "sasl_mechanism": kafka.get("sasl_mechanism"), "proxied": bool(kafka.get("proxied"))}


def _orders(manifest: dict) -> set[str]:
    named = {e["order_no"] for e in manifest["produced"] if e.get("order_no") and e["kind"] != "malformed"}
    return named | set(manifest.get("orders", {}))


def _keys(manifest: dict) -> list[str]:
    """Every step key any event of these orders could have written (never-produced ones too,
    so a row for an event nobody sent is seen): the steps this checker knows, and every effect
    step the manifest declares."""
    declared = effect_steps(manifest.get("effect_steps"))
    keys = []
    for order_no in _orders(manifest):
        for type_ in LOCAL_STEP:
            keys += [k for k in step_keys(order_no, type_) if k]
            keys += [f"{order_no}:{type_}:{step}" for step in declared.get(type_, ())]
    return keys


def _produced(report: CheckReport, manifest: dict) -> None:
    kinds = Counter(e["kind"] for e in manifest["produced"])
    report.events = len(manifest["produced"])
    report.originals, report.exact_duplicates = kinds["original"], kinds["exact_duplicate"]
    report.republished, report.malformed = kinds["republished"], kinds["malformed"]
    report.late = sum(1 for e in manifest["produced"] if e.get("late"))
    report.orders = len(_orders(manifest))


def _offsets(report: CheckReport, manifest: dict, events, dlq, findings: Findings) -> None:
    """Committed offsets of the group against the end of every partition of the events topic
    (the dead-letter topic's, which the compensator consumes, only reported)."""
    if events.error:
        return
    if manifest.get("partitions") not in (None, len(events.ends)):
        findings.flag("manifest_mismatches", f"{manifest['events_topic']} has {len(events.ends)} partitions, "
                                             f"the manifest says {manifest['partitions']}")
    for partition, end in sorted(events.ends.items()):
        committed = events.committed.get(partition)
        report.offsets[str(partition)] = {"committed": committed, "end": end}
        behind = end - (committed or 0)
        if behind > 0:
            findings.flag("offsets_behind", f"partition {partition}: committed {committed}, end {end}", behind)
    if not dlq.error:
        report.dead_letter_topic["committed_behind"] = (
            sum(max(end - dlq.committed.get(p, 0), 0) for p, end in dlq.ends.items()) if dlq.committed else None)


def _workers(report: CheckReport, manifest: dict, findings: Findings) -> None:
    """A worker may end only by the test's hand. One the test stopped or killed that did not
    end as asked (0 after SIGTERM, -9 after SIGKILL) is listed, not failed."""
    report.workers = len(manifest.get("workers", []))
    for worker in manifest.get("workers", []):
        code = worker.get("returncode")
        if code is None:
            continue
        name = f"worker {worker.get('id')} (pid {worker.get('pid')}) exited {code}; log {worker.get('log')}"
        if not (worker.get("killed_by_test") or worker.get("stopped_by_test")):
            findings.flag("unexpected_exits", name)
        elif code not in ({-9, 137} if worker.get("killed_by_test") else set()) | \
                ({0} if worker.get("stopped_by_test") else set()):
            report.unclean_stops.append(name)


def _faults(report: CheckReport, manifest: dict) -> None:
    faults = sorted(manifest.get("faults", []), key=lambda f: f["at"])
    kinds = Counter(f["kind"] for f in faults)
    report.kills = kinds["kill_worker"]
    report.rebalances = kinds["add_worker"] + kinds["remove_worker"]
    report.restarts = {"mariadb": kinds["mariadb_kill"], "kafka": kinds["kafka_kill"],
                       "leader": kinds["leader_kill"], "controller": kinds["controller_kill"],
                       "failover": kinds["db_primary_kill"]}
    until = manifest.get("storm_ended_at") or manifest.get("drained_at") or 0.0
    for name, (on, off) in SPANS.items():
        seconds, since = 0.0, None
        for fault in faults:
            if fault["kind"] == on and since is None:
                since = fault["at"]
            elif fault["kind"] == off and since is not None:
                seconds, since = seconds + fault["at"] - since, None
        if since is not None:
            seconds += max(until - since, 0.0)
        setattr(report, name, round(seconds, 1))
    started, drained = manifest.get("started_at"), manifest.get("drained_at")
    if started is not None and drained is not None:
        report.wall_seconds = round(drained - started, 1)
    storm_began = manifest.get("storm_started_at", started)     # not in the contract: the run's start then
    if storm_began is not None and manifest.get("storm_ended_at") is not None:
        report.storm_seconds = round(manifest["storm_ended_at"] - storm_began, 1)
    report.drain = dict(manifest.get("drain") or {})


def _metrics(report: CheckReport, manifest: dict) -> None:
    """W per kill from the workers' replay counters: events delivered again and found done in
    t_idem. The counter also counts duplicates found done across batches, so it bounds W from
    above; less every duplicate produced, from below. The records an operator's rewind after a
    failover delivered again are no kill's: they are taken off first."""
    metrics = manifest.get("metrics") or {}
    report.replayed = metrics.get("replayed")
    report.claims_found_done = (metrics.get("claims") or {}).get("done", metrics.get("claims_done"))
    report.metrics_dead_letters = dict(metrics.get("dead_letters") or {})
    report.rewound = sum((f.get("rewind") or {}).get("records", 0) for f in manifest.get("faults", [])
                         if f["kind"] == "db_group_rewound")
    if report.replayed is not None and report.kills:
        by_kills = max(report.replayed - report.rewound, 0)
        report.w_per_kill = round(by_kills / report.kills, 1)
        duplicates = report.exact_duplicates + report.republished
        report.w_per_kill_lower = round(max(by_kills - duplicates, 0) / report.kills, 1)


def _failover(report: CheckReport, manifest: dict, findings: Findings) -> None:
    """What the failover lost (the driver's count), whether semi-sync kept its promise, and the
    recovery window a worker must have opened (read from the database here)."""
    failover = manifest.get("failover")
    if not failover:
        return
    mode, lost = failover.get("mode"), failover.get("lost")
    faults = {f["kind"]: f for f in failover.get("faults", [])}
    killed = faults.get("db_primary_kill") or {}
    at_kill = (killed.get("positions") or {}).get("semisync") or {}
    rewind = (faults.get("db_group_rewound") or {}).get("rewind")
    report.failover = {
        "mode": mode, "lost": lost, "lost_t_idem": None if lost is None else
        lost["t_idem"]["missing"] + lost["t_idem"]["behind"], "lost_total": failover.get("lost_total"),
        "lost_transactions": failover.get("lost_transactions"), "gtid": failover.get("gtid"),
        "transactions_only_on_replica": failover.get("transactions_only_on_replica"),
        "newer_on_replica": failover.get("newer_on_replica"), "only_on_replica": failover.get("only_on_replica"),
        "killed_after_storm_began": _after(killed.get("at"), manifest),
        "promote_seconds": ((faults.get("db_promote") or {}).get("promoted") or {}).get("seconds"),
        "behind_seconds": (None if "db_replica_behind" not in faults or not killed
                           else round(killed["at"] - faults["db_replica_behind"]["at"], 1)),
        "semisync_at_kill": {k: at_kill.get(k) for k in ("status", "yes_tx", "no_tx", "no_times")} if at_kill else None,
        "rewind": None if rewind is None else {k: rewind.get(k) for k in ("records", "lag_seconds", "margin_seconds",
                                                                          "covered")},
    }
    if lost is None:
        findings.flag("failover_lost", f"the failover's loss was not counted: {failover.get('error', 'no forensics')}")
    elif mode == "semisync":
        if failover.get("lost_transactions"):
            findings.flag("failover_lost", f"semi-synchronous replication lost {failover['lost_transactions']} "
                                           f"transactions: {failover.get('gtid')}", failover["lost_transactions"])
        for table, n in lost.items():
            if n["missing"] or n["behind"]:
                findings.flag("failover_lost", f"semi-synchronous replication lost {table} rows: {n['missing']} "
                                               f"missing, {n['behind']} behind on the promoted replica, e.g. "
                                               f"{n['sample'][:5]}", n["missing"] + n["behind"])
        if at_kill.get("status") != "ON" or at_kill.get("no_times") not in ("0", 0):
            findings.flag("failover_lost", f"the primary was not waiting for its replica when it died: {at_kill}")
    if report.unfinished_orders:
        findings.flag("failover_unfinished", f"{report.unfinished_orders} orders short of their final state until "
                                             "a person acts", report.unfinished_orders)
    try:
        windows = evidence.read_windows(manifest["mysql"])
    except pymysql.MySQLError as exc:
        findings.flag("unreadable", f"t_recovery_window: {exc!r}")
        return
    by_worker = [w for w in windows if str(w["opened_by"]).startswith("worker:")]
    report.failover["windows_opened_by_workers"] = [
        {"id": w["id"], "opened_by": w["opened_by"], "opened_at": str(w["opened_at"])} for w in by_worker]
    if not by_worker:
        findings.flag("failover_unnoticed", f"no recovery window opened by a worker after the failover "
                                            f"({len(windows)} windows in all)")


def _after(at: float | None, manifest: dict) -> float | None:
    began = manifest.get("storm_started_at")
    return None if at is None or began is None else round(at - began, 1)
