"""order_bulk_job_running says whether this worker runs a bulk job now: an autoscaler keeps the
workers while one does (docs/deploying-kubernetes.md), so it must fall when the job is let go,
when a chunk fails without the job, and when the worker stops."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from types import SimpleNamespace

from app.observability import metrics
from app.timers import bulk as bulk_timer


class Runner:
    """The runtime's BulkRunner as the timer sees it: each step holds a job (its id) or none."""

    def __init__(self, rt, steps) -> None:
        self.rt, self.steps, self.held, self.seen = rt, list(steps), None, []

    async def step(self, guard):
        self.seen.append(metrics.BULK_JOB_RUNNING._value.get())
        held, outcome = self.steps.pop(0)
        self.held = held
        if not self.steps:
            self.rt.stopping = True
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


class Runtime:
    def __init__(self, steps) -> None:
        self.stopping = False
        self.bulk = Runner(self, steps)

    def started(self):
        return self

    @asynccontextmanager
    async def working(self):
        yield

    def guard(self):
        return None


def run(steps) -> tuple[list[float], float]:
    rt = Runtime(steps)
    task = bulk_timer.register(SimpleNamespace(task=lambda fn: fn), rt, SimpleNamespace(bulk=SimpleNamespace(timer_seconds=0)))
    metrics.BULK_JOB_RUNNING.set(0)
    asyncio.run(task())
    return rt.bulk.seen, metrics.BULK_JOB_RUNNING._value.get()


def test_the_gauge_follows_the_job_this_worker_holds():
    seen, last = run([(7, 0.0), (7, 0.0), (None, 0.0), (9, RuntimeError("the chunk failed")), (9, 0.0)])
    assert seen == [0, 1, 1, 0, 1]
    assert last == 0, "a worker that stops runs no job"
