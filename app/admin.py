"""Operator commands: ``python -m app.admin create-topics``.

Topics are created explicitly with their partition counts (the broker's
auto-create is off, and so is Faust's); an existing topic is left as it is,
but a partition count that differs from the setting is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from app.adapters.kafka import ops as kafka_ops
from app.adapters.kafka.connection import KafkaConfigError, KafkaConnection, KafkaStartupError, preflight
from app.adapters.kafka.topics import topic_specs
from app.exits import EXIT_CONFIG, EXIT_UNAVAILABLE
from app.settings import get_settings_or_exit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.admin")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("create-topics", help="create order-event and order-event-dlq if missing")
    args = parser.parse_args(argv)
    if args.command == "create-topics":
        settings = get_settings_or_exit()
        try:
            asyncio.run(preflight(KafkaConnection.from_settings(settings.kafka), wait_seconds=settings.kafka.startup_wait_seconds))
        except (KafkaStartupError, KafkaConfigError) as exc:
            print(f"python -m app.admin: cannot reach Kafka: {exc}", file=sys.stderr)
            return EXIT_UNAVAILABLE if getattr(exc, "retriable", False) else EXIT_CONFIG
        for line in asyncio.run(kafka_ops.create_topics(KafkaConnection.from_settings(settings.kafka), topic_specs(settings))):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
