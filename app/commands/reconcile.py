"""``faust -A app reconcile --from T --to T'``: prove that every record of ``order-event`` whose
timestamp is in ``[T, T')`` reached an end, and that the providers did each effect once.

    faust -A app reconcile --from 2026-12-06T10:00:00Z --to 2026-12-06T11:00:00Z
    faust -A app reconcile --last 1h --json            # the hour that ended now
    faust -A app reconcile --last 1h --lag 10m         # the hour that ended ten minutes ago
    faust -A app reconcile --runs                      # the latest runs (the timer's and people's)
    faust -A app reconcile --last 1d --export proof.jsonl   # every record's end, one JSON line each

The report (``app.reconcile.report``) counts the records by how they ended and lists the findings
with their evidence (topic, partition, offset, order, the steps' rows). Every run is kept in
``t_reconcile_run`` and shown on the console; ``--no-store`` keeps nothing. Exit status: 0 when
nothing was found, 1 with findings, 2 when the run could not complete (the report says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime, timedelta

import click
import faust
from faust.cli import AppCommand, option

from app.adapters.mysql.reconcile import ReconcileReads
from app.commands import database_explained
from app.injection import Wire
from app.reconcile.run import Reconciler
from app.render import ACTOR, json_default
from app.settings import Settings

DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
EXIT = {"clean": 0, "findings": 1, "failed": 2}


def moment(text: str) -> datetime:
    """An ISO 8601 time; without a zone it is UTC."""
    try:
        at = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise SystemExit(f"not a time: {text!r} (ISO 8601, e.g. 2026-12-06T10:00:00Z)") from None
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def duration(text: str) -> timedelta:
    """``90s``, ``10m``, ``1h``, ``2d``."""
    match = DURATION.fullmatch(text.strip())
    if match is None:
        raise SystemExit(f"not a duration: {text!r} (e.g. 90s, 10m, 1h, 2d)")
    return timedelta(seconds=float(match.group(1)) * UNITS[match.group(2)])


def range_of(since: str | None, until: str | None, last: str | None, lag: str | None,
             now: datetime | None = None) -> tuple[datetime, datetime]:
    """The range asked for: ``--from``/``--to``, or ``--last`` ending ``--lag`` before now."""
    now = now or datetime.now(UTC)
    if last is not None:
        if since is not None:
            raise SystemExit("give --from (and --to) or --last, not both")
        end = (moment(until) if until else now) - (duration(lag) if lag else timedelta())
        return end - duration(last), end
    if since is None:
        raise SystemExit("reconcile needs --from (and --to) or --last")
    start, end = moment(since), moment(until) if until else now
    if end <= start:
        raise SystemExit(f"--to ({end.isoformat()}) must be after --from ({start.isoformat()})")
    return start, end


OPTIONS = (
    option("--from", "since", help="records at or after this time (ISO 8601; UTC without a zone)"),
    option("--to", "until", help="records before this time (default: now)"),
    option("--last", help="instead of --from: this long a range (90s, 10m, 1h, 2d) ending at --to or now"),
    option("--lag", help="with --last: end the range this long before --to or now"),
    option("--json", "as_json", is_flag=True, help="the report as JSON"),
    option("--no-store", is_flag=True, help="keep nothing in t_reconcile_run"),
    option("--runs", is_flag=True, help="list the latest runs instead"),
    option("--export", type=click.Path(dir_okay=False, writable=True),
           help="write every record's end to this file, one JSON line each (partition, offset, end, order, type)"),
    option("--actor", default=os.environ.get("USER", "cli"), help="who runs it (default: $USER)"),
)


async def reconcile(cmd: AppCommand, since: str | None, until: str | None, last: str | None, lag: str | None,
                    as_json: bool, no_store: bool, runs: bool, export: str | None, actor: str, *,
                    settings: Settings, opened: Callable[[], AbstractAsyncContextManager],
                    reconcile_reads: ReconcileReads, reconciler: Callable[[], Reconciler]) -> None:
    """Prove that every record of a time range reached an end, and every effect happened once."""
    if not ACTOR.fullmatch(actor or ""):
        raise SystemExit("--actor must be 1-64 letters, digits or _.@+-")
    async with database_explained(settings), opened():
        if runs:
            cmd.say(json.dumps(await reconcile_reads.runs(), default=json_default, indent=2))
            return
        start, end = range_of(since, until, last, lag)
        runner = reconciler()
        with contextlib.ExitStack() as stack:
            if export:
                out = stack.enter_context(open(export, "w", encoding="utf-8"))
                runner.on_verdict = lambda partition, offset, verdict, read: out.write(json.dumps(
                    {"partition": partition, "offset": offset, "end": verdict.end.value,
                     "order_no": read.order_no, "type": read.type or read.skipped_type}) + "\n")
            try:
                report = await runner.run(start, end, started_by=f"cli:{actor}", store=not no_store)
            except asyncio.CancelledError:     # faust's command runner would end silently, status 0
                raise SystemExit("reconcile was cancelled before it completed: nothing proven") from None
    cmd.say(json.dumps(report.as_dict(), default=json_default, indent=2) if as_json else report.text())
    if report.status != "clean":
        raise SystemExit(EXIT[report.status])


def register(app: faust.App, wire: Wire) -> None:
    app.command(*OPTIONS)(wire(reconcile))
