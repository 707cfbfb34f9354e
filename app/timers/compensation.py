"""Runs the dead letters whose retry is due, at most ``COMPENSATOR_BATCH_SIZE`` per tick.

Every worker ticks; one at a time does the work, the one holding the database lease
``compensation-due:<consumer group>`` (``on_leader`` is not mutual exclusion). Each row is
also claimed on its own, so even two holders (a lease that ran out mid-tick) never work
one row twice.
"""

from __future__ import annotations

import logging

import faust

from app import metrics
from app.adapters.mysql.leases import lease_name
from app.bootstrap import Runtime
from app.settings import Settings

log = logging.getLogger(__name__)
LEASE = "compensation-due"


def register(app: faust.App, runtime: Runtime, settings: Settings):
    @app.timer(interval=settings.compensation_timer_seconds, name="compensation_due")
    async def run_due_compensations() -> None:
        rt = await runtime.start()
        owner = rt.compensator.processor.owner
        try:
            if not await rt.leases.acquire(lease_name(LEASE, settings.app_id), owner, 2 * settings.compensation_timer_seconds):
                return
            ran = await rt.compensator.run_due(settings.compensator_batch_size, rt.guard())
        except Exception:
            # A timer that raises is restarted by Faust; say why, and try again next tick.
            log.exception("the due dead letters could not be run this tick")
            return
        if ran:
            metrics.COMPENSATIONS.labels("due_run").inc(ran)
            log.info("ran %d due dead letters", ran)

    return run_due_compensations
