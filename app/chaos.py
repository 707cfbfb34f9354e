"""Fault injection for the chaos tests: die at a named cut point.

Off unless ``CHAOS_KILL_AT`` is set. SIGKILL, not an exception: nothing gets
a chance to clean up, commit or ack, exactly like a power cut or the OOM killer.
The processor tells its observer of each cut point it passes (``app.pipeline.processor.run``);
:class:`CutPoints` is the observer that kills there.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

from app.pipeline.observer import NoObserver

CUTS = ("before_a", "a_b", "looked_up", "b_c", "after_c")
log = logging.getLogger(__name__)


class CutPoints(NoObserver):
    def __init__(self, kill_at: str) -> None:
        if kill_at not in CUTS:
            raise ValueError(f"CHAOS_KILL_AT must be one of {', '.join(CUTS)}, not {kill_at!r}")
        self.kill_at = kill_at

    def cut(self, point: str) -> None:
        if point == self.kill_at:
            log.critical("CHAOS_KILL_AT=%s reached: SIGKILL", point)
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)


def cut_points(kill_at: str | None) -> list[CutPoints]:
    """The observer that kills at ``kill_at``, if it is set."""
    return [CutPoints(kill_at)] if kill_at else []
