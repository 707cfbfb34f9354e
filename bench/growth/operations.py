"""The operations at size, timed: the sweep, the gauges, the queue's lists and counts, a claim read, month drops."""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import date
from typing import Any

from bench.growth.plans import Plan, explain
from bench.growth.planted import (
    ATTEMPT_CAP,
    PLANTED_LETTERS,
    STUCK_OVER_CAP,
    STUCK_ROWS,
    ledger_statement,
    planted_letters_statement,
    stuck_statement,
)
from bench.growth.prefill import rows_by_day, run_sql, table_size
from bench.growth.recording import execute_recorder, statements_of

DROP_MONTHS = 3

async def timed(name: str, repeat: int, call: Callable[[], Awaitable[Any]],
                summary: Callable[[Any], Any] = lambda r: None) -> dict:
    samples = []
    result = None
    for _ in range(repeat):
        started = time.perf_counter()
        result = await call()
        samples.append((time.perf_counter() - started) * 1000)
    return {"name": name, "n": repeat, "first_ms": samples[0], "p50_ms": statistics.median(samples),
            "max_ms": max(samples), "min_ms": min(samples), "result": summary(result)}


async def operations(url: str, settings, *, group: str, today: date, ledger_rows: int, repeat: int,
                     prefill_rows: int, claim_records: Sequence[tuple[bytes, bytes]]) -> dict:
    """Fill the ledger, plant stuck rows, then time and EXPLAIN the sweep, the gauges, the
    compensation list and a claim read, and drop the oldest months. See the module docstring."""
    from app.adapters.mysql import MySqlStore, idem
    from app.adapters.mysql.engine import create_engine
    from app.adapters.mysql.ledger.selection import QueueFilter
    from app.adapters.mysql.partitions import Partitions, month_start
    from app.adapters.mysql.reads.backlog import Watch
    from app.adapters.mysql.reads.console import Queries
    from app.pipeline.events import decode
    from app.pipeline.plan import step_keys
    from app.pipeline.states import LedgerStatus as Status
    from app.timers.stuck import Sweep

    doc: dict[str, Any] = {"group": group}
    started = time.perf_counter()
    if ledger_rows:
        run_sql(url, [ledger_statement(ledger_rows, group)])
    run_sql(url, [planted_letters_statement(group), "ANALYZE TABLE t_compensation"])
    doc["ledger_fill_seconds"] = time.perf_counter() - started
    by_status = {int(s): int(n) for s, n in run_sql(url, ["SELECT status, COUNT(*) FROM t_compensation GROUP BY status"])}
    doc["ledger"] = table_size(url, "t_compensation", exact_rows=sum(by_status.values()))
    doc["ledger"]["by_status"] = by_status
    run_sql(url, [stuck_statement(today)])
    doc["stuck_planted"] = {"pending": STUCK_ROWS, "over_cap": STUCK_OVER_CAP,
                            "letters_past_sla": {Status(s).name.lower(): n for s, n in PLANTED_LETTERS.items()}}
    print(f"  ledger: {sum(doc['ledger']['by_status'].values()):,} rows in {doc['ledger_fill_seconds']:.0f}s; "
          f"{STUCK_ROWS} stuck t_idem rows planted", flush=True)

    engine = create_engine(settings, url=url, pool_size=2, max_overflow=0)
    store = MySqlStore(engine)
    watch, queries = Watch(store), Queries(store, group=group)
    sweep_kw = dict(group=group, stuck_after=600, attempt_cap=ATTEMPT_CAP, sla=1800, limit=1000,
                    console_url="http://x", webhook=None)
    gauges_kw = dict(group=group, stuck_after_seconds=600, attempt_cap=ATTEMPT_CAP)
    newest = (await queries.compensations(QueueFilter(limit=50)))
    page_before = newest[-1]["id"] if newest else 1
    open_first = await queries.compensations(QueueFilter(status=Status.OPEN, limit=50))
    open_before = open_first[-1]["id"] if open_first else 1
    lists = {
        "compensations: no filter (newest 50)": QueueFilter(),
        "compensations: next page (before_id)": QueueFilter(before_id=page_before),
        "compensations: status=open": QueueFilter(status=Status.OPEN),
        "compensations: status=open, next page": QueueFilter(status=Status.OPEN, before_id=open_before),
        "compensations: status=manual": QueueFilter(status=Status.MANUAL),
        "compensations: reason=effect_unavailable (40 % of rows)": QueueFilter(reason="effect_unavailable"),
        "compensations: reason=payload_mismatch (no rows)": QueueFilter(reason="payload_mismatch"),
    }
    # The sweep logs an ERROR line per stuck row: kept out of the bench's output, still formatted.
    quiet = logging.getLogger("app.timers.stuck")
    quiet_state = (quiet.propagate, list(quiet.handlers))
    quiet.propagate, quiet.handlers = False, [logging.NullHandler()]
    timings = []
    try:
        timings.append(await timed("stuck sweep: Sweep(...).run()", repeat,
                                   lambda: Sweep(watch, **sweep_kw).run(),
                                   lambda r: {"stuck": r.stuck, "over_cap": r.over_cap,
                                              "sla_breached": r.sla_breached, "manual": r.manual}))
        timings.append(await timed("gauges: Watch.gauges(...)", repeat, lambda: watch.gauges(**gauges_kw),
                                   lambda g: {"stuck_by_step": g.stuck_by_step, "over_cap": g.over_cap,
                                              "compensation_by_status": g.compensation_by_status,
                                              "idem_rows": g.idem_rows}))
        for name, f in lists.items():
            timings.append(await timed(name, repeat, lambda f=f: queries.compensations(f),
                                       lambda rows: {"rows": len(rows)}))
        timings.append(await timed("counts: Queries.counts() (GET /compensation/ runs it with every list)", repeat,
                                   queries.counts, lambda c: c))
    finally:
        quiet.propagate, quiet.handlers = quiet_state
    doc["timings"] = timings

    # -- the plans --
    plans: list[Plan] = []
    stuck_sql = await statements_of(lambda s: Watch(s).stuck(600, 200))
    plans.append(explain(url, "Watch.stuck (the sweep's page)", *stuck_sql[0]))
    after_sql = await statements_of(lambda s: Watch(s).stuck(600, 200, after=(_first_stuck(url), "ORD-")))
    plans.append(explain(url, "Watch.stuck, next page (after)", *after_sql[0]))
    gauge_sql = await statements_of(lambda s: Watch(s).gauges(**gauges_kw))
    for name, (sql, params) in zip(("Watch.gauges: stuck by step", "Watch.gauges: over the attempt cap",
                                    "Watch.gauges: ledger by status"), gauge_sql):
        plans.append(explain(url, name, sql, params))
    late_sql = await statements_of(lambda s: Watch(s).late_letters(group, (Status.OPEN, Status.RETRYING), 1800, 900))
    plans.append(explain(url, "Watch.late_letters (open, retrying)", *late_sql[0]))
    for name, f in lists.items():
        (sql, params), = await statements_of(lambda s, f=f: Queries(s, group=group).compensations(f))
        plans.append(explain(url, f"Queries.{name.replace(': ', ' ', 1)}", sql, params))
    web_stuck = await statements_of(lambda s: Queries(s, group=group).stuck(600, 200))
    plans.append(explain(url, "Queries.stuck (GET /idem/stuck/)", *web_stuck[0]))
    order_no = claim_records[0][0].decode() if claim_records else f"ORD-{today:%Y%m%d}-P000000001"
    of_order = await statements_of(lambda s: Queries(s, group=group).idem_of_order(order_no))
    plans.append(explain(url, "Queries.idem_of_order (an order's t_idem rows, no part_date)", *of_order[0]))
    counts_sql = await statements_of(lambda s: Queries(s, group=group).counts())
    for name, (sql, params) in zip(("Queries.counts: by status", "Queries.counts: unsettled by reason"), counts_sql):
        plans.append(explain(url, name, sql, params))
    # A claim read as T1 sends it: the step keys of one 500-record batch of the workload.
    events = [decode(k, v, max_bytes=1 << 20) for k, v in claim_records[:settings.batches.size]]
    keys = sorted({key for event in events for key in step_keys(event)})
    dates = sorted({event.part_date for event in events})
    recorded: list = []
    await idem.read(execute_recorder(recorded), keys, dates)
    plans.append(explain(url, f"claim read (idem.read, {len(events)} events, {len(keys)} keys)", *recorded[0]))
    doc["plans"] = [p.as_dict() for p in plans]
    doc["findings"] = [{"name": p.name, "finding": p.finding, "sql": p.sql} for p in plans if p.finding]

    # -- the partition drop: the oldest whole months of the pre-fill, one at a time --
    partitions = Partitions(store, hold_seconds=settings.operations.partition_lock_wait_seconds)
    by_day = rows_by_day(prefill_rows, today)
    first_day = min(by_day) if by_day else today
    listed = await partitions.list()
    # A partition holds [the previous one's bound, its own bound): one whole month of the pre-fill.
    months = [(prev.below, p) for prev, p in zip(listed, listed[1:])
              if prev.below is not None and p.below is not None and prev.below >= first_day
              and p.below == month_start(prev.below, 1) and p.below <= today][:DROP_MONTHS]
    drops = []
    for start, part in months:
        below = part.below
        rows = sum(n for day, n in by_day.items() if start <= day < below)
        begun = time.perf_counter()
        await partitions.drop([part.name])
        drops.append({"partition": part.name, "ms": (time.perf_counter() - begun) * 1000, "rows": rows,
                      "rows_estimate": part.rows})
        print(f"  dropped {part.name} ({rows:,} rows) in {drops[-1]['ms']:.0f} ms", flush=True)
    doc["drops"] = drops
    if drops:
        doc["drop_summary"] = {"n": len(drops), "p50_ms": statistics.median(d["ms"] for d in drops),
                               "max_ms": max(d["ms"] for d in drops)}
    await engine.dispose()
    return doc


def _first_stuck(url: str):
    rows = run_sql(url, ["SELECT MIN(gmt_modified) FROM t_idem WHERE status = 1"])
    return rows[0][0]
