"""The compensation console: ``GET /console/``, a static page over the JSON API (no
build step). It renders every value as text; the page forbids inline scripts and being
framed (CSP). The page holds no data: it asks for the token and sends it with every call."""

from __future__ import annotations

from pathlib import Path

import faust
from aiohttp import web
from faust.web import View

from app.settings import Settings

HERE = Path(__file__).parent
HEADERS = {"Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                                      "frame-ancestors 'none'",
           "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store",
           "Referrer-Policy": "no-referrer"}


def register(app: faust.App, settings: Settings) -> None:
    page = (HERE / "console.html").read_bytes()
    script = (HERE / "console.js").read_bytes()
    groups_script = (HERE / "console-groups.js").read_bytes()
    bulk_script = (HERE / "console-bulk.js").read_bytes()
    reconcile_script = (HERE / "console-reconcile.js").read_bytes()
    overview_script = (HERE / "console-overview.js").read_bytes()

    @app.page("/console/")
    async def console(self: View, request: web.Request) -> web.Response:
        return web.Response(body=page, content_type="text/html", charset="utf-8", headers=HEADERS)

    @app.page("/console/console.js")
    async def console_script(self: View, request: web.Request) -> web.Response:
        return web.Response(body=script, content_type="application/javascript", charset="utf-8", headers=HEADERS)

    @app.page("/console/console-groups.js")
    async def console_groups_script(self: View, request: web.Request) -> web.Response:
        return web.Response(body=groups_script, content_type="application/javascript", charset="utf-8",
                            headers=HEADERS)

    @app.page("/console/console-bulk.js")
    async def console_bulk_script(self: View, request: web.Request) -> web.Response:
        return web.Response(body=bulk_script, content_type="application/javascript", charset="utf-8",
                            headers=HEADERS)

    @app.page("/console/console-reconcile.js")
    async def console_reconcile_script(self: View, request: web.Request) -> web.Response:
        return web.Response(body=reconcile_script, content_type="application/javascript", charset="utf-8",
                            headers=HEADERS)

    @app.page("/console/console-overview.js")
    async def console_overview_script(self: View, request: web.Request) -> web.Response:
        return web.Response(body=overview_script, content_type="application/javascript", charset="utf-8",
                            headers=HEADERS)
