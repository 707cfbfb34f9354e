"""The web views, registered on the Faust app's own web server by ``app.main``."""

from __future__ import annotations

import faust

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
