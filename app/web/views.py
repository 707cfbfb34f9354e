"""The web views, registered on the Faust app's own web server by ``app.main``."""

from __future__ import annotations

import functools

import faust

from app import exits
from app.adapters.web_tokens import TokensFileError, tokens_file
from app.bootstrap import Runtime
from app.settings import Settings
from app.web import (
    bulk,
    compensation,
    console,
    groups,
    health,
    http,
    orders,
    reconcile,
    reconcile_cases,
    roles,
    skipped,
)


def middlewares(settings: Settings) -> list:
    """What runs before every view: who may ask (a token, a Host of ours; ``app.web.http``)."""
    return [http.access(settings)]


def register(app: faust.App, runtime: Runtime, settings: Settings) -> None:
    # A worker whose WEB_TOKENS_FILE cannot be read does not start (a command does not read it).
    app.startup_checks.append(functools.partial(check_tokens_file, settings=settings))  # type: ignore[attr-defined]
    health.register(app, runtime, settings)
    compensation.register(app, runtime, settings)
    orders.register(app, runtime, settings)
    roles.register(app, runtime, settings)
    console.register(app, settings)
    groups.register(app, runtime, settings)
    bulk.register(app, runtime, settings)
    skipped.register(app, runtime, settings)
    reconcile.register(app, runtime, settings)
    reconcile_cases.register(app, runtime, settings)


async def check_tokens_file(app: faust.App, settings: Settings) -> None:
    """A worker whose WEB_TOKENS_FILE cannot be read does not start (exit 78, naming the line)."""
    book = tokens_file(settings)
    if book is None:
        return
    try:
        book.people()
    except TokensFileError as exc:
        exits.stop_at_startup(exits.EXIT_CONFIG, f"cannot start: {exc}")
