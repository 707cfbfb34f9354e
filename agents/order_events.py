"""The ``order-event`` agent: decode a batch, run it through the pipeline."""

from __future__ import annotations

import logging
import os

from app.main import app, order_events, settings
from app.metrics import EVENTS, MALFORMED
from app.pipeline.errors import MalformedEvent
from app.pipeline.events import decode
from app.runtime import Runtime

log = logging.getLogger(__name__)
runtime = Runtime(settings)


@app.agent(order_events, concurrency=1)
async def process_order_events(stream):
    rt = await runtime.start()
    async for batch in stream.take_events(settings.batch_size, within=settings.batch_within_seconds):
        try:
            events = []
            for event in batch:
                try:
                    events.append(decode(event.key, event.value, max_bytes=settings.max_event_bytes))
                except MalformedEvent as exc:
                    message = event.message
                    log.warning("malformed event at %s[%s]@%s: %s (%s)", message.topic, message.partition,
                                message.offset, exc.reason, exc)
                    MALFORMED.labels(exc.reason).inc()
            for event, result in zip(events, await rt.processor.run(events)):
                if result.error is not None:
                    log.warning("%s of %s failed: %s (%s)", event.type.value, event.order_no,
                                result.error.reason, result.error)
                EVENTS.labels(result.outcome or (result.error.reason if result.error else "deferred")).inc()
        except BaseException:
            # take_events() acks the batch when the body raises: stop before that.
            log.critical("batch failed; stopping the worker without acking it", exc_info=True)
            os._exit(70)


@app.on_before_shutdown.connect
async def close_runtime(sender, **kwargs) -> None:
    await runtime.stop()
