"""A bulk job's lease, kept while a chunk runs.

The job's lease (``BULK_LEASE_SECONDS``) says which worker runs the job. A chunk may take far
longer than that: its calls alone may take up to ``LEASE_SECONDS``, and a database outage is
waited out inside it. Renewed only between chunks, the lease would run out under a chunk in
flight; another worker would take the job over and work the same rows while the first still
does (the ledger claims keep the effects single, but the two runners race for the job and
its counts). So while a chunk runs, its :class:`Heartbeat` renews the lease, fenced on the
owner::

    lease      |--------- BULK_LEASE_SECONDS ---------|
    beats      |--- 1/3 ---|--- 1/3 ---|--- 1/3 ---|--- ...     each: until now + BULK_LEASE_SECONDS
    chunk      |=====================================================|  record: renewed with its results
    stopped                                                          ^ the chunk's end (or the worker's)

A beat that cannot reach the database leaves two more before the lease runs out, and the
next comes sooner. A beat that finds the job no longer this owner's (a person paused or
aborted it, or another worker took it over after the beats failed for a whole lease) marks
the lease lost: the chunk begins no other row (:meth:`Heartbeat.held`), and once what it did
is recorded the runner lets the job go.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

RETRY_SECONDS = 1.0          # after a beat that failed: the database may be back by then


class Heartbeat:
    """Renews a job's lease every third of it while the ``async with`` block runs."""

    def __init__(self, renew: Callable[[], Awaitable[bool]], *, lease_seconds: float, job_id: int) -> None:
        self.renew = renew
        self.interval = lease_seconds / 3
        self.job_id = job_id
        self.lost = False
        self._task: asyncio.Task | None = None

    def held(self) -> bool:
        """Whether the job is still this runner's, as far as the last beat knows."""
        return not self.lost

    async def __aenter__(self) -> Heartbeat:
        self._task = asyncio.create_task(self._beat(), name=f"bulk-job-{self.job_id}-heartbeat")
        return self

    async def __aexit__(self, *exc) -> None:
        # The beats end with the chunk, whether it ended, raised or was cancelled (a worker that
        # stops): a lease renewed after the chunk would keep a dead job from the other workers.
        task = self._task
        assert task is not None         # __aenter__ started it
        task.cancel()
        await asyncio.wait([task])

    async def _beat(self) -> None:
        wait = self.interval
        while True:
            await asyncio.sleep(wait)
            try:
                kept = await self.renew()
            except Exception as exc:
                log.warning("bulk job %s: its lease could not be renewed (%r); trying again", self.job_id, exc)
                wait = min(self.interval, RETRY_SECONDS)
                continue
            if not kept:
                self.lost = True
                log.warning("bulk job %s: no longer this worker's while a chunk ran (paused, aborted or taken "
                            "over): the chunk begins no other row", self.job_id)
                return
            wait = self.interval
