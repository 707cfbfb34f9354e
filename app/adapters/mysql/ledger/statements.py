"""Statements on ``t_compensation``, the ledger of dead letters, and its audit trail."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Sequence

import app.adapters.mysql.ledger.grouping as groups
import app.adapters.mysql.orders as orders
from app.adapters.mysql.sql import Execute, Sql, marks
from app.pipeline.model import LedgerRow, SourceKey
from app.pipeline.ports import DeadLetter, SourceRecord
from app.pipeline.states import LedgerStatus, ledger_move_allowed

# What the ledger keeps of a record, per letter: an event it decoded, whole (it is at most
# MAX_EVENT_BYTES, at most 4 MiB, so it can always be run again from the ledger); anything
# else, or a record the dead-letter topic got cut, at most its first 64 KiB of key and of
# value, with the size and SHA-256 of each part that was cut.
KEPT_WHEN_CUT = 64 * 1024
HEADERS_ROOM = 60 * 1024             # record_headers is TEXT
# The letters of a batch are written in statements of about this much at most (a binary value
# may double when escaped; MariaDB's max_allowed_packet is 16 MiB, MySQL 8's 64 MiB): one letter
# larger than this goes alone.
STATEMENT_BYTES = 1024 * 1024
WHOLE_VALUE_MAX = 4 * 1024 * 1024    # the most MAX_EVENT_BYTES allows
COLUMNS = ("id, status, reason, message, retriable, attempts, redrives, COALESCE(next_retry_at <= NOW(3), 1), "
           "next_retry_at, order_no, biz_key, record_key, record_value, record_headers, src_timestamp")


def headers_json(headers: Sequence[tuple[str, bytes | None]]) -> str:
    """The record's own headers, exactly: ``[[base64 key, base64 value or null], ...]``."""
    doc = json.dumps([[base64.b64encode(k.encode("utf-8", "surrogateescape")).decode(),
                       None if v is None else base64.b64encode(v).decode()] for k, v in headers])
    return doc if len(doc) <= HEADERS_ROOM else json.dumps({"omitted": len(headers), "json_bytes": len(doc)})


def parse_headers(doc: str | None) -> tuple[tuple[str, bytes | None], ...]:
    data = json.loads(doc) if doc else []
    if not isinstance(data, list):
        return ()
    return tuple((base64.b64decode(k).decode("utf-8", "surrogateescape"), None if v is None else base64.b64decode(v))
                 for k, v in data)


def row_of(values) -> LedgerRow:
    return LedgerRow(values[0], LedgerStatus(values[1]), values[2], values[3], bool(values[4]), values[5], values[6],
                     bool(values[7]), values[8], values[9], values[10], values[11], values[12],
                     parse_headers(values[13]), None if values[14] is None or values[14] < 0 else int(values[14]))


def _kept(data: bytes | None, limit: int | None) -> tuple[bytes | None, int | None, str | None]:
    """``data`` as the ledger keeps it, with its size and SHA-256 if it was cut."""
    if data is None or limit is None or len(data) <= limit:
        return data, None, None
    return data[:limit], len(data), hashlib.sha256(data).hexdigest()


RECORD_COLUMNS = ("record_key, record_value, record_key_bytes, record_key_sha256, record_value_bytes, "
                  "record_value_sha256, record_headers")


def _record_params(record: SourceRecord, *, whole: bool) -> tuple[list, int]:
    """The record's columns (``RECORD_COLUMNS``) and about how many bytes they take in a statement."""
    key, key_bytes, key_sha = _kept(record.key, KEPT_WHEN_CUT)
    value, value_bytes, value_sha = _kept(record.value, None if whole else KEPT_WHEN_CUT)
    headers = headers_json(record.headers)
    size = 2 * (len(key or b"") + len(value or b"")) + len(headers) + 512
    return [key, value, key_bytes, key_sha, value_bytes, value_sha, headers], size


async def record(execute: Execute, letters: Sequence[DeadLetter], *, group: str, retry_after_seconds: int) -> None:
    """One row per letter, keyed by the consumer group and the record's source (topic,
    partition, offset and timestamp: a topic deleted and created again reuses offsets,
    not timestamps). A letter that is not retriable is for a person at once (``manual``);
    a retriable one waits ``retry_after_seconds`` for the compensator (``open``), or less when its
    error knows when a retry may help (``DeadLetter.retry_in``).

    Writing the same letter again (a replay after a crash) adds no row; if it comes back
    for another reason while the row is unsettled (open or manual), the row takes the new
    reason, message and retry (the order moved on: a waybill that was late is now one that
    may exist for a cancelled order, and that needs a person). The row keeps the record
    (see ``KEPT_WHEN_CUT``), so it can be shown and run again without the topic; the letters
    are written in statements of at most about ``STATEMENT_BYTES``. The letters' orders are
    marked ``has_dead_letters``: their next move, in a later batch, flags these rows
    ``may_be_superseded``. Every row that now holds its letter's reason and message is in that
    cause's error group (``groups.regroup``, same transaction)."""
    rows: list[tuple[str, list, int]] = []
    for letter in letters:
        # Due when a retry may help, if its error says sooner than ``retry_after_seconds`` (a
        # lease's end, an unknown outcome's settle), at least a second from now.
        wait = retry_after_seconds if letter.retry_in is None else min(retry_after_seconds, max(letter.retry_in, 1.0))
        due = f"NOW(3) + INTERVAL {int(wait * 1_000_000)} MICROSECOND"
        source = letter.record
        kept, size = _record_params(source, whole=letter.order_no is not None)
        status = LedgerStatus.OPEN if letter.retriable else LedgerStatus.MANUAL
        rows.append((f"(%s, %s, %s, %s, %s, %s, %s, %s, {int(status)}, %s, %s, %s, %s, "
                     f"{due if letter.retriable else 'NULL'}, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
                     "NOW(3), NOW(3))",
                     [source.topic, source.partition, source.offset,
                      -1 if source.timestamp_ms is None else source.timestamp_ms, group, letter.order_no,
                      letter.event_id, letter.biz_key, letter.reason[:64], letter.message[:1024], letter.retriable,
                      letter.attempts, letter.may_be_superseded, letter.truncated, letter.worker_id,
                      letter.first_failure_at.replace(tzinfo=None), *kept], size))
    # ON DUPLICATE KEY UPDATE assignments run left to right, each seeing the ones before it:
    # ``status`` and ``reason``, which the condition reads, come last, ``reason`` at the very end
    # (the new status is open or manual, so the condition still holds when ``reason`` is set).
    changed = f"status IN ({int(LedgerStatus.OPEN)}, {int(LedgerStatus.MANUAL)}) AND reason <> VALUES(reason)"
    update = ", ".join(f"{column} = IF({changed}, VALUES({column}), {column})"
                       for column in ("message", "retriable", "next_retry_at", "attempts", "gmt_modified", "status",
                                      "reason"))
    for chunk in _chunks(rows, STATEMENT_BYTES):
        await execute(
            "INSERT INTO t_compensation (src_topic, src_partition, src_offset, src_timestamp, consumer_group, "
            "order_no, event_id, biz_key, status, reason, message, retriable, attempts, next_retry_at, "
            f"may_be_superseded, truncated, worker_id, first_failure_at, {RECORD_COLUMNS}, gmt_create, gmt_modified) "
            f"VALUES {', '.join(sql for sql, _, _ in chunk)} ON DUPLICATE KEY UPDATE {update}",
            [value for _, params, _ in chunk for value in params])
    await _group_letters(execute, letters, group)
    order_nos = sorted({letter.order_no for letter in letters if letter.order_no})
    if order_nos:
        await orders.mark_dead_letters(execute, order_nos)


async def _group_letters(execute: Execute, letters: Sequence[DeadLetter], group: str) -> None:
    """The error group of every row that now holds its letter's reason and message (a new row, or
    one that came back for another reason); a replay's row already has it."""
    written = {SourceKey(group, s.topic, s.partition, s.offset, -1 if s.timestamp_ms is None else s.timestamp_ms):
               (letter.reason[:64], letter.message[:1024]) for letter in letters for s in (letter.record,)}
    rows = await groups.by_source(execute, group, sorted(written, key=lambda k: (k.topic, k.partition, k.offset)))
    await groups.regroup(execute, [row for source, row in rows.items() if (row.reason, row.message) == written[source]])


def _chunks(rows: list[tuple[str, list, int]], budget: int):
    chunk: list[tuple[str, list, int]] = []
    used = 0
    for row in rows:
        if chunk and used + row[2] > budget:
            yield chunk
            chunk, used = [], 0
        chunk.append(row)
        used += row[2]
    if chunk:
        yield chunk


async def flag_overtaken(execute: Execute, order_nos: Sequence[str], batch_keys: Sequence[str]) -> None:
    """Dead letters of these orders now have later events that ran after them (but a letter
    is never overtaken by its own event, run again in this batch)."""
    sql = Sql()          # parameters fill the placeholders in the order they are built: build in text order
    where = f"WHERE order_no IN ({sql.list(order_nos)}) AND may_be_superseded = 0"
    spare = f" AND (biz_key IS NULL OR biz_key NOT IN ({sql.list(batch_keys)}))" if batch_keys else ""
    await execute(f"UPDATE t_compensation SET may_be_superseded = 1, gmt_modified = NOW(3) {where}{spare}", sql.params)


# -- the compensator's statements -----------------------------------------------------

async def find(execute: Execute, source: SourceKey) -> LedgerRow | None:
    result = await execute(
        f"SELECT {COLUMNS} FROM t_compensation WHERE consumer_group = %s AND src_topic = %s AND src_partition = %s "
        "AND src_offset = %s AND src_timestamp = %s",
        [source.group, source.topic, source.partition, source.offset, source.timestamp_ms])
    found = result.first()
    return None if found is None else row_of(found)


async def get(execute: Execute, row_id: int, *, group: str | None = None, lock: bool = False) -> LedgerRow | None:
    """Row ``row_id``; with ``group``, only if it is that consumer group's."""
    scope = " AND consumer_group = %s" if group is not None else ""
    result = await execute(f"SELECT {COLUMNS} FROM t_compensation WHERE id = %s{scope}" + (" FOR UPDATE" if lock else ""),
                           [row_id] + ([group] if group is not None else []))
    found = result.first()
    return None if found is None else row_of(found)


async def add_manual(execute: Execute, source: SourceKey, record_: SourceRecord, reason: str, message: str) -> None:
    """A row for a dead letter that has none, or that cannot be read: for a person. Its
    record is kept like any letter's (a value that may be an event up to 4 MiB whole), and
    it joins the error group of its reason and message."""
    kept, _ = _record_params(record_, whole=record_.value is not None and len(record_.value) <= WHOLE_VALUE_MAX)
    await execute(
        "INSERT INTO t_compensation (src_topic, src_partition, src_offset, src_timestamp, consumer_group, status, "
        f"reason, message, retriable, attempts, first_failure_at, {RECORD_COLUMNS}, "
        f"gmt_create, gmt_modified) VALUES (%s, %s, %s, %s, %s, {int(LedgerStatus.MANUAL)}, %s, %s, 0, 0, NOW(3), "
        "%s, %s, %s, %s, %s, %s, %s, NOW(3), NOW(3)) ON DUPLICATE KEY UPDATE src_offset = src_offset",
        [source.topic, source.partition, source.offset, source.timestamp_ms, source.group, reason, message[:1024],
         *kept])
    rows = await groups.by_source(execute, source.group, [source])
    await groups.regroup(execute, [row for row in rows.values() if (row.reason, row.message) == (reason, message[:1024])])


ABANDONED = f"(status = {int(LedgerStatus.RETRYING)} AND lease_until < NOW(3))"


def _claimable(allowed: frozenset[LedgerStatus]) -> str:
    """The statuses of ``allowed`` a claim may start from, as SQL (``-1``: none of them may)."""
    return ", ".join(str(int(s)) for s in sorted(allowed) if ledger_move_allowed(s, LedgerStatus.RETRYING)) or "-1"


async def claim(execute: Execute, row_id: int, owner: str, lease_seconds: float,
                allowed: frozenset[LedgerStatus]) -> bool:
    """From one of ``allowed``, or a retrying row whose claim ran out, to retrying; True if it
    is ours now."""
    lease_us = int(lease_seconds * 1_000_000)
    await execute(
        f"UPDATE t_compensation SET status = {int(LedgerStatus.RETRYING)}, owner = %s, "
        f"lease_until = NOW(3) + INTERVAL {lease_us} MICROSECOND, gmt_modified = NOW(3) WHERE id = %s "
        f"AND (status IN ({_claimable(allowed)}) OR {ABANDONED})", [owner, row_id])
    # Affected-row counts say nothing (CLIENT_FOUND_ROWS): read the owner back.
    result = await execute("SELECT owner FROM t_compensation WHERE id = %s", [row_id])
    found = result.first()
    return found is not None and found[0] == owner


async def next_due(execute: Execute, group: str) -> float | None:
    """Seconds until the group's next row comes due (0 if one is), or None when none waits: the
    earliest retry of an open retriable row, and the earliest end of a retrying row's claim. Each
    read walks ``idx_status_next_retry`` or ``idx_status_id``: the first row of the group."""
    found = []
    for sql in (f"SELECT TIMESTAMPDIFF(MICROSECOND, NOW(3), next_retry_at) FROM t_compensation "
                f"WHERE status = {int(LedgerStatus.OPEN)} AND retriable = 1 AND consumer_group = %s "
                "ORDER BY next_retry_at LIMIT 1",
                f"SELECT TIMESTAMPDIFF(MICROSECOND, NOW(3), MIN(lease_until)) FROM t_compensation "
                f"WHERE status = {int(LedgerStatus.RETRYING)} AND consumer_group = %s"):
        value = (await execute(sql, [group])).scalar()
        if value is not None:
            found.append(max(int(value), 0) / 1e6)
    return min(found, default=None)


async def claim_due(execute: Execute, group: str, limit: int, owner: str, lease_seconds: float) -> list[LedgerRow]:
    """Claim up to ``limit`` of the group's rows to work now: retrying rows whose claim ran out
    (their claimer died), then open retriable rows whose retry is due, oldest due first. Rows
    another transaction is claiming are skipped, not waited for (``SKIP LOCKED``): every worker
    drains at once, none twice. Each read walks ``idx_status_next_retry`` in order."""
    lease_us = int(lease_seconds * 1_000_000)
    ids: list[int] = []
    for where, order in ((ABANDONED, "lease_until"),
                         (f"status = {int(LedgerStatus.OPEN)} AND next_retry_at <= NOW(3) AND retriable = 1",
                          "next_retry_at")):
        if len(ids) >= limit:
            break
        result = await execute(
            f"SELECT id FROM t_compensation WHERE {where} AND consumer_group = %s ORDER BY {order}, id "
            f"LIMIT {int(limit - len(ids))} FOR UPDATE SKIP LOCKED", [group])
        ids += [row[0] for row in result]
    return await _take(execute, ids, owner, lease_us)


async def _take(execute: Execute, ids: list[int], owner: str, lease_us: int) -> list[LedgerRow]:
    """Rows the caller has locked (``FOR UPDATE``) become ``owner``'s claim; the claimed rows."""
    if not ids:
        return []
    await execute(
        f"UPDATE t_compensation SET status = {int(LedgerStatus.RETRYING)}, owner = %s, "
        f"lease_until = NOW(3) + INTERVAL {lease_us} MICROSECOND, gmt_modified = NOW(3) "
        f"WHERE id IN ({marks(len(ids))})", [owner, *ids])
    result = await execute(f"SELECT {COLUMNS} FROM t_compensation WHERE id IN ({marks(len(ids))}) AND owner = %s "
                           "ORDER BY id", [*ids, owner])
    return [row_of(values) for values in result]


async def settle(execute: Execute, row_id: int, owner: str, status: LedgerStatus, *, redrives: int,
                 retry_in: float | None, message: str, reason: str | None) -> bool:
    """retrying -> where the attempt left it, fenced on the owner. A row left open is retriable
    (it is due for another run); a row that failed for a reason of its own takes that reason
    (the caller then moves it to that reason's error group: ``groups.regroup``)."""
    if not ledger_move_allowed(LedgerStatus.RETRYING, status):     # a caller's mistake: the table forbids it
        raise ValueError(f"a retrying ledger row cannot be settled as {status.name.lower()} (LEDGER_TRANSITIONS)")
    retry = "NULL" if retry_in is None else f"NOW(3) + INTERVAL {int(retry_in * 1_000_000)} MICROSECOND"
    result = await execute(
        f"UPDATE t_compensation SET status = %s, redrives = %s, next_retry_at = {retry}, owner = NULL, "
        "lease_until = NULL, message = %s, retriable = %s, reason = COALESCE(%s, reason), gmt_modified = NOW(3) "
        f"WHERE id = %s AND owner = %s AND status = {int(LedgerStatus.RETRYING)}",
        [int(status), redrives, message[:1024], status is LedgerStatus.OPEN, None if reason is None else reason[:64],
         row_id, owner])
    return result.rowcount == 1


async def move(execute: Execute, row_id: int, to: LedgerStatus, allowed: frozenset[LedgerStatus]) -> bool:
    """A person's action: to ``to`` from one of ``allowed`` that the ledger's state machine lets
    move there (the caller holds the row locked)."""
    allowed = frozenset(s for s in allowed if ledger_move_allowed(s, to))
    if not allowed:
        return False
    result = await execute(
        f"UPDATE t_compensation SET status = %s, next_retry_at = NULL, gmt_modified = NOW(3) "
        f"WHERE id = %s AND status IN ({marks(len(allowed))})", [int(to), row_id, *sorted(int(s) for s in allowed)])
    return result.rowcount == 1


async def audit(execute: Execute, row_id: int, *, actor: str, action: str, from_status: LedgerStatus | None,
                to_status: LedgerStatus | None, note: str | None, detail: str | None,
                job_id: int | None = None) -> None:
    """One line of the row's history; ``job_id``: the bulk job that did it, if one did."""
    await execute(
        "INSERT INTO t_compensation_audit (compensation_id, at, actor, action, from_status, to_status, note, detail, "
        "job_id) VALUES (%s, NOW(3), %s, %s, %s, %s, %s, %s, %s)",
        [row_id, actor[:128], action[:32], None if from_status is None else int(from_status),
         None if to_status is None else int(to_status), None if note is None else note[:1024],
         None if detail is None else detail[:1024], job_id])


# -- a bulk job's statements ----------------------------------------------------------

async def get_many(execute: Execute, row_ids: Sequence[int], *, group: str) -> list[LedgerRow]:
    if not row_ids:
        return []
    result = await execute(f"SELECT {COLUMNS} FROM t_compensation WHERE id IN ({marks(len(row_ids))}) "
                           "AND consumer_group = %s ORDER BY id", [*row_ids, group])
    return [row_of(values) for values in result]


async def claim_many(execute: Execute, row_ids: Sequence[int], owner: str, lease_seconds: float, *, group: str,
                     allowed: frozenset[LedgerStatus]) -> list[LedgerRow]:
    """Claim those of ``row_ids`` that are in one of ``allowed`` (or retrying with a claim that
    ran out), skipping rows another transaction is claiming; the rows that are ours now."""
    if not row_ids:
        return []
    lease_us = int(lease_seconds * 1_000_000)
    result = await execute(
        f"SELECT id FROM t_compensation WHERE id IN ({marks(len(row_ids))}) AND consumer_group = %s "
        f"AND (status IN ({_claimable(allowed)}) OR {ABANDONED}) "
        "FOR UPDATE SKIP LOCKED", [*row_ids, group])
    return await _take(execute, [row[0] for row in result], owner, lease_us)
