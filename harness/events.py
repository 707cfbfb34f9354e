"""Build contract-following events (and their Kafka key/value bytes)."""

from __future__ import annotations

import itertools
import json
import uuid
from datetime import UTC, datetime

_serial = itertools.count(1)

DATA = {
    "ORDER_CREATED": lambda: {"amount_cents": 12_900, "phone": "+8613800000000", "address": "1 Test Road"},
    "ORDER_PAID": lambda: {"amount_cents": 12_900},
    "ORDER_CONFIRM": lambda: {},
    "ORDER_CANCEL": lambda: {"reason": "customer asked"},
}
LIFECYCLE = ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM")
# Orders are dated today (UTC): an order older than the dedup retention (IDEM_RETENTION_DAYS) is refused.
TODAY = datetime.now(UTC).strftime("%Y%m%d")


def order_no(day: str = TODAY, prefix: str = "T") -> str:
    """A fresh order number, dated today unless ``day`` says otherwise; ``prefix`` keeps test runs apart."""
    return f"ORD-{day}-{prefix}{next(_serial):07d}{uuid.uuid4().hex[:6]}"


def event(order: str, type_: str, data: dict | None = None, **fields) -> dict:
    doc = {"event_id": str(uuid.uuid4()), "order_no": order, "type": type_,
           "occurred_at": "2026-11-29T10:00:00+08:00", "data": DATA[type_]() if data is None else data}
    doc.update(fields)
    return doc


def record(doc: dict) -> tuple[bytes, bytes]:
    """The Kafka (key, value) of an event: key = order_no."""
    return doc["order_no"].encode(), json.dumps(doc).encode()
