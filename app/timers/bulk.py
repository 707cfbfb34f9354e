"""Runs the bulk jobs of the dead-letter queue (``app.compensation.bulk``), in every worker.

Each round takes a running job whose lease is free or this worker's, works one chunk of it
(renewing the lease while the chunk runs, ``app.compensation.bulk_lease``) and renews the lease
with its results; between chunks it waits as the job's rate allows (``BULK_RATE_PER_SECOND``).
With no job to run it looks again every ``BULK_TIMER_SECONDS``. A worker that stops (SIGTERM)
finishes the chunk in flight (``Runtime.stop`` waits for it, then gives the lease up) and gives its job's lease up, so
another worker takes the job over at once; one that is killed lets the lease run out
(``BULK_LEASE_SECONDS``) and the next worker to look takes it then.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import faust

from app.background import BackgroundWork, RuntimeStopping
from app.compensation.bulk import BulkRunner
from app.injection import Wire
from app.observability import metrics
from app.pipeline.errors import Fatal
from app.pipeline.outage import OutageGuard
from app.settings import Settings

log = logging.getLogger(__name__)


async def run_bulk_jobs(*, settings: Settings, bulk: BulkRunner, background: BackgroundWork,
                        guard: Callable[[], OutageGuard]) -> None:
    while not background.stopping:
        wait = None
        try:
            async with background.working():
                wait = await bulk.step(guard())
        except RuntimeStopping:
            return
        except (Fatal, Exception) as exc:
            log.warning("a bulk job's chunk could not be worked: %r", exc, exc_info=not isinstance(exc, Fatal))
        finally:
            # An autoscaler holds the workers while one runs a job (docs/deploying-kubernetes.md).
            metrics.BULK_JOB_RUNNING.set(0 if bulk.held is None or background.stopping else 1)
        await asyncio.sleep(settings.bulk.timer_seconds if wait is None else wait)


def register(app: faust.App, settings: Settings, wire: Wire):
    return app.task(wire(run_bulk_jobs))
