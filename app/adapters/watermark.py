"""The store's watermark, kept in two places so that a database that went back in time is noticed.

Every worker advances it in the database (``t_store_server.watermark``) every
``STORE_WATERMARK_SECONDS`` and publishes the new value to ``STORE_WATERMARK_TOPIC``, where a
restore of the database cannot reach; at start-up (before the first batch), at every advance and
at every new database connection it compares the store's with the highest it has read there or
seen in the store (``recovery.Remembered``). A store below it was brought back to an older state
(a restore from backup into the same server, a failover to a replica that lacked the last
transactions): a recovery window opens by itself, as for a server change.

Order of an advance: the database first, then Kafka, so Kafka never holds a value the store did
not reach. What a backup holds is then below every value published after it was taken, and the
first advance after a restore finds the store behind. What it cannot see: a backup taken less
than one advance before the workers last wrote (a clean stop advances once more; a kill -9 does
not), and a store restored while the watermark topic was lost too.
"""

from __future__ import annotations

import asyncio
import logging

from app.adapters.kafka.watermark import WatermarkTopic
from app.adapters.mysql.recovery import Advanced, Remembered, report
from app.adapters.mysql.recovery_windows import RecoveryWindows

log = logging.getLogger(__name__)


class StoreWatermark:
    def __init__(self, windows: RecoveryWindows, topic: WatermarkTopic, remembered: Remembered, *, worker_id: str,
                 hours: float, start_seconds: float = 30.0) -> None:
        self.windows, self.topic, self.remembered = windows, topic, remembered
        self.worker_id, self.hours = worker_id, hours
        self.start_seconds = start_seconds
        self._reading = False           # the topic is there and this process reads it

    async def start(self) -> None:
        """Read what Kafka remembers and compare the store with it, before the first batch. A topic
        or a broker that cannot be read leaves only what this process sees itself (said in the log)."""
        try:
            await asyncio.wait_for(self.topic.start(), self.start_seconds)
            self._reading = True
        except Exception as exc:
            log.error("the store's watermark cannot be read from Kafka (%s): a database restored from a backup will "
                      "not be noticed by this worker until it can; open a recovery window yourself after a restore "
                      "(faust -A app recovery start)", exc)
        await self.advance()

    async def advance(self) -> Advanced | None:
        """Read Kafka's highest, advance the store past it (opening a window if the store was below),
        publish the new value. Each part that fails is said in the log and tried again next time."""
        if self._reading:
            try:
                self.remembered.see(await self.topic.read())
            except Exception as exc:
                log.warning("the store's watermark could not be read from Kafka (%r): compared with what this "
                            "worker saw itself", exc)
        try:
            advanced = await self.windows.advance(remembered=self.remembered.value, worker_id=self.worker_id,
                                                  hours=self.hours)
        except Exception as exc:
            log.warning("the store's watermark could not be advanced (%r); next time", exc)
            return None
        if advanced.change is not None:
            report(advanced.change)
        self.remembered.see(advanced.watermark)
        if self._reading:
            try:
                await self.topic.publish(advanced.watermark, worker=self.worker_id)
            except Exception as exc:
                log.warning("the store's watermark %d could not be published (%r); next time", advanced.watermark, exc)
        return advanced

    async def stop(self) -> None:
        """Once more (the work this worker did before its stop is covered), then close."""
        try:
            await self.advance()
        finally:
            await self.topic.stop()
