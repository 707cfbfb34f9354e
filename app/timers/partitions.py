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
from dataclasses import dataclass, field
from datetime import date

import faust

from app.adapters.mysql.partitions import LockNotGranted, Partitions, month_name, plan
from app.bootstrap import Runtime
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


def register(app: faust.App, runtime: Runtime, settings: Settings):
    async def tick() -> None:
        if runtime.stopping:
            return
        try:
            rt = runtime.started()
            if not await rt.leases.acquire(LEASE, rt.owner, 2 * settings.operations.partition_timer_seconds):
                return
            await maintain(rt.partitions, retention=rt.retention, ahead=settings.operations.partitions_ahead)
        except Exception:
            log.exception("t_idem partition maintenance could not run this tick")

    @app.task
    async def maintain_partitions_at_start() -> None:
        # A timer's first tick comes one interval after the start; the months ahead should not wait.
        await asyncio.sleep(STARTUP_DELAY_SECONDS)
        await tick()

    @app.timer(interval=settings.operations.partition_timer_seconds, name="partition_maintenance")
    async def maintain_partitions() -> None:
        await tick()

    return maintain_partitions
