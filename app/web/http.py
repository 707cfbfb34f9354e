"""What every view needs: who may ask, JSON in and out, validated input.

* :func:`access` guards every path of the web server, Faust's own included, before any
  view runs: only ``/health``, ``/healthz``, ``/readyz``, ``/metrics`` and the console's
  static page and script answer without a token. Everything else needs ``Authorization:
  Bearer <token>``: ``WEB_READ_TOKEN`` (a viewer: personal fields masked) or ``WEB_TOKEN``
  (an operator: whole values, downloads) to read, ``WEB_TOKEN`` for any other method; or a
  person's own token of either role (``WEB_TOKENS_FILE``, ``app.adapters.web_tokens``); compared in
  constant time; a header that is not UTF-8 text answers 401 and is not repeated. Without a
  configured token, 403 says which to set. A ``Host`` header that is not one of
  ``settings.web.host_names`` answers 421, so a page on another site cannot reach the views
  through a name that resolves here (DNS rebinding).
* Who acts (:func:`note_and_actor`) and who saw whole values (:func:`reader`): the person a
  token of ``WEB_TOKENS_FILE`` names, whatever the request says (a body's ``actor`` that says
  otherwise is kept in the note); with a shared token (``WEB_TOKEN``, ``WEB_READ_TOKEN``) the
  name the request gives (``actor``, ``X-Actor``) as before, ``anonymous`` without one, but
  never the name of a person who has a token of their own.
* Inputs are checked before they reach a query (400 with the reason); every query
  binds its values as parameters.
* A body larger than ``WEB_MAX_BODY_BYTES`` is refused (413) before it is read.
"""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from app.adapters.mysql.reads.console import Queries
from app.adapters.web_tokens import TokensFileError, digest, tokens_file
from app.personal.masking import mask_answer, order_numbers
from app.render import ACTOR, json_default, readable
from app.settings import Settings

__all__ = ["ACTOR", "OPERATOR", "Caller", "Refused", "Routes", "as_seen", "VIEWER", "access", "authorize", "body",
           "caller", "integer", "json_response", "moment", "note_and_actor", "operator", "readable", "reader",
           "refused", "role", "text"]

# A module's routes: each path, and the handler of each of its methods ("get", "post"), an async function
# of the request and the path's parts whose keyword-only parameters name what it uses (app.web.views).
Routes = dict[str, dict[str, Callable[..., Awaitable[web.Response]]]]


class Refused(Exception):
    """An answer other than 200, with its reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


OPEN_PATHS = frozenset({"/health", "/healthz", "/readyz", "/metrics"})     # probes and scrapers, any Host
PAGES = frozenset({"/console/", "/console/console.js",                     # no data: the token is asked for there
                   "/console/console-groups.js", "/console/console-bulk.js",
                   "/console/console-reconcile.js", "/console/console-overview.js",
                   "/console/console-controls.js"})
READS = frozenset({"GET", "HEAD"})
VIEWER, OPERATOR = "viewer", "operator"
NOTE_CHARS = 1024


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request's token says asks: its role, and the person when the token is one's own."""
    role: str                       # OPERATOR or VIEWER
    person: str | None = None       # the name WEB_TOKENS_FILE gives the token; None: a shared token
NO_FRAMES = {"X-Frame-Options": "DENY", "Content-Security-Policy": "frame-ancestors 'none'"}


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data, default=json_default), status=status, content_type="application/json",
                        headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff", **NO_FRAMES})


def access(settings: Settings):
    """The aiohttp middleware that guards every path (see the module docstring)."""
    allowed = settings.web.host_names

    @web.middleware
    async def guard(request: web.Request, handler):
        if request.path in OPEN_PATHS:
            return await handler(request)
        host = _hostname(request.host)
        if host not in allowed:
            return json_response({"error": _misdirected(host or request.host)}, status=421)
        if request.path in PAGES and request.method in READS:
            return await handler(request)
        try:
            _token(request, settings, read=request.method in READS)
        except Refused as exc:
            return refused(exc)
        return await handler(request)

    return guard


def _misdirected(host: str) -> str:
    if not _utf8(host):
        # Bytes that are not UTF-8 (lone surrogates from aiohttp) are no name of ours: not repeated.
        return "this server does not answer to a Host header that is not UTF-8 text"
    return f"this server does not answer to the Host {host!r}; set WEB_ALLOWED_HOSTS if people reach it by that name"


def _hostname(host: str | None) -> str | None:
    try:
        return urlsplit(f"//{host}").hostname if host else None
    except ValueError:
        return None


def _token(request: web.Request, settings: Settings, *, read: bool) -> Caller:
    """Who the request's token says asks (``WEB_TOKEN``: an operator; ``WEB_READ_TOKEN``, when ``read``:
    a viewer; a line of ``WEB_TOKENS_FILE``: that person as its role, a viewer's only when ``read``),
    or :class:`Refused`."""
    shared = [(OPERATOR, settings.web.token), (VIEWER, settings.web.read_token if read else None)]
    shared = [(role, t) for role, t in shared if t is not None]
    book = tokens_file(settings)
    if not shared and book is None:
        raise Refused(403, "reading the data views needs a token: set WEB_READ_TOKEN, WEB_TOKEN or WEB_TOKENS_FILE "
                           "in the worker's environment, then send 'Authorization: Bearer <token>'" if read else
                      "actions are disabled: set WEB_TOKEN or WEB_TOKENS_FILE in the worker's environment, then "
                      "send 'Authorization: Bearer <token>'")
    header = request.headers.get("Authorization", "")
    if not _utf8(header):
        # aiohttp hands bytes that are not UTF-8 over as lone surrogates, which no token holds
        # and which cannot be encoded to compare: refused as they are, never repeated.
        raise Refused(401, "the Authorization header is not UTF-8 text: send 'Authorization: Bearer <token>'")
    scheme, _, given = header.partition(" ")
    given_bytes = given.strip().encode()
    # Every configured token is compared, whichever matches: the time taken says nothing.
    matches = [Caller(role) for role, t in shared if hmac.compare_digest(given_bytes, t.get_secret_value().encode())]
    broken = False
    if book is not None:
        try:
            people = book.people()
        except TokensFileError:
            people, broken = (), True
        hashed = digest(given_bytes).encode()
        matches += [Caller(p.role, p.name) for p in people
                    if hmac.compare_digest(hashed, p.digest.encode()) and (read or p.role == OPERATOR)]
    if scheme.lower() != "bearer" or not matches:
        if broken:
            raise Refused(503, "per-person tokens are refused for now: the worker cannot read WEB_TOKENS_FILE "
                               "(its log says why)")
        raise Refused(401, "missing or wrong bearer token")
    # An operator's token first (the same secret in both reads whole), a person's before a shared one.
    return min(matches, key=lambda c: (c.role != OPERATOR, c.person is None))


def _utf8(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def caller(request: web.Request, settings: Settings) -> Caller:
    """Who asks a ``GET``: its role and, with a token of its own, the person."""
    return _token(request, settings, read=True)


def role(request: web.Request, settings: Settings) -> str:
    """Who asks a ``GET``: :data:`OPERATOR` (``WEB_TOKEN``: whole values, downloads, actions) or
    :data:`VIEWER` (``WEB_READ_TOKEN``: personal fields masked, see ``app.personal.masking``)."""
    return caller(request, settings).role


async def as_seen(who: str, answer: dict, queries: Queries) -> dict:
    """``answer`` as ``who`` may see it: whole for an operator; masked for a viewer, with the phone
    and address of every order it names known to the masker (``queries.contacts``), so they are
    found in its messages even when the answer does not show the order."""
    if who == OPERATOR:
        return answer
    return mask_answer(answer, await queries.contacts(order_numbers(answer)))


def operator(request: web.Request, settings: Settings, what: str) -> None:
    """Refuse (403) a viewer what only an operator may have."""
    if role(request, settings) != OPERATOR:
        raise Refused(403, f"{what} needs the operator's token (WEB_TOKEN); WEB_READ_TOKEN sees masked values only")


def reader(request: web.Request, settings: Settings) -> tuple[str, str]:
    """Who reads, for the audit of unmasked views: the role, and the person their token names, else
    the ``X-Actor`` header (the console and the API send it), validated like ``actor``;
    ``anonymous`` without one."""
    who = caller(request, settings)
    said = request.headers.get("X-Actor", "").strip() or None
    if said is not None and not ACTOR.fullmatch(said):
        raise Refused(400, "X-Actor must be 1-64 letters, digits or _.@+-")
    return who.role, _name(who, said, settings)


def _name(who: Caller, said: str | None, settings: Settings) -> str:
    """The name the audit writes: the token's person, else what the request said (never a person's
    name under a shared token: the audit would name them for what another did)."""
    if who.person is not None:
        return who.person
    book = tokens_file(settings)
    if said is not None and book is not None:
        try:
            names = book.names()
        except TokensFileError:
            names = frozenset()
        if said in names:
            raise Refused(403, f"{said} has a token of their own (WEB_TOKENS_FILE): use it; a shared token cannot "
                               "act or read under a person's name")
    return said or "anonymous"


def refused(exc: Refused) -> web.Response:
    return json_response({"error": exc.reason}, status=exc.status)


def authorize(request: web.Request, settings: Settings) -> Caller:
    """An action's token (:func:`access` has checked it already; a view checks it again): who acts."""
    return _token(request, settings, read=False)


async def body(request: web.Request, settings: Settings) -> dict[str, Any]:
    """The JSON object of a POST (empty allowed), at most ``WEB_MAX_BODY_BYTES``."""
    limit = settings.web.max_body_bytes
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


def note_and_actor(doc: dict[str, Any], who: Caller, settings: Settings) -> tuple[str | None, str]:
    """An action's note and its actor, ``web:<name>`` (see the module's docstring): a body's ``actor``
    that is not the token's person is kept at the end of the note."""
    note = doc.get("note")
    if note is not None and (not isinstance(note, str) or len(note) > NOTE_CHARS):
        raise Refused(400, f"note must be a string of at most {NOTE_CHARS} characters")
    said = doc.get("actor")
    if said is not None and (not isinstance(said, str) or not ACTOR.fullmatch(said)):
        raise Refused(400, "actor must be 1-64 letters, digits or _.@+-")
    name = _name(who, said, settings)
    if said is not None and said != name:
        told = f"[the request named the actor {said}; the token is {name}'s]"
        note = f"{note[:NOTE_CHARS - len(told) - 1]} {told}" if note else told
    return note, f"web:{name}"


def integer(value: str | None, name: str, *, low: int, high: int, default: int | None = None) -> int | None:
    if value is None or value == "":
        return default
    if not re.fullmatch(r"[0-9]{1,12}", value):
        raise Refused(400, f"{name} must be a whole number")
    number = int(value)
    if not low <= number <= high:
        raise Refused(400, f"{name} must be between {low} and {high}")
    return number


def moment(value: str | None, name: str) -> datetime | None:
    """An instant in ISO 8601 (``2026-12-01T10:00:00Z``; without a zone it is UTC)."""
    if value is None or value == "":
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
    except ValueError:
        raise Refused(400, f"{name} must be an ISO 8601 time like 2026-12-01T10:00:00Z") from None
    return when.astimezone(UTC) if when.tzinfo else when.replace(tzinfo=UTC)


def text(value: str | None, name: str, pattern: re.Pattern, what: str) -> str | None:
    if value is None or value == "":
        return None
    if not pattern.fullmatch(value):
        raise Refused(400, f"{name} must be {what}")
    return value
