"""The compensation queue, over JSON: list, look at, and act on dead letters.

    GET  /compensation/?status=&reason=&order_no=&older_than=&before=&limit=
    GET  /compensation/{id}
    GET  /compensation/{id}/record?part=value|envelope       (operators only: a download)
    POST /compensation/{id}/retry | /resolve | /discard      (bearer token; JSON {"note", "actor"})

Any worker serves the whole queue: it lives in MySQL. A viewer (``WEB_READ_TOKEN``) gets every
answer masked (``app.personal.masking``); an operator's look at a dead letter, and every download, is
written to ``t_view_audit`` first.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Callable

from aiohttp import web

from app.adapters.mysql.ledger.selection import QueueFilter
from app.adapters.mysql.reads.console import Queries
from app.adapters.mysql.reads.view_audit import Seen, ViewAudit
from app.compensation.compensator import Compensator
from app.personal.masking import mask_letter, order_numbers
from app.pipeline.envelopes import Reading
from app.pipeline.errors import MalformedEvent
from app.pipeline.events import ORDER_NO, decode
from app.pipeline.outage import OutageGuard
from app.pipeline.plan import step_keys
from app.pipeline.states import PERSON_ACTIONS, LedgerStatus
from app.render import json_default, with_record
from app.settings import Settings
from app.web.http import (
    NO_FRAMES,
    OPERATOR,
    Refused,
    Routes,
    as_seen,
    authorize,
    body,
    integer,
    json_response,
    moment,
    note_and_actor,
    operator,
    reader,
    refused,
    role,
    text,
)

REASON = re.compile(r"[a-z_.:0-9]{1,64}")
FINGERPRINT = re.compile(r"[0-9a-f]{16}")
STATUSES = {status.name.lower(): status for status in LedgerStatus}


async def list_queue(request: web.Request, *, settings: Settings, queries: Queries) -> web.Response:
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
        who = role(request, settings)
    except Refused as exc:
        return refused(exc)
    items = await queries.compensations(filters)
    cursor = items[-1]["id"] if len(items) == filters.limit else None
    answer = {"items": items, "next_before": cursor, "counts": await queries.counts()}
    return json_response(await as_seen(who, answer, queries))


async def show_letter(request: web.Request, row_id: str, *, settings: Settings, queries: Queries,
                      view_audit: ViewAudit, reading: Reading) -> web.Response:
    try:
        number = integer(row_id, "id", low=1, high=2 ** 62)
        who, name = reader(request, settings)
    except Refused as exc:
        return refused(exc)
    row = await queries.compensation(number)
    if row is None:
        return json_response({"error": f"no compensation row {number}"}, status=404)
    key, value = with_record(row)
    detail = await _detail(queries, row, key, value, max_bytes=settings.batches.max_event_bytes, reading=reading)
    if who != OPERATOR:
        contacts = await queries.contacts(order_numbers(detail, value))
        return json_response(mask_letter(detail, value, contacts))
    await view_audit.record(Seen(f"web:{name}", who, "dead_letter", request.path, compensation_id=number,
                                 order_no=row.get("order_no")))
    return json_response({**detail, "masked": False})


async def download_record(request: web.Request, row_id: str, action: str, *, settings: Settings, queries: Queries,
                          view_audit: ViewAudit) -> web.Response:
    try:
        if action != "record":
            raise Refused(404, f"no view {action!r} of a dead letter: record")
        operator(request, settings, "downloading a record")
        number = integer(row_id, "id", low=1, high=2 ** 62)
        part = request.query.get("part") or "value"
        if part not in ("value", "envelope"):
            raise Refused(400, "part must be value or envelope")
        _, name = reader(request, settings)
    except Refused as exc:
        return refused(exc)
    row = await queries.compensation(number)
    if row is None:
        return json_response({"error": f"no compensation row {number}"}, status=404)
    await view_audit.record(Seen(f"web:{name}", OPERATOR, f"download:{part}", request.path_qs,
                                 compensation_id=number, order_no=row.get("order_no")))
    return download(row, part)


async def act_on_letter(request: web.Request, row_id: str, action: str, *, settings: Settings,
                        compensator: Compensator, guard: Callable[[], OutageGuard]) -> web.Response:
    try:
        who = authorize(request, settings)
        if action not in ("retry", *PERSON_ACTIONS):
            raise Refused(404, f"no action {action!r}: retry, resolve or discard")
        number = integer(row_id, "id", low=1, high=2 ** 62)
        note, actor = note_and_actor(await body(request, settings), who, settings)
    except Refused as exc:
        return refused(exc)
    result = await compensator.perform(number, action, guard(), actor=actor, note=note)
    if not result.found:
        return json_response({"error": result.refused}, status=404)
    if result.refused:
        return json_response({"error": result.refused, **result.as_dict()}, status=409)
    return json_response(result.as_dict())


def download(row: dict, part: str) -> web.Response:
    """A dead letter's record as a file: ``value``, the value's bytes exactly as dead-lettered;
    ``envelope``, JSON with the key, the headers (base64, and text when UTF-8), what the value
    is (its size and SHA-256, whole or as the start of a longer one) and where it came from."""
    headers = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff", **NO_FRAMES}
    number = row["id"]
    value = row["record_value"] or b""
    if part == "value":
        return web.Response(body=value, content_type="application/octet-stream", headers={
            **headers, "Content-Disposition": f'attachment; filename="dead-letter-{number}-value.bin"'})
    key = row["record_key"]

    def encoded(data: bytes | None) -> dict | None:
        return None if data is None else {"base64": base64.b64encode(data).decode(), **_text(data)}

    envelope = {"id": number, "src_topic": row["src_topic"], "src_partition": row["src_partition"],
                "src_offset": row["src_offset"], "src_timestamp": row.get("src_timestamp"),
                "truncated": bool(row["truncated"]), "key": encoded(key),
                "headers": [{"key": k, "value": encoded(v)} for k, v in row["record_headers"]],
                "value": {"bytes": len(value), "sha256": hashlib.sha256(value).hexdigest(),
                          "whole_bytes": row.get("record_value_bytes") or len(value),
                          "whole_sha256": row.get("record_value_sha256") or hashlib.sha256(value).hexdigest()}}
    return web.Response(text=json.dumps(envelope, default=json_default, indent=2), content_type="application/json",
                        headers={**headers,
                                 "Content-Disposition": f'attachment; filename="dead-letter-{number}-envelope.json"'})


def _text(data: bytes) -> dict:
    try:
        return {"text": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {}


async def _detail(queries: Queries, row: dict, key: bytes | None, value: bytes | None, *, max_bytes: int,
                  reading: Reading) -> dict:
    """The row with its record (:func:`with_record`), its history, the t_idem rows of its
    event and its order."""
    keys = [row["biz_key"]] if row.get("biz_key") else []
    try:
        stamp = row.get("src_timestamp")
        keys = step_keys(decode(key, value, max_bytes=max_bytes, headers=row.get("record_headers") or (),
                                reading=reading, timestamp_ms=stamp if isinstance(stamp, int) and stamp >= 0 else None))
    except MalformedEvent:
        pass
    row["idem"] = await queries.idem(keys)
    row["order"] = await queries.order(row["order_no"]) if row.get("order_no") else None
    return row


ROUTES: Routes = {
    "/compensation/": {"get": list_queue},
    "/compensation/{row_id}": {"get": show_letter},
    "/compensation/{row_id}/{action}": {"get": download_record, "post": act_on_letter},
}
