"""Partition maintenance of ``t_idem``: months added ahead, months past the retention dropped.

Every ``PARTITION_TIMER_SECONDS`` every worker ticks; the one holding the database lease
``partition-maintenance`` does the work (``app.adapters.mysql.partitions`` says how an
ALTER is kept from parking the pipeline behind a metadata lock). Adding comes first, so
the current month always has its partition before anything is dropped. A change that
could not get its lock is tried again at the next tick; nothing else waits for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import date

import faust

from app.adapters.mysql.leases import MySqlLeases
from app.adapters.mysql.partitions import LockNotGranted, Partitions, month_name, plan
from app.background import BackgroundWork
from app.injection import Wire
from app.observability import metrics
from app.pipeline.retention import Retention
from app.settings import Settings

log = logging.getLogger(__name__)
LEASE = "partition-maintenance"
STARTUP_DELAY_SECONDS = 5.0


@dataclass
class MaintenanceReport:
    added: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    dropped_rows: int = 0
    failed: list[str] = field(default_factory=list)      # "add"/"drop": why


async def maintain(partitions: Partitions, *, retention: Retention, ahead: int,
                   today: date | None = None) -> MaintenanceReport:
    report = MaintenanceReport()
    if today is not None:               # one date for both: what to add and what may go
        retention = Retention(retention.days, today=lambda: today, ahead=retention.ahead)
    today = retention.today()
    parts = await partitions.list()
    changes = plan(parts, today=today, ahead=ahead, drop_before=retention.drop_before())
    rows = {p.name: p.rows for p in parts}
    for action, items, run in (("add", changes.add, partitions.add), ("drop", changes.drop, partitions.drop)):
        if not items:
            continue
        names = [month_name(m) for m in items] if action == "add" else items
        try:
            await run(items)
        except LockNotGranted as exc:
            metrics.PARTITION_CHANGES.labels(action, "lock_timeout").inc()
            report.failed.append(f"{action}: {exc}")
            log.warning("t_idem partitions: %s %s postponed: %s", action, ", ".join(names), exc)
            continue
        except Exception as exc:
            metrics.PARTITION_CHANGES.labels(action, "error").inc()
            report.failed.append(f"{action}: {exc!r}")
            log.exception("t_idem partitions: %s %s failed", action, ", ".join(names))
            continue
        metrics.PARTITION_CHANGES.labels(action, "ok").inc()
        if action == "add":
            report.added = names
        else:
            report.dropped = names
            report.dropped_rows = sum(rows.get(name, 0) for name in names)
        log.info("t_idem partitions: %s %s%s", "added" if action == "add" else "dropped", ", ".join(names),
                 f" (about {report.dropped_rows} rows, older than {retention.days} days)" if action == "drop" else "")
    return report


async def maintain_partitions(*, settings: Settings, background: BackgroundWork, leases: MySqlLeases, owner: str,
                              idem_partitions: Partitions, retention: Retention) -> None:
    if background.stopping:
        return
    try:
        if not await leases.acquire(LEASE, owner, 2 * settings.operations.partition_timer_seconds):
            return
        await maintain(idem_partitions, retention=retention, ahead=settings.operations.partitions_ahead)
    except Exception:
        log.exception("t_idem partition maintenance could not run this tick")


async def maintain_partitions_at_start(*, tick: Callable[[], Awaitable[None]]) -> None:
    # A timer's first tick comes one interval after the start; the months ahead should not wait.
    await asyncio.sleep(STARTUP_DELAY_SECONDS)
    await tick()


def register(app: faust.App, settings: Settings, wire: Wire):
    tick = wire(maintain_partitions)
    app.task(wire(maintain_partitions_at_start, tick=tick))
    return app.timer(interval=settings.operations.partition_timer_seconds, name="partition_maintenance")(tick)
