"""The reconcile's runs over JSON, for the console's Reconcile section and for scripts.

    GET /reconcile/runs/          the latest runs (the timer's and people's), newest first
    GET /reconcile/runs/{id}/     one run with its report: counts per end, the findings and their evidence

A run is started by the timer (``RECONCILE_EVERY_SECONDS``) or from a shell (``faust -A app
reconcile``); the findings hold order numbers and the steps' rows, never a phone or an address, but
their evidence holds idempotency tokens (the steps' ``idem_token``, the waybills'
``idempotency_key``): a viewer (``WEB_READ_TOKEN``) reads both answers masked
(``app.personal.masking``), and an operator's read of a report, whole, is written to
``t_view_audit`` first.
"""

from __future__ import annotations

from aiohttp import web

from app.adapters.mysql.reads.console import Queries
from app.adapters.mysql.reads.view_audit import Seen, ViewAudit
from app.adapters.mysql.reconcile import ReconcileReads
from app.settings import Settings
from app.web.http import OPERATOR, Refused, Routes, as_seen, json_response, reader, refused, role


async def list_runs(request: web.Request, *, settings: Settings, reconcile_reads: ReconcileReads,
                    queries: Queries) -> web.Response:
    try:
        who = role(request, settings)
    except Refused as exc:
        return refused(exc)
    timer = {"every_seconds": settings.reconcile.every_seconds, "window_seconds": settings.reconcile.window_seconds,
             "lag_seconds": settings.reconcile.lag_seconds}
    answer = {"timer": timer, "runs": await reconcile_reads.runs(50)}
    return json_response(await as_seen(who, answer, queries))


async def show_run(request: web.Request, run_id: str, *, settings: Settings, reconcile_reads: ReconcileReads,
                   queries: Queries, view_audit: ViewAudit) -> web.Response:
    try:
        who, name = reader(request, settings)
    except Refused as exc:
        return refused(exc)
    if not run_id.isdigit():
        return json_response({"error": f"no run {run_id[:40]!r}: a run is a number"}, status=404)
    found = await reconcile_reads.run(int(run_id))
    if found is None:
        return json_response({"error": f"no run {run_id} for this consumer group"}, status=404)
    if who != OPERATOR:
        return json_response(await as_seen(who, found, queries))
    await view_audit.record(Seen(f"web:{name}", who, "reconcile_run", request.path))
    return json_response({**found, "masked": False})


ROUTES: Routes = {
    "/reconcile/runs/": {"get": list_runs},
    "/reconcile/runs/{run_id}/": {"get": show_run},
}
