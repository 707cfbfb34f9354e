"""Writes the planned records to ``order-event`` at a steady rate while the storm runs.

One idempotent acks=all producer for the whole run: the broker's SIGKILL and restart, a
leader's SIGKILL, must not lose, reorder or double a record (records wait in the producer
and are sent again with the same sequence numbers), so its delivery timeout outlasts a
restart by far. Records aiokafka refuses (neither key nor value) go through Kafka's Java
client. The manifest's partition and offset of each record come from its acknowledgement,
recorded the moment it arrives with when the record was handed over and a digest of its
bytes: the checker proves every acknowledged record was kept and consumed (``acked``).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from aiokafka import AIOKafkaProducer

from app.adapters.kafka.topics import EVENT_MAX_MESSAGE_BYTES
from harness.chaos.evidence import record_digest
from harness.chaos.workload import Planned
from harness.java import java_produce

TICK = 0.05
DELIVERY_TIMEOUT_MS = 180_000      # a broker restart takes seconds; a lost record would void the run


class ProducerFailed(AssertionError):
    """A record was not acknowledged: the manifest could not say where it is."""


class SteadyProducer:
    def __init__(self, options: dict, topic: str, records: list[Planned], rate: float, *,
                 java: tuple[str, dict[str, str]] | None = None) -> None:
        """``options``: aiokafka's connection arguments; ``java``: (bootstrap, settings) of Kafka's
        Java client for the records aiokafka refuses."""
        self.options, self.topic, self.records, self.rate = options, topic, records, rate
        self.java = java or (options["bootstrap_servers"], {})
        self.sent = 0                  # records handed to a producer so far
        self.started_at: float | None = None
        self.sent_at: list[float | None] = [None] * len(records)
        self.acked: list[tuple[int, int, float] | None] = [None] * len(records)   # partition, offset, when
        self.acked_on = Counter()      # partition -> records acknowledged there so far
        # (index, event): the record at ``index`` and those after it wait until the event is set,
        # and the pace starts again from there (no burst). The storm gates each big fault's slot,
        # so that records are still being sent when the fault begins, however late it begins.
        self.gates: list[tuple[int, asyncio.Event]] = []
        # While it is set the gates hold nothing back: a rolling upgrade's replacement keeps the input
        # flowing however long it takes (harness/chaos/upgrade.py).
        self.unheld = asyncio.Event()

    @property
    def done(self) -> bool:
        return self.sent >= len(self.records)

    async def run(self) -> list[dict]:
        """Send every record at ``rate`` per second; return the manifest's entries, in order."""
        producer = AIOKafkaProducer(**self.options, acks="all", enable_idempotence=True, linger_ms=5,
                                    request_timeout_ms=DELIVERY_TIMEOUT_MS, max_request_size=EVENT_MAX_MESSAGE_BYTES)
        await producer.start()
        placed: list[asyncio.Future] = []

        async def send(index: int, record: Planned) -> None:
            if record.java:
                future = asyncio.ensure_future(self._java(record))
            else:
                future = await producer.send(self.topic, key=record.key, value=record.value)
            future.add_done_callback(lambda f, i=index: self._acked(i, f))
            placed.append(future)

        try:
            await self.pace(send)
            try:
                acks = await asyncio.wait_for(asyncio.gather(*placed), DELIVERY_TIMEOUT_MS / 1000 + 30)
            except Exception as exc:
                raise ProducerFailed(f"a record of the run was not acknowledged: {exc!r}") from exc
        finally:
            await producer.stop()
        return [{**record.entry(*self._where(ack)), "digest": record_digest(record.key, record.value),
                 "sent_at": self.sent_at[i], "acked_at": self.acked[i][2]}
                for i, (record, ack) in enumerate(zip(self.records, acks))]

    async def pace(self, hand_over) -> None:
        """Hand every record over (``await hand_over(index, record)``) at ``rate`` per second, each
        gate holding the records from its index on until it is set."""
        self.started_at = time.monotonic()
        while not self.done:
            due = min(len(self.records), int((time.monotonic() - self.started_at) * self.rate) + 1)
            while self.sent < due:
                gate = next((event for index, event in self.gates if index <= self.sent and not event.is_set()),
                            None)
                if gate is not None and not self.unheld.is_set():
                    held = time.monotonic()
                    await _either(gate, self.unheld)
                    self.started_at += time.monotonic() - held
                    break
                self.sent_at[self.sent] = time.time()
                await hand_over(self.sent, self.records[self.sent])
                self.sent += 1
            await asyncio.sleep(TICK)

    def _acked(self, index: int, future: asyncio.Future) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        partition, offset = self._where(future.result())
        self.acked[index] = (partition, offset, time.time())
        self.acked_on[partition] += 1

    async def _java(self, record: Planned) -> tuple[int, int]:
        spec = {"partition": record.partition, "key": None, "value": None}
        bootstrap, config = self.java
        [where] = await asyncio.to_thread(java_produce, bootstrap, self.topic,
                                          [spec], config=config or None)
        return where

    @staticmethod
    def _where(ack) -> tuple[int, int]:
        return (ack.partition, ack.offset) if hasattr(ack, "offset") else tuple(ack)


async def _either(*events: asyncio.Event) -> None:
    """Until one of ``events`` is set."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
