"""An order service's transactional outbox relayed by the real Debezium MySQL connector in a real
Kafka Connect worker, into real workers of this processor (``EVENT_ENVELOPE=outbox``), with Connect
SIGKILLed mid-stream and restarted: with Connect's exactly-once source support (transactions, so a
crash aborts what was in flight) and without it (a plain at-least-once relay that sends again what
it had sent). Every order ends right: one waybill per confirmed order, one SMS per cancelled one,
nothing of a rolled-back transaction acted on, and nothing left for a person.

``OUTBOX_ORDERS`` sets how many orders (the short run here; ``make chaos MODE=outbox`` runs the long one).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading

import pytest

from harness.events import DATA, TODAY
from harness.fakes import FakesProcess
from harness.outbox_relay import OutboxRelay
from harness.services import caught_up, end_offsets, wait_for

ORDERS = int(os.environ.get("OUTBOX_ORDERS", "60"))
KILLS = max(1, ORDERS // 400)         # Connect SIGKILLs while the order service writes
STATUS = {"ORDER_CREATED": 1, "ORDER_PAID": 2, "ORDER_CONFIRM": 3, "ORDER_CANCEL": 4}


class OrderService:
    """Writes orders as an order service does: each event in a transaction of its own with the order's
    row; every seventh order's last transaction rolled back, every eleventh order entirely."""

    def __init__(self, relay: OutboxRelay, prefix: str) -> None:
        self.relay = relay
        self.prefix = prefix
        self.expected: dict[str, int] = {}        # order -> status it must end in (absent: never created)
        self.ends: dict[str, str] = {}            # order -> its committed last event

    def order_no(self, n: int) -> str:
        return f"ORD-{TODAY}-{self.prefix}{n:05d}"

    def write(self, n: int) -> None:
        order = self.order_no(n)
        last = "ORDER_CONFIRM" if n % 2 else "ORDER_CANCEL"
        lifecycle = ["ORDER_CREATED", "ORDER_PAID", last]
        if n % 3 == 0:                                          # a type this processor does not handle
            lifecycle.insert(2, "ORDER_SHIPPED")
        end = None
        for step, type_ in enumerate(lifecycle):
            commit = not (n % 11 == 5 or (n % 7 == 6 and step == len(lifecycle) - 1))
            data = DATA.get(type_, lambda: {"carrier": "SF"})()
            self.relay.write_order(order, [(type_, json.dumps(data))], status=type_, commit=commit)
            if commit and type_ in STATUS:
                end = type_
        if end is not None:
            self.expected[order] = STATUS[end]
            self.ends[order] = end


@pytest.mark.parametrize("exactly_once", [True, False], ids=["exactly-once-relay", "at-least-once-relay"])
def test_an_outbox_relay_killed_mid_stream_leaves_every_order_right(settings, topics, spawn_worker, scratch_db,
                                                                    exactly_once):
    pair = topics(partitions=3)
    fakes = FakesProcess()
    relay = OutboxRelay(bootstrap=settings.kafka.bootstrap, topic=pair.events, exactly_once=exactly_once)
    try:
        relay.start()
        service = OrderService(relay, "OB" + ("X" if exactly_once else "L"))
        env = {**fakes.env(), "EVENT_ENVELOPE": "outbox", "BATCH_WITHIN_SECONDS": "0.3"}
        workers = [spawn_worker(pair, "a", **env), spawn_worker(pair, "b", **env)]

        def done() -> int:
            return scratch_db.scalar("SELECT COUNT(*) FROM t_order WHERE order_no LIKE %s",
                                     f"ORD-{TODAY}-{service.prefix}%")

        writer = threading.Thread(target=lambda: [service.write(n) for n in range(ORDERS)], daemon=True)
        writer.start()
        for kill in range(1, KILLS + 1):
            wait_for(lambda at=ORDERS * kill // (KILLS + 5): done() >= at, timeout=600,
                     what=f"orders through the relay before kill {kill}", workers=workers)
            relay.kill_connect()              # mid-stream: the writer goes on while Connect is down
            if kill < KILLS:
                relay.restart_connect()
        writer.join(timeout=60 + ORDERS)
        assert not writer.is_alive(), "the order service did not finish writing"
        relay.restart_connect()

        expected = service.expected
        assert len(expected) > ORDERS // 2

        def statuses() -> dict[str, int]:
            return {r["order_no"]: r["status"] for r in scratch_db.query(
                "SELECT order_no, status FROM t_order WHERE order_no LIKE %s", f"ORD-{TODAY}-{service.prefix}%")}

        wait_for(lambda: statuses() == expected, timeout=300 + ORDERS // 5, what="every order in its committed state",
                 workers=workers)
        wait_for(lambda: caught_up(settings, pair.events, pair.group, 3), timeout=120,
                 what="every record committed", workers=workers)
        ledger = fakes.ledger()
        confirmed = {o for o, end in service.ends.items() if end == "ORDER_CONFIRM"}
        cancelled = {o for o, end in service.ends.items() if end == "ORDER_CANCEL"}
        waybills = {o: len(v) for o, v in ledger["waybills"].items() if o.startswith(f"ORD-{TODAY}-{service.prefix}")}
        sms = {o: len(v) for o, v in ledger["sms"].items() if o.startswith(f"ORD-{TODAY}-{service.prefix}")}
        assert waybills == dict.fromkeys(confirmed, 1)
        assert sms == dict.fromkeys(cancelled, 1)
        left = scratch_db.query("SELECT order_no, reason, status FROM t_compensation WHERE src_topic = %s "
                                "AND status IN (1, 2, 4)", pair.events)
        assert left == [], "left for a person, or still open"
        assert all(w.alive for w in workers)
        records = sum(asyncio.run(end_offsets(settings, pair.events, 3)).values())
        print(f"{len(relay.outbox())} outbox rows committed, {records} offsets on the topic (copies sent again "
              f"and transaction markers), {KILLS} Connect kill(s), {len(expected)} orders")
    finally:
        relay.stop()
        fakes.stop()
