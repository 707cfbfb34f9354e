"""Fault injection for the chaos tests: die at a named cut point.

Off unless ``CHAOS_KILL_AT`` is set. SIGKILL, not an exception: nothing gets
a chance to clean up, commit or ack, exactly like a power cut or the OOM killer.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable

CUTS = ("before_a", "a_b", "looked_up", "b_c", "after_c")
log = logging.getLogger(__name__)


def cut_hook(kill_at: str | None) -> Callable[[str], None]:
    if not kill_at:
        return lambda cut: None
    if kill_at not in CUTS:
        raise ValueError(f"CHAOS_KILL_AT must be one of {', '.join(CUTS)}, not {kill_at!r}")

    def hook(cut: str) -> None:
        if cut == kill_at:
            log.critical("CHAOS_KILL_AT=%s reached: SIGKILL", cut)
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    return hook
