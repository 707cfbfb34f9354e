"""The ``order-event`` agent (walking skeleton): decode, record each event in t_idem."""

from __future__ import annotations

import logging

from app.main import app, order_events, settings
from app.metrics import EVENTS, MALFORMED
from app.pipeline.errors import MalformedEvent
from app.pipeline.events import decode
from app.runtime import Runtime

log = logging.getLogger(__name__)
runtime = Runtime(settings)


@app.agent(order_events, concurrency=1)
async def process_order_events(stream):
    await runtime.start()
    async for batch in stream.take_events(settings.batch_size, within=settings.batch_within_seconds):
        keys = []
        for event in batch:
            try:
                decoded = decode(event.key, event.value, max_bytes=settings.max_event_bytes)
            except MalformedEvent as exc:
                message = event.message
                log.warning("malformed event at %s[%s]@%s: %s (%s)", message.topic, message.partition,
                            message.offset, exc.reason, exc)
                MALFORMED.labels(exc.reason).inc()
                continue
            keys.append(f"{decoded.order_no}:{decoded.type.value}")
        await runtime.store.record(sorted(set(keys)))
        EVENTS.labels("done").inc(len(keys))


@app.on_before_shutdown.connect
async def close_runtime(sender, **kwargs) -> None:
    await runtime.stop()
