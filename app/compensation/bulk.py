"""Bulk actions on the dead-letter queue: a job retries, resolves or discards many ledger rows.

Safe by construction:

* **Exactly the rows that were counted.** A person asks for a dry run (the count and a
  sample), then starts the job with the count they saw (``expected_count``). The job's rows
  are written down when it is made (``t_bulk_item``, one row per ledger row, in the same
  transaction that counts them); a count that moved beyond the tolerance (:func:`tolerated`)
  since the dry run refuses the job, with the count now. A job never touches a row that came
  later, and never more than ``BULK_MAX_ROWS``.
* **Nothing twice.** A row is retried through the compensator's own redrive (the same
  ``t_idem`` keys and tokens), a chunk at a time as one pipeline batch. A row already settled
  is left alone (``unchanged``); a row another claimant holds is tried again later.
* **One runner at a time, any worker.** The job row holds a lease (an owner and an expiry)
  renewed while a chunk runs (``app.compensation.bulk_lease``) and with every chunk's results; a
  worker that dies lets it run out and another takes the job over where the items say it was. A chunk the dead worker had claimed is claimed again once
  its ledger claims run out, and finds its rows settled or its steps done.

This module is the pure part: the job's statuses and transitions, the tolerance, the
progress (rate and ETA), and the runner that works one chunk; the storage is a port.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Protocol

from app.compensation.bulk_lease import Heartbeat

log = logging.getLogger(__name__)


class JobStatus(IntEnum):
    RUNNING = 1
    PAUSED = 2
    DONE = 3
    ABORTED = 4


ACTIONS = ("retry", "resolve", "discard")
FINISHED: frozenset[JobStatus] = frozenset({JobStatus.DONE, JobStatus.ABORTED})

# What a person may do to a job: (from which statuses, to which status). Doing it twice
# changes nothing the second time; from anywhere else it is refused.
TRANSITIONS: dict[str, tuple[frozenset[JobStatus], JobStatus]] = {
    "pause": (frozenset({JobStatus.RUNNING}), JobStatus.PAUSED),
    "resume": (frozenset({JobStatus.PAUSED}), JobStatus.RUNNING),
    "abort": (frozenset({JobStatus.RUNNING, JobStatus.PAUSED}), JobStatus.ABORTED),
}


class TransitionRefused(ValueError):
    """A person's pause, resume or abort from a status it cannot start from."""


def transition(status: JobStatus, command: str) -> tuple[JobStatus, bool]:
    """Where ``command`` takes a job that is ``status``, and whether that is a change.
    :class:`TransitionRefused` from a status it cannot start from (a finished job stays so)."""
    if command not in TRANSITIONS:
        raise TransitionRefused(f"no command {command!r}: pause, resume or abort")
    allowed, to = TRANSITIONS[command]
    if status is to:
        return status, False
    if status not in allowed:
        raise TransitionRefused(f"cannot {command} a job that is {status.name.lower()} (only "
                                f"{', '.join(s.name.lower() for s in sorted(allowed))})")
    return to, True


def tolerance(expected: int, percent: float) -> int:
    """How far the count may move between the dry run and the start: ``percent`` of the
    count seen, rounded down (so a small selection must match exactly)."""
    return int(expected * percent / 100)


def tolerated(expected: int, actual: int, percent: float) -> bool:
    """Whether a job over ``actual`` rows may start when the person saw ``expected``."""
    return abs(actual - expected) <= tolerance(expected, percent)


# -- what became of one row -----------------------------------------------------------

CHANGED, UNCHANGED, FAILED = "changed", "unchanged", "failed"


@dataclass(frozen=True)
class ItemOutcome:
    """One ledger row of a job, worked: ``changed`` (the job settled it as asked),
    ``unchanged`` (nothing to do: already settled), ``failed`` (refused, or the retry failed
    again; ``detail`` says why). ``busy``: someone else holds the row now; try it later."""

    row_id: int
    outcome: str | None
    detail: str | None = None

    @property
    def busy(self) -> bool:
        return self.outcome is None


def busy(row_id: int, detail: str) -> ItemOutcome:
    return ItemOutcome(row_id, None, detail)


PENDING, DONE_ITEM = 0, 1          # t_bulk_item.state


def tally(outcomes: Sequence[ItemOutcome], seen: dict[int, tuple[int, str | None]]) -> tuple[list[ItemOutcome],
                                                                                               Counter]:
    """Which of a chunk's finished ``outcomes`` to write, and what they add to the job's counts
    (``done``, and per outcome), given each item as it is now (``seen``: row id -> its state
    and outcome). A pending item moves to done and counts once. A done item is written again
    only to become ``changed``: a row is settled by one claim, once, so ``changed`` is reported
    once; but a runner that lost the job while that claim's chunk was in flight may have
    recorded the row first as it found it (settled: ``unchanged``; its own retry failed, the
    other's then succeeded: ``failed``)."""
    moving: list[ItemOutcome] = []
    counts: Counter[str | None] = Counter()
    for o in outcomes:
        state, before = seen.get(o.row_id, (None, None))
        if state == PENDING:
            counts["done"] += 1
        elif state == DONE_ITEM and o.outcome == CHANGED and before != CHANGED:
            counts[before] -= 1
        else:
            continue
        moving.append(o)
        counts[o.outcome] += 1
    return moving, counts


# -- progress --------------------------------------------------------------------------

@dataclass(frozen=True)
class Progress:
    total: int
    done: int
    changed: int
    failed: int
    rate: float | None          # rows per second, lately
    status: JobStatus

    @property
    def remaining(self) -> int:
        return max(self.total - self.done, 0)

    @property
    def eta_seconds(self) -> float | None:
        """Seconds until done at the recent rate; 0 when nothing remains; unknown when it does
        not run or no rate is known yet."""
        if self.remaining == 0:
            return 0.0
        if self.status is not JobStatus.RUNNING or not self.rate:
            return None
        return self.remaining / self.rate

    def as_dict(self) -> dict:
        eta = self.eta_seconds
        return {"total": self.total, "done": self.done, "changed": self.changed, "failed": self.failed,
                "unchanged": self.done - self.changed - self.failed, "remaining": self.remaining,
                "rate_per_second": None if self.rate is None else round(self.rate, 1),
                "eta_seconds": None if eta is None else round(eta, 1)}


@dataclass
class Meter:
    """Rows per second over the last ``window`` seconds of work (a pause does not count)."""

    window: float = 30.0
    samples: deque = field(default_factory=deque)

    def add(self, rows: int, at: float) -> None:
        self.samples.append((at, rows))
        while len(self.samples) > 2 and at - self.samples[1][0] > self.window:
            self.samples.popleft()

    def rate(self) -> float | None:
        # Two chunks at least: the first alone does not include the wait the rate limit adds.
        if len(self.samples) < 3:
            return None
        span = self.samples[-1][0] - self.samples[0][0]
        rows = sum(n for _, n in list(self.samples)[1:])
        return rows / span if span > 0 else None


def pace(rows: int, rate: float, started: float, now: float) -> float:
    """How long to wait after a chunk of ``rows`` begun at ``started`` so that the job runs at
    most ``rate`` rows per second."""
    return max(rows / rate - (now - started), 0.0)


# -- the port and the runner ------------------------------------------------------------

@dataclass(frozen=True)
class Job:
    id: int
    action: str
    status: JobStatus
    actor: str
    note: str | None
    previous_owner: str | None = None     # who held its lease before this take


class Finish(Enum):
    """What a runner's attempt to finish its job found."""

    DONE = "done"              # this owner finished it
    WAITING = "waiting"        # rows still pending (busy ones wait for another's claim): not yet
    NOT_OURS = "not ours"      # paused, aborted, taken over or finished already: another's to end


class BulkJobs(Protocol):
    """The job store, as the runner needs it. Jobs are this consumer group's."""

    async def take(self, group: str, owner: str, lease_seconds: float) -> Job | None: ...
    async def pending(self, job_id: int, limit: int) -> list[int]: ...
    async def renew(self, job_id: int, owner: str, lease_seconds: float) -> bool: ...
    async def record(self, job_id: int, outcomes: Sequence[ItemOutcome], *, owner: str, lease_seconds: float,
                     retry_in: float, rate: float | None) -> bool: ...
    async def finish(self, job_id: int, owner: str) -> Finish: ...
    async def release(self, job_id: int, owner: str) -> None: ...


class BulkRunner:
    """Works the jobs of one consumer group, a chunk at a time; every worker runs one.

    ``work(job, row_ids, guard, held)`` does the job's action on a chunk of rows and says what
    became of each (the compensator's bulk methods); ``held()`` turns false once the job is no
    longer this runner's, and a row not begun by then gets no outcome: it stays pending."""

    def __init__(self, jobs: BulkJobs, work, *, group: str, owner: str, lease_seconds: float, chunk_size: int,
                 rate: float, busy_retry_seconds: float) -> None:
        self.jobs = jobs
        self.work = work
        self.group = group
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.chunk_size = chunk_size
        self.rate = rate
        self.busy_retry_seconds = busy_retry_seconds
        self.held: int | None = None          # the job whose lease this runner holds
        self._meters: dict[int, Meter] = {}

    async def step(self, guard) -> float | None:
        """One chunk of one job. The seconds to wait before the next (the rate limit), or
        None when no job needs this worker now."""
        started = time.monotonic()
        job = await guard(lambda: self.jobs.take(self.group, self.owner, self.lease_seconds))
        if job is None:
            self._let_go()
            return None
        if self.held != job.id:
            # A job (re)taken: its rate is measured afresh (a pause, or another's run, is no work of ours).
            self._meters = {}
            if job.previous_owner not in (None, self.owner):
                log.warning("bulk job %s: taken over from %s (its lease ran out)", job.id, job.previous_owner)
            else:
                log.info("bulk job %s (%s): running it", job.id, job.action)
        self.held = job.id
        ids = await guard(lambda: self.jobs.pending(job.id, self.chunk_size))
        if not ids:
            # Nothing pending: the job is done, unless rows wait for someone else's claim, or
            # the job stopped being ours since the take (a pause, an abort, a takeover).
            ending = await guard(lambda: self.jobs.finish(job.id, self.owner))
            if ending is Finish.DONE:
                log.info("bulk job %s (%s): done", job.id, job.action)
                self.held = None
                return 0.0
            if ending is Finish.NOT_OURS:
                self._let_go()
                return None
            return self.busy_retry_seconds
        # The lease is renewed while the chunk runs, however long it takes.
        async with Heartbeat(lambda: self.jobs.renew(job.id, self.owner, self.lease_seconds),
                             lease_seconds=self.lease_seconds, job_id=job.id) as beat:
            outcomes = await self.work(job, ids, guard, beat.held)
        meter = self._meters.setdefault(job.id, Meter())
        now = time.monotonic()
        if not meter.samples:
            meter.add(0, started)
        meter.add(sum(1 for o in outcomes if not o.busy), now)
        # The items and the job's counters move together; the lease is renewed with them,
        # fenced on this owner: a runner that lost the job (paused, aborted, taken over)
        # still records what it did, and stops.
        kept = await guard(lambda: self.jobs.record(job.id, outcomes, owner=self.owner,
                                                    lease_seconds=self.lease_seconds,
                                                    retry_in=self.busy_retry_seconds, rate=meter.rate()))
        if not kept:
            self._let_go()
        return pace(len(ids), self.rate, started, time.monotonic())

    def _let_go(self) -> None:
        """The job this runner held is no longer its own (paused, aborted, taken over): what it
        did is recorded, and it runs no more of it."""
        if self.held is not None:
            log.info("bulk job %s: no longer run here (paused, aborted or taken over); its last chunk is recorded",
                     self.held)
        self.held = None

    async def release(self, guard) -> None:
        """Give the job up now (a worker that stops): another worker need not wait its lease out."""
        if self.held is not None:
            held, self.held = self.held, None
            await guard(lambda: self.jobs.release(held, self.owner))
