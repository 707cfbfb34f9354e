"""What every view needs: JSON in and out, validated input, the token on actions.

* Every POST carries ``Authorization: Bearer <WEB_TOKEN>``, compared in constant time.
  Without a configured token, actions answer 403 and say how to set one.
* Inputs are checked before they reach a query (400 with the reason); every query
  binds its values as parameters.
* A body larger than ``WEB_MAX_BODY_BYTES`` is refused (413) before it is read.
"""

from __future__ import annotations

import hmac
import json
import re
from typing import Any

from aiohttp import web

from app.render import ACTOR, json_default, readable
from app.settings import Settings

__all__ = ["ACTOR", "Refused", "authorize", "body", "integer", "json_response", "note_and_actor", "readable",
           "refused", "text"]


class Refused(Exception):
    """An answer other than 200, with its reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data, default=json_default), status=status, content_type="application/json",
                        headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})


def refused(exc: Refused) -> web.Response:
    return json_response({"error": exc.reason}, status=exc.status)


def authorize(request: web.Request, settings: Settings) -> None:
    if settings.web_token is None:
        raise Refused(403, "actions are disabled: set WEB_TOKEN in the worker's environment, then send "
                           "'Authorization: Bearer <token>'")
    given = request.headers.get("Authorization", "")
    scheme, _, token = given.partition(" ")
    expected = settings.web_token.get_secret_value().encode()
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected):
        raise Refused(401, "missing or wrong bearer token")


async def body(request: web.Request, settings: Settings) -> dict[str, Any]:
    """The JSON object of a POST (empty allowed), at most ``WEB_MAX_BODY_BYTES``."""
    limit = settings.web_max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise Refused(413, f"the body is over {limit} bytes")
    raw = await request.content.read(limit + 1)
    if len(raw) > limit:
        raise Refused(413, f"the body is over {limit} bytes")
    if not raw.strip():
        return {}
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Refused(400, f"the body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise Refused(400, "the body must be a JSON object")
    return doc


def note_and_actor(doc: dict[str, Any], channel: str) -> tuple[str | None, str]:
    note = doc.get("note")
    if note is not None and (not isinstance(note, str) or len(note) > 1024):
        raise Refused(400, "note must be a string of at most 1024 characters")
    actor = doc.get("actor", "anonymous")
    if not isinstance(actor, str) or not ACTOR.fullmatch(actor):
        raise Refused(400, "actor must be 1-64 letters, digits or _.@+-")
    return note, f"{channel}:{actor}"


def integer(value: str | None, name: str, *, low: int, high: int, default: int | None = None) -> int | None:
    if value is None or value == "":
        return default
    if not re.fullmatch(r"[0-9]{1,12}", value):
        raise Refused(400, f"{name} must be a whole number")
    number = int(value)
    if not low <= number <= high:
        raise Refused(400, f"{name} must be between {low} and {high}")
    return number


def text(value: str | None, name: str, pattern: re.Pattern, what: str) -> str | None:
    if value is None or value == "":
        return None
    if not pattern.fullmatch(value):
        raise Refused(400, f"{name} must be {what}")
    return value
