"""What a worker opens once and closes at shutdown: the database engine and the stores."""

from __future__ import annotations

import asyncio
import uuid

from app.adapters.skeleton_store import SkeletonStore
from app.db import create_engine
from app.settings import Settings


class Runtime:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # A fresh incarnation id: a restarted worker never mistakes its
        # predecessor's claims for its own.
        self.owner = f"{settings.worker_id}/{uuid.uuid4().hex[:8]}"
        self._lock = asyncio.Lock()
        self._started = False

    async def start(self) -> "Runtime":
        async with self._lock:
            if not self._started:
                self.engine = create_engine(self.settings)
                self.store = SkeletonStore(self.engine, self.owner)
                self._started = True
        return self

    async def stop(self) -> None:
        async with self._lock:
            if self._started:
                await self.engine.dispose()
                self._started = False
