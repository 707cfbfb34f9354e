"""Statements on ``t_idem``, the steps' state machine. Each write repeats its rule as a
SQL condition (status, attempt, owner, lease), so the database refuses a move the
state machine forbids even if the caller asked for it; the fencing token is ``attempt``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date

from app.adapters.mysql.sql import Execute, Sql, marks
from app.pipeline.errors import Conflict, EffectOutcomeUnknown
from app.pipeline.model import NOT_DELIVERED, UNKNOWN, FailRow, IdemRow, NewRow, Reclaim
from app.pipeline.ports import Finished
from app.pipeline.states import IdemStatus

PENDING, DONE, FAILED = int(IdemStatus.PENDING), int(IdemStatus.DONE), int(IdemStatus.FAILED)


async def read(execute: Execute, keys: Sequence[str], part_dates: Sequence[date]) -> dict[str, IdemRow]:
    """The rows of ``keys``, locked. The lease is compared with the database clock, which also wrote it.

    How long ago a call of the last claim could still have been on its way: once the claim's
    outcome is written (T3), since then; while it is not (the worker may have died after its
    call), since the later of the lease's end and the row's last change, because a claim may
    call until its lease is nearly over and a worker that dies then leaves the row dated at
    its claim.

    How long ago the first claim whose call may have reached the provider began (``first_call_at``;
    a row written before that column existed: its creation, which came earlier, so its age errs long)."""
    if not keys:
        return {}
    sql = Sql()
    result = await execute(
        "SELECT biz_key, status, attempt, owner, idem_token, payload_hash, outcome, last_err, "
        "COALESCE(lease_until < NOW(3), 1), "
        "COALESCE(TIMESTAMPDIFF(MICROSECOND, NOW(3), lease_until), 0), "
        "TIMESTAMPDIFF(MICROSECOND, IF(outcome IS NULL, GREATEST(gmt_modified, COALESCE(lease_until, gmt_modified)), "
        "gmt_modified), NOW(3)), "
        "TIMESTAMPDIFF(MICROSECOND, COALESCE(first_call_at, gmt_create), NOW(3)) "
        f"FROM t_idem WHERE biz_key IN ({sql.list(keys)}) AND part_date IN ({sql.list(part_dates)}) "
        "FOR UPDATE", sql.params)
    return {row[0]: IdemRow(row[0], IdemStatus(row[1]), row[2], row[3], row[4], row[5], row[6], row[7],
                            bool(row[8]), max(row[9], 0) / 1e6, max(row[10], 0) / 1e6, max(row[11], 0) / 1e6)
            for row in result}


async def insert(execute: Execute, rows: Sequence[NewRow], *, owner: str, lease_us: int) -> None:
    """A plain INSERT: a key someone else inserted meanwhile fails the whole transaction
    (1062), and the re-run reads it. A pending row's first call may start now (``first_call_at``)."""
    sql = Sql()
    lit = sql.lit
    # What every row shares, written once: the attempt and owner, the lease or none.
    owned = f"1, {sql.inline(owner) or '%s'}"
    pending, done = f"{owned}, NOW(3) + INTERVAL {lease_us} MICROSECOND", f"{owned}, NULL"
    called = {IdemStatus.PENDING: "NOW(3)"}
    by_owner = owned.endswith("%s")
    values = []
    for row in rows:
        status = row.status
        head = f"({lit(row.biz_key)}, {lit(row.part_date)}, {lit(row.step)}, {_STATUS[status]}, "
        if by_owner:
            sql.params.append(owner)        # parameters in the order of their places, one per place
        values.append(f"{head}{pending if status is IdemStatus.PENDING else done}, "
                      f"{lit(row.idem_token)}, {lit(row.payload_hash)}, {lit(row.outcome)}, NOW(3), NOW(3), "
                      f"{called.get(status, 'NULL')})")
    await execute(
        "INSERT INTO t_idem (biz_key, part_date, step, status, attempt, owner, lease_until, idem_token, "
        f"payload_hash, outcome, gmt_create, gmt_modified, first_call_at) VALUES {', '.join(values)}", sql.params)


_STATUS = {status: str(int(status)) for status in IdemStatus}


async def reclaim(execute: Execute, reclaims: Sequence[Reclaim], *, owner: str, lease_us: int) -> None:
    """Fenced: only rows still pending at the attempt read, whose lease ran out (or was
    never set: a row reopened to be verified) or is ours.
    ``attempt + 1`` is the new fencing token. Fewer rows than asked: :class:`Conflict`.

    ``first_call_at`` stays while an earlier call may have reached the provider; a row that says none
    did ("not delivered", which clears it) dates its first call from this claim, and a row written
    before the column existed from its creation. The assignments run left to right, each seeing the
    ones before it: this one reads ``outcome`` before it is cleared."""
    sql = Sql()
    keys = [r.biz_key for r in reclaims]
    result = await execute(
        f"UPDATE t_idem SET first_call_at = COALESCE(first_call_at, IF(outcome = '{NOT_DELIVERED}', NOW(3), "
        f"gmt_create)), attempt = attempt + 1, owner = {sql.lit(owner)}, outcome = NULL, "
        f"lease_until = NOW(3) + INTERVAL {lease_us} MICROSECOND, gmt_modified = NOW(3) "
        f"WHERE biz_key IN ({sql.list(keys)}) "
        f"AND part_date IN ({sql.list(sorted({r.part_date for r in reclaims}))}) "
        f"AND status = {PENDING} "
        f"AND (biz_key, attempt) IN ({', '.join(sql.tuple(r.biz_key, r.attempt) for r in reclaims)}) "
        f"AND (lease_until IS NULL OR lease_until < NOW(3) OR owner = {sql.lit(owner)})", sql.params)
    if result.rowcount != len(keys):
        raise Conflict(f"re-claimed {result.rowcount} of {len(keys)} rows")


async def fail(execute: Execute, row: FailRow, *, owner: str | None = None) -> bool:
    """pending -> failed, fenced on the attempt (and the owner, in T3). True if it is so now.

    In T3 a re-run after a lost commit may find the row already where it would put it:
    that counts as its own."""
    fence = "biz_key = %s AND part_date = %s AND attempt = %s" + (" AND owner = %s" if owner else "")
    where = [row.biz_key, row.part_date, row.attempt] + ([owner] if owner else [])
    result = await execute(
        f"UPDATE t_idem SET status = {FAILED}, outcome = %s, last_err = %s, lease_until = NULL, "
        f"gmt_modified = NOW(3) WHERE {fence} AND status = {PENDING}", [row.reason, row.message[:512], *where])
    if result.rowcount == 1 or owner is None:
        return result.rowcount == 1
    again = await execute(f"SELECT 1 FROM t_idem WHERE {fence} AND status = {FAILED} AND outcome = %s",
                          [*where, row.reason])
    return again.first() is not None


async def note(execute: Execute, item: Finished, note: str, *, owner: str) -> bool:
    """A pending row stays pending; its outcome says why (``effect_not_delivered`` when the call
    surely did not happen, so that even a non-idempotent effect may be claimed again). "Not
    delivered" says no attempt so far reached the provider: the row has no first call yet."""
    job = item.job
    cleared = ", first_call_at = NULL" if note == NOT_DELIVERED else ""
    result = await execute(
        f"UPDATE t_idem SET outcome = %s, last_err = %s, gmt_modified = NOW(3){cleared} WHERE biz_key = %s "
        f"AND part_date = %s AND status = {PENDING} AND owner = %s AND attempt = %s",
        [note, str(item.error)[:512], job.biz_key, job.part_date, owner, job.attempt])
    return result.rowcount == 1


async def mark_done(execute: Execute, outcome: str, items: Sequence[Finished], *, owner: str) -> set[str]:
    """pending -> done for calls that succeeded, fenced on (owner, attempt); the keys that are ours."""
    keys = [f.job.biz_key for f in items]
    pairs = [v for f in items for v in (f.job.biz_key, f.job.attempt)]
    dates = sorted({f.job.part_date for f in items})
    fence = (f"biz_key IN ({marks(len(keys))}) AND part_date IN ({marks(len(dates))}) "
             f"AND owner = %s AND (biz_key, attempt) IN ({marks(len(keys), '(%s, %s)')})")
    result = await execute(
        f"UPDATE t_idem SET status = {DONE}, outcome = %s, last_err = NULL, lease_until = NULL, "
        f"gmt_modified = NOW(3) WHERE {fence} AND status = {PENDING}", [outcome, *keys, *dates, owner, *pairs])
    if result.rowcount == len(keys):
        return set(keys)
    # Some leases were lost (or a lost commit moved them already): find the rows that are ours.
    rows = await execute(f"SELECT biz_key FROM t_idem WHERE {fence} AND status = {DONE} AND outcome = %s",
                         [*keys, *dates, owner, *pairs, outcome])
    return {row[0] for row in rows}


async def reopen_unknown(execute: Execute, keys: Sequence[str]) -> int:
    """failed (unknown outcome) -> pending, to be verified with the service before any new call.
    ``gmt_modified`` is kept: it dates the call, and asking is safe only a while after it."""
    if not keys:
        return 0
    result = await execute(
        f"UPDATE t_idem SET status = {PENDING}, outcome = %s, lease_until = NULL "
        f"WHERE biz_key IN ({marks(len(keys))}) AND status = {FAILED} AND outcome = %s",
        [EffectOutcomeUnknown.reason, *keys, UNKNOWN])
    return result.rowcount


async def release(execute: Execute, keys: Sequence[str], *, owner: str) -> None:
    """Give up ``owner``'s claims on pending ``keys`` (their record was dead-lettered): another
    claimer may take them at once, with attempt + 1 as ever. The lease ends now rather than
    vanishing: it still dates the last moment this claim's calls could have been made."""
    await execute(f"UPDATE t_idem SET lease_until = LEAST(COALESCE(lease_until, NOW(3)), "
                  f"NOW(3) - INTERVAL 1000 MICROSECOND) WHERE biz_key IN ({marks(len(keys))}) "
                  f"AND status = {PENDING} AND owner = %s", [*keys, owner])


@dataclass(frozen=True)
class Pending:
    biz_key: str
    part_date: date
    attempt: int
    owner: str | None
    live: bool              # its lease still runs (the database clock)
    remaining: float


async def pending(execute: Execute, keys: Sequence[str]) -> list[Pending]:
    """The pending rows of ``keys``, locked."""
    result = await execute(
        "SELECT biz_key, part_date, attempt, owner, COALESCE(lease_until >= NOW(3), 0), "
        "COALESCE(TIMESTAMPDIFF(MICROSECOND, NOW(3), lease_until), 0) "
        f"FROM t_idem WHERE biz_key IN ({marks(len(keys))}) AND status = {PENDING} FOR UPDATE", list(keys))
    return [Pending(row[0], row[1], row[2], row[3], bool(row[4]), max(row[5], 0) / 1e6) for row in result]


async def settle_by_person(execute: Execute, rows: Sequence[Pending], outcome: str, message: str) -> None:
    """pending -> failed with ``outcome`` (a person resolved or discarded the event), fenced on
    the attempt read: a claim that came in between keeps its row."""
    pairs = [v for row in rows for v in (row.biz_key, row.attempt)]
    await execute(
        f"UPDATE t_idem SET status = {FAILED}, outcome = %s, last_err = %s, lease_until = NULL, gmt_modified = NOW(3) "
        f"WHERE status = {PENDING} AND (biz_key, attempt) IN ({marks(len(rows), '(%s, %s)')})",
        [outcome, message[:512], *pairs])
