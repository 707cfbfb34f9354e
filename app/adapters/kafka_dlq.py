"""The dead-letter topic: the original record, byte for byte, plus headers that say
where it came from and why it is here. A publish returns only once the broker
acknowledged every record (acks=all)."""

from __future__ import annotations

import asyncio
from typing import Sequence

from aiokafka import AIOKafkaProducer

from app.admin import DLQ_MAX_MESSAGE_BYTES
from app.pipeline.ports import DeadLetter

MAX_MESSAGE = 1024
PREFIX = "dlq."


def dead_letter_headers(letter: DeadLetter, group: str) -> list[tuple[str, bytes]]:
    """The record's own headers first, then ours (all ``dlq.``-prefixed, UTF-8)."""
    record = letter.record
    ours = {
        "original.topic": record.topic,
        "original.partition": str(record.partition),
        "original.offset": str(record.offset),
        "original.timestamp": "" if record.timestamp_ms is None else str(record.timestamp_ms),
        "consumer.group": group,
        "error.type": letter.reason,
        "error.message": letter.message[:MAX_MESSAGE],
        "retriable": "true" if letter.retriable else "false",
        "attempts": str(letter.attempts),
        "first.failure": letter.first_failure_at.isoformat(timespec="milliseconds"),
        "worker.id": letter.worker_id or "",
        "may.be.superseded": "true" if letter.may_be_superseded else "false",
    }
    own = [(k, v) for k, v in record.headers if not k.startswith(PREFIX)]
    return own + [(PREFIX + name, value.encode()) for name, value in ours.items()]


class KafkaDeadLetterSink:
    def __init__(self, bootstrap: str, topic: str, group: str, *, timeout_seconds: float = 30.0) -> None:
        self.topic = topic
        self.group = group
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks="all", enable_idempotence=True,
            request_timeout_ms=int(timeout_seconds * 1000), max_request_size=DLQ_MAX_MESSAGE_BYTES)
        self._timeout = timeout_seconds

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def publish(self, letters: Sequence[DeadLetter]) -> None:
        async def send(letter: DeadLetter):
            record = letter.record
            return await self._producer.send(self.topic, value=record.value, key=record.key,
                                             headers=dead_letter_headers(letter, self.group))

        # send() waits for topic metadata and buffer space; its future for the ack.
        acks = await asyncio.wait_for(asyncio.gather(*(send(letter) for letter in letters)), self._timeout)
        await asyncio.wait_for(asyncio.gather(*acks), self._timeout)
