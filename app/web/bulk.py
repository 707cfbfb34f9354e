"""Bulk actions on the dead-letter queue, over JSON (``app.compensation.bulk``).

    POST /bulk/dry-run          {"action", "filter"}: the exact count and a sample
    POST /bulk/                 {"action", "filter", "expected_count", "note", "actor"}: start a job
    GET  /bulk/                 the latest jobs
    GET  /bulk/{id}             one job: its progress, and the rows it could not act on
    POST /bulk/{id}/pause | /resume | /abort     {"actor"}

``filter`` takes the names of ``GET /compensation/``'s query (status, reason, order_no,
older_than, fingerprint, since, until), as strings. Any worker serves them; the job itself
runs in whichever worker holds its lease.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from app.adapters.mysql.ledger.bulk_jobs import CountMoved, MySqlBulkJobs
from app.adapters.mysql.ledger.selection import QueueFilter
from app.adapters.mysql.reads.console import Queries
from app.compensation.bulk import ACTIONS, TRANSITIONS, TransitionRefused, tolerance
from app.pipeline.events import ORDER_NO
from app.pipeline.states import LedgerStatus
from app.settings import Settings
from app.web.compensation import FINGERPRINT, REASON
from app.web.http import (
    Refused,
    Routes,
    as_seen,
    authorize,
    body,
    integer,
    json_response,
    moment,
    note_and_actor,
    refused,
    role,
    text,
)

SAMPLE = 20
STATUSES = {s.name.lower(): s for s in (LedgerStatus.OPEN, LedgerStatus.MANUAL)}
FILTERS = ("status", "reason", "order_no", "older_than", "fingerprint", "since", "until")


def queue_filter(doc: Any) -> QueueFilter:
    """The queue filter of a request body (400 with the reason when it is not one)."""
    if doc is None:
        doc = {}
    if not isinstance(doc, dict) or not all(isinstance(v, (str, int)) or v is None for v in doc.values()):
        raise Refused(400, "filter must be an object of strings, like GET /compensation/'s query")
    unknown = set(doc) - set(FILTERS)
    if unknown:
        raise Refused(400, f"unknown filter {sorted(unknown)[0]!r}: {', '.join(FILTERS)}")
    q = {k: None if v is None else str(v) for k, v in doc.items()}
    status = q.get("status") or None
    if status is not None and status not in STATUSES:
        raise Refused(400, "status must be open or manual (a bulk job acts on those only), or none for both")
    return QueueFilter(
        status=STATUSES[status] if status else None,
        reason=text(q.get("reason"), "reason", REASON, "a reason like effect_unavailable"),
        order_no=text(q.get("order_no"), "order_no", ORDER_NO, "ORD-YYYYMMDD-<letters or digits>"),
        older_than_seconds=integer(q.get("older_than"), "older_than", low=0, high=10 ** 9),
        fingerprint=text(q.get("fingerprint"), "fingerprint", FINGERPRINT, "16 hex digits"),
        since=moment(q.get("since"), "since"), until=moment(q.get("until"), "until"))


def action_of(doc: dict) -> str:
    action = doc.get("action")
    if action not in ACTIONS:
        raise Refused(400, f"action must be one of {', '.join(ACTIONS)}")
    return action


async def dry_run(request: web.Request, *, settings: Settings, bulk_jobs: MySqlBulkJobs) -> web.Response:
    cap, percent = settings.bulk.max_rows, settings.bulk.count_tolerance_percent
    try:
        authorize(request, settings)
        doc = await body(request, settings)
        action, filters = action_of(doc), queue_filter(doc.get("filter"))
    except Refused as exc:
        return refused(exc)
    found = await bulk_jobs.dry_run(filters, cap=cap, sample=SAMPLE)
    return json_response({"action": action, **found, "tolerance": tolerance(found["count"], percent),
                          "tolerance_percent": percent})


async def list_jobs(request: web.Request, *, settings: Settings, bulk_jobs: MySqlBulkJobs,
                    queries: Queries) -> web.Response:
    answer = {"items": await bulk_jobs.jobs()}
    return json_response(await as_seen(role(request, settings), answer, queries))


async def start_job(request: web.Request, *, settings: Settings, bulk_jobs: MySqlBulkJobs) -> web.Response:
    cap, percent = settings.bulk.max_rows, settings.bulk.count_tolerance_percent
    try:
        who = authorize(request, settings)
        doc = await body(request, settings)
        action, filters = action_of(doc), queue_filter(doc.get("filter"))
        expected = doc.get("expected_count")
        if not isinstance(expected, int) or isinstance(expected, bool) or not 0 <= expected <= cap:
            raise Refused(400, f"expected_count must be the dry run's count, a whole number up to {cap}")
        note, actor = note_and_actor(doc, who, settings)
    except Refused as exc:
        return refused(exc)
    try:
        job = await bulk_jobs.create(action, filters, expected=expected, tolerance_percent=percent,
                                     cap=cap, actor=actor, note=note)
    except CountMoved as exc:
        return json_response({"error": exc.reason, "count": exc.count, "expected_count": expected},
                             status=409)
    return json_response(job, status=201)


async def show_job(request: web.Request, job_id: str, *, settings: Settings, bulk_jobs: MySqlBulkJobs,
                   queries: Queries) -> web.Response:
    try:
        number = integer(job_id, "id", low=1, high=2 ** 62)
    except Refused as exc:
        return refused(exc)
    job = await bulk_jobs.get(number)
    if job is None:
        return json_response({"error": f"no bulk job {number}"}, status=404)
    answer = {**job, "failures": await bulk_jobs.failures(number)}
    return json_response(await as_seen(role(request, settings), answer, queries))


async def command_job(request: web.Request, job_id: str, command: str, *, settings: Settings,
                      bulk_jobs: MySqlBulkJobs) -> web.Response:
    try:
        who = authorize(request, settings)
        if command not in TRANSITIONS:
            raise Refused(404, f"no command {command!r}: {', '.join(TRANSITIONS)}")
        number = integer(job_id, "id", low=1, high=2 ** 62)
        _, actor = note_and_actor(await body(request, settings), who, settings)
    except Refused as exc:
        return refused(exc)
    try:
        job, changed = await bulk_jobs.command(number, command, actor=actor)
    except TransitionRefused as exc:
        return json_response({"error": str(exc)}, status=409)
    if job is None:
        return json_response({"error": f"no bulk job {number}"}, status=404)
    return json_response({**job, "changed": changed})


ROUTES: Routes = {
    "/bulk/dry-run": {"post": dry_run},
    "/bulk/": {"get": list_jobs, "post": start_job},
    "/bulk/{job_id}": {"get": show_job},
    "/bulk/{job_id}/{command}": {"post": command_job},
}
