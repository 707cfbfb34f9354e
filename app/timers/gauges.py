"""The gauges that live outside this process, refreshed by every worker.

Every ``METRICS_REFRESH_SECONDS`` each worker reads, with a few cheap queries (index
ranges over unfinished work, InnoDB's row estimate, the partition list) and one look at
the broker: stuck and over-cap pending rows, unsettled dead letters and their ages, an open recovery window,
``t_idem``'s size against its budget, the months ready ahead, and the group's lag; and it
adds what it skipped of the types not handled to ``t_skipped_type`` and counts them there (every
type, and the new ones: first skipped within ``NEW_SKIPPED_TYPE_SECONDS``, not ``FOREIGN_EVENT_TYPES``).
Every worker exports the same values, so an alert rule reads them with ``max``, and a
worker that hangs does not take the numbers with it. Each refresh also reads the
database's clock (``app.adapters.mysql.clock``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import faust

from app.adapters.kafka.ops import GroupLag
from app.adapters.mysql import MySqlStore
from app.adapters.mysql.clock import DatabaseClock
from app.adapters.mysql.partitions import CATCH_ALL, Partitions, month_start
from app.adapters.mysql.reads.backlog import Watch
from app.adapters.mysql.reconcile import ReconcileReads
from app.adapters.mysql.recovery_windows import RecoveryWindows
from app.adapters.mysql.skipped_types import SkippedTypes
from app.background import BackgroundWork
from app.injection import Wire
from app.observability import metrics
from app.pipeline.envelopes import Reading
from app.reconcile.casework import Casework
from app.reconcile.run import show_latest
from app.settings import Settings

log = logging.getLogger(__name__)


async def database_gauges(*, settings: Settings, budget_rows: Callable[[], int], clock: DatabaseClock,
                          store: MySqlStore, watch: Watch, idem_partitions: Partitions,
                          recovery_windows: RecoveryWindows) -> None:
    """The thresholds, the backlog, the dead letters, t_idem against its budget and its months ahead, an open
    recovery window; the database's clock read again."""
    metrics.STUCK_THRESHOLD.set(settings.operations.stuck_pending_seconds)
    metrics.COMPENSATION_SLA.set(settings.compensation.sla_seconds)
    budget = budget_rows()
    metrics.IDEM_BUDGET.set(budget)
    try:
        await clock.sync(store)
        g = await watch.gauges(group=settings.app_id, stuck_after_seconds=settings.operations.stuck_pending_seconds,
                               attempt_cap=settings.operations.idem_max_attempts)
        parts = await idem_partitions.list()
        recovering = await recovery_windows.open_age()
    except Exception as exc:
        log.warning("the database gauges could not be refreshed: %r", exc)
        return
    for labels in list(metrics.STUCK_ROWS._metrics):      # steps no longer stuck go back to 0
        if labels[0] not in g.stuck_by_step:
            metrics.STUCK_ROWS.labels(*labels).set(0)
    for step, count in g.stuck_by_step.items():
        metrics.STUCK_ROWS.labels(step).set(count)
    metrics.OVER_CAP_ROWS.set(g.over_cap)
    metrics.RECOVERY_WINDOW_OPEN.set(0 if recovering is None else 1)
    for status, count in g.compensation_by_status.items():
        metrics.COMPENSATION_ROWS.labels(status).set(count)
    metrics.COMPENSATION_OLDEST_OPEN.set(g.oldest_open_seconds)
    metrics.COMPENSATION_OLDEST_MANUAL.set(g.oldest_manual_seconds)
    metrics.IDEM_ROWS.set(g.idem_rows)
    metrics.IDEM_WATERMARK.set(g.idem_rows / budget)
    next_month = month_start(clock.today(), 1)
    metrics.IDEM_PARTITIONS_AHEAD.set(sum(1 for p in parts if p.name != CATCH_ALL and p.below is not None
                                          and p.below > next_month))


async def reconcile_gauges(*, reconcile_reads: ReconcileReads, reconcile_cases: Casework) -> None:
    """The latest completed reconcile, and the cases open for a person."""
    try:
        latest = await reconcile_reads.latest_completed()
    except Exception as exc:
        log.warning("the latest reconcile could not be read: %r", exc)
    else:
        if latest is not None:
            show_latest(*latest)
    try:
        await reconcile_cases.refresh_gauge()
    except Exception as exc:
        log.warning("the reconcile's open cases could not be counted: %r", exc)


async def skipped_type_gauges(*, settings: Settings, skipped_types: SkippedTypes, reading: Reading) -> None:
    """What this worker skipped since the last refresh, added to the group's count; the types counted."""
    taken = metrics.SKIPPED_TYPES.take()
    try:
        await skipped_types.add(taken)
    except Exception as exc:
        metrics.SKIPPED_TYPES.give_back(taken)
        log.warning("the types skipped could not be recorded: %r", exc)
    try:
        total, new = await skipped_types.census(declared=reading.foreign,
                                                new_within_seconds=settings.events.new_skipped_type_seconds)
    except Exception as exc:
        log.warning("the types skipped could not be counted: %r", exc)
    else:
        metrics.SKIPPED_TYPE_COUNT.set(total)
        metrics.SKIPPED_TYPES_NEW.set(new)


async def lag_gauges(*, settings: Settings, lag: GroupLag) -> None:
    """The consumer group's lag per partition, from the broker."""
    try:
        found = await lag.read()
    except Exception as exc:
        log.warning("the consumer group's lag could not be read: %r", exc)
    else:
        for partition, value in found.items():
            metrics.CONSUMER_LAG.labels(settings.kafka.topic, str(partition)).set(value)


# In this order, each failing on its own: the database's parts, then the broker's.
PARTS = (database_gauges, reconcile_gauges, skipped_type_gauges, lag_gauges)


async def refresh_gauges(*, background: BackgroundWork, parts: Sequence[Callable[[], Awaitable[None]]]) -> None:
    if background.stopping:                # the worker is stopping: nothing to refresh for
        return
    try:
        for part in parts:
            await part()
    except Exception:
        log.exception("the gauges could not be refreshed this tick")


def register(app: faust.App, settings: Settings, wire: Wire):
    # The thresholds the alert rules compare with are known before the first refresh.
    metrics.STUCK_THRESHOLD.set(settings.operations.stuck_pending_seconds)
    metrics.COMPENSATION_SLA.set(settings.compensation.sla_seconds)
    timer = app.timer(interval=settings.operations.metrics_refresh_seconds, name="refresh_gauges")
    return timer(wire(refresh_gauges, parts=[wire(part) for part in PARTS]))
