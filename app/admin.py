"""Operator commands: ``python -m app.admin create-topics``.

Topics are created explicitly with their partition counts (the broker's
auto-create is off, and so is Faust's); an existing topic is left as it is,
but a partition count that differs from the setting is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from app.settings import Settings, get_settings


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    replication: int
    config: dict[str, str]


# Every record order-event accepts must fit on the dead-letter topic too,
# with the dead-letter headers on top: the DLQ allows 1 MiB more.
EVENT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024
DLQ_MAX_MESSAGE_BYTES = EVENT_MAX_MESSAGE_BYTES + 1024 * 1024


def topic_specs(settings: Settings, *, events: str | None = None, dlq: str | None = None) -> list[TopicSpec]:
    return [
        TopicSpec(events or settings.order_event_topic, settings.order_event_partitions, settings.topic_replication,
                  {"max.message.bytes": str(EVENT_MAX_MESSAGE_BYTES)}),
        # Dead letters wait for people: keep them 30 days.
        TopicSpec(dlq or settings.dlq_topic, settings.dlq_partitions, settings.topic_replication,
                  {"retention.ms": str(30 * 24 * 3600 * 1000), "max.message.bytes": str(DLQ_MAX_MESSAGE_BYTES)}),
    ]


async def create_topics(settings: Settings, specs: list[TopicSpec] | None = None) -> list[str]:
    """Create the missing topics; return one line per topic saying what happened."""
    specs = specs if specs is not None else topic_specs(settings)
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, request_timeout_ms=30000)
    await admin.start()
    report = []
    try:
        existing = set(await admin.list_topics())
        for spec in specs:
            if spec.name not in existing:
                try:
                    await admin.create_topics([NewTopic(spec.name, spec.partitions, spec.replication,
                                                        topic_configs=spec.config)])
                    report.append(f"created {spec.name} ({spec.partitions} partitions)")
                    continue
                except TopicAlreadyExistsError:
                    pass
            described = await admin.describe_topics([spec.name])
            count = len(described[0]["partitions"])
            note = "" if count == spec.partitions else f" -- configured {spec.partitions}, left unchanged"
            report.append(f"exists  {spec.name} ({count} partitions){note}")
    finally:
        await admin.close()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.admin")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("create-topics", help="create order-event and order-event-dlq if missing")
    args = parser.parse_args(argv)
    if args.command == "create-topics":
        for line in asyncio.run(create_topics(get_settings())):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
