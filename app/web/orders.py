"""Orders and steps, over JSON.

    GET /orders/{order_no}   the order's timeline: its state, every t_idem row, receipts, its newest 50
                             dead letters and how many it has (``dead_letters_total``, up to 10,001)
    GET /idem/{biz_key}      one t_idem row
    GET /idem/stuck/         pending rows older than STUCK_PENDING_SECONDS (at most 200, oldest first)

A viewer (``WEB_READ_TOKEN``) gets every answer masked (``app.personal.masking``); an operator's look at
an order's timeline is written to ``t_view_audit`` first.
"""

from __future__ import annotations

import re

from aiohttp import web

from app.adapters.mysql.reads.console import COUNT_CAP, ORDER_LETTERS, Queries
from app.adapters.mysql.reads.view_audit import Seen, ViewAudit
from app.pipeline.events import ORDER_NO
from app.settings import Settings
from app.web.http import OPERATOR, Refused, Routes, as_seen, integer, json_response, reader, refused, role, text

BIZ_KEY = re.compile(r"ORD-[0-9]{8}-[A-Za-z0-9]{1,40}:[A-Z_]{1,32}:[a-z_]{1,32}")


async def order_timeline(request: web.Request, order_no: str, *, settings: Settings, queries: Queries,
                         view_audit: ViewAudit) -> web.Response:
    try:
        order_no = text(order_no, "order_no", ORDER_NO, "ORD-YYYYMMDD-<letters or digits>")
        who, name = reader(request, settings)
    except Refused as exc:
        return refused(exc)
    order = await queries.order(order_no)
    steps = await queries.idem_of_order(order_no)
    letters = await queries.dead_letters_of_order(order_no)
    if order is None and not steps and not letters:
        return json_response({"error": f"nothing is known of order {order_no}"}, status=404)
    total = len(letters)
    if total >= ORDER_LETTERS:
        total = await queries.dead_letters_of_order_count(order_no)
    answer = {"order_no": order_no, "order": order, "steps": steps,
              "receipts": await queries.receipts(order_no), "dead_letters": letters,
              "dead_letters_total": min(total, COUNT_CAP), "dead_letters_capped": total > COUNT_CAP,
              "dead_letters_all": f"/compensation/?order_no={order_no}"}
    if who != OPERATOR:
        return json_response(await as_seen(who, answer, queries))
    await view_audit.record(Seen(f"web:{name}", who, "timeline", request.path, order_no=order_no))
    return json_response({**answer, "masked": False})


async def stuck_steps(request: web.Request, *, settings: Settings, queries: Queries) -> web.Response:
    try:
        limit = integer(request.query.get("limit"), "limit", low=1, high=200, default=100)
        who = role(request, settings)
    except Refused as exc:
        return refused(exc)
    rows = await queries.stuck(settings.operations.stuck_pending_seconds, limit)
    answer = {"older_than_seconds": settings.operations.stuck_pending_seconds, "rows": rows}
    return json_response(await as_seen(who, answer, queries))


async def step(request: web.Request, biz_key: str, *, settings: Settings, queries: Queries) -> web.Response:
    try:
        biz_key = text(biz_key, "biz_key", BIZ_KEY, "<order_no>:<TYPE>:<step>")
        who = role(request, settings)
    except Refused as exc:
        return refused(exc)
    rows = await queries.idem([biz_key])
    if not rows:
        return json_response({"error": f"no t_idem row {biz_key}"}, status=404)
    return json_response(await as_seen(who, rows[0], queries))


ROUTES: Routes = {
    "/orders/{order_no}": {"get": order_timeline},
    "/idem/stuck/": {"get": stuck_steps},
    "/idem/{biz_key}": {"get": step},
}
