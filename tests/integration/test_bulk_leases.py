"""A bulk job's lease on real MariaDB (``app.adapters.mysql.bulk``): only the runner that holds
the job may finish it; one that lost it (a pause, a takeover) is told so."""

from __future__ import annotations

import uuid

import pytest

from app.adapters.mysql.bulk import MySqlBulkJobs
from app.adapters.mysql.queries import QueueFilter
from app.pipeline.bulk import CHANGED, Finish, ItemOutcome
from app.pipeline.states import LedgerStatus
from harness.dead_letters import write_dead_letters

pytestmark = pytest.mark.integration
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
