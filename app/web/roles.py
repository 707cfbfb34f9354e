"""Who asks, and who saw personal data whole.

    GET /whoami                          the caller's role, what it may do, and the person a token of
                                         WEB_TOKENS_FILE names (``name``; null for a shared token)
    GET /audit/views?limit=&before=      the audit of unmasked views, newest first (operators only)
"""

from __future__ import annotations

from aiohttp import web

from app.adapters.mysql.reads.view_audit import ViewAudit
from app.settings import Settings
from app.web.http import OPERATOR, Refused, Routes, caller, integer, json_response, operator, refused


async def who_am_i(request: web.Request, *, settings: Settings) -> web.Response:
    try:
        who = caller(request, settings)
    except Refused as exc:
        return refused(exc)
    whole = who.role == OPERATOR
    return json_response({"role": who.role, "name": who.person, "masked": not whole, "may_act": whole,
                          "may_download": whole, "audited": whole})


async def unmasked_views(request: web.Request, *, settings: Settings, view_audit: ViewAudit) -> web.Response:
    try:
        operator(request, settings, "the audit of unmasked views")
        limit = integer(request.query.get("limit"), "limit", low=1, high=500, default=100)
        before = integer(request.query.get("before"), "before", low=1, high=2 ** 62)
    except Refused as exc:
        return refused(exc)
    items = await view_audit.recent(limit=limit, before_id=before)
    cursor = items[-1]["id"] if len(items) == limit else None
    return json_response({"items": items, "next_before": cursor})


ROUTES: Routes = {
    "/whoami": {"get": who_am_i},
    "/audit/views": {"get": unmasked_views},
}
