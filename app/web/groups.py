"""Error groups, over JSON: the dead letters of one cause as one line, and a group's inflow.

    GET /groups/?window=24h|7d&status=unsettled|all
    GET /groups/{fingerprint}

The list says, per group: its letters in the window, first and last seen, the letters still
open (open, retrying or manual) and their share, the orders among those, reason, effect,
status or error class and a sample message; the queue's depth and its oldest open letter's
age beside them. A group's page gives its inflow over 24 hours (hourly) and 7 days
(6-hourly). The queue of one group is ``GET /compensation/?fingerprint=<fingerprint>``. A viewer
(``WEB_READ_TOKEN``) gets the sample messages masked (``app.personal.masking``), like every data view.

The console's first page reads the queue at a glance beside them:

    GET /overview/     the queue by status, its oldest open letter's age, the inflow over 24 hours
                       (hourly) and 7 days (6-hourly), the top error groups (most open first), the
                       bulk jobs running or paused, and the providers (``GET /providers/``)
    GET /providers/    per effect: its breaker in this worker (closed, open or probing, for how long,
                       the next probe), the requests of its window that ended and failed, the last
                       failure, the provider's "not yet" still in force, this worker's rate share

Both need a reading token like every data view, masked for a viewer: an error message may name an
order. The breakers are this worker's (``app.pipeline.breaker``): another worker may see its
provider otherwise; the metric ``order_provider_breaker_open`` and the alert ``ProviderDown`` see
them all.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aiohttp import web

from app.adapters.mysql.ledger.bulk_jobs import MySqlBulkJobs
from app.adapters.mysql.reads.console import Queries
from app.adapters.mysql.reads.error_groups import WINDOWS, GroupQueries
from app.compensation.bulk import FINISHED, JobStatus
from app.pipeline.limits import ProviderLimits
from app.settings import Settings
from app.web.compensation import FINGERPRINT
from app.web.http import Refused, Routes, as_seen, json_response, refused, role, text

LISTS = ("unsettled", "all")
TOP_GROUPS = 5
IN_PROGRESS = tuple(s.name.lower() for s in JobStatus if s not in FINISHED)


async def list_groups(request: web.Request, *, settings: Settings, groups: GroupQueries,
                      queries: Queries) -> web.Response:
    window = request.query.get("window") or "24h"
    status = request.query.get("status") or "unsettled"
    if window not in WINDOWS:
        return refused(Refused(400, f"window must be one of {', '.join(WINDOWS)}"))
    if status not in LISTS:
        return refused(Refused(400, f"status must be one of {', '.join(LISTS)}"))
    answer = await groups.groups(WINDOWS[window], unsettled_only=status == "unsettled")
    return json_response(await as_seen(role(request, settings), answer, queries))


async def show_group(request: web.Request, fingerprint: str, *, settings: Settings, groups: GroupQueries,
                     queries: Queries) -> web.Response:
    try:
        text(fingerprint, "fingerprint", FINGERPRINT, "16 hex digits")
    except Refused as exc:
        return refused(exc)
    found = await groups.group(fingerprint)
    if found is None:
        return json_response({"error": f"no error group {fingerprint}"}, status=404)
    return json_response(await as_seen(role(request, settings), found, queries))


async def overview(request: web.Request, *, settings: Settings, queries: Queries, groups: GroupQueries,
                   bulk_jobs: MySqlBulkJobs, limits: ProviderLimits, effect_names: Iterable[str]) -> web.Response:
    who = role(request, settings)
    counts = await queries.counts()
    found = await groups.groups(WINDOWS["24h"], unsettled_only=True)
    inflow = await groups.inflow()
    jobs = [job for job in await bulk_jobs.jobs() if job["status"] in IN_PROGRESS]
    answer = {"now": inflow["now"], "by_status": counts["by_status"], "capped": counts["capped"], "cap": counts["cap"],
              "queue": found["queue"], "inflow": inflow["windows"],
              "top_groups": found["groups"][:TOP_GROUPS], "more_groups": max(len(found["groups"]) - TOP_GROUPS, 0)
              + found["more_groups"], "bulk_in_progress": jobs, "providers": providers(limits, effect_names)}
    return json_response(await as_seen(who, answer, queries))


async def list_providers(request: web.Request, *, settings: Settings, queries: Queries, limits: ProviderLimits,
                         effect_names: Iterable[str]) -> web.Response:
    answer = {"providers": providers(limits, effect_names), "worker": settings.worker_id}
    return json_response(await as_seen(role(request, settings), answer, queries))


def providers(limits: ProviderLimits, effect_names: Iterable[str]) -> list[dict[str, Any]]:
    """What this worker knows of each effect's provider."""
    return limits.health(effect_names)


ROUTES: Routes = {
    "/groups/": {"get": list_groups},
    "/groups/{fingerprint}": {"get": show_group},
    "/overview/": {"get": overview},
    "/providers/": {"get": list_providers},
}
