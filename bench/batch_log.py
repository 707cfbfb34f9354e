"""Every batch a worker finished, read from its log, and the batch times of a window of time.

With ``SLOW_BATCH_SECONDS`` below any batch's time a worker logs each batch it finishes::

    [2026-12-07 19:02:20,292] [16635] [WARNING] slow batch: 160 records in 14331 ms (decode 1 ms, work 14329 ms)

The line's time is when the batch finished (the worker's clock, this machine's local time), so a
batch ran from that time minus its duration until then. A batch's time holds its T1, its calls and
its T3: a statement held up behind a metadata lock shows there whole, to the millisecond, where the
``order_batch_seconds`` histogram would give only the bucket.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] \[\d+\] \[\w+\] slow batch: (\d+) records in (\d+) ms")


@dataclass(frozen=True)
class Batch:
    end: float          # epoch seconds
    seconds: float
    records: int

    @property
    def start(self) -> float:
        return self.end - self.seconds


def batches(log: Path | str) -> list[Batch]:
    """The batches of one worker's log, in the order they finished."""
    found = []
    for line in Path(log).read_text(errors="replace").splitlines():
        match = _LINE.match(line)
        if match:
            at = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            found.append(Batch(at, int(match.group(3)) / 1000, int(match.group(2))))
    return found


def in_window(all_batches: Iterable[Batch], since: float, until: float) -> list[Batch]:
    """The batches that ran at any moment between ``since`` and ``until``."""
    return [b for b in all_batches if b.end >= since and b.start <= until]


def stats(window: list[Batch], since: float, until: float) -> dict:
    """Batches, records per second over the window, and p50, p99 and the longest batch, in ms."""
    times = sorted(b.seconds for b in window)
    span = max(until - since, 1e-9)

    def rank(q: float) -> float | None:
        return round(times[min(len(times) - 1, int(q * len(times)))] * 1000) if times else None

    return {"seconds": round(until - since, 2), "batches": len(window),
            "records_per_second": round(sum(b.records for b in window) / span, 1),
            "p50_ms": rank(0.50), "p99_ms": rank(0.99), "max_ms": rank(1.0)}
