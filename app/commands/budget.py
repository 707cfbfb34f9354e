"""``faust -A app budget``: the dedup store's capacity model for a rate, printed.

    faust -A app budget --rate 520 --partitions 48 --workers 16 --retention-days 90
    faust -A app budget --current          # also t_idem as it is now: rows, bytes per row, watermark

Every option defaults to the settings (``CAPACITY_EVENTS_PER_SECOND``, ``ORDER_EVENT_PARTITIONS``,
``IDEM_RETENTION_DAYS``...); the model is ``app.pipeline.capacity``'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import faust
from faust.cli import AppCommand, option

from app.adapters.mysql.partitions import Partitions
from app.commands import database_explained
from app.injection import Wire
from app.pipeline.capacity import Budget
from app.settings import Settings


def _n(value: float) -> str:
    return f"{value:,.0f}"


def _bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:,.1f} {unit}"
        value /= 1024
    return f"{value:,.1f} TiB"


def render(b: Budget, *, budget_rows: int, current: tuple[int, float] | None = None) -> str:
    i = b.inputs
    per_day = i.rate * 86_400
    lines = [
        f"inputs: {i.rate:g} events/s on average ({_n(per_day)} a day), {i.peak_rate:g}/s at the peak, a worker "
        f"at most {_n(i.worker_max_rate)}/s; {i.partitions} partitions, {i.workers} worker(s); {i.keys_per_event:g} "
        f"t_idem rows per event; commits every {i.commit_interval:g} s or {_n(i.commit_every)} acks; batches of "
        f"up to {i.batch_size} within {i.batch_within:g} s",
        "",
        "replay window W (events delivered again and found done in t_idem)",
        "  lower bound, one worker killed (kill -9, OOM), r = the events/s it processed:",
        f"    W <= min(r x {i.commit_interval:g} s, {_n(i.commit_every)}) in whole batches + the batch in flight, "
        f"a batch being min({i.batch_size}, r x {i.batch_within:g} s) events",
        f"    keeping up at the peak (r = {i.peak_rate / max(i.workers, 1):,.0f}/s): W <= {_n(b.w_kill)} events "
        f"(about {_n(b.w_kill_typical)} on average)",
        f"    working off a backlog (r = {_n(i.worker_max_rate)}/s):  W <= {_n(b.w_kill_backlog)} events",
        f"    every worker killed at once, at the peak:    W <= {_n(b.w_kill_all)} events",
        "  a clean stop (SIGTERM) or a rebalance: W = 0 (the batch in flight finishes and is committed)",
        f"  max.poll.records ({i.max_poll_records}) bounds one fetch, not W: fetched records not processed yet "
        "come again without being found done",
        f"  upper bound, offsets lost (stopped longer than the offsets retention, or reset): everything the topic "
        f"still holds, {_n(b.w_outage_per_hour)} events per hour of the stop; {_n(b.w_offsets_expired)} after "
        f"{i.offsets_retention_days:g} days",
        f"  t_idem rows the worst kill's replay reads again: {_n(b.replay_rows)} (they must still be there)",
        "",
        "retention",
        f"  needed: max(offsets retention {i.offsets_retention_days:g} d, outage SLA {i.outage_sla_days:g} d, "
        f"dead-letter window {i.dead_letter_days:g} d) x {i.safety:g} = {b.retention_needed_days:g} days",
        f"  configured: IDEM_RETENTION_DAYS={i.retention_days:g}: "
        + ("enough" if b.retention_ok else "TOO SHORT: a replay after a long outage would be refused "
                                          "(beyond_dedup_retention) instead of deduplicated"),
        "",
        "size (every step key of every event of the retention, plus up to a month: partitions go whole)",
        f"  rows:  {_n(per_day * i.keys_per_event)} a day x ({i.retention_days:g} + 31) days = {_n(b.rows)}",
        f"  bytes: {_n(b.rows)} x {i.row_bytes:g} B = {_bytes(b.bytes)}",
        f"  budget (order_idem_capacity_budget_rows, the watermark's divisor): {_n(budget_rows)}"
        + (" (IDEM_CAPACITY_BUDGET_ROWS)" if budget_rows != b.rows else " (the model's rows)"),
    ]
    if current is not None:
        rows, row_bytes = current
        lines += ["", f"now: t_idem holds ~{_n(rows)} rows ({row_bytes:,.0f} B per row as InnoDB reports it); "
                      f"watermark {rows / budget_rows:.3f}"]
    return "\n".join(lines)


OPTIONS = (
    option("--rate", type=float, help="average events/s over a day (CAPACITY_EVENTS_PER_SECOND)"),
    option("--peak-rate", "peak_rate", type=float,
           help="the group's events/s at the busiest hour (CAPACITY_PEAK_EVENTS_PER_SECOND)"),
    option("--worker-max-rate", "worker_max_rate", type=float,
           help="events/s one worker reaches working off a backlog (20,000)"),
    option("--partitions", type=int, help="order-event partitions (ORDER_EVENT_PARTITIONS)"),
    option("--workers", type=int, help="workers in the group (1)"),
    option("--retention-days", "retention_days", type=float, help="IDEM_RETENTION_DAYS"),
    option("--keys-per-event", "keys_per_event", type=float, help="t_idem rows per event (the most any "
                                                                  "event type writes)"),
    option("--row-bytes", "row_bytes", type=float, help="bytes per t_idem row (CAPACITY_ROW_BYTES)"),
    option("--outage-sla-days", "outage_sla_days", type=float, help="CAPACITY_OUTAGE_SLA_DAYS"),
    option("--offsets-retention-days", "offsets_retention_days", type=float,
           help="KAFKA_OFFSETS_RETENTION_DAYS"),
    option("--current/--no-current", default=False, help="also read t_idem's size now from the database"),
)


async def budget(cmd: AppCommand, current: bool, *, settings: Settings, capacity: Callable[..., Budget],
                 opened: Callable[[], AbstractAsyncContextManager], idem_partitions: Partitions,
                 **overrides) -> None:
    """Print the replay window, retention and size model of the dedup store."""
    model = capacity(**overrides)
    budget_rows = settings.operations.idem_capacity_budget_rows or model.rows
    now = None
    if current:
        async with database_explained(settings), opened():
            now = await asyncio.wait_for(idem_partitions.size(), 30)
    cmd.say(render(model, budget_rows=budget_rows, current=now))


def register(app: faust.App, wire: Wire) -> None:
    app.command(*OPTIONS)(wire(budget))
