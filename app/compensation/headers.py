"""The headers a dead letter carries on the dead-letter topic, named once: the writer
(``app.adapters.kafka.dlq``) sets them, the compensator reads where a letter came from
with :func:`source_of` and :func:`origin_group`. Every name starts with ``dlq.``; a
record's own headers keep their names beside them. What each holds is in the docs
(exactly-once page, "Dead-letter records")."""

from __future__ import annotations

import re

from app.pipeline.model import SourceKey
from app.pipeline.ports import SourceRecord

PREFIX = "dlq."

# Where it came from (what the compensator needs to find its ledger row).
ORIGINAL_TOPIC = "dlq.original.topic"
ORIGINAL_PARTITION = "dlq.original.partition"
ORIGINAL_OFFSET = "dlq.original.offset"
ORIGINAL_TIMESTAMP = "dlq.original.timestamp"      # empty: the record had none
CONSUMER_GROUP = "dlq.consumer.group"
# Why, and how often.
ERROR_TYPE = "dlq.error.type"                       # the reason, as in t_compensation.reason
ERROR_MESSAGE = "dlq.error.message"
RETRIABLE = "dlq.retriable"
ATTEMPTS = "dlq.attempts"
FIRST_FAILURE = "dlq.first.failure"
WORKER_ID = "dlq.worker.id"
TRACEPARENT = "dlq.traceparent"                     # the span that dead-lettered it, when traced
MAY_BE_SUPERSEDED = "dlq.may.be.superseded"
# One letter for a run of unreadable records, and the letter that carries their raw batch.
COVERS_OFFSETS = "dlq.covers.offsets"
COVERS_COUNT = "dlq.covers.count"
RAW_BATCH_OFFSET = "dlq.raw.batch.offset"
# What changed on the way (the topic's size limit, header keys no client can send).
ORIGINAL_HEADERS = "dlq.original.headers"           # JSON: every original header, base64
ORIGINAL_HEADERS_COUNT = "dlq.original.headers.count"
TRUNCATED = "dlq.truncated"                         # which of value, key, headers were cut
PLACEHOLDER = "dlq.placeholder"                     # "value": the original had neither key nor value


def original_bytes(part: str) -> str:
    """The size of an original ``part`` (value, key, headers) that was cut."""
    return f"dlq.original.{part}.bytes"


def original_sha256(part: str) -> str:
    """The SHA-256 of an original ``part`` that was cut."""
    return f"dlq.original.{part}.sha256"


# Kafka's rule for topic names, and the ledger's columns: an origin outside them is not one.
TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
GROUP_MAX = 255
INT32_MAX, INT64_MAX = 2 ** 31 - 1, 2 ** 63 - 1


def origin_group(record: SourceRecord) -> str | None:
    """The consumer group a dead letter says it belongs to, if it says (and it can be read)."""
    for name, value in record.headers:
        if name == CONSUMER_GROUP and value is not None:
            try:
                return value.decode()
            except UnicodeDecodeError:
                return None
    return None


def source_of(record: SourceRecord) -> SourceKey:
    """Where a dead letter came from, from its ``dlq.`` headers; :class:`ValueError` saying why
    if they do not say, or say something no Kafka record (or ledger row) can be."""
    try:
        h = {name: value.decode() for name, value in record.headers if name.startswith(PREFIX) and value is not None}
    except UnicodeDecodeError:
        raise ValueError("a dlq. header is not UTF-8") from None
    missing = [name for name in (CONSUMER_GROUP, ORIGINAL_TOPIC, ORIGINAL_PARTITION, ORIGINAL_OFFSET) if name not in h]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    group, topic = h[CONSUMER_GROUP], h[ORIGINAL_TOPIC]
    if not 1 <= len(group) <= GROUP_MAX:
        raise ValueError(f"{CONSUMER_GROUP} is {len(group)} characters, not 1 to {GROUP_MAX}")
    if not TOPIC_NAME.fullmatch(topic):
        raise ValueError(f"{ORIGINAL_TOPIC} {topic[:80]!r} is not a Kafka topic name")
    numbers = []
    for name, low, high, default in ((ORIGINAL_PARTITION, 0, INT32_MAX, None),
                                     (ORIGINAL_OFFSET, 0, INT64_MAX, None),
                                     (ORIGINAL_TIMESTAMP, -1, INT64_MAX, -1)):
        text = h.get(name, "")
        if not text and default is not None:
            numbers.append(default)
            continue
        if not re.fullmatch(r"-?[0-9]{1,19}", text) or not low <= int(text) <= high:
            raise ValueError(f"{name} {text[:40]!r} is not a whole number from {low} to {high}")
        numbers.append(int(text))
    return SourceKey(group, topic, *numbers)
