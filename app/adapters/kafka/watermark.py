"""The store's watermark as Kafka remembers it: ``STORE_WATERMARK_TOPIC``, one partition,
compacted, a record per advance keyed by the consumer group (``APP_ID``), whose value says
the watermark the store reached (``{"watermark": n, "worker": ..., "at": ...}``).

A restore of the database cannot reach it: a store found behind what this topic holds went
back in time (``app.adapters.watermark``). Several workers publish, so their records may
arrive out of order; what counts is the highest of the key's, not its newest.
"""

from __future__ import annotations

import time

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from app.adapters.kafka.connection import KafkaConnection, connection_of

# Read back at start-up: the newest records of the partition, enough for the records of every
# worker of a deployment since the last compaction (segments roll hourly), other deployments'
# keys included. Then every tick reads only what came since.
TAIL = 20_000


class TopicMissing(RuntimeError):
    """The watermark topic does not exist (``python -m app.admin create-topics`` creates it)."""


class WatermarkTopic:
    def __init__(self, kafka: KafkaConnection | str, topic: str, key: str, *, timeout_seconds: float = 10.0) -> None:
        self.topic, self.key = topic, key.encode("utf-8")
        self._tp = TopicPartition(topic, 0)
        self._options = connection_of(kafka).client_options()
        self._timeout_ms = int(timeout_seconds * 1000)
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self.highest = 0          # the highest watermark of our key read so far

    async def start(self) -> None:
        """Connect, and place the reader on the newest ``TAIL`` records. :class:`TopicMissing`
        when the topic does not exist. A start that fails closes what it opened, so that it can be
        tried again (the topic created later, the broker back)."""
        self._producer = AIOKafkaProducer(acks="all", enable_idempotence=True, request_timeout_ms=self._timeout_ms,
                                          **self._options)
        self._consumer = AIOKafkaConsumer(group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
                                          request_timeout_ms=self._timeout_ms, **self._options)
        try:
            await self._producer.start()
            await self._consumer.start()
            if self.topic not in await self._consumer.topics():
                raise TopicMissing(f"the topic {self.topic} does not exist: create it "
                                   "(python -m app.admin create-topics)")
            self._consumer.assign([self._tp])
            begin = (await self._consumer.beginning_offsets([self._tp]))[self._tp]
            end = (await self._consumer.end_offsets([self._tp]))[self._tp]
            self._consumer.seek(self._tp, max(begin, end - TAIL))
        except BaseException:
            await self.stop()
            raise

    async def read(self) -> int:
        """The highest watermark of our key on the topic, reading what was published since the last read."""
        consumer = self._started(self._consumer)
        end = (await consumer.end_offsets([self._tp]))[self._tp]
        while await consumer.position(self._tp) < end:
            fetched = await consumer.getmany(self._tp, timeout_ms=1000, max_records=5000)
            for record in fetched.get(self._tp, ()):
                if record.key == self.key:
                    self.highest = max(self.highest, _watermark(record.value))
        return self.highest

    async def publish(self, watermark: int, *, worker: str) -> None:
        """Write ``watermark`` and return once the broker acknowledged it (acks=all)."""
        value = orjson.dumps({"watermark": watermark, "worker": worker, "at": round(time.time(), 3)})
        await self._started(self._producer).send_and_wait(self.topic, value=value, key=self.key, partition=0)

    async def stop(self) -> None:
        clients, self._consumer, self._producer = (self._consumer, self._producer), None, None
        for client in clients:
            if client is None:
                continue
            try:
                await client.stop()
            except Exception:
                pass

    def _started(self, client):
        if client is None:
            raise RuntimeError(f"the watermark topic {self.topic} is not open: start() first")
        return client


def _watermark(value: bytes | None) -> int:
    """The watermark a record carries; 0 for one that is not ours to read (a tombstone, another shape)."""
    try:
        found = orjson.loads(value or b"").get("watermark")
    except (orjson.JSONDecodeError, AttributeError):
        return 0
    return found if isinstance(found, int) and not isinstance(found, bool) and found > 0 else 0
