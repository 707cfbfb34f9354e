"""Row f, Faust's own ceiling: the worker's Faust configuration (uvloop, batch-level
monitor, raw serializers, ``take_events(BATCH_SIZE)``, concurrency 1) with an agent
that does nothing with its batches. ``faust -A bench.noop_app worker``."""

from __future__ import annotations

from faust.web import Request, Response, View

from app.faust_app import create_app, freeze_startup_objects, order_event_topic
from app.settings import get_settings

settings = get_settings()
app = create_app(settings)
order_events = order_event_topic(app, settings)


@app.agent(order_events, concurrency=1)
async def consume(stream):
    freeze_startup_objects()
    async for _batch in stream.take_events(settings.batches.size, within=settings.batches.within_seconds):
        pass


@app.page("/health")
async def health(self: View, request: Request) -> Response:
    return self.json({"ok": True})


@app.page("/metrics")
async def metrics(self: View, request: Request) -> Response:
    return self.bytes(b"", content_type="text/plain; version=0.0.4")
