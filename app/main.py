"""The composition root: the Faust app, its topics, the runtime, and what runs on them.

Nothing here decides anything about events; it builds the pieces once and hands each
agent, timer, web view and command the collaborators it names (``app.injection``),
never the runtime; they import neither this module nor each other.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import AsyncIterator

from agents import compensator as compensator_agent
from agents import order_events as order_events_agent
from app import exits
from app.adapters.kafka.connection import KafkaConfigError
from app.bootstrap import Runtime
from app.commands import budget as budget_command
from app.commands import controls as controls_command
from app.commands import dlq as dlq_command
from app.commands import reconcile as reconcile_command
from app.commands import recovery as recovery_command
from app.commands import web_token as web_token_command
from app.exits import EXIT_CONFIG
from app.faust_app import check_database, create_app, dead_letter_topic, order_event_topic
from app.injection import Collaborators
from app.settings import SettingsError, get_settings_or_exit
from app.timers import bulk as bulk_timer
from app.timers import compensation as compensation_timer
from app.timers import controls as controls_timer
from app.timers import gauges as gauges_timer
from app.timers import partitions as partitions_timer
from app.timers import reconcile as reconcile_timer
from app.timers import stuck as stuck_timer
from app.timers import watchdog as watchdog_timer
from app.timers import watermark as watermark_timer
from app.web import views

settings = get_settings_or_exit()
try:
    app = create_app(settings, web_middlewares=views.middlewares(settings))
except KafkaConfigError as exc:         # e.g. a KAFKA_SSL_* file that is no PEM certificate
    print(f"order-event-processor: the settings cannot work: {exc}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_CONFIG) from None
logging.getLogger("app").setLevel(settings.operations.log_level.upper())
# After Kafka's check (create_app): the database's, TLS included (the benchmark's no-op app has none).
app.startup_checks.append(functools.partial(check_database, settings=settings))

order_events = order_event_topic(app, settings)
dead_letters = dead_letter_topic(app, settings)
try:
    runtime = Runtime(settings)
except SettingsError as exc:            # no IDEM_TOKEN_SECRET
    print(f"order-event-processor: the settings cannot work: {exc}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_CONFIG) from None
# Opened once as the worker starts, before the agents, timers and views that use it.
app.opened_first.append(("runtime", runtime.start, runtime.stop))


@contextlib.asynccontextmanager
async def opened_for_a_command() -> AsyncIterator[None]:
    """What a command runs in: the runtime opened without the dead-letter producer, closed after."""
    await runtime.start(kafka=False)
    try:
        yield
    finally:
        await runtime.stop()


# Each entry point is handed what it names, by name: the runtime's parts, the app's agents (the
# readiness view reports them) and, for a command, the runtime opened around it.
wire = Collaborators({**runtime.collaborators(), "agents": app.agents, "opened": opened_for_a_command})
process_order_events = order_events_agent.register(app, order_events, settings, wire)
if settings.compensation.enabled:
    compensate_dead_letters = compensator_agent.register(app, dead_letters, settings, wire)
    run_due_compensations = compensation_timer.register(app, settings, wire)
stuck_sweep = stuck_timer.register(app, settings, wire)
run_bulk_jobs = bulk_timer.register(app, settings, wire)
maintain_partitions = partitions_timer.register(app, settings, wire)
refresh_gauges = gauges_timer.register(app, settings, wire)
read_controls = controls_timer.register(app, settings, wire)
advance_store_watermark = watermark_timer.register(app, settings, wire)
reconcile_window = reconcile_timer.register(app, settings, wire)
watchdog = watchdog_timer.register(app, settings, wire)
exits.bound_the_stop(settings.kafka.stop_timeout)
views.register(app, settings, wire)
dlq_command.register(app, wire)
budget_command.register(app, wire)
recovery_command.register(app, wire)
reconcile_command.register(app, wire)
web_token_command.register(app, wire)
controls_command.register(app, wire)


@app.on_before_shutdown.connect
async def close_runtime(sender, **kwargs) -> None:
    # Sent after Faust waited for the streams to be empty: no batch is in flight.
    await runtime.stop()
