"""The store's watermark, advanced by every worker every ``STORE_WATERMARK_SECONDS``: in the
database, then on Kafka, and compared with what Kafka remembers (``app.adapters.watermark``).
A store found behind (restored from a backup while the workers ran, or before they started)
opens a recovery window by itself."""

from __future__ import annotations

import faust

from app.bootstrap import Runtime, RuntimeStopping
from app.settings import Settings


def register(app: faust.App, runtime: Runtime, settings: Settings):
    @app.timer(interval=settings.database.store_watermark_seconds)
    async def advance_store_watermark() -> None:
        rt = runtime.started()
        try:
            async with rt.working():            # a stopping runtime waits for it before it closes anything
                await rt.watermark.advance()
        except RuntimeStopping:
            return

    return advance_store_watermark
