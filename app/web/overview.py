"""The console's first page, over JSON: the queue at a glance, and the providers as this worker sees them.

    GET /overview/     the queue by status, its oldest open letter's age, the inflow over 24 hours
                       (hourly) and 7 days (6-hourly), the top error groups (most open first), the
                       bulk jobs running or paused, and the providers (``GET /providers/``)
    GET /providers/    per effect: its breaker in this worker (closed, open or probing, for how long,
                       the next probe), the requests of its window that ended and failed, the last
                       failure, the provider's "not yet" still in force, this worker's rate share

Both need a reading token like every data view; a viewer (``WEB_READ_TOKEN``) gets them masked
(``app.personal.masking``): an error message may name an order. The breakers are this worker's
(``app.pipeline.breaker``): another worker may see its provider otherwise; the metric
``order_provider_breaker_open`` and the alert ``ProviderDown`` see them all.
"""

from __future__ import annotations

from typing import Any

import faust
from aiohttp import web
from faust.web import View

from app.adapters.mysql.reads.error_groups import WINDOWS
from app.bootstrap import Runtime
from app.compensation.bulk import FINISHED, JobStatus
from app.settings import Settings
from app.web.http import as_seen, json_response, role

TOP_GROUPS = 5
IN_PROGRESS = tuple(s.name.lower() for s in JobStatus if s not in FINISHED)


def providers(rt: Runtime) -> list[dict[str, Any]]:
    """What this worker knows of each effect's provider (none when it calls no provider)."""
    limits = getattr(rt, "limits", None)
    return [] if limits is None else limits.health(rt.client_factories)


async def overview(rt: Runtime) -> dict[str, Any]:
    counts = await rt.queries.counts()
    groups = await rt.groups.groups(WINDOWS["24h"], unsettled_only=True)
    inflow = await rt.groups.inflow()
    jobs = [job for job in await rt.bulk_jobs.jobs() if job["status"] in IN_PROGRESS]
    return {"now": inflow["now"], "by_status": counts["by_status"], "capped": counts["capped"], "cap": counts["cap"],
            "queue": groups["queue"], "inflow": inflow["windows"],
            "top_groups": groups["groups"][:TOP_GROUPS], "more_groups": max(len(groups["groups"]) - TOP_GROUPS, 0)
            + groups["more_groups"], "bulk_in_progress": jobs, "providers": providers(rt)}


def register(app: faust.App, runtime: Runtime, settings: Settings) -> None:

    @app.page("/overview/")
    class Overview(View):
        async def get(self, request: web.Request) -> web.Response:
            rt = runtime.started()
            return json_response(await as_seen(role(request, settings), await overview(rt), rt.queries))

    @app.page("/providers/")
    class Providers(View):
        async def get(self, request: web.Request) -> web.Response:
            rt = runtime.started()
            answer = {"providers": providers(rt), "worker": settings.worker_id}
            return json_response(await as_seen(role(request, settings), answer, rt.queries))
