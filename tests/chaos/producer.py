"""Writes the planned records to ``order-event`` at a steady rate while the storm runs.

One idempotent acks=all producer for the whole run: the broker's SIGKILL and restart
must not lose, reorder or double a record (records wait in the producer and are sent
again with the same sequence numbers), so its delivery timeout outlasts a restart by
far. Records aiokafka refuses (neither key nor value) go through Kafka's Java client.
The manifest's partition and offset of each record come from the acknowledgements.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from aiokafka import AIOKafkaProducer

from app.topics import EVENT_MAX_MESSAGE_BYTES
from tests.chaos.workload import Planned
from tests.support.java import java_produce

TICK = 0.05
DELIVERY_TIMEOUT_MS = 180_000      # a broker restart takes seconds; a lost record would void the run


class ProducerFailed(AssertionError):
    """A record was not acknowledged: the manifest could not say where it is."""


class SteadyProducer:
    def __init__(self, bootstrap: str, topic: str, records: list[Planned], rate: float) -> None:
        self.bootstrap, self.topic, self.records, self.rate = bootstrap, topic, records, rate
        self.sent = 0                  # records handed to a producer so far
        self.started_at: float | None = None

    @property
    def done(self) -> bool:
        return self.sent >= len(self.records)

    async def run(self) -> list[dict]:
        """Send every record at ``rate`` per second; return the manifest's entries, in order."""
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=True,
                                    linger_ms=5, request_timeout_ms=DELIVERY_TIMEOUT_MS,
                                    max_request_size=EVENT_MAX_MESSAGE_BYTES)
        await producer.start()
        placed: list[asyncio.Future] = []
        try:
            self.started_at = time.monotonic()
            while not self.done:
                due = min(len(self.records), int((time.monotonic() - self.started_at) * self.rate) + 1)
                while self.sent < due:
                    record = self.records[self.sent]
                    if record.java:
                        placed.append(asyncio.ensure_future(self._java(record)))
                    else:
                        placed.append(await producer.send(self.topic, key=record.key, value=record.value))
                    self.sent += 1
                await asyncio.sleep(TICK)
            try:
                acks = await asyncio.wait_for(asyncio.gather(*placed), DELIVERY_TIMEOUT_MS / 1000 + 30)
            except Exception as exc:
                raise ProducerFailed(f"a record of the run was not acknowledged: {exc!r}") from exc
        finally:
            await producer.stop()
        return [record.entry(*self._where(ack)) for record, ack in zip(self.records, acks)]

    async def _java(self, record: Planned) -> tuple[int, int]:
        spec = {"partition": record.partition, "key": None, "value": None}
        broker = SimpleNamespace(kafka_bootstrap=self.bootstrap)
        [where] = await asyncio.to_thread(java_produce, broker, self.topic, [spec])
        return where

    @staticmethod
    def _where(ack) -> tuple[int, int]:
        return (ack.partition, ack.offset) if hasattr(ack, "offset") else tuple(ack)
