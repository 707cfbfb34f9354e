"""``faust -A app dlq list | show ID | retry ID | resolve ID | discard ID``: the compensation
queue from a shell, with the same rules and the same audit trail as the console.

    faust -A app dlq list --status manual --limit 20
    faust -A app dlq show 42                      # phone and address masked, as a viewer sees them
    faust -A app dlq show 42 --unmasked --actor alice      # whole, and written to t_view_audit
    faust -A app dlq retry 42 --note "logistics is back" --actor alice
"""

from __future__ import annotations

import json
import os

import click
import faust
from faust.cli import argument, option

from app.adapters.mysql.queries import QueueFilter
from app.adapters.mysql.views import Seen
from app.bootstrap import Runtime
from app.commands import database_explained
from app.pipeline.compensation import ACTIONS, Status
from app.settings import Settings
from app.masking import mask_letter
from app.render import ACTOR, json_default, with_record

STATUSES = {status.name.lower(): status for status in Status}


def register(app: faust.App, runtime: Runtime, settings: Settings) -> None:
    @app.command(
        argument("action", type=click.Choice(["list", "show", "retry", *ACTIONS])),
        argument("row_id", type=int, required=False),
        option("--status", type=click.Choice(sorted(STATUSES)), help="list: only this status"),
        option("--reason", help="list: only this reason"),
        option("--order-no", "order_no", help="list: only this order"),
        option("--limit", type=int, default=50, help="list: at most this many rows (50)"),
        option("--before", type=int, help="list: rows older than this id (the next page)"),
        option("--note", help="retry/resolve/discard: why, for the audit trail"),
        option("--actor", default=os.environ.get("USER", "cli"), help="who acts (default: $USER)"),
        option("--unmasked", is_flag=True, default=False,
               help="show: phone and address whole (written to the audit of unmasked views)"),
    )
    async def dlq(self, action: str, row_id: int | None, status: str | None, reason: str | None,
                  order_no: str | None, limit: int, before: int | None, note: str | None, actor: str,
                  unmasked: bool) -> None:
        """Look at and act on the dead-letter compensation queue."""
        if action != "list" and row_id is None:
            raise SystemExit(f"dlq {action} needs a row id")
        if not ACTOR.fullmatch(actor or ""):
            raise SystemExit("--actor must be 1-64 letters, digits or _.@+-")
        async with database_explained(settings):
            rt = await runtime.start(kafka=False)
            try:
                if action == "list":
                    rows = await rt.queries.compensations(QueueFilter(
                        status=STATUSES[status] if status else None, reason=reason, order_no=order_no,
                        before_id=before, limit=max(1, min(limit, 200))))
                    self.say(self.tabulate(
                        [(r["id"], r["status"], r["reason"], r["order_no"] or "", r["attempts"],
                          str(r["first_failure_at"]), str(r["next_retry_at"] or "")) for r in rows],
                        headers=["id", "status", "reason", "order", "attempts", "first failure", "next retry"],
                        title="compensation queue"))
                elif action == "show":
                    row = await rt.queries.compensation(row_id)
                    if row is None:
                        raise SystemExit(f"no compensation row {row_id}")
                    _, value = with_record(row)
                    if unmasked:
                        await rt.view_audit.record(Seen(f"cli:{actor}", "operator", "dead_letter",
                                                        f"dlq show {row_id} --unmasked", compensation_id=row_id,
                                                        order_no=row.get("order_no")))
                    else:
                        row = mask_letter(row, value)
                    self.say(json.dumps(row, default=json_default, indent=2))
                else:
                    result = await rt.compensator.perform(row_id, action, rt.guard(), actor=f"cli:{actor}", note=note)
                    self.say(json.dumps({"id": row_id, "action": action, **result.as_dict(),
                                         **({"refused": result.refused} if result.refused else {})}, indent=2))
                    if result.refused:
                        raise SystemExit(1)
            finally:
                await rt.stop()

    return dlq
