"""order_bulk_job_running says whether this worker runs a bulk job now: an autoscaler keeps the
workers while one does (docs/deploying-kubernetes.md), so it must fall when the job is let go,
when a chunk fails without the job, and when the worker stops."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from types import SimpleNamespace

from app.observability import metrics
from app.timers import bulk as bulk_timer


class Background:
    """The runtime's background work as the timer sees it: stopping once the steps are done."""

    def __init__(self) -> None:
        self.stopping = False

    @asynccontextmanager
    async def working(self):
        yield


class Runner:
    """The runtime's BulkRunner as the timer sees it: each step holds a job (its id) or none."""

    def __init__(self, background, steps) -> None:
        self.background, self.steps, self.held, self.seen = background, list(steps), None, []

    async def step(self, guard):
        self.seen.append(metrics.BULK_JOB_RUNNING._value.get())
        held, outcome = self.steps.pop(0)
        self.held = held
        if not self.steps:
            self.background.stopping = True
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


def run(steps) -> tuple[list[float], float]:
    background = Background()
    bulk = Runner(background, steps)
    metrics.BULK_JOB_RUNNING.set(0)
    asyncio.run(bulk_timer.run_bulk_jobs(settings=SimpleNamespace(bulk=SimpleNamespace(timer_seconds=0)), bulk=bulk,
                                         background=background, guard=lambda: None))
    return bulk.seen, metrics.BULK_JOB_RUNNING._value.get()


def test_the_gauge_follows_the_job_this_worker_holds():
    seen, last = run([(7, 0.0), (7, 0.0), (None, 0.0), (9, RuntimeError("the chunk failed")), (9, 0.0)])
    assert seen == [0, 1, 1, 0, 1]
    assert last == 0, "a worker that stops runs no job"
