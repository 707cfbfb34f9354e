"""Kafka outside the stream: topics, consumer groups, offsets, and sending records.

One copy of each, used by the operator command (``python -m app.admin``), the demo
producer, the tests and the benchmark.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    GroupCoordinatorNotAvailableError,
    GroupLoadInProgressError,
    NotCoordinatorForGroupError,
    TopicAlreadyExistsError,
)
from aiokafka.protocol.admin import DeleteGroupsRequest

from app.adapters.kafka.connection import KafkaConnection, connection_of
from app.adapters.kafka.topics import EVENT_MAX_MESSAGE_BYTES, TopicSpec

# Where a function takes ``kafka``: a KafkaConnection (``KafkaConnection.from_settings(settings.kafka)``), or a bare
# "host:port,..." list for a PLAINTEXT broker.
Kafka = KafkaConnection | str

# (key, value), or (key, value, headers) for headers of its own
Record = tuple[bytes | None, bytes | None] | tuple[bytes | None, bytes | None, list[tuple[str, bytes]] | None]


@asynccontextmanager
async def admin(kafka: Kafka) -> AsyncIterator[AIOKafkaAdminClient]:
    client = AIOKafkaAdminClient(request_timeout_ms=30_000, **connection_of(kafka).client_options())
    await client.start()
    try:
        yield client
    finally:
        await client.close()


async def create_topics(kafka: Kafka, specs: Sequence[TopicSpec]) -> list[str]:
    """Create the missing topics; an existing one is left as it is, and a partition count that
    differs from its spec is reported. One line per topic saying what happened."""
    report = []
    async with admin(kafka) as client:
        existing = set(await client.list_topics())
        for spec in specs:
            if spec.name not in existing:
                try:
                    await client.create_topics([NewTopic(spec.name, spec.partitions, spec.replication,
                                                         topic_configs=spec.config)])
                    report.append(f"created {spec.name} ({spec.partitions} partitions)")
                    continue
                except TopicAlreadyExistsError:
                    pass
            described = await client.describe_topics([spec.name])
            count = len(described[0]["partitions"])
            note = "" if count == spec.partitions else f" -- configured {spec.partitions}, left unchanged"
            report.append(f"exists  {spec.name} ({count} partitions){note}")
    return report


async def delete_topics(kafka: Kafka, names: Iterable[str]) -> None:
    """Best effort: a topic already gone is no error."""
    async with admin(kafka) as client:
        try:
            await client.delete_topics(list(names))
        except Exception:
            pass


async def delete_groups(kafka: Kafka, groups: Iterable[str]) -> None:
    """Best effort (aiokafka's admin client has no public call for DeleteGroups, API 42)."""
    async with admin(kafka) as client:
        for group in groups:
            try:
                node = await client.find_coordinator(group)
                await client._send_request(DeleteGroupsRequest([group]), node_id=node)
            except Exception:
                pass


@dataclass(frozen=True)
class Durability:
    """How many brokers hold a topic, and how many must have a record before it is acknowledged."""

    topic: str
    partitions: int
    replication: int          # the smallest replica count of its partitions
    min_insync: int
    unclean_election: bool

    def risks(self, *, replication: int = 3, min_insync: int = 2) -> list[str]:
        found = []
        if self.replication < replication:
            found.append(f"replication factor {self.replication} (< {replication})")
        if self.min_insync < min_insync:
            found.append(f"min.insync.replicas={self.min_insync} (< {min_insync})")
        if self.unclean_election:
            found.append("unclean.leader.election.enable=true")
        return found


async def durability(kafka: Kafka, topics: Sequence[str]) -> dict[str, Durability | None]:
    """Each topic's replication as the brokers have it (None: the topic does not exist)."""
    found: dict[str, Durability | None] = {}
    async with admin(kafka) as client:
        existing = set(await client.list_topics())
        present = [topic for topic in topics if topic in existing]
        found.update({topic: None for topic in topics if topic not in existing})
        if not present:
            return found
        described = {entry["topic"]: entry for entry in await client.describe_topics(present)}
        responses = await client.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t) for t in present])
        configs: dict[str, dict[str, str]] = {}
        for response in responses:
            for _code, _message, _type, name, entries, *_ in response.resources:
                configs[name] = {entry[0]: entry[1] for entry in entries}
        for topic in present:
            partitions = described[topic]["partitions"]
            config = configs.get(topic, {})
            found[topic] = Durability(
                topic, len(partitions), min((len(p["replicas"]) for p in partitions), default=0),
                int(config.get("min.insync.replicas") or 1),
                (config.get("unclean.leader.election.enable") or "false").lower() == "true")
    return found


class CommittedOffsets:
    """A consumer group's committed offsets of one topic, read without joining the group."""

    def __init__(self, client: AIOKafkaAdminClient, group: str, topic: str) -> None:
        self.client, self.group, self.topic = client, group, topic
        self._coordinator: int | None = None

    # The answers of a coordinator that is not there yet (a new cluster creates its offsets topic
    # on the first FindCoordinator), still loading, or moved: asked again, the coordinator found anew.
    COORDINATOR_MOVING = (GroupCoordinatorNotAvailableError, GroupLoadInProgressError, NotCoordinatorForGroupError)
    ATTEMPTS = 40
    PAUSE_SECONDS = 0.25

    async def read(self) -> dict[int, int]:
        for attempt in range(1, self.ATTEMPTS + 1):
            try:
                if self._coordinator is None:
                    self._coordinator = await self.client.find_coordinator(self.group)
                offsets = await self.client.list_consumer_group_offsets(self.group, self._coordinator)
            except self.COORDINATOR_MOVING:
                self._coordinator = None
                if attempt == self.ATTEMPTS:
                    raise
                await asyncio.sleep(self.PAUSE_SECONDS)
                continue
            return {tp.partition: meta.offset for tp, meta in offsets.items()
                    if tp.topic == self.topic and meta.offset >= 0}
        raise AssertionError("unreachable")


async def committed_offsets(kafka: Kafka, group: str, topic: str, partitions: int) -> dict[int, int]:
    """Every partition's committed offset, 0 where nothing is committed."""
    async with admin(kafka) as client:
        found = await CommittedOffsets(client, group, topic).read()
    return {p: found.get(p, 0) for p in range(partitions)}


async def end_offsets(kafka: Kafka, topic: str, partitions: int, *,
                      isolation_level: str = "read_uncommitted") -> dict[int, int]:
    """Each partition's end: the high watermark, or with ``read_committed`` the last stable offset
    (the first offset of a transaction still open, if there is one)."""
    consumer = AIOKafkaConsumer(isolation_level=isolation_level, **connection_of(kafka).client_options())
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        return {tp.partition: offset for tp, offset in (await consumer.end_offsets(tps)).items()}
    finally:
        await consumer.stop()


async def produce(kafka: Kafka, topic: str, records: Iterable[Record], *,
                  headers: list[tuple[str, bytes]] | None = None, timestamps: Sequence[int] | None = None,
                  linger_ms: int = 5, max_batch_size: int = 16 * 1024) -> list[tuple[int, int]]:
    """Send ``records`` in order with acks=all and an idempotent producer (so per-partition
    order holds); wait for every acknowledgement; return each record's (partition, offset).
    ``headers`` go on every record that brings none of its own."""
    producer = AIOKafkaProducer(acks="all", enable_idempotence=True, linger_ms=linger_ms,
                                max_batch_size=max_batch_size, max_request_size=EVENT_MAX_MESSAGE_BYTES,
                                **connection_of(kafka).client_options())
    await producer.start()
    try:
        pending = []
        for i, (key, value, *own) in enumerate(records):
            pending.append(await producer.send(topic, value=value, key=key, headers=own[0] if own else headers,
                                               timestamp_ms=timestamps[i] if timestamps is not None else None))
        return [(meta.partition, meta.offset) for meta in await asyncio.gather(*pending)]
    finally:
        await producer.stop()


class GroupLag:
    """A consumer group's lag on one topic, per partition (end offset minus committed offset; a
    partition with nothing committed counts from its earliest offset), read from the broker with
    clients of its own: what a worker that is stuck cannot report about itself, the others can.

    With ``read_committed`` the end is the last stable offset: records of a transaction still open
    cannot be read yet, so they are not lag. (Transaction markers and aborted records after the
    last record are not lag either: the workers commit past them, ``app.adapters.kafka.consumer``.)"""

    def __init__(self, kafka: Kafka, group: str, topic: str, *, isolation_level: str = "read_committed") -> None:
        self.kafka, self.group, self.topic = connection_of(kafka), group, topic
        self.isolation_level = isolation_level
        self._admin: AIOKafkaAdminClient | None = None
        self._consumer: AIOKafkaConsumer | None = None

    async def read(self) -> dict[int, int]:
        if self._admin is None:
            admin_client = AIOKafkaAdminClient(request_timeout_ms=10_000, **self.kafka.client_options())
            consumer = AIOKafkaConsumer(request_timeout_ms=10_000, isolation_level=self.isolation_level,
                                        **self.kafka.client_options())
            await admin_client.start()
            try:
                await consumer.start()
            except BaseException:
                await admin_client.close()
                raise
            self._admin, self._consumer = admin_client, consumer
        try:
            partitions = self._consumer.partitions_for_topic(self.topic)
            if partitions is None:
                cluster = await self._consumer._client.fetch_all_metadata()
                partitions = cluster.partitions_for_topic(self.topic) or set()
            tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
            if not tps:
                return {}
            committed = await CommittedOffsets(self._admin, self.group, self.topic).read()
            ends = await self._consumer.end_offsets(tps)
            missing = [tp for tp in tps if tp.partition not in committed]
            starts = await self._consumer.beginning_offsets(missing) if missing else {}
            return {tp.partition: max(ends[tp] - committed.get(tp.partition, starts.get(tp, 0)), 0) for tp in tps}
        except BaseException:
            await self.close()          # start afresh next time (the coordinator may have moved)
            raise

    async def close(self) -> None:
        admin_client, consumer, self._admin, self._consumer = self._admin, self._consumer, None, None
        for client in (consumer, admin_client):
            if client is None:
                continue
            try:
                await (client.stop() if client is consumer else client.close())
            except Exception:
                pass
