"""Compensation: the dead-letter agent, the drain of due dead letters, their backoff, attempts and SLA.

``COMPENSATION_DRAIN_BATCH_SIZE`` is used capped by ``BATCH_SIZE``: that cap spans two groups, so
it is ``Settings.drain_batch_size`` on the root, not here.
"""

from __future__ import annotations

from app.settings._base import Group, setting


class CompensationSettings(Group):
    TITLE = "Compensation"

    enabled: bool = setting("COMPENSATOR_ENABLED", True,
        description='Run the dead-letter agent and the drain of due dead letters in this worker.')

    batch_size: int = setting("COMPENSATOR_BATCH_SIZE", 10, ge=1, le=10,
        description='Dead letters per batch of the dead-letter agent (at most 10).')

    drain_batch_size: int = setting("COMPENSATION_DRAIN_BATCH_SIZE", 100, ge=1,
        description='Due dead letters a worker claims and runs through the pipeline at once while it drains (at most '
                    '`BATCH_SIZE` is used).')

    within_seconds: float = setting("COMPENSATOR_WITHIN_SECONDS", 1.0, gt=0,
        description='How long a compensator batch waits to fill up.')

    backoff_seconds: float = setting("COMPENSATION_BACKOFF_SECONDS", 60.0, gt=0,
        description='The wait after a failed redrive, doubling each time ...')

    backoff_max_seconds: float = setting("COMPENSATION_BACKOFF_MAX_SECONDS", 3600.0, gt=0,
        description='... up to this.')

    max_attempts: int = setting("COMPENSATION_MAX_ATTEMPTS", 5, ge=1,
        description='Redrives before a dead letter goes to a person (`manual`).')

    timer_seconds: float = setting("COMPENSATION_TIMER_SECONDS", 30.0, gt=0,
        description='The longest every worker sleeps between looks for due dead letters when it found none: it sleeps'
                    " until the next row comes due (a retry's time, the end of a dead claim) or a dead letter "
                    'arrives, whichever is first; while some are due it drains them without a pause.')

    sla_seconds: float = setting("COMPENSATION_SLA_SECONDS", 1800.0, gt=0,
        description='A dead letter open (or retrying) longer than this breaches its SLA: the sweep alerts.')

