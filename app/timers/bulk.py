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

import faust

from app.bootstrap import Runtime, RuntimeStopping
from app.observability import metrics
from app.pipeline.errors import Fatal
from app.settings import Settings

log = logging.getLogger(__name__)


def register(app: faust.App, runtime: Runtime, settings: Settings):
    @app.task
    async def run_bulk_jobs() -> None:
        rt = runtime.started()
        while not rt.stopping:
            wait = None
            try:
                async with rt.working():
                    wait = await rt.bulk.step(rt.guard())
            except RuntimeStopping:
                return
            except (Fatal, Exception) as exc:
                log.warning("a bulk job's chunk could not be worked: %r", exc, exc_info=not isinstance(exc, Fatal))
            finally:
                # An autoscaler holds the workers while one runs a job (docs/deploying-kubernetes.md).
                metrics.BULK_JOB_RUNNING.set(0 if rt.bulk.held is None or rt.stopping else 1)
            await asyncio.sleep(settings.bulk.timer_seconds if wait is None else wait)

    return run_bulk_jobs
