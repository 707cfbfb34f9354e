"""Stopping a worker without acknowledging what it holds.

``Stream.take_events()`` acks its whole batch in a ``finally`` when the loop body
raises or the agent is cancelled; ``app.crash()`` and ``sys.exit`` both end up there.
So when an agent meets something it cannot finish (the database gone past its budget,
a dead letter the broker did not take), the process leaves with ``os._exit``: no
``finally``, no ack, no commit. A supervisor restarts it, and Kafka delivers again.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

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
EXIT_CONFIG = 78       # EX_CONFIG: the settings cannot work (a wrong password, an unknown CA, ...): change them


def stop_at_startup(code: int, message: str) -> None:
    """End a process that has not begun to work: one log line that says why, then exit ``code``."""
    log.critical("%s (exit %d)", message, code)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    os._exit(code)


def bound_the_stop(seconds: float) -> None:
    """After SIGTERM, give the worker ``seconds`` to stop; then leave with ``os._exit(70)``.

    A clean stop waits for the batch in flight to finish, then commits and leaves the group;
    with the broker gone or hung, the commit and the consumer's and producer's stops wait on
    requests that nobody answers (measured: minutes), and mode's ``ServiceThread.stop`` joins the
    consumer's thread with no timeout, on the event loop. A SIGTERM during start-up was seen to
    hang the same way: the consumer thread's stop timed out, the event loop closed, and the
    process waited for ever on that (non-daemon) thread. Leaving after the bound is safe: Faust
    commits only acknowledged offsets, and a batch is acknowledged only once it finished (an agent
    that is cancelled before that stops through :func:`stop_without_ack` first). So whatever was
    not committed is delivered again, to this worker's successor or another; nothing is skipped.

    The timer is a thread, so it runs even when the event loop is blocked. It is armed from the
    Python-level SIGTERM handler, which wraps the one the event loop installed (asyncio and
    uvloop both call it besides reading their wake-up descriptor); the wrap is put in place right
    after the worker installs its signal handlers (``Worker.install_signal_handlers``, replaced by
    :func:`arming_the_stop_bound` through ``app.adapters.kafka.upstream``), before anything starts.
    This call only sets the bound, before the worker starts.
    """
    _stop_bound.clear()
    _stop_bound.append(seconds)


_stop_bound: list[float] = []     # the bound :func:`bound_the_stop` set, if any


def arming_the_stop_bound(install: Callable) -> Callable:
    """``Worker.install_signal_handlers`` (mode's, ``install``) followed by the wrap of the SIGTERM
    handler that arms the bound, when :func:`bound_the_stop` set one (put in place by
    ``app.adapters.kafka.upstream``)."""
    @functools.wraps(install)
    def install_signal_handlers(worker) -> None:
        install(worker)
        if _stop_bound:
            signal.signal(signal.SIGTERM, _arming(signal.getsignal(signal.SIGTERM), _stop_bound[0]))
    return install_signal_handlers


def _arming(previous, seconds: float):
    """A SIGTERM handler that starts the bound's timer, then calls ``previous``."""
    def leave_after_the_bound() -> None:
        time.sleep(seconds)
        log.critical("the worker did not stop within %.0f s of SIGTERM (STOP_TIMEOUT_SECONDS): leaving without "
                     "committing anything more (exit %d)", seconds, EXIT_NOT_ACKED)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(EXIT_NOT_ACKED)

    armed: list[threading.Thread] = []

    def on_sigterm(signum, frame) -> None:
        if not armed:
            armed.append(threading.Thread(target=leave_after_the_bound, name="stop-bound", daemon=True))
            armed[0].start()
        if callable(previous):
            previous(signum, frame)
    return on_sigterm
