"""The time the pipeline goes by: a monotonic clock and a way to wait on it, replaced together where a
test runs on virtual time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Clock:
    now: Callable[[], float] = time.monotonic                      # seconds, only ever compared
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep


REAL_TIME = Clock()
