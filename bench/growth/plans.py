"""``EXPLAIN PARTITIONS`` and ``ANALYZE`` of a statement, and what makes its plan a finding."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass, field

from harness.services import connect

# A statement that reads this many rows (ANALYZE's r_rows), or walks a whole table or index
# (type ALL or index) past FULL_SCAN_ROWS, is reported as a finding.
SCAN_ROWS = 100_000
FULL_SCAN_ROWS = 1_000


@dataclass
class Plan:
    name: str
    sql: str                                  # as sent, values in place (long IN lists shortened)
    explain: list[dict] = field(default_factory=list)
    analyze: list[dict] = field(default_factory=list)
    finding: str | None = None

    def as_dict(self) -> dict:
        return {"name": self.name, "sql": self.sql, "explain": self.explain, "analyze": self.analyze,
                "finding": self.finding}


def _shorten(sql: str, limit: int = 600) -> str:
    return sql if len(sql) <= limit else sql[:limit] + f" ... ({len(sql):,} characters)"


def explain(url: str, name: str, sql: str, params: Sequence) -> Plan:
    """``EXPLAIN PARTITIONS`` and ``ANALYZE`` (run, with the rows read) of one statement."""
    with closing(connect(url)) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION time_zone = '+00:00'")
        text = cur.mogrify(sql, tuple(params)) if params else sql
        cur.execute("EXPLAIN PARTITIONS " + text)
        plan = [dict(row) for row in cur.fetchall()]
        cur.execute("ANALYZE " + text)
        analyzed = [dict(row) for row in cur.fetchall()]
    result = Plan(name, _shorten(text), plan, analyzed)
    result.finding = _scan(result)
    return result


def _scan(plan: Plan) -> str | None:
    """Whether the statement reads the table rather than an index range. Judged on the rows
    ANALYZE counted (EXPLAIN's estimate ignores LIMIT: a keyset page of 50 may be estimated at
    half the table): a full table or index scan (type ALL or index) that read more than
    ``FULL_SCAN_ROWS`` rows, or any access that read ``SCAN_ROWS`` or more."""
    problems = []
    for est, run in zip(plan.explain, plan.analyze or plan.explain):
        table = str(est.get("table") or "")
        if table.startswith("<") or not table:
            continue                          # a derived table or a subquery's result: bounded by its LIMIT
        rows = _int(est.get("rows")) or 0
        counted = _int(run.get("r_rows"))
        read = counted if counted is not None else rows
        what = f"~{rows:,} rows estimated" + (f", {counted:,} read" if counted is not None else "")
        if est.get("type") in ("ALL", "index") and read > FULL_SCAN_ROWS:
            problems.append(f"{table}: type {est['type']} (the whole "
                            f"{'table' if est['type'] == 'ALL' else 'index ' + str(est.get('key'))}), {what}")
        elif read >= SCAN_ROWS:
            problems.append(f"{table}: type {est.get('type')} key {est.get('key')}, {what}")
    return "; ".join(problems) or None


def _int(value) -> int | None:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def plan_lines(plan: Plan) -> list[str]:
    """The plan as aligned text lines: EXPLAIN's columns, with ANALYZE's r_rows beside rows."""
    cols = ("id", "select_type", "table", "partitions", "type", "key", "key_len", "rows", "r_rows", "Extra")
    table = []
    for est, run in zip(plan.explain, plan.analyze or [{}] * len(plan.explain)):
        row = dict(est)
        row["r_rows"] = run.get("r_rows")
        parts = str(row.get("partitions") or "")
        if parts.count(",") >= 3:
            names = parts.split(",")
            row["partitions"] = f"{names[0]},...,{names[-1]} ({len(names)})"
        table.append(["" if row.get(c) is None else str(row.get(c)) for c in cols])
    widths = [max(len(c), *(len(r[i]) for r in table)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in table]
    return lines
