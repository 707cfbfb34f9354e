"""Demo producer: ``python -m demo --orders 100`` sends order lifecycles to ``order-event``.

Most orders go CREATED -> PAID -> CONFIRM; every tenth is cancelled after
payment; a few records are duplicates, and two break the contract so the
dead-letter path has something to show.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import uuid
from datetime import UTC, datetime

from app.adapters.kafka import ops as kafka_ops
from app.adapters.kafka.connection import KafkaConnection
from app.settings import get_settings_or_exit


def lifecycle(order_no: str, cancel: bool) -> list[dict]:
    now = datetime.now(UTC).isoformat()
    steps = [("ORDER_CREATED", {"amount_cents": random.randint(100, 99_999), "phone": "+8613800000000",
                                "address": f"{random.randint(1, 999)} Demo Street"}),
             ("ORDER_PAID", None),
             ("ORDER_CANCEL", {"reason": "customer changed their mind"}) if cancel else ("ORDER_CONFIRM", {})]
    events = []
    for type_, data in steps:
        if type_ == "ORDER_PAID":
            data = {"amount_cents": events[0]["data"]["amount_cents"]}
        events.append({"event_id": str(uuid.uuid4()), "order_no": order_no, "type": type_,
                       "occurred_at": now, "data": data})
    return events


async def produce(orders: int) -> int:
    settings = get_settings_or_exit()
    day = datetime.now(UTC).strftime("%Y%m%d")
    run = uuid.uuid4().hex[:6].upper()
    records: list[tuple[bytes, bytes]] = []
    for n in range(orders):
        order_no = f"ORD-{day}-D{run}{n:05d}"
        for doc in lifecycle(order_no, cancel=n % 10 == 9):
            records.append((order_no.encode(), json.dumps(doc).encode()))
    records += random.sample(records, k=max(1, len(records) // 20))       # duplicates
    records += [(b"ORD-BROKEN", b"\xff not utf-8"), (b"ORD-BROKEN", b'{"type": "ORDER_PAID"}')]
    await kafka_ops.produce(KafkaConnection.from_settings(settings.kafka), settings.kafka.topic, records)
    return len(records)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m demo")
    parser.add_argument("--orders", type=int, default=100)
    args = parser.parse_args()
    sent = asyncio.run(produce(args.orders))
    print(f"demo: sent {sent} records for {args.orders} orders to {get_settings_or_exit().kafka.topic}")


if __name__ == "__main__":
    main()
