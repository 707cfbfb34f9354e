"""Drains the dead letters whose retry is due, as fast as the services answer.

Every worker drains: each round claims up to ``COMPENSATION_DRAIN_BATCH_SIZE`` (at most
``BATCH_SIZE``) due rows of
its consumer group in one statement that skips rows another worker is claiming (``SKIP
LOCKED``), runs their events through the pipeline as one batch and settles them; rounds
follow each other while rows are due, and a round is over within a lease of the calls it
makes. When nothing is due, the worker sleeps until the next row comes due (a retry's time, the
end of a dead claim), or a new dead letter arrives, at most ``COMPENSATION_TIMER_SECONDS``: a
dead letter that may be retried in 8 s is retried then, not at the next look.
(A database lease, one worker at a time, is not needed: every row is claimed on its own.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import faust

from app.background import BackgroundWork, RuntimeStopping
from app.compensation.compensator import Compensator
from app.injection import Wire
from app.observability import metrics
from app.pipeline.errors import Fatal
from app.pipeline.outage import OutageGuard
from app.settings import Settings

log = logging.getLogger(__name__)


async def drain_due_compensations(*, settings: Settings, compensator: Compensator, background: BackgroundWork,
                                  guard: Callable[[], OutageGuard]) -> None:
    while not background.stopping:
        ran = 0
        try:
            # A worker that is stopping starts no new round, and closes nothing under the
            # round in flight (Runtime.stop waits for it).
            async with background.working():
                ran = await compensator.drain(guard(), seconds=settings.compensation.timer_seconds,
                                              batch_size=settings.drain_batch_size)
        except RuntimeStopping:
            return
        except (Fatal, Exception) as exc:
            # The agents stop the worker when the database stays away; here, say why and look again.
            log.warning("the due dead letters could not be drained: %r", exc, exc_info=not isinstance(exc, Fatal))
        if ran:
            metrics.COMPENSATIONS.labels("due_run").inc(ran)
            log.info("ran %d due dead letters", ran)
        else:
            await compensator.sleep_until_due(guard(), settings.compensation.timer_seconds)


def register(app: faust.App, settings: Settings, wire: Wire):
    return app.task(wire(drain_due_compensations))
