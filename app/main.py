"""The composition root: the Faust app, its topics, agents and web views.

Nothing here decides anything about events; it wires the pieces together.
"""

from __future__ import annotations

import logging
from pathlib import Path

import faust

from app.monitor import BatchLevelMonitor
from app.settings import get_settings

settings = get_settings()
if settings.event_loop == "uvloop":
    # Same as `faust -L uvloop`: the CLI imports the app before it creates the loop.
    import mode.loop

    mode.loop.use("uvloop")
Path(settings.data_dir).mkdir(parents=True, exist_ok=True)

app = faust.App(
    settings.app_id,
    broker=settings.kafka_broker,
    # No Faust tables: the idempotency memory is MySQL's t_idem.
    store="memory://",
    datadir=f"{settings.data_dir}/{{conf.name}}",
    autodiscover=False,
    Monitor=BatchLevelMonitor,
    # Topics are created explicitly (``python -m app.admin create-topics``);
    # the worker never creates one by accident with the wrong partition count.
    topic_allow_declare=False,
    topic_disable_leader=True,
    consumer_auto_offset_reset="earliest",
    broker_commit_interval=settings.broker_commit_interval_seconds,
    broker_session_timeout=settings.broker_session_timeout_seconds,
    broker_heartbeat_interval=settings.broker_heartbeat_interval_seconds,
    web_bind=settings.web_bind,
    web_host=settings.web_bind,
    web_port=settings.web_port,
    logging_config=None,
    loghandlers=[],
)

order_events = app.topic(
    settings.order_event_topic,
    key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw",
    partitions=settings.order_event_partitions,
)

logging.getLogger("app").setLevel(settings.log_level.upper())

# Agents and views register themselves on import. (``import app.web.views``
# would rebind the name ``app`` to the package, hence the ``from`` form.)
from agents import order_events as _order_events_agent  # noqa: E402,F401
from app.web import views as _views  # noqa: E402,F401
