"""The web views: each module's routes (``ROUTES``: a path, and each of its methods' handler), installed
on the Faust app's own web server by ``app.main``, each handler handed what it names (``app.injection``).

Faust routes a path to a ``View`` class and serves the methods the class defines (HEAD with GET);
the class of each path is made here from its handlers, which stay plain module-level functions.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping

import faust
from aiohttp import web
from faust.web import View

from app import exits
from app.adapters.web_tokens import TokensFileError, tokens_file
from app.injection import Wire
from app.settings import Settings
from app.web import (
    bulk,
    compensation,
    console,
    controls,
    groups,
    health,
    http,
    orders,
    reconcile,
    reconcile_cases,
    roles,
    skipped,
)

# In the order their routes are added: a path with a fixed part before one with a variable part there.
MODULES = (health, compensation, orders, roles, console, groups, bulk, skipped, reconcile, reconcile_cases, controls)


def middlewares(settings: Settings) -> list:
    """What runs before every view: who may ask (a token, a Host of ours; ``app.web.http``)."""
    return [http.access(settings)]


def register(app: faust.App, settings: Settings, wire: Wire) -> None:
    # A worker whose WEB_TOKENS_FILE cannot be read does not start (a command does not read it).
    app.startup_checks.append(functools.partial(check_tokens_file, settings=settings))  # type: ignore[attr-defined]
    for module in MODULES:
        for path, methods in module.ROUTES.items():
            app.page(path)(view(methods, wire))


def view(methods: Mapping[str, Callable[..., Awaitable[web.Response]]], wire: Wire) -> type[View]:
    """The ``View`` of one path: each method ("get", "post") calls its handler with the request, the
    path's parts and what the handler names. Named after the first handler, in its module."""
    first = next(iter(methods.values()))
    served = {method: _method(wire(handler)) for method, handler in methods.items()}
    return type(first.__name__, (View,), {**served, "__module__": first.__module__, "__doc__": first.__doc__})


def _method(handler: Callable[..., Awaitable[web.Response]]) -> Callable[..., Awaitable[web.Response]]:
    async def method(view: View, request: web.Request, **parts: str) -> web.Response:
        return await handler(request, **parts)
    return method


async def check_tokens_file(app: faust.App, settings: Settings) -> None:
    """A worker whose WEB_TOKENS_FILE cannot be read does not start (exit 78, naming the line)."""
    book = tokens_file(settings)
    if book is None:
        return
    try:
        book.people()
    except TokensFileError as exc:
        exits.stop_at_startup(exits.EXIT_CONFIG, f"cannot start: {exc}")
