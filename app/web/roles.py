"""Who asks, and who saw personal data whole.

    GET /whoami                          the caller's role, what it may do, and the person a token of
                                         WEB_TOKENS_FILE names (``name``; null for a shared token)
    GET /audit/views?limit=&before=      the audit of unmasked views, newest first (operators only)
"""

from __future__ import annotations

import faust
from aiohttp import web
from faust.web import View

from app.bootstrap import Runtime
from app.settings import Settings
from app.web.http import OPERATOR, Refused, caller, integer, json_response, operator, refused


def register(app: faust.App, runtime: Runtime, settings: Settings) -> None:

    @app.page("/whoami")
    class WhoAmI(View):
        async def get(self, request: web.Request) -> web.Response:
            try:
                who = caller(request, settings)
            except Refused as exc:
                return refused(exc)
            whole = who.role == OPERATOR
            return json_response({"role": who.role, "name": who.person, "masked": not whole, "may_act": whole,
                                  "may_download": whole, "audited": whole})

    @app.page("/audit/views")
    class Views(View):
        async def get(self, request: web.Request) -> web.Response:
            try:
                operator(request, settings, "the audit of unmasked views")
                limit = integer(request.query.get("limit"), "limit", low=1, high=500, default=100)
                before = integer(request.query.get("before"), "before", low=1, high=2 ** 62)
            except Refused as exc:
                return refused(exc)
            rt = runtime.started()
            items = await rt.view_audit.recent(limit=limit, before_id=before)
            cursor = items[-1]["id"] if len(items) == limit else None
            return json_response({"items": items, "next_before": cursor})
