"""Health and Prometheus metrics."""

from __future__ import annotations

import faust
from faust.web import Request, Response, View
from prometheus_client import generate_latest

from app.settings import Settings


def register(app: faust.App, settings: Settings) -> None:
    @app.page("/health")
    async def health(self: View, request: Request) -> Response:
        return self.json({"ok": True, "app_id": settings.app_id, "worker_id": settings.worker_id})

    @app.page("/metrics")
    async def metrics(self: View, request: Request) -> Response:
        # prometheus_client's CONTENT_TYPE_LATEST carries a charset, which aiohttp refuses here.
        return self.bytes(generate_latest(), content_type="text/plain; version=0.0.4")
