"""Kafka plumbing of the benchmark: topics and groups of its own, the pre-fill, offsets."""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.protocol.admin import DeleteGroupsRequest

from bench.workload import Workload


@asynccontextmanager
async def admin_client(bootstrap: str):
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    await admin.start()
    try:
        yield admin
    finally:
        await admin.close()


async def create_topics(bootstrap: str, topics: dict[str, int]) -> None:
    async with admin_client(bootstrap) as admin:
        await admin.create_topics([NewTopic(name, partitions, 1) for name, partitions in topics.items()])


async def delete_topics(bootstrap: str, names: list[str]) -> None:
    async with admin_client(bootstrap) as admin:
        await admin.delete_topics(names)


async def delete_groups(bootstrap: str, groups: list[str]) -> None:
    """Best effort: aiokafka's admin client has no public call for DeleteGroups (API 42)."""
    async with admin_client(bootstrap) as admin:
        for group in groups:
            node = await admin.find_coordinator(group)
            await admin._send_request(DeleteGroupsRequest([group]), node_id=node)


async def produce(bootstrap: str, workload: Workload) -> float:
    """Send every record (acks=all, no compression) and wait for every acknowledgement; seconds taken."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20,
                                max_batch_size=1024 * 1024, max_request_size=8 * 1024 * 1024,
                                compression_type=None)
    await producer.start()
    started = time.perf_counter()
    try:
        pending = [await producer.send(workload.topic, value=value, key=key) for key, value in workload.records]
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return time.perf_counter() - started


class CommittedOffsets:
    """Polls a consumer group's committed offsets of one topic (one OffsetFetch per poll)."""

    def __init__(self, admin: AIOKafkaAdminClient, group: str, topic: str) -> None:
        self.admin, self.group, self.topic = admin, group, topic
        self._coordinator: int | None = None

    async def read(self) -> dict[int, int]:
        if self._coordinator is None:
            self._coordinator = await self.admin.find_coordinator(self.group)
        offsets = await self.admin.list_consumer_group_offsets(self.group, self._coordinator)
        return {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == self.topic}
