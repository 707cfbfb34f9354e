"""Bulk jobs on MySQL (``t_bulk_job``, ``t_bulk_item``): the dry run, the job's creation with
its rows written down, its lease, its progress, and a person's pause, resume and abort."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict
from typing import Any, TypeVar

from app.adapters.mysql.ledger.selection import QueueFilter
from app.adapters.mysql.sql import Execute, marks
from app.adapters.mysql.store import MySqlStore
from app.compensation.bulk import (
    CHANGED,
    FAILED,
    Finish,
    ItemOutcome,
    Job,
    JobStatus,
    Progress,
    tally,
    tolerated,
    transition,
)
from app.pipeline.states import LedgerStatus

T = TypeVar("T")
# A job works the rows a person can still act on; the others are settled, or being worked.
ACTIONABLE = (LedgerStatus.OPEN, LedgerStatus.MANUAL)
SAMPLE_COLUMNS = "id, status, reason, fingerprint, order_no, attempts, redrives, first_failure_at, message"
JOB_COLUMNS = ("id, action, status, filter, note, created_by, expected_count, total, done_count, changed_count, "
               "failed_count, rate_per_minute, owner, lease_until, paused_by, aborted_by, finished_at, gmt_create, "
               "gmt_modified")


class CountMoved(Exception):
    """The rows the filter selects now are not the count the person saw (beyond the tolerance)."""

    def __init__(self, count: int, reason: str) -> None:
        super().__init__(reason)
        self.count = count
        self.reason = reason


def selection(f: QueueFilter, group: str) -> tuple[str, list]:
    """The WHERE of the rows a bulk job over filter ``f`` takes: the group's, open or manual."""
    where = ["consumer_group = %s", f"status IN ({', '.join(str(int(s)) for s in ACTIONABLE)})"]
    params: list = [group]
    for clause, value in (("status = %s", None if f.status is None else int(f.status)),
                          ("reason = %s", f.reason), ("order_no = %s", f.order_no),
                          ("first_failure_at <= NOW(3) - INTERVAL %s SECOND", f.older_than_seconds),
                          ("fingerprint = %s", f.fingerprint),
                          ("first_failure_at >= %s", None if f.since is None else f.since.replace(tzinfo=None)),
                          ("first_failure_at < %s", None if f.until is None else f.until.replace(tzinfo=None))):
        if value is not None:
            where.append(clause)
            params.append(value)
    return " AND ".join(where), params


def filter_doc(f: QueueFilter) -> str:
    doc = {k: v for k, v in asdict(f).items() if v is not None and k not in ("before_id", "limit")}
    if f.status is not None:
        doc["status"] = f.status.name.lower()
    for side in ("since", "until"):
        if side in doc:
            doc[side] = doc[side].isoformat()
    return json.dumps(doc, sort_keys=True)


def _dicts(result) -> list[dict[str, Any]]:
    keys = list(result.keys())
    return [dict(zip(keys, row)) for row in result]


def job_view(row: dict[str, Any]) -> dict[str, Any]:
    """A job as the views show it: its row, its filter, its progress."""
    status = JobStatus(row["status"])
    rate = None if row["rate_per_minute"] is None else row["rate_per_minute"] / 60
    progress = Progress(row["total"], row["done_count"], row["changed_count"], row["failed_count"], rate, status)
    return {"id": row["id"], "action": row["action"], "status": status.name.lower(),
            "filter": json.loads(row["filter"]), "note": row["note"], "created_by": row["created_by"],
            "expected_count": row["expected_count"], **progress.as_dict(), "owner": row["owner"],
            "lease_until": row["lease_until"], "paused_by": row["paused_by"], "aborted_by": row["aborted_by"],
            "created_at": row["gmt_create"], "modified_at": row["gmt_modified"], "finished_at": row["finished_at"]}


async def _renew(execute: Execute, job_id: int, owner: str, lease_seconds: float) -> bool:
    """The lease check: renewed only while the job runs and is ``owner``'s. Whether it is, is
    read back: the UPDATE's row count says rows matched (CLIENT_FOUND_ROWS), and a renewal in
    the same millisecond changes nothing."""
    await execute(f"UPDATE t_bulk_job SET lease_until = NOW(3) + INTERVAL {int(lease_seconds * 1_000_000)} "
                  "MICROSECOND WHERE id = %s AND owner = %s AND status = %s", [job_id, owner, int(JobStatus.RUNNING)])
    row = (await execute("SELECT owner, status FROM t_bulk_job WHERE id = %s", [job_id])).first()
    return row is not None and row[0] == owner and row[1] == int(JobStatus.RUNNING)


class MySqlBulkJobs:
    def __init__(self, store: MySqlStore, *, group: str) -> None:
        self.store = store
        self.group = group

    async def _run(self, work: Callable[[Execute], Awaitable[T]]) -> T:
        return await self.store.in_transaction(lambda tx: work(tx._exec))

    # -- for people --------------------------------------------------------------------

    async def dry_run(self, f: QueueFilter, *, cap: int, sample: int) -> dict[str, Any]:
        """The exact count of the rows a job would take (up to ``cap`` + 1) and the first ``sample``."""
        where, params = selection(f, self.group)

        async def work(execute: Execute) -> dict[str, Any]:
            count = (await execute(f"SELECT COUNT(*) FROM (SELECT id FROM t_compensation WHERE {where} "
                                   f"LIMIT {int(cap) + 1}) AS s", params)).scalar()
            rows = _dicts(await execute(f"SELECT {SAMPLE_COLUMNS} FROM t_compensation WHERE {where} ORDER BY id "
                                        f"LIMIT {int(sample)}", params))
            for row in rows:
                row["status"] = LedgerStatus(row["status"]).name.lower()
            return {"count": min(count, cap), "capped": count > cap, "cap": cap, "sample": rows}
        return await self._run(work)

    async def create(self, action: str, f: QueueFilter, *, expected: int, tolerance_percent: float, cap: int,
                     actor: str, note: str | None) -> dict[str, Any]:
        """The job, its rows written down in the same transaction that counts them: the job works
        exactly these. :class:`CountMoved` (nothing written) when they are too many, none, or
        not the count seen within the tolerance."""
        where, params = selection(f, self.group)

        async def work(execute: Execute) -> dict[str, Any]:
            await execute("INSERT INTO t_bulk_job (consumer_group, action, status, filter, note, created_by, "
                          "expected_count, total, gmt_create, gmt_modified) VALUES (%s, %s, %s, %s, %s, %s, %s, 0, "
                          "NOW(3), NOW(3))", [self.group, action, int(JobStatus.RUNNING), filter_doc(f),
                                              None if note is None else note[:1024], actor[:128], expected])
            job_id = (await execute("SELECT LAST_INSERT_ID()", [])).scalar()
            await execute(f"INSERT INTO t_bulk_item (job_id, compensation_id, state, gmt_modified) "
                          f"SELECT %s, id, 0, NOW(3) FROM t_compensation WHERE {where} ORDER BY id "
                          f"LIMIT {int(cap) + 1}", [job_id, *params])
            count = (await execute("SELECT COUNT(*) FROM t_bulk_item WHERE job_id = %s", [job_id])).scalar()
            if count > cap:
                raise CountMoved(count, f"the filter selects more than BULK_MAX_ROWS={cap} rows: narrow it")
            if count == 0:
                raise CountMoved(0, "no dead letter the job could act on matches the filter now")
            if not tolerated(expected, count, tolerance_percent):
                raise CountMoved(count, f"the queue changed: the filter selects {count} rows now, the dry run "
                                        f"counted {expected} (BULK_COUNT_TOLERANCE_PERCENT={tolerance_percent:g}); "
                                        "look again and start with the new count")
            await execute("UPDATE t_bulk_job SET total = %s WHERE id = %s", [count, job_id])
            return await self._job(execute, job_id)
        return await self._run(work)

    async def get(self, job_id: int) -> dict[str, Any] | None:
        return await self._run(lambda execute: self._job(execute, job_id))

    async def _job(self, execute: Execute, job_id: int) -> dict[str, Any] | None:
        rows = _dicts(await execute(f"SELECT {JOB_COLUMNS} FROM t_bulk_job WHERE id = %s AND consumer_group = %s",
                                    [job_id, self.group]))
        return job_view(rows[0]) if rows else None

    async def jobs(self, limit: int = 50) -> list[dict[str, Any]]:
        rows = await self._run(lambda execute: execute(
            f"SELECT {JOB_COLUMNS} FROM t_bulk_job WHERE consumer_group = %s ORDER BY id DESC LIMIT {int(limit)}",
            [self.group]))
        return [job_view(row) for row in _dicts(rows)]

    async def failures(self, job_id: int, limit: int = 50) -> list[dict[str, Any]]:
        """The rows the job could not act on, and why."""
        rows = await self._run(lambda execute: execute(
            "SELECT compensation_id, detail FROM t_bulk_item WHERE job_id = %s AND state = 1 AND outcome = %s "
            f"ORDER BY compensation_id LIMIT {int(limit)}", [job_id, FAILED]))
        return _dicts(rows)

    async def command(self, job_id: int, command: str, *, actor: str) -> tuple[dict[str, Any] | None, bool]:
        """A person's pause, resume or abort; (the job, whether it changed). ``TransitionRefused``
        from a status the command cannot start from. Leaving ``running`` gives the lease up: the
        runner's chunk in flight finishes, and it runs no other."""
        async def work(execute: Execute) -> tuple[dict[str, Any] | None, bool]:
            found = (await execute("SELECT status FROM t_bulk_job WHERE id = %s AND consumer_group = %s FOR UPDATE",
                                   [job_id, self.group])).first()
            if found is None:
                return None, False
            to, changed = transition(JobStatus(found[0]), command)
            if changed:
                who = {"pause": ", paused_by = %s", "abort": ", aborted_by = %s, finished_at = NOW(3)"}.get(command, "")
                await execute(f"UPDATE t_bulk_job SET status = %s, owner = NULL, lease_until = NULL{who}, "
                              "gmt_modified = NOW(3) WHERE id = %s",
                              [int(to), *([actor[:128]] if who else []), job_id])
            return await self._job(execute, job_id), changed
        return await self._run(work)

    # -- for the runner (app.compensation.bulk.BulkJobs) -------------------------------------

    async def take(self, group: str, owner: str, lease_seconds: float) -> Job | None:
        """A running job of the group whose lease is ``owner``'s or free (never held, or run out:
        its runner died), the one held first; taken or renewed for ``lease_seconds``."""
        lease_us = int(lease_seconds * 1_000_000)

        async def work(execute: Execute) -> Job | None:
            found = (await execute(
                "SELECT id, owner FROM t_bulk_job WHERE consumer_group = %s AND status = %s AND (owner IS NULL "
                # The lease check: a holder that died lets its lease run out, and the job is ours then.
                "OR owner = %s OR lease_until < NOW(3)) ORDER BY owner = %s DESC, id LIMIT 1 FOR UPDATE SKIP LOCKED",
                [group, int(JobStatus.RUNNING), owner, owner])).first()
            if found is None:
                return None
            await execute(f"UPDATE t_bulk_job SET owner = %s, lease_until = NOW(3) + INTERVAL {lease_us} MICROSECOND "
                          "WHERE id = %s", [owner, found[0]])
            row = (await execute("SELECT id, action, status, created_by, note FROM t_bulk_job WHERE id = %s",
                                 [found[0]])).first()
            return Job(row[0], row[1], JobStatus(row[2]), row[3], row[4], previous_owner=found[1])
        return await self._run(work)

    async def pending(self, job_id: int, limit: int) -> list[int]:
        result = await self._run(lambda execute: execute(
            "SELECT compensation_id FROM t_bulk_item WHERE job_id = %s AND state = 0 AND (not_before IS NULL OR "
            f"not_before <= NOW(3)) ORDER BY compensation_id LIMIT {int(limit)}", [job_id]))
        return [row[0] for row in result]

    async def record(self, job_id: int, outcomes: Sequence[ItemOutcome], *, owner: str, lease_seconds: float,
                     retry_in: float, rate: float | None) -> bool:
        """What a chunk did, with the job's counters, in one transaction: an item counts once
        (:func:`~app.compensation.bulk.tally`). Busy items wait ``retry_in``. The lease is renewed
        if it is still ``owner``'s and the job runs; False when it is not (stop)."""
        finished = [o for o in outcomes if not o.busy]
        waiting = [o.row_id for o in outcomes if o.busy]

        async def work(execute: Execute) -> bool:
            counted = Counter()
            if finished:
                ids = [o.row_id for o in finished]
                result = await execute(f"SELECT compensation_id, state, outcome FROM t_bulk_item WHERE job_id = %s AND "
                                       f"compensation_id IN ({marks(len(ids))}) FOR UPDATE", [job_id, *ids])
                moving, counted = tally(finished, {row[0]: (row[1], row[2]) for row in result})
                if moving:
                    await execute(
                        "INSERT INTO t_bulk_item (job_id, compensation_id, state, outcome, detail, gmt_modified) "
                        f"VALUES {marks(len(moving), '(%s, %s, 1, %s, %s, NOW(3))')} ON DUPLICATE KEY UPDATE "
                        "outcome = VALUES(outcome), detail = VALUES(detail), gmt_modified = NOW(3), state = 1",
                        [v for o in moving for v in (job_id, o.row_id, o.outcome, None if o.detail is None
                                                     else o.detail[:1024])])
            if waiting:
                await execute(f"UPDATE t_bulk_item SET not_before = NOW(3) + INTERVAL {int(retry_in * 1_000_000)} "
                              f"MICROSECOND WHERE job_id = %s AND compensation_id IN ({marks(len(waiting))}) "
                              "AND state = 0", [job_id, *waiting])
            await execute(
                "UPDATE t_bulk_job SET done_count = done_count + %s, changed_count = changed_count + %s, "
                "failed_count = failed_count + %s, rate_per_minute = COALESCE(%s, rate_per_minute), "
                "gmt_modified = NOW(3) WHERE id = %s",
                [counted["done"], counted[CHANGED], counted[FAILED], None if rate is None else round(rate * 60),
                 job_id])
            return await _renew(execute, job_id, owner, lease_seconds)
        return await self._run(work)

    async def renew(self, job_id: int, owner: str, lease_seconds: float) -> bool:
        """The lease renewed for ``lease_seconds`` if the job runs and is ``owner``'s (a chunk's
        heartbeat); False when it is not."""
        return await self._run(lambda execute: _renew(execute, job_id, owner, lease_seconds))

    async def finish(self, job_id: int, owner: str) -> Finish:
        """Done, if the job still runs, is still ``owner``'s and no item is pending (busy ones
        included); else what stood in the way. The job's row is locked and read first, so the
        UPDATE meets what was read: who finished is read, never inferred from the row count the
        UPDATE reports (the MySQL dialects connect with CLIENT_FOUND_ROWS: rows matched)."""
        async def work(execute: Execute) -> Finish:
            row = (await execute("SELECT owner, status FROM t_bulk_job WHERE id = %s FOR UPDATE", [job_id])).first()
            if row is None or row[0] != owner or row[1] != int(JobStatus.RUNNING):
                return Finish.NOT_OURS
            left = (await execute("SELECT 1 FROM t_bulk_item WHERE job_id = %s AND state = 0 LIMIT 1",
                                  [job_id])).first()
            if left is not None:
                return Finish.WAITING
            await execute("UPDATE t_bulk_job SET status = %s, owner = NULL, lease_until = NULL, finished_at = NOW(3), "
                          "gmt_modified = NOW(3) WHERE id = %s AND owner = %s AND status = %s",
                          [int(JobStatus.DONE), job_id, owner, int(JobStatus.RUNNING)])
            return Finish.DONE
        return await self._run(work)

    async def release(self, job_id: int, owner: str) -> None:
        await self._run(lambda execute: execute(
            "UPDATE t_bulk_job SET owner = NULL, lease_until = NULL WHERE id = %s AND owner = %s", [job_id, owner]))
