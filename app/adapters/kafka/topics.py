"""The topics: their names come from settings, their sizes and configs from here.

Every record ``order-event`` accepts must fit on the dead-letter topic too, with the
dead-letter headers on top: the dead-letter topic allows 1 MiB more (and records too
big even for that go there truncated, see ``app.adapters.kafka.dlq``).
"""

from __future__ import annotations

from dataclasses import dataclass

from app.settings import Settings

EVENT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024
DLQ_MAX_MESSAGE_BYTES = EVENT_MAX_MESSAGE_BYTES + 1024 * 1024
DLQ_RETENTION_MS = 30 * 24 * 3600 * 1000      # dead letters wait for people: 30 days


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    replication: int
    config: dict[str, str]


def durability(replication: int) -> dict[str, str]:
    """With three replicas or more, an ``acks=all`` write waits for two of them: one broker may be
    lost without losing an acknowledged record, and a partition down to one replica refuses writes
    instead of acknowledging what one disk holds."""
    return {"min.insync.replicas": "2"} if replication >= 3 else {}


# The watermark topic keeps the newest record of each key for ever (compaction); its segments roll
# hourly so that compaction can work, not once a week.
WATERMARK_CONFIG = {"cleanup.policy": "compact", "segment.ms": str(3600 * 1000), "min.cleanable.dirty.ratio": "0.1"}


def topic_specs(settings: Settings, *, events: str | None = None, dlq: str | None = None) -> list[TopicSpec]:
    """``order-event``, ``order-event-dlq`` and the watermark topic as the settings want them
    (other names for tests)."""
    extra = durability(settings.kafka.replication)
    return [
        TopicSpec(events or settings.kafka.topic, settings.kafka.partitions, settings.kafka.replication,
                  {"max.message.bytes": str(EVENT_MAX_MESSAGE_BYTES), **extra}),
        TopicSpec(dlq or settings.kafka.dlq_topic, settings.kafka.dlq_partitions, settings.kafka.replication,
                  {"retention.ms": str(DLQ_RETENTION_MS), "max.message.bytes": str(DLQ_MAX_MESSAGE_BYTES), **extra}),
        TopicSpec(settings.kafka.store_watermark_topic, 1, settings.kafka.replication, {**WATERMARK_CONFIG, **extra}),
    ]
