"""What the chaos run writes to ``order-event``: every record planned up front from the seed.

Orders follow ``CREATED, PAID, then CONFIRM or CANCEL``; some stop after CREATED or PAID.
Their events are interleaved (a pool of open orders, one event of a random one at a
time), so an order's events land in different batches, and a kill or a fault can fall
between them. Mixed in:

    exact_duplicate   the same bytes again, some hundreds of records later
    republished       a new event_id asking for the same thing (same order, type and data)
    late              two neighbours of an order's lifecycle produced the other way round
                      (PAID before CREATED): the earlier one arrives late
    malformed         not JSON, not an object, no order_no, an unknown type, an amount that
                      is a string, not UTF-8, and neither key nor value (written with Kafka's
                      Java client: aiokafka refuses to)

Order numbers carry today's date, so every event is inside the dedup retention.
"""

from __future__ import annotations

import heapq
import json
import random
import uuid
from dataclasses import dataclass, field

from harness.events import TODAY

CREATED, PAID, CONFIRM, CANCEL = "ORDER_CREATED", "ORDER_PAID", "ORDER_CONFIRM", "ORDER_CANCEL"
LIFECYCLES = (((CREATED,), 0.10), ((CREATED, PAID), 0.15), ((CREATED, PAID, CONFIRM), 0.45),
              ((CREATED, PAID, CANCEL), 0.30))
MALFORMED_KINDS = ("not_json", "not_object", "no_order_no", "bad_type", "bad_amount", "not_utf8")
OPEN_ORDERS = 64             # orders in progress at once: an order's events are ~this many records apart


@dataclass(frozen=True)
class Shares:
    """How much of each kind of trouble, per original event."""

    exact_duplicate: float = 0.03
    republished: float = 0.03
    late: float = 0.04           # per order: two neighbouring events swapped
    malformed: float = 0.002
    null_records: int = 1        # records with neither key nor value (Java client)
    duplicate_within: int = 2000  # an exact duplicate or re-publication follows within this many records
    malformed_kinds: tuple[str, ...] = MALFORMED_KINDS     # what an upstream can write (an outbox: no bytes but text)


@dataclass
class Planned:
    """One record to write, and what the manifest says about it."""

    kind: str
    key: bytes | None
    value: bytes | None
    event_id: str | None = None
    order_no: str | None = None
    type: str | None = None
    duplicate_of: str | None = None
    late: bool = False
    malformed_kind: str | None = None
    java: bool = False           # written with Kafka's Java client
    partition: int | None = None  # chosen here only for Java records

    def entry(self, partition: int, offset: int) -> dict:
        return {"partition": partition, "offset": offset, "kind": self.kind, "event_id": self.event_id,
                "order_no": self.order_no, "type": self.type, "duplicate_of": self.duplicate_of,
                "late": self.late, "malformed_kind": self.malformed_kind}


@dataclass
class Workload:
    records: list[Planned] = field(default_factory=list)
    orders: dict[str, list[str]] = field(default_factory=dict)     # order_no -> its lifecycle

    def count(self, kind: str) -> int:
        return sum(1 for r in self.records if r.kind == kind)


class _Planner:
    def __init__(self, seed: int, shares: Shares, partitions: int) -> None:
        self.rng = random.Random(seed)
        self.shares = shares
        self.partitions = partitions
        self.tag = f"{seed % 100000:05d}"
        self.workload = Workload()
        self.later: list[tuple[int, int, Planned]] = []     # (due position, tie-breaker, record)
        self.produced_stage: dict[str, int] = {}              # order -> highest lifecycle index produced
        self.serial = 0

    def uuid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def order(self) -> tuple[str, list[dict]]:
        """A new order: its number, and its events in the order they will be produced."""
        order_no = f"ORD-{TODAY}-C{self.tag}{len(self.workload.orders):07d}"
        lifecycle = self.rng.choices([lc for lc, _ in LIFECYCLES], [w for _, w in LIFECYCLES])[0]
        self.workload.orders[order_no] = list(lifecycle)
        amount = self.rng.randrange(100, 1_000_000)
        data = {CREATED: {"amount_cents": amount, "phone": f"+86138{self.rng.randrange(10**8):08d}",
                          "address": f"{self.rng.randrange(1, 999)} Chaos Road"},
                PAID: {"amount_cents": amount}, CONFIRM: {}, CANCEL: {"reason": "customer asked"}}
        docs = [{"event_id": self.uuid(), "order_no": order_no, "type": t, "occurred_at": self.occurred_at(i),
                 "data": data[t], "_stage": i} for i, t in enumerate(lifecycle)]
        if len(docs) > 1 and self.rng.random() < self.shares.late:
            i = self.rng.randrange(len(docs) - 1)
            docs[i], docs[i + 1] = docs[i + 1], docs[i]
        return order_no, docs

    def occurred_at(self, stage: int) -> str:
        return f"2026-11-29T10:{stage:02d}:{self.rng.randrange(60):02d}+08:00"

    def emit(self, doc: dict, kind: str, duplicate_of: str | None = None, value: bytes | None = None) -> Planned:
        order_no, stage = doc["order_no"], doc["_stage"]
        late = self.produced_stage.get(order_no, -1) > stage
        self.produced_stage[order_no] = max(self.produced_stage.get(order_no, -1), stage)
        body = value if value is not None else json.dumps({k: v for k, v in doc.items() if k != "_stage"}).encode()
        record = Planned(kind, order_no.encode(), body, doc["event_id"], order_no, doc["type"], duplicate_of, late)
        self.workload.records.append(record)
        return record

    def original(self, doc: dict) -> None:
        record = self.emit(doc, "original")
        position = len(self.workload.records)
        if self.rng.random() < self.shares.exact_duplicate:
            self.defer(position, ("exact_duplicate", doc, record.value))
        if self.rng.random() < self.shares.republished:
            again = {**doc, "event_id": self.uuid(), "occurred_at": self.occurred_at(doc["_stage"])}
            self.defer(position, ("republished", again, doc["event_id"]))
        if self.rng.random() < self.shares.malformed:
            kinds = self.shares.malformed_kinds
            self.malformed(kinds[self.rng.randrange(len(kinds))])

    def defer(self, position: int, what: tuple) -> None:
        self.serial += 1
        heapq.heappush(self.later, (position + self.rng.randint(1, self.shares.duplicate_within), self.serial, what))

    def flush(self, everything: bool = False) -> None:
        while self.later and (everything or self.later[0][0] <= len(self.workload.records)):
            _, _, (kind, doc, extra) = heapq.heappop(self.later)
            if kind == "exact_duplicate":
                self.emit(doc, kind, duplicate_of=doc["event_id"], value=extra)
            else:
                self.emit(doc, kind, duplicate_of=extra)

    def malformed(self, kind: str) -> None:
        """A record that breaks the contract, keyed by an order number no real order has."""
        self.serial += 1
        order_no = f"ORD-{TODAY}-M{self.tag}{self.serial:07d}"
        good = {"event_id": self.uuid(), "order_no": order_no, "type": CREATED, "occurred_at": self.occurred_at(0),
                "data": {"amount_cents": 100, "phone": "+8613800000000", "address": "1 Nowhere Road"}}
        values = {
            "not_json": b'{"event_id": "' + good["event_id"].encode() + b'", "order_no": ',
            "not_object": json.dumps([good]).encode(),
            "no_order_no": json.dumps({k: v for k, v in good.items() if k != "order_no"}).encode(),
            "bad_type": json.dumps({**good, "type": "ORDER_TELEPORTED"}).encode(),
            "bad_amount": json.dumps({**good, "data": {**good["data"], "amount_cents": "12.90"}}).encode(),
            "not_utf8": b"\xff\xfe" + json.dumps(good).encode("utf-16-le"),
        }
        self.workload.records.append(Planned("malformed", order_no.encode(), values[kind], malformed_kind=kind))

    def special(self, kind: str) -> None:
        if kind != "null_key_value":
            self.malformed(kind)
            return
        self.workload.records.append(Planned("malformed", None, None, malformed_kind=kind, java=True,
                                             partition=self.rng.randrange(self.partitions)))


def plan(seed: int, *, min_events: int, min_orders: int, partitions: int, shares: Shares = Shares()) -> Workload:
    """Every record of the run, in the order it will be produced."""
    p = _Planner(seed, shares, partitions)
    pool: list[list[dict]] = []          # open orders: their events still to produce
    planned = 0                          # original events of the orders opened so far
    # Each kind of malformed record at least once (and the records with neither key nor
    # value), at random places; more malformed records follow originals at their share.
    specials = ["null_key_value"] * shares.null_records + list(shares.malformed_kinds)
    p.rng.shuffle(specials)
    spots = sorted(p.rng.sample(range(1, max(min_events, len(specials) + 1)), len(specials)))
    pending = list(zip(spots, specials))
    while pool or planned < min_events or len(p.workload.orders) < min_orders:
        wanted = planned < min_events or len(p.workload.orders) < min_orders
        if wanted and (len(pool) < OPEN_ORDERS or p.rng.random() < 0.02):
            _, docs = p.order()
            pool.append(docs)
            planned += len(docs)
            continue
        i = p.rng.randrange(len(pool))
        p.original(pool[i].pop(0))
        if not pool[i]:
            pool[i] = pool[-1]
            pool.pop()
        p.flush()
        while pending and pending[0][0] <= len(p.workload.records):
            p.special(pending.pop(0)[1])
    p.flush(everything=True)
    for _, kind in pending:
        p.special(kind)
    return p.workload
