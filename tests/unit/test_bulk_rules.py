"""The pure rules of bulk jobs (``app.compensation.bulk``): the tolerance between the dry run and
the start, a job's transitions, its progress and ETA, the rate limit, the runner's chunk, and
the heartbeat that keeps the job's lease while a chunk runs (``app.compensation.bulk_lease``)."""

from __future__ import annotations

import asyncio

import pytest

from app.compensation.bulk import (
    CHANGED,
    FAILED,
    TRANSITIONS,
    UNCHANGED,
    BulkRunner,
    Finish,
    ItemOutcome,
    Job,
    JobStatus,
    Meter,
    Progress,
    TransitionRefused,
    busy,
    pace,
    tally,
    tolerance,
    tolerated,
    transition,
)
from app.compensation.bulk_lease import Heartbeat


def test_the_tolerance_is_a_percent_of_the_count_seen_rounded_down():
    assert tolerance(10, 1.0) == 0 and tolerance(99, 1.0) == 0 and tolerance(100, 1.0) == 1
    assert tolerance(10_000, 1.0) == 100 and tolerance(10_000, 0) == 0
    assert tolerated(10, 10, 1.0) and not tolerated(10, 11, 1.0) and not tolerated(10, 9, 1.0)
    assert tolerated(10_000, 10_100, 1.0) and tolerated(10_000, 9_900, 1.0)
    assert not tolerated(10_000, 10_101, 1.0) and not tolerated(10_000, 9_899, 1.0)
    assert tolerated(0, 0, 1.0) and not tolerated(0, 1, 50.0)


@pytest.mark.parametrize("status", list(JobStatus))
@pytest.mark.parametrize("command", list(TRANSITIONS))
def test_every_transition_of_a_job_from_every_status(status, command):
    allowed, to = TRANSITIONS[command]
    if status is to:
        assert transition(status, command) == (status, False)          # twice: no change the second time
    elif status in allowed:
        assert transition(status, command) == (to, True)
    else:
        with pytest.raises(TransitionRefused):
            transition(status, command)


def test_a_finished_job_stays_finished_and_only_a_paused_one_resumes():
    for finished in (JobStatus.DONE, JobStatus.ABORTED):
        for command in ("pause", "resume"):
            with pytest.raises(TransitionRefused):
                transition(finished, command)
    with pytest.raises(TransitionRefused):
        transition(JobStatus.DONE, "abort")
    assert transition(JobStatus.ABORTED, "abort") == (JobStatus.ABORTED, False)
    with pytest.raises(TransitionRefused):
        transition(JobStatus.RUNNING, "restart")


def test_progress_says_what_remains_and_when_it_ends_at_the_recent_rate():
    p = Progress(total=1000, done=400, changed=390, failed=4, rate=50.0, status=JobStatus.RUNNING)
    assert p.remaining == 600 and p.eta_seconds == 12.0
    assert p.as_dict() == {"total": 1000, "done": 400, "changed": 390, "failed": 4, "unchanged": 6,
                           "remaining": 600, "rate_per_second": 50.0, "eta_seconds": 12.0}
    assert Progress(1000, 400, 390, 4, 50.0, JobStatus.PAUSED).eta_seconds is None        # it does not run
    assert Progress(1000, 400, 390, 4, None, JobStatus.RUNNING).eta_seconds is None       # no rate yet
    assert Progress(1000, 1000, 990, 4, None, JobStatus.DONE).eta_seconds == 0.0


def test_the_meter_measures_rows_per_second_over_its_window():
    meter = Meter(window=10)
    assert meter.rate() is None
    meter.add(0, 0.0)
    meter.add(100, 1.0)
    assert meter.rate() is None                # one chunk says nothing of the pace between chunks
    meter.add(100, 2.0)
    assert meter.rate() == 100.0
    for t in range(3, 30):
        meter.add(10, float(t))               # slower lately: the old samples leave the window
    assert 9.0 <= meter.rate() <= 11.0


def test_the_pace_keeps_a_job_at_its_rate():
    assert pace(100, 200.0, started=0.0, now=0.1) == pytest.approx(0.4)
    assert pace(100, 200.0, started=0.0, now=0.7) == 0.0
    assert pace(100, 10.0, started=5.0, now=5.0) == 10.0


class Jobs:
    """A job store in memory, for the runner."""

    def __init__(self, items: list[int]) -> None:
        self.job = Job(7, "retry", JobStatus.RUNNING, "web:alice", None)
        self.pending_items = list(items)
        self.recorded: list[ItemOutcome] = []
        self.finished = False
        self.holder: str | None = None
        self.keep = True

    async def take(self, group, owner, lease_seconds):
        if self.finished or (self.holder not in (None, owner)):
            return None
        self.holder = owner
        return self.job

    async def pending(self, job_id, limit):
        return self.pending_items[:limit]

    async def renew(self, job_id, owner, lease_seconds):
        return self.holder == owner

    async def record(self, job_id, outcomes, *, owner, lease_seconds, retry_in, rate):
        self.recorded.extend(outcomes)
        done = {o.row_id for o in outcomes if not o.busy}
        self.pending_items = [i for i in self.pending_items if i not in done]
        return self.keep

    async def finish(self, job_id, owner):
        if self.holder != owner:
            return Finish.NOT_OURS
        self.finished = not self.pending_items
        return Finish.DONE if self.finished else Finish.WAITING

    async def release(self, job_id, owner):
        if self.holder == owner:
            self.holder = None


async def guard(work):
    return await work()


def test_the_runner_works_a_job_chunk_by_chunk_until_it_is_done_and_retries_busy_rows():
    jobs = Jobs(list(range(1, 8)))
    tries: dict[int, int] = {}

    async def work(job, ids, guard, held):
        out = []
        for i in ids:
            tries[i] = tries.get(i, 0) + 1
            if i == 3 and tries[i] == 1:
                out.append(busy(i, "claimed by another worker"))
            else:
                out.append(ItemOutcome(i, {1: UNCHANGED, 2: FAILED}.get(i, CHANGED)))
        return out

    runner = BulkRunner(jobs, work, group="g", owner="w1", lease_seconds=30, chunk_size=3, rate=1e9,
                        busy_retry_seconds=1)

    async def run():
        waits = []
        while (wait := await runner.step(guard)) is not None:
            waits.append(wait)
            if len(waits) > 20:
                raise AssertionError("the runner never finished")
        return waits

    asyncio.run(run())
    assert jobs.finished and tries[3] == 2 and all(tries[i] == 1 for i in tries if i != 3)
    assert [o.outcome for o in jobs.recorded if not o.busy].count(CHANGED) == 5
    assert runner.held is None


def test_a_runner_that_lost_its_job_stops_and_a_stopping_one_gives_the_lease_up():
    jobs = Jobs(list(range(1, 100)))

    async def work(job, ids, guard, held):
        return [ItemOutcome(i, CHANGED) for i in ids]

    runner = BulkRunner(jobs, work, group="g", owner="w1", lease_seconds=30, chunk_size=10, rate=100.0,
                        busy_retry_seconds=1)
    wait = asyncio.run(runner.step(guard))
    assert runner.held == 7 and 0 < wait <= 0.1                       # 10 rows at 100 rows/s
    asyncio.run(runner.release(guard))
    assert runner.held is None and jobs.holder is None
    jobs.keep = False                                                  # paused or taken over meanwhile
    asyncio.run(runner.step(guard))
    assert runner.held is None


def test_a_runner_whose_job_was_taken_before_it_could_finish_it_says_so_and_lets_it_go(caplog):
    jobs = Jobs([1, 2])

    async def work(job, ids, guard, held):
        return [ItemOutcome(i, CHANGED) for i in ids]

    runner = BulkRunner(jobs, work, group="g", owner="w1", lease_seconds=30, chunk_size=10, rate=1e9,
                        busy_retry_seconds=1)
    asyncio.run(runner.step(guard))                       # both rows done; the job not finished yet
    assert runner.held == 7 and not jobs.finished

    async def taken_over(group, owner, lease_seconds):
        job = jobs.job
        jobs.holder = "w2"                                # after this take, w2's lease: w1's ran out
        return job

    jobs.take = taken_over
    caplog.set_level("INFO", logger="app.compensation.bulk")
    assert asyncio.run(runner.step(guard)) is None
    assert not jobs.finished and runner.held is None
    assert ": done" not in caplog.text and "no longer run here" in caplog.text


def heartbeats() -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks() if t.get_name().endswith("-heartbeat")]


def test_a_chunks_heartbeat_renews_the_lease_until_the_chunk_ends():
    async def scenario():
        renewals, second = [], asyncio.Event()

        async def renew():
            renewals.append(1)
            if len(renewals) == 2:
                second.set()
            if len(renewals) == 1:
                raise ConnectionError("the database is away")       # a beat that fails: the next one tries again
            return True

        async with Heartbeat(renew, lease_seconds=0.03, job_id=7) as beat:
            await asyncio.wait_for(second.wait(), 10)
            assert beat.held() and heartbeats()
        assert heartbeats() == []                                     # no beat outlives its chunk
        with pytest.raises(asyncio.CancelledError):                   # nor a chunk cancelled (a worker stopping)
            async with Heartbeat(renew, lease_seconds=0.03, job_id=8):
                asyncio.current_task().cancel()
                await asyncio.Event().wait()
        assert heartbeats() == []

    asyncio.run(scenario())


def test_a_chunk_whose_lease_is_lost_begins_no_other_row_and_its_runner_lets_the_job_go():
    jobs = Jobs(list(range(1, 11)))
    lost = asyncio.Event()

    async def renew(job_id, owner, lease_seconds):
        jobs.holder = "w2"                        # taken over (or paused) while the chunk runs
        jobs.keep = False
        lost.set()
        return False

    jobs.renew = renew

    async def work(job, ids, guard, held):
        out = [ItemOutcome(ids[0], CHANGED)]
        await asyncio.wait_for(lost.wait(), 10)   # the first row is under way when the beat finds the job lost
        out += [ItemOutcome(i, CHANGED) for i in ids[1:] if held()]
        return out

    runner = BulkRunner(jobs, work, group="g", owner="w1", lease_seconds=0.03, chunk_size=5, rate=1e9,
                        busy_retry_seconds=1)
    asyncio.run(runner.step(guard))
    assert [o.row_id for o in jobs.recorded] == [1] and jobs.pending_items == list(range(2, 11))
    assert runner.held is None


def test_an_item_counts_once_and_changed_replaces_what_a_runner_that_lost_the_job_recorded_first():
    seen = {1: (0, None), 2: (1, UNCHANGED), 3: (1, FAILED), 4: (1, CHANGED), 5: (1, UNCHANGED)}
    moving, counts = tally([ItemOutcome(1, FAILED), ItemOutcome(2, CHANGED), ItemOutcome(3, CHANGED),
                            ItemOutcome(4, CHANGED), ItemOutcome(5, FAILED), ItemOutcome(6, CHANGED)], seen)
    assert [o.row_id for o in moving] == [1, 2, 3]                  # 4 counted already, 5 not changed, 6 not the job's
    assert (counts["done"], counts[CHANGED], counts[FAILED], counts[UNCHANGED]) == (1, 2, 0, -1)
