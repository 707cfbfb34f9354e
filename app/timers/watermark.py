"""The store's watermark, advanced by every worker every ``STORE_WATERMARK_SECONDS``: in the
database, then on Kafka, and compared with what Kafka remembers (``app.adapters.watermark``).
A store found behind (restored from a backup while the workers ran, or before they started)
opens a recovery window by itself."""

from __future__ import annotations

import faust

from app.adapters.watermark import StoreWatermark
from app.background import BackgroundWork, RuntimeStopping
from app.injection import Wire
from app.settings import Settings


async def advance_store_watermark(*, watermark: StoreWatermark, background: BackgroundWork) -> None:
    try:
        async with background.working():            # a stopping runtime waits for it before it closes anything
            await watermark.advance()
    except RuntimeStopping:
        return


def register(app: faust.App, settings: Settings, wire: Wire):
    return app.timer(interval=settings.database.store_watermark_seconds)(wire(advance_store_watermark))
