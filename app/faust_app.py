"""How a Faust app of this processor is configured (used by ``app.main`` and the benchmark)."""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import faust
import mode
from sqlalchemy.exc import InterfaceError, OperationalError

from app import exits
from app.adapters.effects import http_session
from app.adapters.effects.registry import UnknownProvider, client_factories
from app.adapters.effects.signing import CredentialsRefused, SigningNotConfigured
from app.adapters.kafka import consumer as kafka_consumer
from app.adapters.kafka import ops as kafka_ops
from app.adapters.kafka import records as kafka_records
from app.adapters.kafka import upstream
from app.adapters.kafka.connection import KafkaConfigError, KafkaConnection, KafkaStartupError, preflight
from app.adapters.mysql import preflight as mysql_preflight
from app.adapters.mysql import schema
from app.adapters.mysql.engine import create_engine
from app.adapters.mysql.tls import MySqlTls
from app.observability.metrics import build_info
from app.observability.monitor import BatchLevelMonitor
from app.settings import Settings
from app.version import VERSION

log = logging.getLogger(__name__)


class OpenedWithTheApp(mode.Service):
    """What a worker opens once, as a Faust service: started with the app, after its start-up
    checks and before Faust's producer and consumer, the agents, the timers and the web views
    (``ProcessorApp.opened_first``), and stopped after all of them."""

    def __init__(self, name: str, open_: Callable[[], Awaitable[object]], close: Callable[[], Awaitable[None]],
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.name, self._open, self._close = name, open_, close

    @property
    def shortlabel(self) -> str:
        return self.name

    async def on_start(self) -> None:
        await self._open()

    async def on_stop(self) -> None:
        await self._close()


class ProcessorApp(faust.App):
    """Faust's app, with checks that run when a worker starts, before any Kafka client of Faust's,
    and the services a worker opens before anything of Faust's runs (``opened_first``)."""

    startup_checks: list[Callable[[ProcessorApp], Awaitable[None]]]
    opened_first: list[tuple[str, Callable[[], Awaitable[object]], Callable[[], Awaitable[None]]]]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.startup_checks = []
        self.opened_first = []      # (name, open, close)

    def on_init_dependencies(self):
        faust_own = list(super().on_init_dependencies())
        if self.producer_only or self.client_only:      # a command: it opens what it needs itself
            return faust_own
        # Started in this order, stopped in the reverse one: ours first up and last down.
        return [*(OpenedWithTheApp(name, open_, close, loop=self.loop, beacon=self.beacon)
                  for name, open_, close in self.opened_first), *faust_own]

    async def on_first_start(self) -> None:
        await super().on_first_start()
        for check in self.startup_checks:
            await check(self)


async def check_kafka(app: faust.App, settings: Settings) -> None:
    """Before Faust's consumer and producer: can we connect, and will what we write survive a broker?

    A refusal (wrong password, unknown CA, a TLS listener spoken to in PLAINTEXT) stops the worker at
    once with exit 78 and a line that says which; no broker answering is waited out for
    KAFKA_STARTUP_WAIT_SECONDS, then exit 69."""
    conn = KafkaConnection.from_settings(settings.kafka)
    log.info("Kafka: %s", conn.describe())
    try:
        await preflight(conn, wait_seconds=settings.kafka.startup_wait_seconds, stopping=lambda: app.should_stop)
    except KafkaStartupError as exc:
        exits.stop_at_startup(exits.EXIT_UNAVAILABLE if exc.retriable else exits.EXIT_CONFIG,
                              f"cannot start: {exc}")
        return
    except KafkaConfigError as exc:
        exits.stop_at_startup(exits.EXIT_CONFIG, f"cannot start: {exc}")
        return
    topics = [settings.kafka.topic, settings.kafka.dlq_topic]
    deadline = time.monotonic() + settings.kafka.startup_wait_seconds
    while True:
        try:
            found = await kafka_ops.durability(conn, topics)
            break
        except Exception as exc:
            message = f"the topics' replication could not be read ({exc!r})"
            # A node not ready or a leader moving passes; no DescribeConfigs permission does not.
            passing = getattr(exc, "retriable", False) or isinstance(exc, (asyncio.TimeoutError, OSError))
            if passing and time.monotonic() < deadline and not app.should_stop:
                log.warning("%s; trying again", message)
                await asyncio.sleep(2.0)
                continue
            if settings.kafka.require_replication:
                exits.stop_at_startup(exits.EXIT_UNAVAILABLE if passing else exits.EXIT_CONFIG,
                                      f"cannot start: {message} (KAFKA_REQUIRE_REPLICATION=true)")
                return
            log.warning("%s: not checked", message)
            return
    for topic, durability in found.items():
        if durability is None:
            log.error("topic %s does not exist: create it (python -m app.admin create-topics)", topic)
            continue
        risks = durability.risks()
        if not risks:
            continue
        message = (f"topic {topic} has {', '.join(risks)}: an acknowledged event or dead letter may not survive "
                   "the loss of a broker (production wants replication 3, min.insync.replicas=2, "
                   "unclean leader election off)")
        if settings.kafka.require_replication:
            exits.stop_at_startup(exits.EXIT_CONFIG, f"cannot start: {message} (KAFKA_REQUIRE_REPLICATION=true)")
            return
        log.warning("%s; KAFKA_REQUIRE_REPLICATION=true refuses to start like this", message)


async def check_database(app: faust.App, settings: Settings) -> None:
    """Before the first batch: does the database let us in, over TLS when MYSQL_SSL_* asks for it?

    A refusal (a CA that did not sign the server's certificate, a server without TLS, TLS
    required and not configured, a client certificate refused, access denied) stops the worker at
    once with exit 78 and a line that names the setting to fix. A server that does not answer is
    waited for, up to INFRA_RETRY_BUDGET_SECONDS; then the worker starts anyway and its batches
    wait it out as in any outage (and stop it, exit 70, when it lasts past their budget). A schema
    whose migrations are behind this code stops it too (exit 78, what to run)."""
    log.info("order-event-processor %s (its migrations' head: %s)", VERSION, schema.revisions()[0])
    tls = MySqlTls.from_settings(settings.database)
    where = mysql_preflight.Target.of(settings.database.url)
    log.info("database: %s as %r, %s", where, where.user, tls.describe())
    engine = create_engine(settings, pool_size=1, max_overflow=0)
    try:
        cipher = await mysql_preflight.preflight(
            engine, tls, where, wait_seconds=settings.database.infra_retry_budget_seconds,
            attempt_timeout=max(5.0, settings.database.connect_timeout_seconds), stopping=lambda: app.should_stop)
    except mysql_preflight.DatabaseStartupError as exc:
        if not exc.retriable:
            exits.stop_at_startup(exits.EXIT_CONFIG, f"cannot start: {exc}")
            return
        log.warning("%s (waited %.0f s: INFRA_RETRY_BUDGET_SECONDS); starting anyway: batches wait for the "
                    "database as in an outage", exc, settings.database.infra_retry_budget_seconds)
        return
    else:
        log.info("the database answers at %s%s", where, f" over TLS ({cipher})" if cipher else " (no TLS)")
        try:
            await check_schema(engine)
        except (OperationalError, InterfaceError) as exc:
            # It answered, then went away (a restart) before its schema was read: as when it does
            # not answer at all, start, and let the batches wait for it as in an outage.
            log.warning("the database went away while its schema was read (%s); starting anyway: batches wait "
                        "for the database as in an outage", exc.orig if exc.orig is not None else exc)
    finally:
        await engine.dispose()


async def check_providers(app: faust.App, settings: Settings) -> None:
    """Every effect's provider can be built from the settings (a provider named that serves the effect,
    a signing provider's account and secret), and no provider refuses this deployment's signature:
    otherwise exit 78 and a line that names the settings, never a loop of refused calls. A provider
    that does not answer is not the settings' fault: it is waited out call by call, as in an outage."""
    session = http_session(1)
    try:
        try:
            clients = {name: make(session, settings.effects) for name, make in client_factories().items()}
        except (UnknownProvider, SigningNotConfigured) as exc:
            exits.stop_at_startup(exits.EXIT_CONFIG, f"cannot start: {exc}")
            return
        for name, client in clients.items():
            check = getattr(client, "check_credentials", None)
            if check is None:
                continue
            try:
                await check()
            except CredentialsRefused as exc:
                exits.stop_at_startup(exits.EXIT_CONFIG, f"cannot start: {exc}")
                return
            log.info("%s: the provider accepts this deployment's signature", name)
    finally:
        await session.close()


async def check_schema(engine) -> None:
    """Refuse to start on a schema this release does not run on: behind its migrations, or newer and
    no longer serving it (app.adapters.mysql.schema); export what it runs on (order_build_info)."""
    known = schema.revisions()
    found = await schema.found_schema(engine)
    verdict = schema.judge_revision(found, known)
    if not verdict.ok:
        exits.stop_at_startup(exits.EXIT_CONFIG, f"cannot start: {verdict.message}")
        return
    if verdict.message:
        log.warning(verdict.message)
    build_info(schema_revision=found.revision, code_revision=known[0])


def create_app(settings: Settings, *, web_middlewares: Sequence = ()) -> ProcessorApp:
    """The app; ``web_middlewares`` run before every view of its web server (``app.main`` hands
    it the one that decides who may ask, ``app.web.views.middlewares``)."""
    build_info(code_revision=schema.revisions()[0], schema_revision=None)
    if settings.operations.event_loop == "uvloop":
        # Same as `faust -L uvloop`: the CLI imports the app before it creates the loop.
        import mode.loop

        mode.loop.use("uvloop")
    Path(settings.operations.data_dir).mkdir(parents=True, exist_ok=True)
    # The bound on a decompressed record batch (app.adapters.kafka.records) and the consumer's
    # isolation level (app.adapters.kafka.consumer), read by the replacements installed next.
    kafka_records.configure(settings.batches.max_batch_bytes)
    kafka_consumer.configure(settings.kafka.isolation_level, settings.kafka.revoke_grace_seconds)
    # Every replacement of Faust's, mode's and aiokafka's internals, in one place, checked against
    # the installed versions (exit 78 on others): app.adapters.kafka.upstream.
    upstream.install()
    app = ProcessorApp(
        settings.app_id,
        broker=settings.kafka.faust_broker,
        # SASL and/or TLS for Faust's consumer and producer, from the one place that builds them.
        broker_credentials=KafkaConnection.from_settings(settings.kafka).faust_credentials(),
        producer_acks=-1,
        # No Faust tables: the idempotency memory is MySQL's t_idem.
        store="memory://",
        datadir=f"{settings.operations.data_dir}/{{conf.name}}",
        autodiscover=False,
        Monitor=BatchLevelMonitor,
        # Topics are created explicitly (``python -m app.admin create-topics``);
        # the worker never creates one by accident with the wrong partition count.
        topic_allow_declare=False,
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=settings.kafka.commit_interval_seconds,
        broker_commit_every=settings.kafka.commit_every,
        broker_session_timeout=settings.kafka.session_timeout_seconds,
        broker_heartbeat_interval=settings.kafka.heartbeat_interval_seconds,
        broker_rebalance_timeout=settings.kafka.rebalance_timeout_seconds,
        broker_max_poll_records=settings.kafka.max_poll_records,
        consumer_max_fetch_size=settings.kafka.max_partition_fetch_bytes,
        web_bind=settings.web.bind,
        web_host=settings.web.bind,
        web_port=settings.web.port,
        web_application_options={"middlewares": list(web_middlewares)},
        logging_config=None,
        loghandlers=[],
    )
    app.startup_checks.append(functools.partial(check_kafka, settings=settings))
    app.startup_checks.append(functools.partial(check_providers, settings=settings))
    return app


def order_event_topic(app: faust.App, settings: Settings) -> faust.TopicT:
    """``order-event``, read raw: a record that is not JSON must reach our decoder
    (a Faust decode error inside ``take()`` silently ends the agent)."""
    return app.topic(settings.kafka.topic, key_type=bytes, value_type=bytes, key_serializer="raw",
                     value_serializer="raw", partitions=settings.kafka.partitions)


def dead_letter_topic(app: faust.App, settings: Settings) -> faust.TopicT:
    """``order-event-dlq``, read raw like ``order-event``."""
    return app.topic(settings.kafka.dlq_topic, key_type=bytes, value_type=bytes, key_serializer="raw",
                     value_serializer="raw", partitions=settings.kafka.dlq_partitions)


GC_YOUNG_THRESHOLD = 30_000


def freeze_startup_objects() -> None:
    """Move everything alive after startup out of the garbage collector's sight.

    Faust, aiokafka and SQLAlchemy keep hundreds of thousands of long-lived
    objects; every full collection walked them all, and a gen-2 collection that landed
    inside a batch made it one of the slowest. After ``gc.freeze()`` none does: the p99
    batch and the throughput of the local-only benchmark both improved (the figures: the
    docs' Benchmarks page and bench/results/history.md; ``make bench`` produces them).

    Then the youngest generation is collected every ``GC_YOUNG_THRESHOLD`` allocations instead
    of CPython's 700: a batch of 500 events makes about 10,000 short-lived objects that reference
    counting frees on its own, so at 700 the collector ran about fifteen times a batch for almost
    nothing. On the local-only benchmark, in pairs taken in turns, the worker's CPU per event went
    down and its peak RSS did not move; a far higher threshold saved no more and let one
    collection make a batch slow (the figures: the docs' Benchmarks page and bench/results/history.md).
    """
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
