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


def cloudevent(doc: dict, *, structured: bool = False, type_name: str | None = None,
               **attributes: str) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """The same event as a CloudEvent over Kafka: binary mode (``ce_*`` headers, the data as the
    value) or structured (``application/cloudevents+json``); key = the order number (partitionkey)."""
    attrs = {"specversion": "1.0", "id": doc["event_id"], "source": "/test/order-service",
             "type": type_name or doc["type"], "subject": doc["order_no"], "time": doc["occurred_at"],
             "datacontenttype": "application/json", **attributes}
    key = doc["order_no"].encode()
    if structured:
        return key, json.dumps({**attrs, "data": doc["data"]}).encode(), [
            ("content-type", b"application/cloudevents+json; charset=UTF-8")]
    headers = [("ce_" + name, value.encode()) for name, value in attrs.items() if name != "datacontenttype"]
    return key, json.dumps(doc["data"]).encode(), [*headers, ("content-type", b"application/json")]


def outbox(doc: dict) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """The same event as the Debezium outbox EventRouter relays it: key = the aggregate id (the order
    number), the event id in the ``id`` header, the type in ``eventType``, the value the payload."""
    return (doc["order_no"].encode(), json.dumps(doc["data"]).encode(),
            [("id", doc["event_id"].encode()), ("eventType", doc["type"].encode())])
