"""Error groups on MySQL: each ledger row's fingerprint, and the summary the group views read.

Every ledger write that sets or changes a row's reason and message (a new dead letter, a
letter that came back for another reason, a redrive that failed for a reason of its own, a
row the compensator opened for a letter it could not read) calls :func:`regroup` in the same
transaction. It reads the rows it is given under their locks, and for each whose fingerprint
is not the one its reason and message make, it sets the new one and moves the row between
the hourly buckets of ``t_error_group_hour``: -1 in its old group, +1 in its new one, in the
hour of its first failure (which never changes). So the buckets always equal::

    SELECT consumer_group, fingerprint, hour(first_failure_at), COUNT(*) FROM t_compensation GROUP BY 1, 2, 3

A crash rolls the row and its buckets back together; a replay finds the row's fingerprint
already right and counts nothing; two workers dead-lettering the same record wait for each
other on the row's lock, and the second reads the fingerprint the first wrote (the reads here
are locking reads, which see the latest committed row under READ COMMITTED and REPEATABLE
READ alike). The counts are never inferred from affected-row counts (CLIENT_FOUND_ROWS).

A bucket's ``first_at``/``last_at`` only widen: after rows left a bucket they may be earlier
or later than its remaining rows (within the hour). The buckets of one outage are one row
each per hour: every transaction that adds to it waits for the one before to commit, which
is short (one batch's dead letters).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from app.adapters.mysql.sql import Execute, marks
from app.compensation.fingerprints import ErrorShape, shape
from app.pipeline.model import SourceKey

GROUPED = "id, consumer_group, fingerprint, first_failure_at, reason, message"


@dataclass(frozen=True, slots=True)
class Grouped:
    """A ledger row as its group sees it."""

    id: int
    group: str
    fingerprint: str | None
    first_failure_at: datetime
    reason: str
    message: str | None


def hour_of(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


async def by_id(execute: Execute, ids: Sequence[int]) -> list[Grouped]:
    if not ids:
        return []
    result = await execute(f"SELECT {GROUPED} FROM t_compensation WHERE id IN ({marks(len(ids))}) ORDER BY id "
                           "FOR UPDATE", list(ids))
    return [Grouped(*row) for row in result]


async def by_source(execute: Execute, group: str, sources: Sequence[SourceKey]) -> dict[SourceKey, Grouped]:
    """The rows of ``sources`` (all of consumer group ``group``), by source."""
    if not sources:
        return {}
    rows = ", ".join("(%s, %s, %s, %s)" for _ in sources)
    result = await execute(
        f"SELECT src_topic, src_partition, src_offset, src_timestamp, {GROUPED} FROM t_compensation "
        f"WHERE consumer_group = %s AND (src_topic, src_partition, src_offset, src_timestamp) IN ({rows}) "
        "ORDER BY id FOR UPDATE",
        [group, *(value for s in sources for value in (s.topic, s.partition, s.offset, s.timestamp_ms))])
    return {SourceKey(group, *row[:4]): Grouped(*row[4:]) for row in result}


async def regroup(execute: Execute, rows: Iterable[Grouped]) -> None:
    """Give each of ``rows`` (read under lock, in this transaction) the fingerprint of its reason
    and message, moving it between the groups' buckets (see the module docstring)."""
    moves: list[tuple[Grouped, ErrorShape]] = []
    for row in rows:
        cause = shape(row.reason, row.message)
        if cause.fingerprint != row.fingerprint:
            moves.append((row, cause))
    if not moves:
        return
    cases = " ".join("WHEN %s THEN %s" for _ in moves)
    await execute(f"UPDATE t_compensation SET fingerprint = CASE id {cases} END WHERE id IN ({marks(len(moves))})",
                  [v for row, cause in moves for v in (row.id, cause.fingerprint)] + [row.id for row, _ in moves])
    # (group, fingerprint, hour) -> [letters to add, earliest and latest first failure that joined]
    buckets: dict[tuple[str, str, datetime], list] = {}
    for row, cause in moves:
        hour = hour_of(row.first_failure_at)
        if row.fingerprint is not None:
            buckets.setdefault((row.group, row.fingerprint, hour), [0, hour, hour])[0] -= 1
        joined = buckets.setdefault((row.group, cause.fingerprint, hour), [0, row.first_failure_at,
                                                                           row.first_failure_at])
        joined[0] += 1
        joined[1], joined[2] = min(joined[1], row.first_failure_at), max(joined[2], row.first_failure_at)
    # In key order, like every writer of these rows: two transactions never wait for each other in a circle.
    keys = sorted(buckets)
    await execute(
        "INSERT INTO t_error_group_hour (consumer_group, fingerprint, hour, letters, first_at, last_at) VALUES "
        f"{', '.join('(%s, %s, %s, %s, %s, %s)' for _ in keys)} ON DUPLICATE KEY UPDATE "
        # left to right, each seeing the ones before: ``letters`` last, the conditions read the new letter count
        "first_at = IF(VALUES(letters) > 0, LEAST(first_at, VALUES(first_at)), first_at), "
        "last_at = IF(VALUES(letters) > 0, GREATEST(last_at, VALUES(last_at)), last_at), "
        "letters = letters + VALUES(letters)",
        [v for key in keys for v in (*key, *buckets[key])])
    causes = {(row.group, cause.fingerprint): (cause, row.message) for row, cause in moves}
    names = sorted(causes)
    await execute(
        "INSERT INTO t_error_group (consumer_group, fingerprint, reason, effect, detail, sample, gmt_create, "
        f"gmt_modified) VALUES {', '.join('(%s, %s, %s, %s, %s, %s, NOW(3), NOW(3))' for _ in names)} "
        "ON DUPLICATE KEY UPDATE sample = VALUES(sample), gmt_modified = VALUES(gmt_modified)",
        [v for name in names for v in (*name, causes[name][0].reason[:64], causes[name][0].effect[:32],
                                       causes[name][0].detail[:64], (causes[name][1] or "")[:1024])])
