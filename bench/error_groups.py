"""What the error-group views cost at a million ledger rows, and what the migration's backfill
of fingerprints costs at that size.

A scratch database is migrated to 0009 (the fingerprint column, nothing filling it), filled
with ``--rows`` dead letters by one ``INSERT ... SELECT`` over MariaDB's SEQUENCE engine
(:func:`fill_statement`): ``len(CAUSES)`` causes, a few huge (one outage of 40 % of the letters
in six hours three days ago, a flaky service all week long) and dozens of small ones, over the
past 7 days, every letter with an order number and an event id of its own in its message;
97 % settled, 2 % open, 0.5 % manual, the rest retrying, plus the newest 3,000 open. Then
``python -m app.admin migrate`` runs migration 0011, which computes every row's fingerprint with
the app's own function and fills the summary (timed). Then, through the app's own
``GroupQueries`` and ``Queries`` on an aiomysql engine, each read the views make is timed
``--repeat`` times: p50, p95, max in ms; and so is the write of a batch's 100 dead letters of
the outage's cause (the ledger rows and their summary, one transaction), after which the
summary must still equal a count of the ledger.

    .venv/bin/python -m bench.error_groups [--rows 1000000] [--repeat 50] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from contextlib import closing
from datetime import UTC, datetime

from app.adapters.mysql.engine import create_engine
from app.adapters.mysql.ledger.selection import QueueFilter
from app.adapters.mysql.reads.console import Queries
from app.adapters.mysql.reads.error_groups import WINDOWS, GroupQueries
from app.adapters.mysql.store import MySqlStore
from app.compensation.fingerprints import fingerprint
from app.pipeline.ports import DeadLetter, SourceRecord
from app.settings import get_settings
from harness.services import ScratchDatabase

GROUP = "bench-groups"
# (reason, message with {o} for the order and {e} for the event id, weight in 1000ths)
HUGE = [
    ("effect_unavailable", "logistics for {o}: answered 503", 400),
    ("effect_unavailable", "logistics for {o}: ClientConnectorError: Cannot connect to host 10.1.2.{n}:8443 "
                           "ssl:default [Connect call failed ('10.1.2.{n}', 8443)]", 250),
    ("effect_outcome_unknown", "SMS for {o}: no answer within {n}.5s; it may have been sent", 120),
    ("precondition_not_met", "event {e} of {o} needs the order PAID, it is CREATED", 80),
]
SMALL_REASONS = ("effect_rejected", "effect_unavailable", "deadline_exceeded", "malformed", "internal_error",
                 "effect_bad_receipt", "unknown_outcome_non_idempotent", "store_error")
SMALL = [(SMALL_REASONS[i % len(SMALL_REASONS)], f"cause {chr(97 + i % 26)}{chr(97 + i // 26)}: {{o}} failed "
          f"with code {400 + i} after {{n}} ms", 0) for i in range(36)]
CAUSES = HUGE + SMALL
SMALL_SHARE = 1000 - sum(w for _, _, w in HUGE)      # 150 in 1000, spread over the small causes
RECENT_OPEN = 3000


def _sql_message(template: str) -> str:
    """The SQL expression of a cause's message: order ``o``, event ``e``, a number ``n`` from ``seq``."""
    parts, rest = [], template
    while rest:
        head, brace, tail = rest.partition("{")
        if head:
            parts.append("'" + head.replace("'", "''") + "'")
        if not brace:
            break
        name, _, rest = tail.partition("}")
        parts.append({"o": "o", "e": "e", "n": "CAST(seq MOD 97 AS CHAR)"}[name])
    return "CONCAT(" + ", ".join(parts) + ")"


def fill_statement(total: int) -> str:
    edges, acc = [], 0
    for _, _, weight in HUGE:
        acc += weight
        edges.append(acc)
    # cause index: by seq MOD 1000 into the huge causes, the rest spread over the small ones
    cause = ("CASE " + " ".join(f"WHEN seq MOD 1000 < {edge} THEN {i}" for i, edge in enumerate(edges))
             + f" ELSE {len(HUGE)} + (seq DIV 1000) MOD {len(SMALL)} END")
    reason = "ELT(c + 1, " + ", ".join(f"'{r}'" for r, _, _ in CAUSES) + ")"
    message = "ELT(c + 1, " + ", ".join(_sql_message(m) for _, m, _ in CAUSES) + ")"
    week = 7 * 86400
    # the first huge cause is one outage (6 hours, 3 days ago); the others all week long
    when = (f"IF(c = 0, UTC_TIMESTAMP(3) - INTERVAL 3 DAY + INTERVAL (seq * 7919) MOD 21600 SECOND, "
            f"UTC_TIMESTAMP(3) - INTERVAL (seq * 7919) MOD {week} SECOND)")
    status = (f"CASE WHEN seq > {total - RECENT_OPEN} THEN 1 WHEN seq MOD 100 < 2 THEN 1 WHEN seq MOD 200 = 3 THEN 4 "
              "WHEN seq MOD 1000 = 7 THEN 2 ELSE 3 END")
    return (
        "INSERT INTO t_compensation (src_topic, src_partition, src_offset, src_timestamp, consumer_group, order_no, "
        "event_id, biz_key, status, reason, message, retriable, attempts, next_retry_at, worker_id, first_failure_at, "
        "gmt_create, gmt_modified) "
        f"SELECT 'order-event', seq MOD 8, seq DIV 8, UNIX_TIMESTAMP(f) * 1000, '{GROUP}', o, e, "
        f"CONCAT(o, ':ORDER_CONFIRM:issue_waybill'), st, {reason}, LEFT({message}, 1024), 1, 3, "
        "IF(st = 1, f + INTERVAL 60 SECOND, NULL), 'worker-1', f, f, f "
        f"FROM (SELECT seq, c, {status} AS st, {when} AS f, "
        "CONCAT('ORD-', DATE_FORMAT(UTC_DATE(), '%Y%m%d'), '-B', LPAD(seq, 9, '0')) AS o, "
        "MD5(CONCAT('event-', seq)) AS e "
        f"FROM (SELECT seq, {cause} AS c FROM seq_1_to_{total}) AS s0) AS s")


def _run(conn, sql: str) -> None:
    with conn.cursor() as cur:
        cur.execute(sql)


async def _time(name: str, read, repeat: int) -> dict:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        await read()
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    p95 = times[min(len(times) - 1, int(round(0.95 * (len(times) - 1))))]
    row = {"read": name, "p50": statistics.median(times), "p95": p95, "max": times[-1]}
    print(f"| {name} | {row['p50']:.1f} | {row['p95']:.1f} | {row['max']:.1f} |", flush=True)
    return row


_written = [0]


async def _write(store: MySqlStore) -> None:
    """100 new letters of the outage's cause, as a batch's dead letters are written."""
    now = datetime.now(UTC)
    base = 10_000_000 + _written[0]
    _written[0] += 100
    letters = [DeadLetter(SourceRecord("order-event", 9, base + i, 1, b"k", b"v"), "effect_unavailable",
                          f"logistics for ORD-20261201-W{base + i}: answered 503", True, 3, now,
                          order_no=f"ORD-20261201-W{base + i}") for i in range(100)]
    await store.in_transaction(lambda tx: tx.record_dead_letters(letters, group=GROUP, retry_after_seconds=60))


async def measure(url: str, repeat: int) -> list[dict]:
    settings = get_settings()
    engine = create_engine(settings, url=url)
    store = MySqlStore(engine)
    groups, queries = GroupQueries(store, group=GROUP), Queries(store, group=GROUP)
    huge = fingerprint(HUGE[0][0], HUGE[0][1].format(o="ORD-20261201-B1", e="x", n=1))
    small = fingerprint(SMALL[5][0], SMALL[5][1].format(o="ORD-20261201-B1", e="x", n=1))
    print("| read | p50 ms | p95 ms | max ms |\n|---|---|---|---|")
    rows = []
    try:
        for window in ("24h", "7d"):
            for status in ("unsettled", "all"):
                rows.append(await _time(f"GET /groups/?window={window}&status={status}",
                                        lambda w=window, s=status: groups.groups(WINDOWS[w],
                                                                                 unsettled_only=s == "unsettled"),
                                        repeat))
        for label, fp in (("huge", huge), ("small", small)):
            rows.append(await _time(f"GET /groups/{{{label} group}}", lambda fp=fp: groups.group(fp), repeat))
            rows.append(await _time(f"GET /compensation/?fingerprint={{{label} group}}: its list (the click-through)",
                                    lambda fp=fp: queries.compensations(QueueFilter(fingerprint=fp)), repeat))
        # The queue view runs these with every list, whatever the filter (not the groups' own work).
        rows.append(await _time("GET /compensation/: the counts beside every list (Queries.counts)",
                                queries.counts, repeat))
        rows.append(await _time("a batch of 100 dead letters of the huge group written (ledger rows and summary)",
                                lambda: _write(store), repeat))
        listing = await groups.groups(WINDOWS["7d"], unsettled_only=False)
        print(f"  {len(listing['groups'])} groups, {sum(g['letters'] for g in listing['groups']):,} letters in 7d, "
              f"queue depth {listing['queue']['depth']:,}")
    finally:
        await engine.dispose()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args()
    db = ScratchDatabase(get_settings().database.url, label="bench_groups").create(migrated=False)
    try:
        db.migrate("0009")
        with closing(db.connect()) as conn:
            started = time.perf_counter()
            _run(conn, fill_statement(args.rows))
            print(f"filled {args.rows:,} ledger rows in {time.perf_counter() - started:.1f}s", flush=True)
        started = time.perf_counter()
        db.migrate("head")
        print(f"migration 0011 (fingerprints and summary of {args.rows:,} rows): "
              f"{time.perf_counter() - started:.1f}s", flush=True)
        with closing(db.connect()) as conn:
            _run(conn, "ANALYZE TABLE t_compensation, t_error_group_hour, t_error_group")
        [check] = db.query("SELECT (SELECT SUM(letters) FROM t_error_group_hour) AS summed, "
                           "(SELECT COUNT(*) FROM t_compensation WHERE fingerprint IS NULL) AS without")
        assert int(check["summed"]) == args.rows and check["without"] == 0, check
        asyncio.run(measure(db.url, args.repeat))
        [check] = db.query("SELECT (SELECT SUM(letters) FROM t_error_group_hour) AS summed, "
                           "(SELECT COUNT(*) FROM t_compensation) AS counted")
        assert check["summed"] == check["counted"], check
    finally:
        if not args.keep:
            db.drop()


if __name__ == "__main__":
    main()
