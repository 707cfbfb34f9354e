"""Prometheus metrics of the processor, served at ``/metrics`` with Faust's own.

Durations are in seconds (Prometheus convention); the batch buckets are fine
below 100 ms because that is where a healthy batch lives.
"""

import logging
import time

from prometheus_client import Counter, Gauge, Histogram

from app.pipeline.breaker import PROBE_SECONDS, Change
from app.pipeline.model import CLAIM_RESULTS, CONFLICTS, BatchPlan
from app.pipeline.observer import NoObserver

log = logging.getLogger(__name__)

EVENTS = Counter("order_events_total", "Events consumed from order-event, by outcome.", ["outcome"])
MALFORMED = Counter("order_events_malformed_total", "Events that break the contract, by reason.", ["reason"])
DEAD_LETTERS = Counter("order_dead_letters_total", "Records sent to the dead-letter topic, by reason.", ["reason"])
SKIPPED = Counter("order_events_skipped_total",
                  "Events of types this processor does not handle, skipped (UNHANDLED_EVENT_TYPES=skip), by type: a "
                  "type FOREIGN_EVENT_TYPES names by its name, any other as `other` (never a name a record chose; "
                  "/skipped/ lists them by name).", ["type"])
RETRIES = Counter("order_record_retries_total", "Per-record retries in phase 2, by reason.", ["reason"])
BATCHES = Counter("order_batches_total", "Batches finished (their offsets may be committed).")
BATCH_SECONDS = Histogram(
    "order_batch_seconds", "Wall time of one batch, from take() to finished.",
    buckets=(0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2, 5, 10, 30, 60))
BATCH_EVENTS = Histogram("order_batch_events", "Records per batch.",
                         buckets=(1, 10, 50, 100, 200, 300, 400, 500, 1000))
DB_ROUND_TRIPS = Counter("order_db_round_trips_total", "Statements and commits sent to the database.")
EFFECT_CALLS = Counter("order_effect_calls_total", "External calls, by effect and result.", ["effect", "result"])
LEASE_WAITS = Counter("order_lease_waits_total", "Records that waited for another worker's lease.")
INFRA_WAIT_SECONDS = Counter("order_infra_wait_seconds_total", "Time batches spent waiting for the database.")
IN_FLIGHT_BATCH = Gauge("order_batch_in_flight", "Batches being processed (up to BATCHES_IN_FLIGHT).")
IN_FLIGHT_RECORDS = Gauge("order_records_in_flight",
                          "Records taken and not finished (up to BATCHES_IN_FLIGHT x BATCH_SIZE, plus those held).")
HELD_RECORDS = Gauge("order_records_held",
                     "Records held before their first try while their effect's breaker is open (up to "
                     "BREAKER_HOLD_RECORDS; not counted against BATCHES_IN_FLIGHT x BATCH_SIZE).")
COMPENSATIONS = Counter("order_compensations_total",
                        "Dead letters the compensator handled, by what became of them.", ["result"])
BULK_JOB_RUNNING = Gauge("order_bulk_job_running", "1 while this worker runs a bulk job of the dead-letter queue "
                                                   "(it holds the job's lease), else 0.")

# -- the dedup store ------------------------------------------------------------------
# A claim is one step key a T1 looked at: taken (new, reclaimed), or found done, held by another
# worker's live lease, failed for good, waiting for its service to settle, recorded with another
# payload, or over the attempt cap. Conflicts are the claims that found the key done or held.
IDEM_WRITES = Counter("order_idem_writes_total",
                      "Idempotency claims: every step key a T1 tried to take (the conflict rate's denominator).")
IDEM_CONFLICTS = Counter("order_idem_conflicts_total",
                         "Claims that found the key already done or held by another worker's live lease.")
IDEM_CLAIMS = Counter("order_idem_claims_total", "Idempotency claims, by result.", ["result"])
REPLAYED = Counter("order_events_replayed_total",
                   "Events delivered again whose work t_idem already holds as done (a replay after a crash or "
                   "rebalance, or a re-published duplicate).")
EFFECT_SECONDS = Histogram("order_effect_call_seconds", "External calls: latency, by effect.", ["effect"],
                           buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
IDEM_ROWS = Gauge("order_idem_rows_estimated", "t_idem rows, as InnoDB estimates them (cheap, within ~10%).")
IDEM_BUDGET = Gauge("order_idem_capacity_budget_rows", "The rows t_idem is sized for (the budget command).")
IDEM_WATERMARK = Gauge("order_idem_capacity_watermark", "t_idem rows / the capacity budget.")
IDEM_PARTITIONS_AHEAD = Gauge("order_idem_partitions_ahead", "Monthly t_idem partitions after the current month.")
PARTITION_CHANGES = Counter("order_idem_partition_changes_total",
                            "Partition maintenance statements, by action (add, drop) and result.", ["action", "result"])

# -- what the sweep finds ---------------------------------------------------------------
STUCK_ROWS = Gauge("order_idem_stuck_rows", "Pending t_idem rows older than the stuck threshold, by step.", ["step"])
OVER_CAP_ROWS = Gauge("order_idem_over_attempt_cap_rows",
                      "Pending t_idem rows claimed IDEM_MAX_ATTEMPTS times: never claimed again automatically.")
STUCK_THRESHOLD = Gauge("order_idem_stuck_threshold_seconds", "STUCK_PENDING_SECONDS: when a pending row is stuck.")
ALERTS = Counter("order_alerts_total", "Alerts the stuck sweep raised (one per row and sweep), by alert name.",
                 ["alertname"])
ALERT_POSTS = Counter("order_alert_webhook_posts_total", "Alert webhook POSTs, by result (ok, failed).", ["result"])
SWEEPS = Counter("order_stuck_sweeps_total", "Stuck sweeps this worker ran (it held the sweep's lease).")
COMPENSATION_ROWS = Gauge("order_compensation_rows", "t_compensation rows of this consumer group, by status.",
                          ["status"])
COMPENSATION_OLDEST_OPEN = Gauge("order_compensation_oldest_open_age_seconds",
                                 "Age of the oldest open or retrying dead letter (0 when there is none).")
COMPENSATION_OLDEST_MANUAL = Gauge("order_compensation_oldest_manual_age_seconds",
                                   "Age of the oldest dead letter waiting for a person (0 when there is none).")
COMPENSATION_SLA = Gauge("order_compensation_sla_seconds", "COMPENSATION_SLA_SECONDS: how long a dead letter may "
                                                           "stay open.")

# -- Kafka ------------------------------------------------------------------------------
CONSUMER_LAG = Gauge("order_kafka_consumer_lag", "Records of order-event not yet committed by the consumer group "
                                                 "(end offset - committed offset), read from the broker.",
                     ["topic", "partition"])
LAST_COMMIT = Gauge("order_kafka_last_commit_timestamp_seconds", "When this worker last committed offsets "
                                                                 "(Unix time).")

# -- self-healing (app.timers.watchdog) ----------------------------------------------------
WORKER_HEALTHY = Gauge("order_worker_healthy", "1 while the watchdog sees this worker in its group and moving, "
                                               "0 while a check fails (then /readyz answers 503).")
WORKER_UNHEALTHY = Gauge("order_worker_unhealthy", "1 while this check of the watchdog fails (membership, "
                                                   "heartbeat, fetch).", ["check"])
WATCHDOG_ACTIONS = Counter("order_watchdog_actions_total", "What the watchdog did about a failing check: rejoin "
                                                           "(forced a rejoin of the group), exit (exit 70).",
                           ["check", "action"])

for _result in CLAIM_RESULTS:          # every series exists from the start, at 0 (rate() needs a first sample)
    IDEM_CLAIMS.labels(_result)
for _check in ("membership", "heartbeat", "fetch"):
    WORKER_UNHEALTHY.labels(_check)
    for _action in ("rejoin", "exit"):
        WATCHDOG_ACTIONS.labels(_check, _action)


RATE_LIMITED = Counter("order_provider_rate_limited_total",
                       "Calls a provider answered 429 (not yet): waited for, never an attempt used up, by effect.",
                       ["effect"])
LIMIT_WAIT_SECONDS = Counter("order_provider_limit_wait_seconds_total",
                             "Time calls waited for their provider's limits (its rate share, its concurrency, a "
                             "Retry-After), by effect.", ["effect"])
RATE_SHARE = Gauge("order_provider_rate_share_calls_per_second",
                   "This worker's share of an effect's EFFECTS__<EFFECT>__CALLS_PER_SECOND (the rate over the live "
                   "workers); 0: no rate set.", ["effect"])
BREAKER_OPEN = Gauge("order_provider_breaker_open",
                     "1 while this worker's breaker for an effect's provider is open (most calls failed for the "
                     "provider's sake: its calls are not made, their records dead-lettered as provider_unavailable).",
                     ["effect"])
BREAKER_OPENED = Gauge("order_provider_breaker_opened_timestamp_seconds",
                       "When this worker's breaker for an effect's provider opened (Unix time; 0 while closed).",
                       ["effect"])
LIVE_MEMBERS = Gauge("order_provider_limit_members", "Live workers (heartbeats) a provider's rate is shared among.")


class PipelineMetrics(NoObserver):
    """The pipeline's observer that counts (``app.pipeline.observer``): each committed T1's claims, the
    providers' pace and breakers."""

    def planned(self, plan: BatchPlan) -> None:
        total = conflicts = 0
        for result, count in plan.claims.items():
            IDEM_CLAIMS.labels(result).inc(count)
            total += count
            if result in CONFLICTS:
                conflicts += count
        IDEM_WRITES.inc(total)
        IDEM_CONFLICTS.inc(conflicts)
        if plan.replayed:
            REPLAYED.inc(plan.replayed)

    def breaker(self, effect: str, change: Change) -> None:
        opened = change is Change.OPENED
        BREAKER_OPEN.labels(effect).set(1 if opened else 0)
        BREAKER_OPENED.labels(effect).set(time.time() if opened else 0)
        if opened:
            log.warning("the breaker of %s's provider opened: most of its recent calls failed for the provider's "
                        "sake; its calls are not made until a probe, one call every %gs, gets an answer: their "
                        "records wait in their orders (up to BREAKER_HOLD_RECORDS, until near their batch's deadline), "
                        "then are dead-lettered as provider_unavailable", effect, PROBE_SECONDS)
        else:
            log.warning("the breaker of %s's provider closed: its probe got an answer", effect)

    def paced(self, effect: str, waited: float, *, rate_limited: float | None = None) -> None:
        if waited > 0:
            LIMIT_WAIT_SECONDS.labels(effect).inc(waited)
        if rate_limited is not None:
            RATE_LIMITED.labels(effect).inc()

# -- the release ------------------------------------------------------------------------
BUILD_INFO = Gauge(
    "order_build_info",
    "1, labelled with this worker's release (version), the head of its migrations (code_revision) and the "
    "revision of the database's schema it runs on (schema_revision; 'unknown' until it was read): a rolling "
    "upgrade is done when every worker shows the new version.", ["version", "code_revision", "schema_revision"])


def build_info(*, code_revision: str, schema_revision: str | None) -> None:
    """Export what this worker is and runs on (one series: the previous one is dropped)."""
    from app.version import VERSION

    BUILD_INFO.clear()
    BUILD_INFO.labels(VERSION, code_revision, schema_revision or "unknown").set(1)


# -- operator controls (app.pipeline.controls): every worker exports what it last read --------------
EFFECT_HELD = Gauge("order_effect_held", "1 while a person holds the effect across the whole group (operator "
                    "controls): its records wait, nothing is dead-lettered for it.", ["effect"])
EFFECT_HOLD_PLANNED_END = Gauge(
    "order_effect_hold_planned_end_timestamp_seconds",
    "The planned end of the effect's hold in force (0: none); a hold a person must end alerts past it.", ["effect"])
EFFECT_HOLD_OVERDUE = Gauge("order_effect_hold_overdue_seconds",
                            "How long the effect's hold in force is past its planned end (0: not).", ["effect"])
PARTITION_PAUSED = Gauge("order_partition_paused", "1 while a person pauses the input's partition: its lag is "
                         "paused, not stuck; 0 for the input's other partitions.", ["topic", "partition"])
HELD_BY_EFFECT = Gauge("order_records_held_by_effect",
                       "Records this worker holds, before their claim, for the effect (its breaker open, or held by "
                       "a person).", ["effect"])
CONTROLS_READ = Gauge("order_controls_read_timestamp_seconds",
                      "When this worker last read the operator controls (every CONTROLS_REFRESH_SECONDS).")


# -- recovery windows ---------------------------------------------------------------------
STORE_SERVER_CHANGES = Counter(
    "order_store_server_changes_total",
    "Times this worker found the store on another database server than the one it last recorded (a failover to a "
    "replica, a server rebuilt from a backup) and opened a recovery window.")
STORE_WENT_BACK = Counter(
    "order_store_went_back_total",
    "Times this worker found the store's watermark below the one it had reached (read from the watermark topic, "
    "or seen in the store): the database went back in time, a restore from backup or a failover that lost "
    "transactions; it opened a recovery window.")
RESTORE_DETECTION_UP = Gauge(
    "order_restore_detection_up",
    "1 while this worker reads and publishes the store's watermark on the watermark topic (a database restored "
    "from a backup is noticed); 0 while it cannot (the topic missing, the broker or its ACLs refusing): tried again "
    "every 6 advances (a minute by default).")
RECOVERY_WINDOW_OPEN = Gauge("order_recovery_window_open",
                             "1 while a recovery window is open: fresh SMS claims are looked up before they are sent.")
# Reconciliation (app.reconcile): set by the process that ran it (the timer's lease holder).
RECONCILE_RUNS = Counter("order_reconcile_runs_total", "Reconcile runs, by how they ended: clean, findings or failed.",
                         ["status"])
RECONCILE_SECONDS = Histogram("order_reconcile_duration_seconds", "How long a reconcile run took.",
                              buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600))
RECONCILE_RECORDS = Counter("order_reconcile_records_total", "Records reconciled, by how they ended (done, duplicate, "
                            "superseded, skipped, dead_letter, in_progress, unread, or a finding).", ["end"])
RECONCILE_FINDINGS = Gauge("order_reconcile_findings", "Findings of the latest reconcile run that completed, by kind "
                           "(unaccounted, stuck, receipt_mismatch, ledger_without_record, provider).", ["kind"])
RECONCILE_LAST_RUN = Gauge("order_reconcile_last_run_timestamp_seconds",
                           "When the latest reconcile run that completed finished.")
RECONCILE_LAST_RANGE_END = Gauge("order_reconcile_last_range_end_timestamp_seconds",
                                 "The end of the range the latest completed reconcile run covered.")


class SkippedTypes:
    """Counts the records of types not handled, says so in the log once per type per ``every`` seconds
    (how many since it last did: a new upstream type is seen, never a flood), and keeps what :meth:`take`
    hands to ``t_skipped_type`` (the counts since, the latest one's place). The counter's label is a
    type's name only when ``FOREIGN_EVENT_TYPES`` names it (:meth:`declare`), else ``other``; the log
    and the table keep the names, a worker's first ``MAX_TYPES`` (later ones as ``other``)."""

    MAX_TYPES = 100

    def __init__(self, every: float = 60.0, clock=time.monotonic) -> None:
        self.every = every
        self._clock = clock
        self.declared: frozenset[str] = frozenset()
        self._since: dict[str, int] = {}
        self._said: dict[str, float] = {}
        self._pending: dict[str, tuple[int, tuple[str, int, int] | None]] = {}
        SKIPPED.labels("other")

    def declare(self, names: frozenset[str]) -> None:
        """The types named by ``FOREIGN_EVENT_TYPES``: each a series of its own, from 0."""
        self.declared = names
        for name in names:
            SKIPPED.labels(name)

    def record(self, counts, where=None) -> None:
        now = self._clock()
        for name, count in counts.items():
            SKIPPED.labels(name if name in self.declared else "other").inc(count)
            key = name if name in self._said or len(self._said) < self.MAX_TYPES else "other"
            held, _ = self._pending.get(key, (0, None))
            self._pending[key] = (held + count, (where or {}).get(name))
            self._since[key] = self._since.get(key, 0) + count
            last = self._said.get(key)
            if last is None or now - last >= self.every:
                log.info("skipped %d event(s) of type %r since %s: not a type this processor handles "
                         "(UNHANDLED_EVENT_TYPES=skip; EVENT_TYPES maps upstream names)",
                         self._since[key], name if key != "other" else "<one of many>",
                         "the start" if last is None else f"{now - last:.0f} s ago")
                self._said[key], self._since[key] = now, 0

    def take(self) -> dict[str, tuple[int, tuple[str, int, int] | None]]:
        """What was skipped since the last take, by type: (how many, where the latest is)."""
        taken, self._pending = self._pending, {}
        return taken

    def give_back(self, taken: dict[str, tuple[int, tuple[str, int, int] | None]]) -> None:
        """A take that could not be written: counted again at the next."""
        for label, (count, where) in taken.items():
            held, newer = self._pending.get(label, (0, None))
            self._pending[label] = (held + count, newer or where)


SKIPPED_TYPES = SkippedTypes()
# Read from t_skipped_type by every worker's gauges' refresh (the same values on every worker: max them).
SKIPPED_TYPE_COUNT = Gauge("order_skipped_types",
                           "Types this consumer group skipped, ever (t_skipped_type; a worker's types past its first "
                           "100 count as one, `other`).")
SKIPPED_TYPES_NEW = Gauge("order_skipped_types_new",
                          "Types this consumer group skipped for the first time within NEW_SKIPPED_TYPE_SECONDS that "
                          "FOREIGN_EVENT_TYPES does not name (the alert NewEventTypeSkipped).")

# The providers' reconciliation's cases for a person (t_reconcile_case, app.reconcile.cases): read from the
# table by whichever process files cases or acts on one, so every worker that did exports the same values.
RECONCILE_CASES_OPEN = Gauge("order_reconcile_cases_open",
                             "Open reconcile cases of this consumer group, by kind (duplicate, orphan, missing).",
                             ["kind"])
RECONCILE_CASE_ACTIONS = Counter("order_reconcile_case_actions_total",
                                 "Reconcile cases a person closed, by action (compensate, adopt, dismiss).", ["action"])
