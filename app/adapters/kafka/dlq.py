"""The dead-letter topic: the original record, byte for byte, plus headers that say
where it came from and why it is here. A publish returns only once the broker
acknowledged every record (acks=all).

Every dead letter must be sendable, whatever the original was, or the worker
would stop on it again after every restart. So three kinds of record are
changed on the way, and a header says how:

* neither key nor value (legal on the wire; aiokafka refuses to send one):
  the value becomes ``b""`` and ``dlq.placeholder: value`` says so;
* an oversized record (reason ``oversized``, or a record too big for the
  dead-letter topic): the value, and the key or the headers if they are
  large too, are cut to their first ``DLQ_TRUNCATE_BYTES``;
  ``dlq.truncated`` names what was cut, and ``dlq.original.<part>.bytes`` and
  ``dlq.original.<part>.sha256`` describe the whole;
* header keys that are not UTF-8 (aiokafka cannot send them, and no consumer
  built on it could read them back): the keys are written escaped
  (``\\xff``), and ``dlq.original.headers`` holds every original header
  exactly, as JSON ``[[base64 key, base64 value or null], ...]``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace

from aiokafka import AIOKafkaProducer
from aiokafka.errors import UnknownTopicOrPartitionError
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from app.adapters.kafka.connection import KafkaConnection, connection_of
from app.adapters.kafka.topics import DLQ_MAX_MESSAGE_BYTES
from app.compensation import headers as H
from app.pipeline.ports import DeadLetter

MAX_MESSAGE = 1024


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A dead letter as it goes on the topic."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    truncated: bool


def _is_utf8(name: str) -> bool:
    if name.isascii():
        return True
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _raw(name: str) -> bytes:
    return name.encode("utf-8", "surrogateescape")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def outgoing(letter: DeadLetter, group: str, *, truncate_bytes: int,
             max_bytes: int = DLQ_MAX_MESSAGE_BYTES) -> Outgoing:
    """What :class:`KafkaDeadLetterSink` sends for ``letter`` (pure: the ledger asks it too).

    The record is sized as the producer and the broker size it (aiokafka's estimate of the
    encoded record, every header's framing and our own headers included). Whatever does not
    fit is given up in this order, each time with its size and SHA-256 in our headers: the
    JSON copy of headers whose keys are not UTF-8, the value, the key, the record's own
    headers. An ``oversized`` record has its value and key cut whatever the room."""
    record = letter.record
    key, value = record.key, record.value
    own = [(k, v) for k, v in record.headers if not k.startswith(H.PREFIX)]
    notes: dict[str, str] = {}
    cut: list[str] = []

    if not all(_is_utf8(k) for k, _ in own):
        notes[H.ORIGINAL_HEADERS] = json.dumps(
            [[base64.b64encode(_raw(k)).decode(), None if v is None else base64.b64encode(v).decode()]
             for k, v in record.headers])
        own = [(_raw(k).decode("utf-8", "backslashreplace"), v) for k, v in own]

    def describe(part: str, data: bytes) -> None:
        notes[H.original_bytes(part)] = str(len(data))
        notes[H.original_sha256(part)] = _digest(data)

    def fits() -> bool:
        headers = own + _our_headers(letter, group, {**notes, H.TRUNCATED: "value,key,headers",
                                                     H.PLACEHOLDER: "value"})
        return DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers) <= max_bytes

    def cut_data(part: str, data: bytes | None) -> bytes | None:
        if data is None or len(data) <= truncate_bytes:
            return data
        describe(part, data)
        cut.append(part)
        return data[:truncate_bytes]

    if letter.reason == "oversized":
        value, key = cut_data("value", value), cut_data("key", key)
    def describe_headers() -> None:
        notes[H.ORIGINAL_HEADERS_COUNT] = str(len(record.headers))
        describe("headers", b"".join(_raw(k) + (v or b"") for k, v in record.headers))

    if not fits() and H.ORIGINAL_HEADERS in notes:
        notes.pop(H.ORIGINAL_HEADERS)          # the exact copy goes; what it was is described
        describe_headers()
    if not fits() and "value" not in cut:
        value = cut_data("value", value)
    if not fits() and "key" not in cut:
        key = cut_data("key", key)
    if not fits() and own:
        notes.pop(H.ORIGINAL_HEADERS, None)
        describe_headers()
        own = []
        cut.append("headers")
    if cut:
        notes[H.TRUNCATED] = ",".join(cut)
    if key is None and value is None:
        value = b""
        notes[H.PLACEHOLDER] = "value"     # the original had neither key nor value
    return Outgoing(key, value, own + _our_headers(letter, group, notes), truncated=bool(cut))


def _our_headers(letter: DeadLetter, group: str, notes: dict[str, str]) -> list[tuple[str, bytes]]:
    record = letter.record
    ours = {
        H.ORIGINAL_TOPIC: record.topic,
        H.ORIGINAL_PARTITION: str(record.partition),
        H.ORIGINAL_OFFSET: str(record.offset),
        H.ORIGINAL_TIMESTAMP: "" if record.timestamp_ms is None else str(record.timestamp_ms),
        H.CONSUMER_GROUP: group,
        H.ERROR_TYPE: letter.reason,
        H.ERROR_MESSAGE: letter.message[:MAX_MESSAGE],
        H.RETRIABLE: "true" if letter.retriable else "false",
        H.ATTEMPTS: str(letter.attempts),
        H.FIRST_FAILURE: letter.first_failure_at.isoformat(timespec="milliseconds"),
        H.WORKER_ID: letter.worker_id or "",
        H.MAY_BE_SUPERSEDED: "true" if letter.may_be_superseded else "false",
        **notes,
    }
    if letter.trace is not None:
        ours[H.TRACEPARENT] = letter.trace
    if letter.covers is not None:
        first, last, count = letter.covers
        ours[H.COVERS_OFFSETS] = f"{first}-{last}"
        ours[H.COVERS_COUNT] = str(count)
    run = record.unreadable
    if run is not None and run.first != record.offset:
        ours[H.RAW_BATCH_OFFSET] = str(run.first)    # the letter that carries the raw record batch
    return [(name, value.encode()) for name, value in ours.items()]


METADATA_RETRY_SECONDS = 0.5    # between asks for a dead-letter topic's metadata the brokers did not give


def request_timeout_ms(send_timeout_seconds: float) -> int:
    """One produce request's bound within a send's: a third of it, at least 2 s."""
    return int(max(send_timeout_seconds / 3, 2.0) * 1000)


class KafkaDeadLetterSink:
    def __init__(self, kafka: KafkaConnection | str, topic: str, group: str, *, timeout_seconds: float = 30.0,
                 truncate_bytes: int = 64 * 1024) -> None:
        self.topic = topic
        self.group = group
        self.truncate_bytes = truncate_bytes
        # Idempotent with acks=all: a send retried through a leader change is written once, and
        # acknowledged only when every in-sync replica has it (min.insync.replicas). Each request
        # may take a third of the bound: a request on a connection a network cut left hanging is
        # given up and sent again on a fresh one (twice) before the bound runs out.
        self._producer = AIOKafkaProducer(
            acks="all", enable_idempotence=True, request_timeout_ms=request_timeout_ms(timeout_seconds),
            max_request_size=DLQ_MAX_MESSAGE_BYTES, **connection_of(kafka).client_options())
        self._timeout = timeout_seconds

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def ping(self) -> None:
        """Raises unless the cluster answers a metadata request."""
        await self._producer.client.fetch_all_metadata()

    def prepare(self, letters: Sequence[DeadLetter]) -> list[DeadLetter]:
        """The letters as they will be sent: ``truncated`` set where the record will be cut."""
        return [replace(letter, truncated=self._outgoing(letter).truncated) for letter in letters]

    def _outgoing(self, letter: DeadLetter) -> Outgoing:
        return outgoing(letter, self.group, truncate_bytes=self.truncate_bytes)

    async def publish(self, letters: Sequence[DeadLetter]) -> None:
        async def send(letter: DeadLetter):
            out = self._outgoing(letter)
            while True:
                try:
                    return await self._producer.send(self.topic, value=out.value, key=out.key, headers=out.headers)
                except UnknownTopicOrPartitionError:
                    # The topic's metadata was not to be had within one request (its brokers are
                    # restarting, and this producer never cached it): ask again, within the bound.
                    # It stopped the worker a third of DLQ_SEND_TIMEOUT_SECONDS into a broker restart.
                    await asyncio.sleep(METADATA_RETRY_SECONDS)

        # send() waits for topic metadata and buffer space; its future for the ack.
        acks = await asyncio.wait_for(asyncio.gather(*(send(letter) for letter in letters)), self._timeout)
        await asyncio.wait_for(asyncio.gather(*acks), self._timeout)
