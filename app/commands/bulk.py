"""``faust -A app dlq bulk ...``: bulk actions on the dead-letter queue from a shell, with the
same rules as the console (``app.compensation.bulk``): a dry run, a start that carries the count
seen, a job the workers run in the background.

    faust -A app dlq bulk retry --reason provider_unavailable --dry-run     # a provider's outage: its breaker open
    faust -A app dlq bulk retry --reason effect_unavailable --dry-run       # ... and its calls that failed
    faust -A app dlq bulk retry --reason provider_unavailable               # shows the count, asks, starts
    faust -A app dlq bulk retry --reason effect_unavailable
    faust -A app dlq bulk discard --fingerprint 3f2a... --expect 120 --yes --note "test data" --wait
    faust -A app dlq bulk status [JOB] | pause JOB | resume JOB | abort JOB
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import click

from app.adapters.mysql.ledger.bulk_jobs import CountMoved, MySqlBulkJobs
from app.adapters.mysql.ledger.selection import QueueFilter
from app.compensation.bulk import ACTIONS, FINISHED, TRANSITIONS, JobStatus, TransitionRefused
from app.pipeline.states import LedgerStatus
from app.render import json_default
from app.settings import Settings

BULK_COMMANDS = (*ACTIONS, "status", *TRANSITIONS)
STATUSES = {"open": LedgerStatus.OPEN, "manual": LedgerStatus.MANUAL}
SAMPLE = 10
DONE = {"retry": "retried", "resolve": "resolved", "discard": "discarded"}


def moment(value: str | None, name: str) -> datetime | None:
    if not value:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise SystemExit(f"--{name} must be an ISO 8601 time like 2026-12-01T10:00:00Z") from None
    return when.astimezone(UTC) if when.tzinfo else when.replace(tzinfo=UTC)


def selection_filter(selection: dict) -> QueueFilter:
    status = selection.get("status")
    if status is not None and status not in STATUSES:
        raise SystemExit("--status must be open or manual for a bulk job (it acts on those only)")
    return QueueFilter(status=STATUSES[status] if status else None, reason=selection.get("reason"),
                       order_no=selection.get("order_no"), older_than_seconds=selection.get("older_than"),
                       fingerprint=selection.get("fingerprint"), since=moment(selection.get("since"), "since"),
                       until=moment(selection.get("until"), "until"))


def _line(job: dict) -> str:
    eta = "" if job["eta_seconds"] is None else f", ETA {job['eta_seconds']:.0f} s"
    rate = "" if job["rate_per_second"] is None else f", {job['rate_per_second']:.0f} rows/s"
    return (f"job {job['id']} {job['action']} {job['status']}: {job['done']}/{job['total']} done, {job['changed']} "
            f"changed, {job['failed']} failed, {job['remaining']} remaining{rate}{eta}")


async def bulk_command(cmd, jobs: MySqlBulkJobs, settings: Settings, command: str, job_id: int | None,
                       selection: dict, *, dry_run: bool, expect: int | None, yes: bool, wait: bool, as_json: bool,
                       actor: str, note: str | None) -> None:
    say = (lambda doc, text: cmd.say(json.dumps(doc, default=json_default, indent=2))) if as_json else \
        (lambda doc, text: cmd.say(text))
    if command == "status":
        if job_id is None:
            found = await jobs.jobs(limit=20)
            say({"items": found}, "\n".join(_line(j) for j in found) or "no bulk jobs")
        else:
            job = await jobs.get(job_id)
            if job is None:
                raise SystemExit(f"no bulk job {job_id}")
            say({**job, "failures": await jobs.failures(job_id)}, _line(job))
        return
    if command in TRANSITIONS:
        if job_id is None:
            raise SystemExit(f"dlq bulk {command} needs a job id")
        try:
            job, changed = await jobs.command(job_id, command, actor=actor)
        except TransitionRefused as exc:
            raise SystemExit(str(exc)) from None
        if job is None:
            raise SystemExit(f"no bulk job {job_id}")
        say({**job, "changed": changed}, _line(job))
        return
    f = selection_filter(selection)
    cap = settings.bulk.max_rows
    if dry_run or expect is None:
        found = await jobs.dry_run(f, cap=cap, sample=SAMPLE)
        say({"action": command, **found}, "\n".join(
            [f"{found['count']}{'+' if found['capped'] else ''} dead letters would be {DONE[command]}"
             + (f" (more than BULK_MAX_ROWS={cap}: narrow the filter)" if found["capped"] else "")]
            + [f"  {r['id']}  {r['status']}  {r['reason']}  {r['order_no'] or ''}" for r in found["sample"]]))
        if dry_run:
            return
        if yes:
            raise SystemExit("--yes needs --expect N, the count you saw in a dry run")
        if found["capped"] or not found["count"]:
            raise SystemExit(1)
        if not click.confirm(f"{command} these {found['count']} dead letters?"):
            raise SystemExit(1)
        expect = found["count"]
    try:
        job = await jobs.create(command, f, expected=expect, tolerance_percent=settings.bulk.count_tolerance_percent,
                                cap=cap, actor=actor, note=note)
    except CountMoved as exc:
        raise SystemExit(f"refused: {exc.reason}") from None
    say(job, f"started {_line(job)}")
    while wait and JobStatus[job["status"].upper()] not in FINISHED:
        await asyncio.sleep(2)
        job = await jobs.get(job["id"])
        if not as_json:
            cmd.say(_line(job))
    if wait and as_json:
        say(job, "")
