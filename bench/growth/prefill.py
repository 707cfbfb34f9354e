"""The pre-fill: ``t_idem`` filled with done rows over the past year, its size, its partitions."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from contextlib import closing
from datetime import date, timedelta

import pymysql

from harness.services import connect

PREFILL_CHUNK = 1_000_000
PARTITIONED_AFTER = "0005"                # the revision before migration 0006 (t_idem's partitions)
DAYS = 365
# One order's four t_idem rows, as the pipeline writes them for CREATED, PAID and CONFIRM:
# (event type, step, outcome); the last is the waybill call's effect step.
ROWS_PER_ORDER = (("ORDER_CREATED", "create_order", "applied"), ("ORDER_PAID", "mark_paid", "applied"),
                  ("ORDER_CONFIRM", "mark_confirmed", "applied"), ("ORDER_CONFIRM", "issue_waybill", "waybill_issued"))
OWNER = "worker-1/main/5f0c2a9e"          # what Runtime.owner looks like: <worker id>/<role>/<8 hex>


def run_sql(url: str, statements: Sequence[str]) -> list[tuple]:
    """Run statements on one connection (UTC session, like the app's); the last one's rows."""
    with closing(connect(url)) as conn, conn.cursor(pymysql.cursors.Cursor) as cur:
        cur.execute("SET SESSION time_zone = '+00:00'")
        rows: list[tuple] = []
        for statement in statements:
            cur.execute(statement)
            rows = list(cur.fetchall())
        return rows


def sequence_engine(url: str) -> bool:
    try:
        return [r[0] for r in run_sql(url, ["SELECT seq FROM seq_1_to_3"])] == [1, 2, 3]
    except pymysql.MySQLError:
        return False


def _orders(rows: int) -> int:
    return math.ceil(rows / len(ROWS_PER_ORDER))


def prefill_statement(first: int, last: int, total: int, today: date) -> str:
    """Rows ``first..last`` of ``total``: row ``seq`` is step ``k`` of order ``o``; the orders
    are spread evenly over the 365 days before ``today`` (oldest first, so each monthly
    partition is written in primary-key order), the times of day scattered."""
    orders = _orders(total)
    width = len(ROWS_PER_ORDER)

    def pick(i: int) -> str:
        return "ELT(k, " + ", ".join(f"'{r[i]}'" for r in ROWS_PER_ORDER) + ")"

    return (
        "INSERT INTO t_idem (biz_key, part_date, step, status, attempt, owner, lease_until, idem_token, "
        "payload_hash, outcome, last_err, gmt_create, gmt_modified) "
        f"SELECT CONCAT('ORD-', DATE_FORMAT(d, '%Y%m%d'), '-P', LPAD(o, 9, '0'), ':', {pick(0)}, ':', {pick(1)}), "
        f"d, {pick(1)}, 2, 1, '{OWNER}', NULL, IF(k = {width}, MD5(CONCAT('token-', seq)), NULL), "
        f"SHA2(CONCAT(o, ':', k), 256), {pick(2)}, NULL, "
        # the order's events a minute and a half apart; the waybill 45 ms after its claim
        "TIMESTAMP(d) + INTERVAL (((o * 7919) MOD 86400000) * 1000 + (k - 1) * 90000000) MICROSECOND, "
        f"TIMESTAMP(d) + INTERVAL (((o * 7919) MOD 86400000) * 1000 + (k - 1) * 90000000 "
        f"+ IF(k = {width}, 45000, 0)) MICROSECOND "
        f"FROM (SELECT seq, (seq - 1) DIV {width} AS o, (seq - 1) MOD {width} + 1 AS k, "
        f"DATE'{today.isoformat()}' - INTERVAL ({DAYS} - ((seq - 1) DIV {width}) * {DAYS} DIV {orders}) DAY AS d "
        f"FROM seq_{first}_to_{last}) AS s")


def rows_by_day(total: int, today: date) -> dict[date, int]:
    """How many pre-filled rows each day holds (the same arithmetic as the statement)."""
    orders, width = _orders(total), len(ROWS_PER_ORDER)
    counts = {}
    for j in range(DAYS):
        lo, hi = -(-j * orders // DAYS), -(-(j + 1) * orders // DAYS)      # orders with o * 365 // orders == j
        rows = max(0, min(width * hi, total) - width * lo)
        if rows:
            counts[today - timedelta(days=DAYS - j)] = rows
    return counts


def prefill(url: str, total: int, today: date, chunk: int = PREFILL_CHUNK) -> dict:
    """``total`` done rows into ``t_idem``, then ``ANALYZE TABLE``. Returns the times."""
    started = time.perf_counter()
    inserted = 0
    with closing(connect(url)) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION time_zone = '+00:00'")
        for first in range(1, total + 1, chunk):
            last = min(first + chunk - 1, total)
            inserted += cur.execute(prefill_statement(first, last, total, today))
            print(f"  pre-fill: {inserted:,} of {total:,} rows, {time.perf_counter() - started:.0f}s", flush=True)
        insert_seconds = time.perf_counter() - started
        analyze_started = time.perf_counter()
        cur.execute("ANALYZE TABLE t_idem")
        cur.fetchall()
        analyze_seconds = time.perf_counter() - analyze_started
    return {"rows": inserted, "insert_seconds": insert_seconds, "analyze_seconds": analyze_seconds,
            "seconds": insert_seconds + analyze_seconds, "chunk": chunk, "days": DAYS,
            "first_day": (today - timedelta(days=DAYS)).isoformat(), "last_day": (today - timedelta(days=1)).isoformat()}


def table_size(url: str, table: str = "t_idem", exact_rows: int | None = None) -> dict:
    """InnoDB's figures for ``table`` from information_schema (no scan): the estimated rows,
    data and index bytes, and the files' sizes; bytes per row over ``exact_rows`` if given."""
    (rows, data, index, parts), = run_sql(url, [
        "SELECT COALESCE(SUM(TABLE_ROWS), 0), COALESCE(SUM(DATA_LENGTH), 0), COALESCE(SUM(INDEX_LENGTH), 0), "
        "COUNT(*) FROM information_schema.PARTITIONS "
        f"WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{table}'"])
    try:        # needs the PROCESS privilege, which the app's user may not have
        files = int(run_sql(url, [
            "SELECT COALESCE(SUM(FILE_SIZE), 0) FROM information_schema.INNODB_SYS_TABLESPACES "
            f"WHERE NAME = CONCAT(DATABASE(), '/{table}') OR NAME LIKE CONCAT(DATABASE(), '/{table}#P#%')"])[0][0])
    except pymysql.MySQLError:
        files = None
    total = int(data) + int(index)
    count = exact_rows if exact_rows is not None else int(rows)
    return {"table": table, "rows_estimate": int(rows), "rows": count, "data_bytes": int(data),
            "index_bytes": int(index), "bytes": total, "bytes_per_row": total / count if count else None,
            "file_bytes": files, "partitions": int(parts)}


def restore_partitions(url: str) -> list[str]:
    """``t_idem``'s monthly partitions as a fresh database has them. A worker's partition
    maintenance drops the months past IDEM_RETENTION_DAYS (90 by default): after the c rows
    the scratch table starts three months back, and its first partition would swallow nine
    months of the pre-fill. Migration 0006 is undone and done again (instant on the empty table).
    Returns the partitions' names."""
    from harness.services import migrate
    if run_sql(url, ["SELECT COUNT(*) FROM t_idem"])[0][0]:
        raise RuntimeError("t_idem is not empty: its partitions are not laid out again under rows")
    migrate(url, PARTITIONED_AFTER, down=True)
    migrate(url)
    return partition_names(url)


def partition_names(url: str) -> list[str]:
    return [r[0] for r in run_sql(url, [
        "SELECT PARTITION_NAME FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = DATABASE() "
        "AND TABLE_NAME = 't_idem' ORDER BY PARTITION_ORDINAL_POSITION"]) if r[0]]
