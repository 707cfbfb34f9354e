"""Stopping a worker without acknowledging what it holds.

``Stream.take_events()`` acks its whole batch in a ``finally`` when the loop body
raises or the agent is cancelled; ``app.crash()`` and ``sys.exit`` both end up there.
So when an agent meets something it cannot finish (the database gone past its budget,
a dead letter the broker did not take), the process leaves with ``os._exit``: no
``finally``, no ack, no commit. A supervisor restarts it, and Kafka delivers again.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger(__name__)
EXIT_NOT_ACKED = 70   # EX_SOFTWARE: stopped on purpose, the batch in flight was not committed


def stop_without_ack(exc: BaseException) -> None:
    """Stop the process now: no ``finally``, no ack, no commit."""
    log.critical("stopping the worker without committing the batch in flight (exit %d): %r",
                 EXIT_NOT_ACKED, exc, exc_info=exc)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_NOT_ACKED)


EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: a service we need did not answer within its bound
EXIT_CONFIG = 78       # EX_CONFIG: the settings cannot work (a wrong password, an unknown CA, ...)


def stop_at_startup(code: int, message: str) -> None:
    """End a process that has not begun to work: one log line that says why, then exit ``code``."""
    log.critical("%s (exit %d)", message, code)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    os._exit(code)
