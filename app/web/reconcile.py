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

import faust
from aiohttp import web
from faust.web import View

from app.adapters.mysql.reads.view_audit import Seen
from app.bootstrap import Runtime
from app.settings import Settings
from app.web.http import OPERATOR, Refused, as_seen, json_response, reader, refused, role


def register(app: faust.App, runtime: Runtime, settings: Settings) -> None:
    timer = {"every_seconds": settings.reconcile.every_seconds, "window_seconds": settings.reconcile.window_seconds,
             "lag_seconds": settings.reconcile.lag_seconds}

    @app.page("/reconcile/runs/")
    class ReconcileRuns(View):
        async def get(self, request: web.Request) -> web.Response:
            try:
                who = role(request, settings)
            except Refused as exc:
                return refused(exc)
            rt = runtime.started()
            answer = {"timer": timer, "runs": await rt.reconcile_reads.runs(50)}
            return json_response(await as_seen(who, answer, rt.queries))

    @app.page("/reconcile/runs/{run_id}/")
    class ReconcileRun(View):
        async def get(self, request: web.Request, run_id: str) -> web.Response:
            try:
                who, name = reader(request, settings)
            except Refused as exc:
                return refused(exc)
            if not run_id.isdigit():
                return json_response({"error": f"no run {run_id[:40]!r}: a run is a number"}, status=404)
            rt = runtime.started()
            found = await rt.reconcile_reads.run(int(run_id))
            if found is None:
                return json_response({"error": f"no run {run_id} for this consumer group"}, status=404)
            if who != OPERATOR:
                return json_response(await as_seen(who, found, rt.queries))
            await rt.view_audit.record(Seen(f"web:{name}", who, "reconcile_run", request.path))
            return json_response({**found, "masked": False})
