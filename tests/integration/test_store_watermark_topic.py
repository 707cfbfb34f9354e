"""The store's watermark as Kafka remembers it: several workers publish, out of order; a reader
takes the highest of its own deployment's, not the newest, and reads only what is new after
its first read. Real Kafka."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from app.adapters.kafka import ops as kafka_ops
from app.adapters.kafka.connection import KafkaConnection
from app.adapters.kafka.topics import topic_specs
from app.adapters.kafka.watermark import TopicMissing, WatermarkTopic
from harness.services import wait_for, worker_metric


@pytest.fixture
async def topic(settings):
    name = f"test-store-watermark-{uuid.uuid4().hex[:8]}"
    [spec] = [s for s in topic_specs(settings.model_copy(update={"store_watermark_topic": name}))
              if s.name == name]
    await kafka_ops.create_topics(KafkaConnection.from_settings(settings.kafka), [spec])
    yield name
    await kafka_ops.delete_topics(KafkaConnection.from_settings(settings.kafka), [name])


async def opened(settings, name: str, key: str) -> WatermarkTopic:
    reader = WatermarkTopic(KafkaConnection.from_settings(settings.kafka), name, key)
    await reader.start()
    return reader


async def test_a_reader_finds_the_highest_of_its_deployment_whatever_the_order(settings, topic):
    first, second, other = [await opened(settings, topic, key) for key in ("group-a", "group-a", "group-b")]
    try:
        for writer, value in ((first, 5), (second, 9), (first, 7), (other, 100)):
            await writer.publish(value, worker=f"w{value}")
        reader = await opened(settings, topic, "group-a")
        try:
            assert await reader.read() == 9
            await second.publish(12, worker="w12")
            assert await reader.read() == 12
            assert await reader.read() == 12          # nothing new: the same
        finally:
            await reader.stop()
    finally:
        for writer in (first, second, other):
            await writer.stop()


async def test_a_missing_topic_is_said_with_what_to_run(settings):
    reader = WatermarkTopic(KafkaConnection.from_settings(settings.kafka), f"test-no-such-topic-{uuid.uuid4().hex[:8]}", "group-a")
    try:
        with pytest.raises(TopicMissing, match="create-topics"):
            await reader.start()
    finally:
        await reader.stop()


def test_a_watermark_topic_missing_at_start_up_is_opened_once_it_exists(settings, topics, spawn_worker):
    # An upgrade whose create-topics nobody ran: the worker runs, says it cannot notice a restore
    # (the gauge at 0), and opens the topic by itself once it exists, without a restart.
    name = f"test-store-watermark-{uuid.uuid4().hex[:8]}"
    worker = spawn_worker(topics(), STORE_WATERMARK_TOPIC=name, STORE_WATERMARK_SECONDS="1")
    wait_for(lambda: worker_metric(worker, "order_restore_detection_up") == 0, timeout=60,
             what="order_restore_detection_up at 0 while the topic is missing", workers=[worker])
    worker.wait_log(f"the topic {name} does not exist")
    [spec] = [s for s in topic_specs(settings.model_copy(update={"store_watermark_topic": name})) if s.name == name]
    connection = KafkaConnection.from_settings(settings.kafka)
    asyncio.run(kafka_ops.create_topics(connection, [spec]))
    try:
        wait_for(lambda: worker_metric(worker, "order_restore_detection_up") == 1, timeout=60,
                 what="order_restore_detection_up at 1 once the topic exists", workers=[worker])
        worker.wait_log("the store's watermark is read from Kafka again")

        async def published() -> int:
            reader = await opened(settings, name, worker.env["APP_ID"])
            try:
                return await reader.read()
            finally:
                await reader.stop()

        assert asyncio.run(published()) > 0
    finally:
        asyncio.run(kafka_ops.delete_topics(connection, [name]))
