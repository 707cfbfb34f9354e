"""The compensation queue, over JSON: list, look at, and act on dead letters.

    GET  /compensation/?status=&reason=&order_no=&older_than=&before=&limit=
    GET  /compensation/{id}
    POST /compensation/{id}/retry | /resolve | /discard      (bearer token; JSON {"note", "actor"})

Any worker serves the whole queue: it lives in MySQL.
"""

from __future__ import annotations

import re

import faust
from aiohttp import web
from faust.web import View

from app.adapters.mysql.queries import QueueFilter
from app.bootstrap import Runtime
from app.pipeline.compensation import ACTIONS, Status
from app.pipeline.errors import MalformedEvent
from app.pipeline.events import ORDER_NO, decode
from app.pipeline.plan import step_keys
from app.settings import Settings
from app.web.http import (Refused, authorize, body, integer, json_response, moment, note_and_actor, readable, refused,
                          text)

REASON = re.compile(r"[a-z_.:0-9]{1,64}")
FINGERPRINT = re.compile(r"[0-9a-f]{16}")
STATUSES = {status.name.lower(): status for status in Status}


def register(app: faust.App, runtime: Runtime, settings: Settings) -> None:

    @app.page("/compensation/")
    class Queue(View):
        async def get(self, request: web.Request) -> web.Response:
            try:
                query = request.query
                status = query.get("status") or None
                if status is not None and status not in STATUSES:
                    raise Refused(400, f"status must be one of {', '.join(STATUSES)}")
                filters = QueueFilter(
                    status=STATUSES[status] if status else None,
                    reason=text(query.get("reason"), "reason", REASON, "a reason like effect_unavailable"),
                    order_no=text(query.get("order_no"), "order_no", ORDER_NO, "ORD-YYYYMMDD-<letters or digits>"),
                    older_than_seconds=integer(query.get("older_than"), "older_than", low=0, high=10 ** 9),
                    fingerprint=text(query.get("fingerprint"), "fingerprint", FINGERPRINT, "16 hex digits"),
                    since=moment(query.get("since"), "since"), until=moment(query.get("until"), "until"),
                    before_id=integer(query.get("before"), "before", low=1, high=2 ** 62),
                    limit=integer(query.get("limit"), "limit", low=1, high=200, default=50))
            except Refused as exc:
                return refused(exc)
            rt = await runtime.start()
            items = await rt.queries.compensations(filters)
            cursor = items[-1]["id"] if len(items) == filters.limit else None
            return json_response({"items": items, "next_before": cursor, "counts": await rt.queries.counts()})

    @app.page("/compensation/{row_id}")
    class Entry(View):
        async def get(self, request: web.Request, row_id: str) -> web.Response:
            try:
                number = integer(row_id, "id", low=1, high=2 ** 62)
            except Refused as exc:
                return refused(exc)
            rt = await runtime.start()
            row = await rt.queries.compensation(number)
            if row is None:
                return json_response({"error": f"no compensation row {number}"}, status=404)
            return json_response(await _detail(rt, row))

    @app.page("/compensation/{row_id}/{action}")
    class Action(View):
        async def post(self, request: web.Request, row_id: str, action: str) -> web.Response:
            try:
                authorize(request, settings)
                if action not in ("retry", *ACTIONS):
                    raise Refused(404, f"no action {action!r}: retry, resolve or discard")
                number = integer(row_id, "id", low=1, high=2 ** 62)
                note, actor = note_and_actor(await body(request, settings), "web")
            except Refused as exc:
                return refused(exc)
            rt = await runtime.start()
            return await act(rt, number, action, actor=actor, note=note)


async def act(rt: Runtime, row_id: int, action: str, *, actor: str, note: str | None) -> web.Response:
    result = await rt.compensator.perform(row_id, action, rt.guard(), actor=actor, note=note)
    if not result.found:
        return json_response({"error": result.refused}, status=404)
    if result.refused:
        return json_response({"error": result.refused, **result.as_dict()}, status=409)
    return json_response(result.as_dict())


async def _detail(rt: Runtime, row: dict) -> dict:
    """The row, its record, its history, the t_idem rows of its event and its order."""
    key, value = row.pop("record_key"), row.pop("record_value")
    headers = row.pop("record_headers")
    row["record"] = {"key": readable(key), "value": readable(value),
                     "headers": [{"key": k, "value": readable(v)} for k, v in headers]}
    keys = [row["biz_key"]] if row.get("biz_key") else []
    try:
        keys = step_keys(decode(key, value, max_bytes=rt.settings.max_event_bytes))
    except MalformedEvent:
        pass
    row["idem"] = await rt.queries.idem(keys)
    row["order"] = await rt.queries.order(row["order_no"]) if row.get("order_no") else None
    return row
