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
first advance after a restore finds the store behind. A topic that cannot be opened at start-up
(missing after an upgrade nobody ran ``create-topics`` for, a broker away) is tried again every
``retry_seconds`` (:data:`WATERMARK_RETRY_TICKS` advances): ``order_restore_detection_up`` is 0 meanwhile, and the ``RestoreDetectionDown``
alert says so. What it cannot see: a backup taken less
than one advance before the workers last wrote (a clean stop advances once more; a kill -9 does
not), and a store restored while the watermark topic was lost too.
"""

from __future__ import annotations

import asyncio
import logging
import time

from app.adapters.kafka.watermark import WatermarkTopic
from app.adapters.mysql.recovery import Advanced, Remembered, report
from app.adapters.mysql.recovery_windows import RecoveryWindows
from app.observability.metrics import RESTORE_DETECTION_UP

log = logging.getLogger(__name__)
# A topic that could not be opened is tried again every this many advances: each try may wait up to
# ``start_seconds`` for a broker that does not answer, and the advance waits for it.
WATERMARK_RETRY_TICKS = 6


class StoreWatermark:
    def __init__(self, windows: RecoveryWindows, topic: WatermarkTopic, remembered: Remembered, *, worker_id: str,
                 hours: float, start_seconds: float = 30.0, retry_seconds: float = 60.0,
                 clock=time.monotonic) -> None:
        self.windows, self.topic, self.remembered = windows, topic, remembered
        self.worker_id, self.hours = worker_id, hours
        self.start_seconds, self.retry_seconds = start_seconds, retry_seconds
        self._clock = clock
        self._reading = False           # the topic is there and this process reads it
        self._tried_at: float | None = None   # the last start of the topic that failed

    async def start(self) -> None:
        """Read what Kafka remembers and compare the store with it, before the first batch. A topic
        or a broker that cannot be read leaves only what this process sees itself (said in the log,
        and by ``order_restore_detection_up``) until a later advance opens it."""
        await self._open()
        await self.advance()

    async def _open(self) -> None:
        """Open the topic if it is not, at most every ``retry_seconds`` (each try may take up to
        ``start_seconds``, and the advance waits for it)."""
        if self._reading:
            return
        now = self._clock()
        if self._tried_at is not None and now - self._tried_at < self.retry_seconds:
            return
        try:
            await asyncio.wait_for(self.topic.start(), self.start_seconds)
        except Exception as exc:
            first = self._tried_at is None
            self._tried_at = now
            RESTORE_DETECTION_UP.set(0)
            if first:
                log.error("the store's watermark cannot be read from Kafka (%s): a database restored from a backup "
                          "will not be noticed by this worker until it can (tried again every %g s); open a recovery "
                          "window yourself after a restore (faust -A app recovery start)", exc, self.retry_seconds)
            else:
                log.warning("the store's watermark still cannot be read from Kafka (%s); tried again in %g s",
                            exc, self.retry_seconds)
            return
        if self._tried_at is not None:
            log.warning("the store's watermark is read from Kafka again: a restore is noticed once more")
        self._reading, self._tried_at = True, None

    async def advance(self) -> Advanced | None:
        """Read Kafka's highest, advance the store past it (opening a window if the store was below),
        publish the new value. Each part that fails is said in the log and tried again next time;
        ``order_restore_detection_up`` says whether both Kafka's parts worked this time."""
        await self._open()
        working = self._reading
        if self._reading:
            try:
                self.remembered.see(await self.topic.read())
            except Exception as exc:
                working = False
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
                working = False
                log.warning("the store's watermark %d could not be published (%r); next time", advanced.watermark, exc)
        RESTORE_DETECTION_UP.set(1 if working else 0)
        return advanced

    async def stop(self) -> None:
        """Once more (the work this worker did before its stop is covered), then close."""
        try:
            await self.advance()
        finally:
            await self.topic.stop()
