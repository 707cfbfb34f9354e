"""The reconcile's runs over JSON, for the console's Reconcile section and for scripts.

    GET /reconcile/runs/          the latest runs (the timer's and people's), newest first
    GET /reconcile/runs/{id}/     one run with its report: counts per end, the findings and their evidence

A run is started by the timer (``RECONCILE_EVERY_SECONDS``) or from a shell (``faust -A app
reconcile``); the findings hold order numbers and the steps' rows, never a phone or an address.
"""

from __future__ import annotations

import faust
from aiohttp import web
from faust.web import View

from app.bootstrap import Runtime
from app.settings import Settings
from app.web.http import json_response


def register(app: faust.App, runtime: Runtime, settings: Settings) -> None:
    timer = {"every_seconds": settings.reconcile.every_seconds, "window_seconds": settings.reconcile.window_seconds,
             "lag_seconds": settings.reconcile.lag_seconds}

    @app.page("/reconcile/runs/")
    class ReconcileRuns(View):
        async def get(self, request: web.Request) -> web.Response:
            rt = runtime.started()
            return json_response({"timer": timer, "runs": await rt.reconcile_reads.runs(50)})

    @app.page("/reconcile/runs/{run_id}/")
    class ReconcileRun(View):
        async def get(self, request: web.Request, run_id: str) -> web.Response:
            if not run_id.isdigit():
                return json_response({"error": f"no run {run_id[:40]!r}: a run is a number"}, status=404)
            found = await runtime.started().reconcile_reads.run(int(run_id))
            if found is None:
                return json_response({"error": f"no run {run_id} for this consumer group"}, status=404)
            return json_response(found)
