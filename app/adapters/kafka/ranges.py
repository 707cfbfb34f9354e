"""A topic over a time range, read outside the group: what the reconcile reads.

The range's offsets come from the records' timestamps (``ListOffsets`` by time, what
``offsetsForTimes`` is in Kafka's Java client): from the first record at or after ``since`` to
the first at or after ``until`` (or the partition's end). The read is ``read_committed``, as the
workers read: a transactional upstream's aborted records are not records of the input. Records
come in chunks, one partition after another, so that a run's memory is one chunk's, whatever the
range holds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition

from app.adapters.kafka.connection import KafkaConnection, connection_of
from app.adapters.kafka.ops import CommittedOffsets, admin

FETCH_MAX_BYTES = 16 * 1024 * 1024
# A range is history: nothing to wait for at a partition's end. The default (500 ms) held every move
# to the next partition that long, for the long poll still open on the one read to its end.
FETCH_MAX_WAIT_MS = 10


@dataclass(frozen=True, slots=True)
class Span:
    """A partition's offsets of the range: ``start`` included, ``end`` excluded."""

    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(self.end - self.start, 0)


class TopicRange:
    """``async with TopicRange(kafka, topic, since_ms, until_ms) as r:`` then ``r.spans``, ``r.committed(group)``
    and ``async for chunk in r.read(span)``."""

    def __init__(self, kafka: KafkaConnection | str, topic: str, since_ms: int, until_ms: int, *,
                 chunk: int = 2000, isolation_level: str = "read_committed") -> None:
        if until_ms <= since_ms:
            raise ValueError(f"the range must end after it begins ({since_ms} .. {until_ms} ms)")
        self.kafka, self.topic, self.since_ms, self.until_ms = connection_of(kafka), topic, since_ms, until_ms
        self.chunk, self.isolation_level = chunk, isolation_level
        self.spans: list[Span] = []
        self._consumer: AIOKafkaConsumer | None = None

    async def __aenter__(self) -> TopicRange:
        self._consumer = AIOKafkaConsumer(group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
                                          isolation_level=self.isolation_level, fetch_max_bytes=FETCH_MAX_BYTES,
                                          max_partition_fetch_bytes=FETCH_MAX_BYTES, request_timeout_ms=30_000,
                                          fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
                                          **self.kafka.client_options())
        await self._consumer.start()
        try:
            self.spans = await self._spans()
        except BaseException:
            await self._consumer.stop()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        if self._consumer is not None:
            await self._consumer.stop()

    async def _spans(self) -> list[Span]:
        consumer = self._consumer
        async with admin(self.kafka) as client:
            [described] = await client.describe_topics([self.topic])
        partitions = [] if described.get("error_code") else sorted(p["partition"] for p in described["partitions"])
        if not partitions:
            raise LookupError(f"topic {self.topic} not found")
        tps = [TopicPartition(self.topic, p) for p in partitions]
        ends = await consumer.end_offsets(tps)
        starts = await consumer.offsets_for_times({tp: self.since_ms for tp in tps})
        stops = await consumer.offsets_for_times({tp: self.until_ms for tp in tps})
        spans = []
        for tp in tps:
            end = stops[tp].offset if stops.get(tp) is not None else ends[tp]
            start = starts[tp].offset if starts.get(tp) is not None else ends[tp]
            spans.append(Span(tp.partition, start, min(end, ends[tp])))
        return spans

    async def committed(self, group: str) -> dict[int, int]:
        """The group's committed offsets on the topic (absent: nothing committed)."""
        async with admin(self.kafka) as client:
            return await CommittedOffsets(client, group, self.topic).read()

    async def read(self, span: Span) -> AsyncIterator[Sequence]:
        """The span's records (aiokafka's ``ConsumerRecord``), in chunks of at most ``chunk``."""
        if span.size == 0:
            return
        consumer = self._consumer
        tp = TopicPartition(self.topic, span.partition)
        consumer.assign([tp])
        consumer.seek(tp, span.start)
        while await consumer.position(tp) < span.end:
            batch = await consumer.getmany(tp, timeout_ms=1000, max_records=self.chunk)
            records = [r for r in batch.get(tp, ()) if r.offset < span.end]
            if records:
                yield records
