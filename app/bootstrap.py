"""The runtime of a worker, built in one place: what it opens once and closes at
shutdown (database engine, HTTP session, dead-letter producer) and the pipeline
built on them. ``app.main`` makes one and hands each agent, timer, view and command
the parts it names (``Runtime.collaborators``, ``app.injection``), never the runtime.

The effect clients are registered here by effect name; an effect declared in
``app.pipeline.steps`` without a client is refused when the runtime is made,
before the worker joins its group.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, fields
from functools import partial
from operator import attrgetter

import aiohttp

from app.adapters.effects import EffectClients, http_session
from app.adapters.effects.listings import at_provider, listings
from app.adapters.effects.registry import ClientFactory, client_factories, token_paths
from app.adapters.kafka.connection import KafkaConnection
from app.adapters.kafka.dlq import KafkaDeadLetterSink
from app.adapters.kafka.ops import GroupLag
from app.adapters.kafka.ranges import TopicRange
from app.adapters.kafka.watermark import WatermarkTopic
from app.adapters.mysql import MySqlStore
from app.adapters.mysql.clock import DatabaseClock
from app.adapters.mysql.controls import MySqlControls
from app.adapters.mysql.engine import create_engine
from app.adapters.mysql.heartbeat import Heartbeat, beats_in_flight
from app.adapters.mysql.leases import MySqlLeases
from app.adapters.mysql.ledger.bulk_jobs import MySqlBulkJobs
from app.adapters.mysql.ledger.port import MySqlLedger
from app.adapters.mysql.partitions import Partitions
from app.adapters.mysql.reads.backlog import Watch
from app.adapters.mysql.reads.console import Queries
from app.adapters.mysql.reads.error_groups import GroupQueries
from app.adapters.mysql.reads.view_audit import ViewAudit
from app.adapters.mysql.reconcile import RECEIPT_TABLES, ReceiptRanges, ReconcileReads
from app.adapters.mysql.reconcile_cases import MySqlCases
from app.adapters.mysql.recovery import Remembered
from app.adapters.mysql.recovery_windows import RecoveryWindows
from app.adapters.mysql.skipped_types import SkippedTypes
from app.adapters.watermark import WATERMARK_RETRY_TICKS, StoreWatermark
from app.background import BackgroundWork
from app.chaos import cut_points
from app.compensation.bulk import BulkRunner
from app.compensation.compensator import Compensator
from app.compensation.rules import Backoff
from app.injection import Opened
from app.observability import tracing
from app.observability.metrics import (
    BREAKER_OPEN,
    BREAKER_OPENED,
    LIVE_MEMBERS,
    RATE_SHARE,
    SKIPPED_TYPES,
    PipelineMetrics,
)
from app.observability.pipeline_spans import PipelineSpans
from app.pipeline.batch import BatchHandler, BatchPolicy, Identity
from app.pipeline.controls import Controls
from app.pipeline.envelopes import Reading, reading_of
from app.pipeline.limits import EffectLimit, ProviderLimits
from app.pipeline.liveness_fence import SelfFence
from app.pipeline.observer import Observers
from app.pipeline.outage import OutageGuard
from app.pipeline.processor import Processor, ProcessorPolicy, Safeguards
from app.pipeline.retention import Retention
from app.pipeline.tokens import StepTokens
from app.reconcile.casework import Casework
from app.reconcile.providers import ProviderSection, ProviderSide, reconcile_providers
from app.reconcile.run import Judging, Reconciler
from app.settings import Settings
from app.settings.effects import EffectsSettings
from app.settings.events import EventsSettings, type_names
from app.sizing import budget_rows, capacity

log = logging.getLogger(__name__)

# Each effect's client, built from the effects' settings by the provider the deployment picks
# (app/adapters/effects/registry.py).
EFFECT_CLIENTS: dict[str, ClientFactory] = client_factories()
ALERT_CONNECTIONS = 2        # the stuck sweep's alert webhook: one POST at a time, of one worker
RECONCILE_CONNECTIONS = 2    # the reconcile's own HTTP pool: never a slot of the order agent's


def event_reading(events: EventsSettings) -> Reading:
    """How the worker reads records, as the settings say (``app.pipeline.envelopes``)."""
    return reading_of(events.envelope, events.sources(), type_names(events.type_names), events.versions,
                      events.unhandled, events.foreign)


def provider_limits(effects: EffectsSettings, names: Iterable[str]) -> ProviderLimits:
    """The limits of every effect with a client, from ``EFFECTS__<EFFECT>__{CALLS_PER_SECOND,CONCURRENCY}``."""
    resolved = {name: effects.effect(name) for name in names}
    return ProviderLimits({name: EffectLimit(r.calls_per_second, r.concurrency) for name, r in resolved.items()})


class RuntimeNotOpen(RuntimeError):
    """The runtime asked for before the worker opened it, or after it closed it."""


@dataclass(frozen=True, slots=True)
class StoreAdapters:
    """What the worker reads and writes in its database beside the pipeline, one adapter per concern,
    each on the runtime's store: made when it opens, handed to the entry points by these names."""
    queries: Queries                        # the console's reads: the queue, an order's timeline, t_idem rows
    view_audit: ViewAudit
    groups: GroupQueries
    bulk_jobs: MySqlBulkJobs
    skipped_types: SkippedTypes
    reconcile_cases: Casework               # the providers' cases: filed, read, acted on (app.reconcile.casework)
    reconcile_reads: ReconcileReads
    watch: Watch                            # the stuck sweep's and the gauges' reads
    recovery_windows: RecoveryWindows
    idem_partitions: Partitions             # t_idem's months
    leases: MySqlLeases
    operator_controls: MySqlControls        # effects held and partitions paused by people, and their audit

    @classmethod
    def on(cls, store: MySqlStore, settings: Settings, tokens: StepTokens) -> StoreAdapters:
        group = settings.app_id
        return cls(queries=Queries(store, group=group), view_audit=ViewAudit(store, group=group),
                   groups=GroupQueries(store, group=group), bulk_jobs=MySqlBulkJobs(store, group=group),
                   skipped_types=SkippedTypes(store, group=group),
                   reconcile_cases=Casework(MySqlCases(store, group=group), partial(at_provider, settings.effects),
                                            group=group, tokens=tokens),
                   reconcile_reads=ReconcileReads(store, group=group), watch=Watch(store),
                   recovery_windows=RecoveryWindows(store),
                   idem_partitions=Partitions(store, hold_seconds=settings.operations.partition_lock_wait_seconds),
                   leases=MySqlLeases(store), operator_controls=MySqlControls(store, group=group))


# The runtime's own parts that entry points may name (beside StoreAdapters' fields), made when it opens.
OPENED_PARTS = ("store", "clock", "retention", "limits", "alert_http", "compensator", "bulk", "batches", "lag",
                "watermark", "dead_letters")


class Runtime:
    def __init__(self, settings: Settings, role: str = "main",
                 clients: dict[str, ClientFactory] | None = None) -> None:
        self.settings = settings
        self.tokens = StepTokens(settings.effects.token_key())        # SettingsError without IDEM_TOKEN_SECRET
        # The registry as it is now, not as it was at import: a provider listed later (registry.added) counts.
        self.client_factories = client_factories() if clients is None else clients
        EffectClients.check(self.client_factories)
        # A fresh incarnation id: a restarted worker never mistakes its
        # predecessor's claims for its own, and waits for their leases.
        self.role = role
        run = uuid.uuid4().hex[:12]
        self.owner = f"{settings.worker_id}/{role}/{run}"
        self.incarnation = f"{settings.worker_id}/{run}"      # liveness_fence.incarnation_of(any owner of ours)
        self._lock = asyncio.Lock()
        self._started = False
        self.background = BackgroundWork()          # what stop() waits for (app.background)
        self.reading = event_reading(settings.events)
        SKIPPED_TYPES.declare(self.reading.foreign)
        # What people hold and pause (app.pipeline.controls): read when the runtime opens, before the first
        # batch, then every CONTROLS_REFRESH_SECONDS (app.timers.controls).
        self.controls = Controls()

    async def start(self, *, kafka: bool = True) -> Runtime:
        """Open everything (``kafka=False``: all but the dead-letter producer, for commands)."""
        async with self._lock:
            if self._started:
                return self
            s = self.settings
            # The highest watermark this process knows the store reached: every new connection is
            # checked against it (app.adapters.watermark).
            self.remembered = Remembered()
            self.engine = create_engine(s, remembered=self.remembered)
            self.store = MySqlStore(self.engine, lock_retries=s.database.lock_retries,
                                    statement_timeout=s.database.statement_timeout_seconds,
                                    transaction_timeout=s.database.transaction_timeout_seconds)
            # "Today" is the database's: see app.adapters.mysql.clock.
            self.clock = DatabaseClock()
            try:
                await asyncio.wait_for(self.clock.sync(self.store), 5)
            except Exception as exc:       # the database may come later: this process's clock until then
                log.warning("the database's clock could not be read yet (%r)", exc)
            self.retention = Retention(s.operations.idem_retention_days, today=self.clock.today, ahead=s.operations.partitions_ahead)
            # This process's heartbeat: its calls start only while it is recent, and other workers
            # take its claims over once it is not (app.pipeline.liveness_fence).
            # Its own connections, a beat every interval each on its own, bounded by the time after which
            # it could keep nothing open: a beat never waits behind the batches for a pooled connection,
            # nor on a connection a restart or a cut left dead (the next one starts on a fresh connection),
            # and on a slow database the beats land late instead of not at all (app.adapters.mysql.heartbeat).
            self.fence = SelfFence(s.effects.worker_dead_after_seconds)
            # Each provider's limits, shared by every caller of this process; a group-wide rate is
            # shared among the live workers, counted at each heartbeat (app.pipeline.limits).
            self.limits = provider_limits(s.effects, self.client_factories)
            self.limits.controls = self.controls          # a person's hold refuses calls as a breaker does
            for name in self.client_factories:      # every effect's breaker has its series from the start
                BREAKER_OPEN.labels(name).set(0)
                BREAKER_OPENED.labels(name).set(0)
            in_flight = beats_in_flight(s.effects.worker_heartbeat_seconds, s.effects.worker_dead_after_seconds)
            self.heartbeat_engine = create_engine(s, pool_size=in_flight, max_overflow=0, remembered=self.remembered)
            beats = MySqlStore(self.heartbeat_engine, lock_retries=0, statement_timeout=s.effects.worker_dead_after_seconds,
                               transaction_timeout=s.effects.worker_dead_after_seconds)
            self.heartbeat = Heartbeat(beats, self.incarnation, s.worker_id, self.fence,
                                       every=s.effects.worker_heartbeat_seconds, on_members=self._members)
            try:
                await asyncio.wait_for(self.heartbeat.beat_once(), 5)
            except TimeoutError:          # the database may come later: the loop beats then
                pass
            self.heartbeat.start()
            # Each caller of the services has a pool of its own, as large as its own limit of calls in
            # flight: the order agent's batches, the compensator's redrives (its drain, its agent, bulk
            # jobs), the alert webhook. A call then waits for its caller's slot, before its lease is
            # checked, never for a connection that another caller holds, inside its own timeout (where
            # the wait would end as "maybe sent" although nothing was).
            # Traced (OTEL_* settings), each effect call is a span and carries traceparent to its provider.
            tracing.configure(s.tracing, worker_id=s.worker_id)
            # What the pipeline reports: counted, traced (while tracing is on), and killed at a chaos run's cut.
            self.observer = Observers(PipelineMetrics(), PipelineSpans(), *cut_points(s.operations.chaos_kill_at))
            self.http = http_session(s.effects.concurrency, tracing.client_trace_configs(token_paths()))
            self.redrive_http = http_session(s.effects.concurrency, tracing.client_trace_configs(token_paths()))
            self.alert_http = http_session(ALERT_CONNECTIONS)
            self.effects = self._effect_clients(self.http)
            self.processor = self._processor(self.owner)
            # The compensator's claims are its own: never mistaken for the main agent's lease.
            self.compensator = Compensator(
                self._processor(self.owner.replace(f"/{self.role}/", "/compensator/"),
                                self._effect_clients(self.redrive_http)),
                MySqlLedger(self.store, dead_after=s.effects.worker_dead_after_seconds),
                group=s.app_id, lease_seconds=self.redrive_seconds(), max_event_bytes=s.batches.max_event_bytes,
                reading=self.reading, backoff=Backoff(s.compensation.backoff_seconds, s.compensation.backoff_max_seconds,
                                s.compensation.max_attempts))
            self.adapters = StoreAdapters.on(self.store, s, self.tokens)
            await self._read_controls()
            self.bulk = BulkRunner(
                self.adapters.bulk_jobs, self._bulk_chunk, group=s.app_id, owner=self.owner.replace(f"/{self.role}/", "/bulk/"),
                lease_seconds=s.bulk.lease_seconds, chunk_size=min(s.bulk.chunk_size, s.batches.size),
                rate=s.bulk.rate_per_second, busy_retry_seconds=min(s.bulk.lease_seconds, 5.0))
            self.lag = GroupLag(KafkaConnection.from_settings(s.kafka), s.app_id, s.kafka.topic,
                                isolation_level=s.kafka.isolation_level)
            self.dead_letters = KafkaDeadLetterSink(KafkaConnection.from_settings(s.kafka), s.kafka.dlq_topic, s.app_id,
                                                    timeout_seconds=s.batches.dlq_send_timeout_seconds,
                                                    truncate_bytes=s.batches.dlq_truncate_bytes)
            self._kafka = kafka
            if kafka:
                await self.dead_letters.start()
                # Before the first batch: is the store still where Kafka remembers it?
                self.watermark = StoreWatermark(
                    self.adapters.recovery_windows, WatermarkTopic(KafkaConnection.from_settings(s.kafka), s.kafka.store_watermark_topic, s.app_id), self.remembered,
                    worker_id=s.worker_id, hours=s.database.recovery_auto_hours,
                    retry_seconds=WATERMARK_RETRY_TICKS * s.database.store_watermark_seconds)
                await self.watermark.start()
            self.batches = BatchHandler(
                self.processor, self.store, self.dead_letters, identity=Identity(s.app_id, s.worker_id),
                policy=BatchPolicy(
                    backoff=s.batches.retry_backoff, max_event_bytes=s.batches.max_event_bytes,
                    infra_budget=s.database.infra_retry_budget_seconds, max_lease_wait=2 * s.effects.lease_seconds,
                    deadline=s.batches.deadline_seconds, dlq_retry_after=s.batches.dlq_retry_after_seconds,
                    concurrency=s.effects.concurrency, hold_records=s.effects.breaker_hold_records),
                reading=self.reading)
            self._started = True
        return self

    def reconciler(self) -> Reconciler:
        """A reconcile of this deployment's input (``app.reconcile``), the providers' records included."""
        s = self.settings
        return Reconciler(self.started().adapters.reconcile_reads, partial(TopicRange, KafkaConnection.from_settings(s.kafka)),
                          Judging(self.reading, s.batches.max_event_bytes, s.operations.stuck_pending_seconds),
                          group=s.app_id, topic=s.kafka.topic, chunk=s.reconcile.chunk,
                          keep_findings=s.reconcile.keep_findings, providers=self._reconcile_providers)

    async def _reconcile_providers(self, since, until, run_id: int | None) -> tuple[dict, int]:
        """The providers' side of a run (``app.reconcile.providers``); its findings filed as cases for a person
        (a run that keeps nothing, ``run_id`` None, files none)."""
        section = await self.compare_providers(since, until)
        if run_id is not None:
            await self.adapters.reconcile_cases.file(section.findings, run_id)
        return section.as_dict(), len(section.findings)

    async def compare_providers(self, since, until) -> ProviderSection:
        """Each effect's provider's records against our receipts over ``[since, until)`` (``app.reconcile.providers``)."""
        options = self.settings.reconcile
        async with http_session(RECONCILE_CONNECTIONS) as session:
            sides = [ProviderSide(effect, name, listing,
                                  ReceiptRanges(self.store, effect) if effect in RECEIPT_TABLES else None)
                     for effect, (name, listing) in listings(self.settings.effects, session).items()]
            return await reconcile_providers(sides, since=since, until=until, tokens=self.tokens,
                                             margin_seconds=options.provider_margin_seconds,
                                             slice_seconds=options.provider_slice_seconds,
                                             max_rows=options.provider_max_rows)

    def started(self) -> Runtime:
        """This runtime, open: the worker opens it once as it starts (``RuntimeService``), before
        its agents, timers and web views run; a command opens it itself (``start(kafka=False)``)."""
        if not self._started:
            raise RuntimeNotOpen("the runtime is not open: the worker has not started it yet, or has stopped it")
        return self

    def collaborators(self) -> dict[str, object]:
        """What an agent, timer, view or command may name (``app.injection``), by name: the settings and
        what this runtime knows before it opens, as they are; what it makes when it opens (its adapters,
        store, compensator...) as an :class:`Opened` that finds it at each use."""
        s = self.settings
        opened = {name: Opened(functools.partial(self._part, name)) for name in OPENED_PARTS}
        adapters = {f.name: Opened(functools.partial(self._part, f"adapters.{f.name}")) for f in fields(StoreAdapters)}
        return {"settings": s, "reading": self.reading, "tokens": self.tokens, "owner": self.owner,
                "effect_names": tuple(self.client_factories), "background": self.background,
                # A fresh budget for waiting out an unreachable database, at each call.
                "guard": functools.partial(OutageGuard, s.database.infra_retry_budget_seconds),
                "capacity": functools.partial(capacity, s), "budget_rows": functools.partial(budget_rows, s),
                "reconciler": self.reconciler, "controls": self.controls, **opened, **adapters}

    async def _read_controls(self) -> None:
        """The operator controls in force, before the first batch: a hold or a pause made while no worker
        ran is kept from its first record on (a database not there yet: the timer reads them later)."""
        try:
            self.controls.update(*await asyncio.wait_for(self.adapters.operator_controls.in_force(), 5))
        except Exception as exc:
            log.warning("the operator controls could not be read yet (%r): read again every "
                        "CONTROLS_REFRESH_SECONDS", exc)

    def _part(self, path: str) -> object:
        return attrgetter(path)(self.started())

    def _effect_clients(self, session: aiohttp.ClientSession) -> EffectClients:
        return EffectClients({name: make(session, self.settings.effects) for name, make in self.client_factories.items()})

    def _processor(self, owner: str, effects: EffectClients | None = None) -> Processor:
        s = self.settings
        policy = ProcessorPolicy(
            lease_seconds=s.effects.lease_seconds, effect_concurrency=s.effects.concurrency,
            effect_timeout=s.effects.timeout_seconds, lease_margin=s.effects.lease_margin_seconds,
            attempt_cap=s.operations.idem_max_attempts, settle_group=s.batches.settle_group,
            settle_after=s.batches.settle_after_ms / 1000)
        return Processor(self.store, effects or self.effects, owner=owner, tokens=self.tokens, policy=policy,
                         safeguards=Safeguards(self.limits, self.fence, self.retention), observer=self.observer)

    def _members(self, members: int) -> None:
        self.limits.set_members(members)
        LIVE_MEMBERS.set(self.limits.members)
        for name in self.client_factories:
            RATE_SHARE.labels(name).set(self.limits.share(name))

    async def _bulk_chunk(self, job, row_ids, guard, held):
        """A bulk job's action on a chunk of its rows, as the job's creator (``app.compensation.bulk``)."""
        return await self.compensator.bulk(job.action, row_ids, guard, actor=job.actor, note=job.note, job_id=job.id,
                                           held=held)

    def redrive_seconds(self) -> float:
        """How long a claim of a ledger row lasts: longer than a redrive of a batch can take
        (its calls end within a lease; its three transactions may each run into their time
        limit; the database may be waited out within the budget), so that another worker takes
        a row over only once its claimer is surely gone."""
        s = self.settings
        return s.effects.lease_seconds + s.database.infra_retry_budget_seconds + 3 * s.database.transaction_timeout_seconds

    async def stop(self) -> None:
        # The round in flight finishes first, and none starts after it (app.background).
        await self.background.stop()
        async with self._lock:
            if self._started:
                await self._release_bulk_job()
                if self._kafka:
                    await self._stop_watermark()
                    await self.dead_letters.stop()
                await self.lag.close()
                await self.heartbeat.stop()
                for session in (self.http, self.redrive_http, self.alert_http):
                    await session.close()
                await self.engine.dispose()
                await self.heartbeat_engine.dispose()
                tracing.shutdown()
                self._started = False

    async def _stop_watermark(self) -> None:
        """The store's watermark advanced once more (what this worker did is covered), within a bound."""
        try:
            await asyncio.wait_for(self.watermark.stop(), 10)
        except Exception as exc:
            log.warning("the store's watermark was not advanced at the stop: %r", exc)

    async def _release_bulk_job(self) -> None:
        """A stopping worker gives its bulk job up (its chunk in flight is over): another worker
        takes it over at once instead of after BULK_LEASE_SECONDS."""
        try:
            await asyncio.wait_for(self.bulk.release(lambda work: work()), 5)
        except Exception as exc:
            log.warning("the bulk job's lease could not be given up (it runs out by itself): %r", exc)
