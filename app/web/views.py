"""Health. (``/metrics`` is served by Faust's Prometheus sensor, set up in ``app.main``;
it exports the default registry, so ``app.metrics`` appear there too.)"""

from __future__ import annotations

from faust.web import Request, Response, View

from app.main import app, settings


@app.page("/health")
async def health(self: View, request: Request) -> Response:
    return self.json({"ok": True, "app_id": settings.app_id, "worker_id": settings.worker_id})
