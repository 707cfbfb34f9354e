"""``faust -A app dlq list | show ID | retry ID | resolve ID | discard ID``: the compensation
queue from a shell, with the same rules and the same audit trail as the console.

    faust -A app dlq list --status manual --limit 20
    faust -A app dlq show 42                      # phone and address masked, as a viewer sees them
    faust -A app dlq show 42 --unmasked --actor alice      # whole, and written to t_view_audit
    faust -A app dlq retry 42 --note "logistics is back" --actor alice
    faust -A app dlq bulk retry --reason provider_unavailable --dry-run     # an outage: both of its reasons
    faust -A app dlq bulk retry --reason effect_unavailable --dry-run
    faust -A app dlq bulk retry --reason provider_unavailable --expect 9412 --wait
    faust -A app dlq bulk retry --reason effect_unavailable --expect 310 --wait
    faust -A app dlq bulk status [JOB] | pause JOB | resume JOB | abort JOB
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import click
import faust
from faust.cli import AppCommand, argument, option

from app.adapters.mysql.ledger.bulk_jobs import MySqlBulkJobs
from app.adapters.mysql.ledger.selection import QueueFilter
from app.adapters.mysql.reads.console import Queries
from app.adapters.mysql.reads.view_audit import Seen, ViewAudit
from app.commands import database_explained
from app.commands.bulk import BULK_COMMANDS, bulk_command, moment
from app.compensation.compensator import Compensator
from app.injection import Wire
from app.personal.masking import mask_letter, order_numbers
from app.pipeline.outage import OutageGuard
from app.pipeline.states import PERSON_ACTIONS, LedgerStatus
from app.render import ACTOR, json_default, with_record
from app.settings import Settings

STATUSES = {status.name.lower(): status for status in LedgerStatus}


OPTIONS = (
    argument("action", type=click.Choice(["list", "show", "retry", *PERSON_ACTIONS, "bulk"])),
    argument("target", required=False),
    argument("job_id", type=int, required=False),
    option("--status", type=click.Choice(sorted(STATUSES)), help="list, bulk: only this status"),
    option("--reason", help="list, bulk: only this reason"),
    option("--order-no", "order_no", help="list, bulk: only this order"),
    option("--fingerprint", help="list, bulk: only this error group (16 hex digits)"),
    option("--older-than", "older_than", type=int,
           help="list, bulk: only rows that first failed this many seconds ago"),
    option("--since", help="list, bulk: only rows that first failed at or after this time (ISO 8601, UTC)"),
    option("--until", help="list, bulk: only rows that first failed before this time (ISO 8601, UTC)"),
    option("--dry-run", "dry_run", is_flag=True, help="bulk: the count and a sample; change nothing"),
    option("--expect", type=int, help="bulk: the count you saw in the dry run (refused if the queue moved)"),
    option("--yes", is_flag=True, help="bulk: do not ask (needs --expect)"),
    option("--wait", is_flag=True, help="bulk: follow the job's progress until it ends"),
    option("--json", "as_json", is_flag=True, help="bulk: print JSON"),
    option("--limit", type=int, default=50, help="list: at most this many rows (50)"),
    option("--before", type=int, help="list: rows older than this id (the next page)"),
    option("--note", help="retry/resolve/discard: why, for the audit trail"),
    option("--actor", default=os.environ.get("USER", "cli"), help="who acts (default: $USER)"),
    option("--unmasked", is_flag=True, default=False,
           help="show: phone and address whole (written to the audit of unmasked views)"),
)


async def dlq(cmd: AppCommand, action: str, target: str | None, job_id: int | None, status: str | None,
              reason: str | None, order_no: str | None, fingerprint: str | None, older_than: int | None,
              since: str | None, until: str | None, dry_run: bool, expect: int | None, yes: bool, wait: bool,
              as_json: bool, limit: int, before: int | None, note: str | None, actor: str, unmasked: bool, *,
              settings: Settings, opened: Callable[[], AbstractAsyncContextManager], queries: Queries,
              view_audit: ViewAudit, compensator: Compensator, guard: Callable[[], OutageGuard],
              bulk_jobs: MySqlBulkJobs) -> None:
    """Look at and act on the dead-letter compensation queue, one row or in bulk."""
    if not ACTOR.fullmatch(actor or ""):
        raise SystemExit("--actor must be 1-64 letters, digits or _.@+-")
    row_id = None
    if action == "bulk":
        if target not in BULK_COMMANDS:
            raise SystemExit(f"dlq bulk needs one of {', '.join(BULK_COMMANDS)}")
    elif action != "list":
        if target is None or not target.isdigit():
            raise SystemExit(f"dlq {action} needs a row id")
        row_id = int(target)
    async with database_explained(settings), opened():
        if action == "bulk":
            selection = dict(status=status, reason=reason, order_no=order_no, fingerprint=fingerprint,
                             older_than=older_than, since=since, until=until)
            await bulk_command(cmd, bulk_jobs, settings, target, job_id, selection, dry_run=dry_run, expect=expect,
                               yes=yes, wait=wait, as_json=as_json, actor=f"cli:{actor}", note=note)
        elif action == "list":
            rows = await queries.compensations(QueueFilter(
                status=STATUSES[status] if status else None, reason=reason, order_no=order_no,
                fingerprint=fingerprint, older_than_seconds=older_than, since=moment(since, "since"),
                until=moment(until, "until"), before_id=before, limit=max(1, min(limit, 200))))
            cmd.say(cmd.tabulate(
                [(r["id"], r["status"], r["reason"], r["order_no"] or "", r["attempts"],
                  str(r["first_failure_at"]), str(r["next_retry_at"] or "")) for r in rows],
                headers=["id", "status", "reason", "order", "attempts", "first failure", "next retry"],
                title="compensation queue"))
        elif action == "show":
            cmd.say(json.dumps(await _shown(queries, view_audit, row_id, actor=actor, unmasked=unmasked),
                               default=json_default, indent=2))
        else:
            result = await compensator.perform(row_id, action, guard(), actor=f"cli:{actor}", note=note)
            cmd.say(json.dumps({"id": row_id, "action": action, **result.as_dict(),
                                **({"refused": result.refused} if result.refused else {})}, indent=2))
            if result.refused:
                raise SystemExit(1)


async def _shown(queries: Queries, view_audit: ViewAudit, row_id: int, *, actor: str, unmasked: bool) -> dict:
    """A dead letter as ``dlq show`` prints it: masked, or whole and written to the audit of unmasked views."""
    row = await queries.compensation(row_id)
    if row is None:
        raise SystemExit(f"no compensation row {row_id}")
    _, value = with_record(row)
    if unmasked:
        await view_audit.record(Seen(f"cli:{actor}", "operator", "dead_letter", f"dlq show {row_id} --unmasked",
                                     compensation_id=row_id, order_no=row.get("order_no")))
        return row
    return mask_letter(row, value, await queries.contacts(order_numbers(row, value)))


def register(app: faust.App, wire: Wire) -> None:
    app.command(*OPTIONS)(wire(dlq))
