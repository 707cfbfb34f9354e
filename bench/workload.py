"""The benchmark's input: contract-following order events on fresh topics.

A workload is a list of Kafka ``(key, value)`` records, built per order as its
lifecycle (CREATED, PAID[, CONFIRM]) on one key, with many orders interleaved,
plus 10 % duplicates: byte-identical re-sends of earlier records, each placed
a little later in the stream than its original (so on the same partition, after it).

* ``full``:  60 % CREATED/PAID, 30 % CONFIRM (one waybill call each), 10 % duplicates
* ``local``: 90 % CREATED/PAID, 10 % duplicates: no external call at all
* ``mixed``: waybill and SMS calls: two orders in three are confirmed (CREATED, PAID, CONFIRM:
  a waybill), the third is cancelled after payment (CREATED, PAID, CANCEL: an SMS), so
  60 % CREATED/PAID, 20 % CONFIRM, 10 % CANCEL, 10 % duplicates (rows g of the benchmark)
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import orjson

LIFECYCLES = {
    "full": ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM"),
    "local": ("ORDER_CREATED", "ORDER_PAID"),
    "mixed": ("ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM"),
}
# Mixes whose orders do not all live the same life: order i takes VARIANTS[name][i % len(...)].
# (A mix not listed here: every order takes LIFECYCLES[name].)
VARIANTS = {
    "mixed": (LIFECYCLES["mixed"], LIFECYCLES["mixed"], ("ORDER_CREATED", "ORDER_PAID", "ORDER_CANCEL")),
}
CANCEL_REASONS = ("customer changed their mind", "out of stock", "address not deliverable")
# The order state a lifecycle's last event leads to (app.pipeline.states.OrderStatus).
FINAL_STATUS = {"ORDER_CREATED": 1, "ORDER_PAID": 2, "ORDER_CONFIRM": 3, "ORDER_CANCEL": 4}
DUPLICATE_SHARE = 0.10
# Orders in flight at once: an order's events land about this many records apart.
ACTIVE_ORDERS = 2_000
# A duplicate lands 1..DUPLICATE_MAX_GAP records after its original: a re-send,
# not a replay of the whole topic. Keeps the duplicate share even along the topic,
# so a prefix (the naive run) sees the same mix as the whole.
DUPLICATE_MAX_GAP = 5_000
TZ = timezone(timedelta(hours=8))


@dataclass
class Workload:
    name: str
    topic: str
    records: list[tuple[bytes, bytes]]
    orders: int
    lifecycle: tuple[str, ...]
    types: Counter = field(default_factory=Counter)   # originals by event type, plus "duplicate"
    # Orders per lifecycle (one entry, ``lifecycle``, unless the mix has VARIANTS).
    lifecycles: dict[tuple[str, ...], int] = field(default_factory=dict)

    def describe(self) -> dict:
        doc = {"topic": self.topic, "events": len(self.records), "orders": self.orders,
               "lifecycle": list(self.lifecycle), "types": dict(self.types)}
        if len(self.lifecycles) > 1:
            doc["lifecycles"] = {" > ".join(cycle): n for cycle, n in self.lifecycles.items()}
        return doc

    def expected_orders(self) -> dict[int, int]:
        """Orders by the final status their lifecycle leads to."""
        expected: Counter = Counter()
        for cycle, n in self.lifecycles.items():
            expected[FINAL_STATUS[cycle[-1]]] += n
        return dict(expected)

    def expected_calls(self, event_type: str) -> int:
        """Orders whose lifecycle has ``event_type`` (one effect call each, e.g. a waybill per CONFIRM)."""
        return sum(n for cycle, n in self.lifecycles.items() if event_type in cycle)


def build(name: str, total: int, *, topic: str, tag: str, seed: int = 7) -> Workload:
    """``total`` records of mix ``name`` ('full', 'local' or 'mixed'); ``tag`` keeps order numbers
    unique per run."""
    lifecycle = LIFECYCLES[name]
    variants = VARIANTS.get(name, (lifecycle,))
    rng = random.Random(f"{seed}-{name}")
    events_per_order = sum(len(cycle) for cycle in variants) / len(variants)
    orders = max(1, round(total * (1 - DUPLICATE_SHARE) / events_per_order))
    originals = _originals(rng, variants, orders, prefix=f"B{tag}{name[0].upper()}")
    duplicates = max(0, total - len(originals))
    workload = Workload(name, topic, _with_duplicates(rng, originals, duplicates), orders, lifecycle)
    for i in range(orders):
        cycle = variants[i % len(variants)]
        workload.lifecycles[cycle] = workload.lifecycles.get(cycle, 0) + 1
        workload.types.update(cycle)
    workload.types["duplicate"] = duplicates
    return workload


def _originals(rng: random.Random, variants: tuple[tuple[str, ...], ...], orders: int,
               prefix: str) -> list[tuple[bytes, bytes]]:
    """Every order's lifecycle in order on its key (order i takes ``variants[i % len(variants)]``);
    orders interleaved at random."""
    day = datetime.now(TZ).strftime("%Y%m%d")
    clock = datetime.now(TZ).replace(microsecond=0)
    records: list[tuple[bytes, bytes]] = []
    active: list[list] = []        # [order_no, next step, amount, lifecycle]
    started = 0
    while started < orders or active:
        while started < orders and len(active) < ACTIVE_ORDERS:
            active.append([f"ORD-{day}-{prefix}{started:07d}", 0, rng.randrange(100, 1_000_000),
                           variants[started % len(variants)]])
            started += 1
        slot = rng.randrange(len(active))
        order = active[slot]
        lifecycle = order[3]
        occurred = clock + timedelta(milliseconds=len(records))
        records.append(_record(order[0], lifecycle[order[1]], order[2], occurred))
        order[1] += 1
        if order[1] == len(lifecycle):
            active[slot] = active[-1]
            active.pop()
    return records


def _record(order_no: str, type_: str, amount: int, occurred: datetime) -> tuple[bytes, bytes]:
    if type_ == "ORDER_CREATED":
        data = {"amount_cents": amount, "phone": f"+86138{amount:08d}", "address": f"{amount % 997} Bench Road"}
    elif type_ == "ORDER_PAID":
        data = {"amount_cents": amount}
    elif type_ == "ORDER_CANCEL":
        data = {"reason": CANCEL_REASONS[amount % len(CANCEL_REASONS)]}
    else:
        data = {}
    doc = {"event_id": str(uuid.uuid4()), "order_no": order_no, "type": type_,
           "occurred_at": occurred.isoformat(timespec="milliseconds"), "data": data}
    return order_no.encode(), orjson.dumps(doc)


def _with_duplicates(rng: random.Random, originals: list, count: int) -> list[tuple[bytes, bytes]]:
    """Insert ``count`` byte-identical copies of random originals, each after its original."""
    last = len(originals) - 1
    keyed = [((i, 0), record) for i, record in enumerate(originals)]
    for serial, i in enumerate(rng.choices(range(len(originals)), k=count), start=1):
        # Sorted right after original ``at`` (at >= i, serial > 0): later than its own original.
        at = min(i + rng.randint(1, DUPLICATE_MAX_GAP), last)
        keyed.append(((at, serial), originals[i]))
    keyed.sort(key=lambda item: item[0])
    return [record for _, record in keyed]
