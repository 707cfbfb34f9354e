"""The operator controls over JSON (``app.pipeline.controls``): an effect held across the group, a
partition of the input paused.

    GET  /controls/                         the holds in force or to come, the pauses, the latest ended
                                            and the audit; any reading token (a viewer's reasons masked)
    POST /controls/holds/                   {"effect", "reason", "start"?, "end" | "hours", "until_released"?}
    POST /controls/holds/{id}/release       {"note"}
    POST /controls/pauses/                  {"partition", "topic"?, "reason"}
    POST /controls/pauses/{partition}/resume    {"note", "topic"?}

Every action needs the operator's token and is audited (``t_control_audit``) as ``web:<who>``; each
worker sees it within ``CONTROLS_REFRESH_SECONDS``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from app.adapters.mysql.controls import ControlRefused, MySqlControls
from app.adapters.mysql.reads.console import Queries
from app.pipeline.controls import Controls, hold_window
from app.settings import Settings
from app.web.http import (
    Refused,
    Routes,
    as_seen,
    authorize,
    body,
    integer,
    json_response,
    moment,
    note_and_actor,
    refused,
    role,
)

REASON_CHARS = 1024


async def show_controls(request: web.Request, *, settings: Settings, operator_controls: MySqlControls,
                        controls: Controls, queries: Queries, effect_names: tuple[str, ...]) -> web.Response:
    holds, pauses = await operator_controls.in_force()
    answer = {"holds": [h.as_dict() for h in holds], "pauses": [p.as_dict() for p in pauses],
              "ended": [e.as_dict() for e in await operator_controls.ended(20)],
              "audit": await operator_controls.audit(20), "effects": list(effect_names),
              "topic": settings.kafka.topic, "partitions": settings.kafka.partitions,
              "refresh_seconds": settings.operations.controls_refresh_seconds,
              "this_worker": {"held": sorted(controls.held()),
                              "paused": [{"topic": t, "partition": p} for t, p in sorted(controls.paused())]}}
    return json_response(await as_seen(role(request, settings), answer, queries))


async def hold_effect(request: web.Request, *, settings: Settings, operator_controls: MySqlControls,
                      effect_names: tuple[str, ...]) -> web.Response:
    try:
        who = authorize(request, settings)
        doc = await body(request, settings)
        effect = doc.get("effect")
        if effect not in effect_names:
            raise Refused(400, f"effect must be one of {', '.join(effect_names)}")
        reason = _reason(doc.get("reason"))
        hours = doc.get("hours")
        if hours is not None and (isinstance(hours, bool) or not isinstance(hours, (int, float))):
            raise Refused(400, "hours must be a number")
        until_released = doc.get("until_released", False)
        if not isinstance(until_released, bool):
            raise Refused(400, "until_released must be true or false")
        start, end = moment(_string(doc, "start"), "start"), moment(_string(doc, "end"), "end")
        try:
            begins, lasts = hold_window(datetime.now(UTC), start=start, end=end, hours=hours)
        except ValueError as exc:
            raise Refused(400, str(exc)) from None
        _, actor = note_and_actor({k: v for k, v in doc.items() if k == "actor"}, who, settings)
    except Refused as exc:
        return refused(exc)
    try:
        made = await operator_controls.hold(effect, reason=reason, actor=actor, starts_in=begins, lasts=lasts,
                                            auto_release=not until_released)
    except ControlRefused as exc:
        return json_response({"error": str(exc)}, status=400)
    return json_response({"held": made.as_dict()}, status=201)


async def release_hold(request: web.Request, hold_id: str, *, settings: Settings,
                       operator_controls: MySqlControls) -> web.Response:
    try:
        who = authorize(request, settings)
        number = integer(hold_id, "id", low=1, high=2 ** 62)
        note, actor = note_and_actor(await body(request, settings), who, settings)
        if not (note or "").strip():
            raise Refused(400, "ending a hold needs a note: what changed")
    except Refused as exc:
        return refused(exc)
    ended = await operator_controls.release(actor=actor, note=note or "", hold_id=number)
    if not ended:
        return json_response({"error": f"no hold {number} in force"}, status=404)
    return json_response({"ended": [hold.as_dict() for hold in ended]})


async def pause_partition(request: web.Request, *, settings: Settings,
                          operator_controls: MySqlControls) -> web.Response:
    try:
        who = authorize(request, settings)
        doc = await body(request, settings)
        topic, partition = _partition(doc, settings)
        reason = _reason(doc.get("reason"))
        _, actor = note_and_actor({k: v for k, v in doc.items() if k == "actor"}, who, settings)
    except Refused as exc:
        return refused(exc)
    made, new = await operator_controls.pause(topic, partition, reason=reason, actor=actor)
    return json_response({"paused": made.as_dict(), "new": new}, status=201 if new else 200)


async def resume_partition(request: web.Request, partition: str, *, settings: Settings,
                           operator_controls: MySqlControls) -> web.Response:
    try:
        who = authorize(request, settings)
        doc = await body(request, settings)
        topic, number = _partition({**doc, "partition": partition}, settings)
        note, actor = note_and_actor(doc, who, settings)
        if not (note or "").strip():
            raise Refused(400, "resuming needs a note: what was found")
    except Refused as exc:
        return refused(exc)
    ended = await operator_controls.resume(topic, number, actor=actor, note=note or "")
    if ended is None:
        return json_response({"error": f"{topic}[{number}] is not paused"}, status=404)
    return json_response({"resumed": ended.as_dict()})


def _reason(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > REASON_CHARS:
        raise Refused(400, f"reason must say why, in at most {REASON_CHARS} characters: what people will read "
                           "while it lasts")
    return value.strip()


def _string(doc: dict, name: str) -> str | None:
    value = doc.get(name)
    if value is not None and not isinstance(value, str):
        raise Refused(400, f"{name} must be an ISO 8601 time, like 2026-12-08T02:00:00+08:00")
    return value


def _partition(doc: dict, settings: Settings) -> tuple[str, int]:
    topic = doc.get("topic") or settings.kafka.topic
    if topic != settings.kafka.topic:
        raise Refused(400, f"only the input's partitions pause: topic must be {settings.kafka.topic}")
    value = doc.get("partition")
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise Refused(400, f"partition must be 0 to {settings.kafka.partitions - 1}")
    number = integer(str(value), "partition", low=0, high=settings.kafka.partitions - 1)
    if number is None:
        raise Refused(400, f"partition must be 0 to {settings.kafka.partitions - 1}")
    return topic, number


ROUTES: Routes = {
    "/controls/": {"get": show_controls},
    "/controls/holds/": {"post": hold_effect},
    "/controls/holds/{hold_id}/release": {"post": release_hold},
    "/controls/pauses/": {"post": pause_partition},
    "/controls/pauses/{partition}/resume": {"post": resume_partition},
}
