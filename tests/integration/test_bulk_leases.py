"""A bulk job's lease on real MariaDB (``app.adapters.mysql.ledger.bulk_jobs``): only the runner that holds
the job may finish it; one that lost it (a pause, a takeover) is told so; and a chunk slower
than the lease, with a second runner waiting for the job, is worked once, by its holder (two
runners in this process, the fake logistics API slowed down over real HTTP)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

from app.adapters.mysql.ledger.bulk_jobs import MySqlBulkJobs
from app.adapters.mysql.ledger.port import MySqlLedger
from app.adapters.mysql.ledger.selection import QueueFilter
from app.compensation.bulk import CHANGED, UNCHANGED, BulkRunner, Finish, ItemOutcome
from app.compensation.compensator import Compensator
from app.compensation.rules import Backoff
from app.pipeline.outage import OutageGuard
from app.pipeline.states import LedgerStatus
from harness.dead_letters import write_dead_letters

MANUAL_ROWS = QueueFilter(status=LedgerStatus.MANUAL)


async def new_job(harness, scratch_db, rows: int) -> tuple[MySqlBulkJobs, int, list[int]]:
    group = f"lease-{uuid.uuid4().hex[:8]}"
    write_dead_letters(scratch_db, group, "test-events", rows)
    jobs = MySqlBulkJobs(harness.store(), group=group)
    job = await jobs.create("discard", MANUAL_ROWS, expected=rows, tolerance_percent=0, cap=100, actor="web:t",
                            note=None)
    return jobs, job["id"], [r["compensation_id"] for r in scratch_db.query(
        "SELECT compensation_id FROM t_bulk_item WHERE job_id = %s ORDER BY compensation_id", job["id"])]


def lease_runs_out(scratch_db, job_id: int) -> None:
    """The holder's lease ran out (its worker stalled): anyone may take the job now."""
    scratch_db.query("UPDATE t_bulk_job SET lease_until = NOW(3) - INTERVAL 1 SECOND WHERE id = %s", job_id)


async def test_only_the_runner_holding_a_job_finishes_it(harness, scratch_db):
    jobs, job_id, items = await new_job(harness, scratch_db, 2)
    group = jobs.group
    assert (await jobs.take(group, "a/bulk/1", 30)).id == job_id
    assert await jobs.finish(job_id, "a/bulk/1") is Finish.WAITING            # its rows are not done yet
    lease_runs_out(scratch_db, job_id)
    assert (await jobs.take(group, "b/bulk/2", 30)).previous_owner == "a/bulk/1"
    assert await jobs.record(job_id, [ItemOutcome(i, CHANGED) for i in items], owner="b/bulk/2", lease_seconds=30,
                             retry_in=1, rate=None)

    assert await jobs.finish(job_id, "a/bulk/1") is Finish.NOT_OURS          # a wakes up: not its job any more
    assert (await jobs.get(job_id))["status"] == "running"
    assert await jobs.finish(job_id, "b/bulk/2") is Finish.DONE
    done = await jobs.get(job_id)
    assert (done["status"], done["owner"], done["done"], done["changed"]) == ("done", None, 2, 2)
    assert done["finished_at"] is not None
    assert await jobs.finish(job_id, "b/bulk/2") is Finish.NOT_OURS          # finished once


async def test_a_row_changed_by_a_runner_that_lost_the_job_counts_as_changed_once(harness, scratch_db):
    jobs, job_id, [row] = await new_job(harness, scratch_db, 1)
    await jobs.take(jobs.group, "a/bulk/1", 30)
    lease_runs_out(scratch_db, job_id)
    await jobs.take(jobs.group, "b/bulk/2", 30)
    # b found the row settled by a's chunk in flight and recorded it first; then a records its change.
    assert await jobs.record(job_id, [ItemOutcome(row, UNCHANGED)], owner="b/bulk/2", lease_seconds=30, retry_in=1,
                             rate=None)
    assert not await jobs.record(job_id, [ItemOutcome(row, CHANGED)], owner="a/bulk/1", lease_seconds=30,
                                 retry_in=1, rate=None)
    await jobs.record(job_id, [ItemOutcome(row, CHANGED)], owner="a/bulk/1", lease_seconds=30, retry_in=1, rate=None)
    counts = await jobs.get(job_id)
    assert (counts["done"], counts["changed"], counts["unchanged"], counts["failed"]) == (1, 1, 0, 0)
    assert scratch_db.scalar("SELECT outcome FROM t_bulk_item WHERE job_id = %s", job_id) == CHANGED


async def test_a_paused_job_is_not_finished_by_its_runner(harness, scratch_db):
    jobs, job_id, items = await new_job(harness, scratch_db, 1)
    await jobs.take(jobs.group, "a/bulk/1", 30)
    await jobs.record(job_id, [ItemOutcome(items[0], CHANGED)], owner="a/bulk/1", lease_seconds=30, retry_in=1,
                      rate=None)
    await jobs.command(job_id, "pause", actor="web:p")
    assert await jobs.finish(job_id, "a/bulk/1") is Finish.NOT_OURS
    paused = await jobs.get(job_id)
    assert (paused["status"], paused["finished_at"]) == ("paused", None)
    await jobs.command(job_id, "resume", actor="web:p")
    await jobs.take(jobs.group, "a/bulk/1", 30)
    assert await jobs.finish(job_id, "a/bulk/1") is Finish.DONE


class WatchedJobs(MySqlBulkJobs):
    """The job store, keeping what each finish() found."""

    def __init__(self, store, *, group: str, finishes: list[tuple[str, Finish]]) -> None:
        super().__init__(store, group=group)
        self.finishes = finishes

    async def finish(self, job_id: int, owner: str) -> Finish:
        ending = await super().finish(job_id, owner)
        self.finishes.append((owner, ending))
        return ending


async def test_a_chunk_slower_than_the_lease_is_worked_once_by_the_runner_holding_the_job(harness, scratch_db,
                                                                                       caplog):
    # One call at a time, a second each: a chunk of 4 rows takes 4 s, twice the job's lease.
    lease, chunk, rows = 2.0, 4, 8
    harness.fakes.configure({"waybill": {"latency_ms": 1000}})
    group = f"lease-{uuid.uuid4().hex[:8]}"
    orders = write_dead_letters(scratch_db, group, "test-events", rows)
    finishes: list[tuple[str, Finish]] = []
    worked: dict[str, list[list[int]]] = {}

    async def runner(name: str) -> BulkRunner:
        processor = await harness.processor(owner=f"{name}/compensator/x", concurrency=1, timeout=5.0)
        compensator = Compensator(processor, MySqlLedger(processor.store), group=group, backoff=Backoff(1, 1, 5),
                                  lease_seconds=120, max_event_bytes=1 << 20)
        worked[name] = []

        async def work(job, ids, guard, held):
            worked[name].append(list(ids))
            return await compensator.bulk(job.action, ids, guard, actor=job.actor, note=job.note, job_id=job.id,
                                          held=held)

        return BulkRunner(WatchedJobs(processor.store, group=group, finishes=finishes), work, group=group, owner=f"{name}/bulk/1",
                          lease_seconds=lease, chunk_size=chunk, rate=1e6, busy_retry_seconds=0.5)

    jobs = MySqlBulkJobs(harness.store(), group=group)
    job = await jobs.create("retry", MANUAL_ROWS, expected=rows, tolerance_percent=0, cap=100, actor="web:t",
                            note=None)

    async def run(r: BulkRunner) -> None:
        # Both runners look for the job as the timer does, until it has ended.
        while (await jobs.get(job["id"]))["status"] == "running":
            wait = await r.step(OutageGuard(10))
            await asyncio.sleep(0.05 if wait is None else wait)

    caplog.set_level("INFO", logger="app.compensation.bulk")
    await asyncio.wait_for(asyncio.gather(run(await runner("a")), run(await runner("b"))), 120)

    times = Counter(i for name in worked for ids in worked[name] for i in ids)
    assert len(times) == rows and set(times.values()) == {1}, f"a row worked twice: {worked}"
    assert "taken over from" not in caplog.text
    [holder] = [name for name in worked if worked[name]]
    assert [f for f in finishes if f[1] is Finish.DONE] == [(f"{holder}/bulk/1", Finish.DONE)]
    done = await jobs.get(job["id"])
    changed = scratch_db.scalar("SELECT COUNT(*) FROM t_compensation_audit WHERE job_id = %s AND to_status = %s",
                                job["id"], int(LedgerStatus.COMPENSATED))
    assert (done["status"], done["done"], done["changed"], changed) == ("done", rows, rows, rows)
    calls = Counter(c["body"]["order_no"] for c in harness.fakes.ledger.calls if c["service"] == "waybill")
    assert calls == Counter(orders), "a waybill called twice, or never"


async def test_a_chunk_whose_job_is_no_longer_its_own_begins_no_other_row(harness, scratch_db):
    group = f"lease-{uuid.uuid4().hex[:8]}"
    write_dead_letters(scratch_db, group, "test-events", 3)
    ids = [r["id"] for r in scratch_db.query("SELECT id FROM t_compensation WHERE consumer_group = %s ORDER BY id",
                                             group)]
    processor = await harness.processor(owner="c/compensator/x")
    compensator = Compensator(processor, MySqlLedger(processor.store), group=group, backoff=Backoff(1, 1, 5),
                              lease_seconds=120, max_event_bytes=1 << 20)
    guard = OutageGuard(10)
    held = iter([True, False])                          # lost while the first row was worked

    outcomes = await compensator.bulk("discard", ids, guard, actor="web:t", note=None, job_id=1,
                                      held=lambda: next(held))
    assert [(o.row_id, o.outcome) for o in outcomes] == [(ids[0], CHANGED)]
    assert await compensator.bulk("retry", ids[1:], guard, actor="web:t", note=None, job_id=1,
                                  held=lambda: False) == []
    statuses = [r["status"] for r in scratch_db.query("SELECT status FROM t_compensation WHERE consumer_group = %s "
                                                      "ORDER BY id", group)]
    assert statuses == [LedgerStatus.DISCARDED, LedgerStatus.MANUAL, LedgerStatus.MANUAL]   # none claimed
    assert harness.fakes.ledger.calls == []
