"""The watchdog: a worker that has fallen out of its group, or stopped moving, heals itself.

Every ``WATCHDOG_INTERVAL_SECONDS`` it looks at the consumer (``app.adapters.kafka.liveness``)
and lets ``app.pipeline.liveness`` decide: healthy; unhealthy for the first time (``/readyz`` answers
503 with the reason, and a rejoin of the group is forced); still unhealthy a grace later: the
worker exits 70 through ``app.exits.stop_without_ack``, which commits nothing, so the batch in
flight, if any, is delivered again to whoever gets its partitions. The bounds and why they
are what they are: ``app.pipeline.liveness``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

import faust
from prometheus_client import REGISTRY

from app.adapters.kafka.liveness import ConsumerProbe
from app.exits import stop_without_ack
from app.injection import Wire
from app.observability import metrics
from app.pipeline import liveness
from app.pipeline.liveness import Action, Bounds, Watch
from app.settings import Settings

log = logging.getLogger(__name__)


class WorkerStuck(RuntimeError):
    """The watchdog gave up on this worker: out of its group or not moving, and a rejoin did not help."""


async def bootstrap_answers(bootstrap: str, timeout: float = 2.0) -> bool:
    """Whether any broker of the bootstrap list accepts a TCP connection (nothing is sent)."""
    for address in bootstrap.split(","):
        host, _, port = address.rpartition(":")
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)), timeout)
        except (TimeoutError, OSError, ValueError):
            continue
        writer.close()
        return True
    return False


def _batch_in_flight() -> bool:
    return bool(REGISTRY.get_sample_value("order_batch_in_flight"))


class Watchdog:
    """What the watchdog keeps between its ticks: the consumer it reads, and its watch once the consumer
    has started."""

    def __init__(self, app: faust.App, bounds: Bounds) -> None:
        self.probe = ConsumerProbe(app)
        self.bounds = bounds
        self.watch: Watch | None = None


async def watch_the_consumer(*, settings: Settings, watchdog: Watchdog) -> None:
    now = time.monotonic()
    observation = watchdog.probe.read(_batch_in_flight())
    if observation is None:                 # the consumer has not started yet
        return
    if watchdog.watch is None:
        watchdog.watch = Watch(watchdog.bounds, now)
    watch = watchdog.watch
    before = watch.verdict
    if not before.healthy:
        observation = replace(observation, bootstrap_answers=await bootstrap_answers(settings.kafka.bootstrap))
    verdict = watch.observe(observation, now)
    liveness.report(verdict)
    metrics.WORKER_HEALTHY.set(1 if verdict.healthy else 0)
    for check in ("membership", "heartbeat", "fetch"):
        metrics.WORKER_UNHEALTHY.labels(check).set(1 if verdict.check == check else 0)
    if verdict.healthy and not before.healthy:
        log.warning("watchdog: healthy again")
    if verdict.action is Action.REJOIN:
        log.error("watchdog: %s: forcing a rejoin of the group (exit 70 if that does not help within %.0f s)",
                  verdict.reason, watchdog.bounds.rejoin_grace_seconds)
        metrics.WATCHDOG_ACTIONS.labels(verdict.check, "rejoin").inc()
        watchdog.probe.force_rejoin()
    elif verdict.action is Action.EXIT:
        log.critical("watchdog: %s: exiting so that the supervisor starts a fresh worker", verdict.reason)
        metrics.WATCHDOG_ACTIONS.labels(verdict.check, "exit").inc()
        stop_without_ack(WorkerStuck(verdict.reason))


def register(app: faust.App, settings: Settings, wire: Wire):
    """The watchdog's timer on ``app`` (none with ``WATCHDOG_ENABLED=false``)."""
    if not settings.kafka.watchdog_enabled:
        return None
    bounds = Bounds(settings.kafka.watchdog_stall, settings.kafka.watchdog_rejoin_grace, settings.kafka.rebalance_timeout_seconds)
    metrics.WORKER_HEALTHY.set(1)
    timer = app.timer(interval=settings.kafka.watchdog_interval_seconds, name="watchdog")
    return timer(wire(watch_the_consumer, watchdog=Watchdog(app, bounds)))
