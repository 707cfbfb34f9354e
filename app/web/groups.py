"""Error groups, over JSON: the dead letters of one cause as one line, and a group's inflow.

    GET /groups/?window=24h|7d&status=unsettled|all
    GET /groups/{fingerprint}

The list says, per group: its letters in the window, first and last seen, the letters still
open (open, retrying or manual) and their share, the orders among those, reason, effect,
status or error class and a sample message; the queue's depth and its oldest open letter's
age beside them. A group's page gives its inflow over 24 hours (hourly) and 7 days
(6-hourly). The queue of one group is ``GET /compensation/?fingerprint=<fingerprint>``. A viewer
(``WEB_READ_TOKEN``) gets the sample messages masked (``app.personal.masking``), like every data view.
"""

from __future__ import annotations

import faust
from aiohttp import web
from faust.web import View

from app.adapters.mysql.reads.error_groups import WINDOWS
from app.bootstrap import Runtime
from app.settings import Settings
from app.web.compensation import FINGERPRINT
from app.web.http import Refused, as_seen, json_response, refused, role, text

LISTS = ("unsettled", "all")


def register(app: faust.App, runtime: Runtime, settings: Settings) -> None:

    @app.page("/groups/")
    class Groups(View):
        async def get(self, request: web.Request) -> web.Response:
            window = request.query.get("window") or "24h"
            status = request.query.get("status") or "unsettled"
            if window not in WINDOWS:
                return refused(Refused(400, f"window must be one of {', '.join(WINDOWS)}"))
            if status not in LISTS:
                return refused(Refused(400, f"status must be one of {', '.join(LISTS)}"))
            rt = runtime.started()
            answer = await rt.groups.groups(WINDOWS[window], unsettled_only=status == "unsettled")
            return json_response(await as_seen(role(request, settings), answer, rt.queries))

    @app.page("/groups/{fingerprint}")
    class Group(View):
        async def get(self, request: web.Request, fingerprint: str) -> web.Response:
            try:
                text(fingerprint, "fingerprint", FINGERPRINT, "16 hex digits")
            except Refused as exc:
                return refused(exc)
            rt = runtime.started()
            found = await rt.groups.group(fingerprint)
            if found is None:
                return json_response({"error": f"no error group {fingerprint}"}, status=404)
            return json_response(await as_seen(role(request, settings), found, rt.queries))
