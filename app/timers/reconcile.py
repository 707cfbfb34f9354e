"""The continuous reconcile: every ``RECONCILE_EVERY_SECONDS`` one worker reconciles the trailing
window of the input (``RECONCILE_WINDOW_SECONDS`` of records, ending ``RECONCILE_LAG_SECONDS``
ago: by default every 10 minutes, the hour that ended 10 minutes ago), so every record is judged
several times, the last time long after it should have reached its end.

Runs older than ``RECONCILE_KEEP_DAYS`` are deleted after each run. One worker at a time runs it: the holder of the database lease ``reconcile:<consumer group>``,
taken for twice the interval (at least two minutes, longer than a run) and renewed at each of its ticks, so the same worker keeps it while
it lives and another takes over after it died. A run that fails is logged and counted
(``order_reconcile_runs_total{status="failed"}``), and the next tick tries again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import faust

from app.adapters.mysql.leases import MySqlLeases, lease_name
from app.adapters.mysql.reconcile import ReconcileReads
from app.background import BackgroundWork
from app.injection import Wire
from app.reconcile.run import Reconciler
from app.settings import Settings

log = logging.getLogger(__name__)
LEASE = "reconcile"
LEASE_FLOOR_SECONDS = 120.0     # a run may outlast a short interval; the lease outlasts the run


def window(now: datetime, *, window_seconds: float, lag_seconds: float) -> tuple[datetime, datetime]:
    """The range a tick at ``now`` reconciles."""
    end = now - timedelta(seconds=lag_seconds)
    return end - timedelta(seconds=window_seconds), end


async def reconcile_window(*, settings: Settings, background: BackgroundWork, leases: MySqlLeases, owner: str,
                           reconciler: Callable[[], Reconciler], reconcile_reads: ReconcileReads) -> None:
    if background.stopping:
        return
    try:
        if not await leases.acquire(lease_name(LEASE, settings.app_id), owner,
                                    max(2 * settings.reconcile.every_seconds, LEASE_FLOOR_SECONDS)):
            return
        since, until = window(datetime.now(UTC), window_seconds=settings.reconcile.window_seconds,
                              lag_seconds=settings.reconcile.lag_seconds)
        report = await reconciler().run(since, until, started_by=f"timer:{settings.worker_id}")
        await reconcile_reads.forget(settings.reconcile.keep_days)
    except Exception:
        log.exception("the reconcile could not run this tick")
        return
    line = (f"reconcile {since.isoformat()} .. {until.isoformat()} (run {report.run_id}): "
            f"{report.tally.records:,} records in {report.seconds:.1f} s, {report.findings:,} findings")
    if report.status == "clean":
        log.info("%s", line)
    elif report.status == "findings":
        log.error("%s: %s (the console's Reconcile page has their evidence)", line, report.tally.by_kind())
    else:
        log.error("%s; failed: %s", line, report.error)


def register(app: faust.App, settings: Settings, wire: Wire):
    every = settings.reconcile.every_seconds
    if not every:
        return None
    return app.timer(interval=every, name="reconcile")(wire(reconcile_window))
