"""The compensation console: ``GET /console/``, a static page over the JSON API (no
build step). It renders every value as text; the page forbids inline scripts and being
framed (CSP). The page holds no data: it asks for the token and sends it with every call."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from app.web.http import Routes

HERE = Path(__file__).parent
HEADERS = {"Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                                      "frame-ancestors 'none'",
           "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store",
           "Referrer-Policy": "no-referrer"}
# Read once, as the worker imports its views.
PAGE = (HERE / "console.html").read_bytes()
SCRIPT = (HERE / "console.js").read_bytes()
GROUPS_SCRIPT = (HERE / "console-groups.js").read_bytes()
BULK_SCRIPT = (HERE / "console-bulk.js").read_bytes()
RECONCILE_SCRIPT = (HERE / "console-reconcile.js").read_bytes()
OVERVIEW_SCRIPT = (HERE / "console-overview.js").read_bytes()
CONTROLS_SCRIPT = (HERE / "console-controls.js").read_bytes()


def _script(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="application/javascript", charset="utf-8", headers=HEADERS)


async def console(request: web.Request) -> web.Response:
    return web.Response(body=PAGE, content_type="text/html", charset="utf-8", headers=HEADERS)


async def console_script(request: web.Request) -> web.Response:
    return _script(SCRIPT)


async def console_groups_script(request: web.Request) -> web.Response:
    return _script(GROUPS_SCRIPT)


async def console_bulk_script(request: web.Request) -> web.Response:
    return _script(BULK_SCRIPT)


async def console_reconcile_script(request: web.Request) -> web.Response:
    return _script(RECONCILE_SCRIPT)


async def console_overview_script(request: web.Request) -> web.Response:
    return _script(OVERVIEW_SCRIPT)


async def console_controls_script(request: web.Request) -> web.Response:
    return _script(CONTROLS_SCRIPT)


ROUTES: Routes = {
    "/console/": {"get": console},
    "/console/console.js": {"get": console_script},
    "/console/console-groups.js": {"get": console_groups_script},
    "/console/console-bulk.js": {"get": console_bulk_script},
    "/console/console-reconcile.js": {"get": console_reconcile_script},
    "/console/console-overview.js": {"get": console_overview_script},
    "/console/console-controls.js": {"get": console_controls_script},
}
