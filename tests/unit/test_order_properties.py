"""The order state machine under any delivery of one order's events, through the real batch
handler and processor on the in-memory store (``harness/memory_store.py``).

A delivery is the order's events (CREATED, PAID, CONFIRM, CANCEL: any of them) in any order,
with copies: exact ones (the same record again, same ``event_id``) and re-published ones (a new
``event_id``, the same request), cut into batches anyhow. What the batch handler dead-letters is
delivered again afterwards, as the compensator would run it, until nothing moves any more.

The property: where the order ends depends only on which events there were, never on their
order or their count. The expected end is written here from the docs' table, not asked of
``app.pipeline.states``.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import asdict

from hypothesis import example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from app.pipeline.batch import BatchHandler, BatchPolicy, Identity
from app.pipeline.clock import Clock
from app.pipeline.events import EventType
from app.pipeline.processor import Processor, ProcessorPolicy
from app.pipeline.states import ORDER_DATA, OrderStatus
from app.pipeline.tokens import StepTokens
from harness.events import event, order_no
from harness.memory_store import MemoryStore
from harness.pipeline import MemorySink, source
from harness.scenarios import MemoryEffects

TYPES = tuple(t.value for t in EventType)      # a new event type is drawn too: the model below must know it
LIFECYCLE = [("ORDER_CREATED", False), ("ORDER_PAID", False), ("ORDER_CONFIRM", False), ("ORDER_CANCEL", False)]
# A delivery that reaches CONFIRMED before its CANCEL needs four events in one order: 1,000 examples find one.
PROPERTY = hsettings(max_examples=1000, deadline=None, derandomize=True, database=None)


@st.composite
def deliveries(draw) -> tuple[frozenset[str], list[tuple[str, bool]], list[int]]:
    """(the set of event types, the delivery: (type, a re-published copy?) in order, the batch sizes;
    what the sizes leave over is one more batch). A type's later plain entries are exact copies of its first."""
    sequence = draw(st.lists(st.tuples(st.sampled_from(TYPES), st.booleans()), min_size=1, max_size=8))
    sizes = draw(st.lists(st.integers(1, len(sequence)), min_size=1, max_size=len(sequence)))
    return frozenset(kind for kind, _ in sequence), sequence, sizes


def expected_status(kinds: frozenset[str]) -> OrderStatus | None:
    """The docs: CREATED -> PAID -> CONFIRMED, and CANCELLED from any of them; an event whose
    order is not there yet waits for it (a retry, a redrive); an event behind the order is stale."""
    if "ORDER_CREATED" not in kinds:
        return None
    if "ORDER_CANCEL" in kinds:
        return OrderStatus.CANCELLED
    if "ORDER_PAID" not in kinds:
        return OrderStatus.CREATED
    return OrderStatus.CONFIRMED if "ORDER_CONFIRM" in kinds else OrderStatus.PAID


class Delivery:
    """One order's events through the batch handler, then the dead letters again until they settle."""

    def __init__(self) -> None:
        self.order = order_no(prefix="PROP")
        self.firsts: dict[str, dict] = {}          # type -> its first event document

    def doc(self, kind: str, republished: bool) -> dict:
        first = self.firsts.setdefault(kind, event(self.order, kind))
        return dict(first, event_id=str(uuid.uuid4())) if republished else first

    async def run(self, sequence: list[tuple[str, bool]], sizes: list[int]) -> tuple[MemoryStore, MemoryEffects]:
        store = MemoryStore()
        effects = MemoryEffects(asyncio.sleep)
        processor = Processor(store, effects, owner="prop/main/1", tokens=StepTokens(b"properties"),
                              policy=ProcessorPolicy(lease_seconds=30, effect_concurrency=4))
        sink = MemorySink()
        handler = BatchHandler(processor, store, sink, identity=Identity("prop", "prop"), clock=Clock(sleep=_no_wait),
                               policy=BatchPolicy(backoff=(0, 0, 0), max_event_bytes=1 << 20, infra_budget=5,
                                                  max_lease_wait=1))
        records = [source(self.doc(kind, republished)) for kind, republished in sequence]
        for batch in _cut(records, sizes):
            await handler.handle(batch)
        letters = sink.sent
        while letters:
            assert all(letter.retriable for letter in letters), [(x.reason, x.message) for x in letters]
            sink.sent = []
            for letter in letters:
                await handler.handle([letter.record])
            if len(sink.sent) == len(letters):      # none settled, so none will: they wait for events never sent
                break
            letters = sink.sent
        return store, effects


def _cut(records: list, sizes: list[int]) -> list[list]:
    batches, start = [], 0
    for size in sizes:
        if start < len(records):
            batches.append(records[start:start + size])
            start += size
    if start < len(records):
        batches.append(records[start:])
    return batches


async def _no_wait(seconds: float) -> None:
    await asyncio.sleep(0)


def deliver(sequence: list[tuple[str, bool]], sizes: list[int]) -> tuple[dict | None, MemoryEffects]:
    """The order as it ends (status and data, not the dead-letter bookkeeping) and the calls made."""
    delivery = Delivery()
    loop = asyncio.new_event_loop()
    try:
        store, effects = loop.run_until_complete(delivery.run(sequence, sizes))
    finally:
        loop.close()
    order = store.state.orders.get(delivery.order)
    return (None if order is None else {k: v for k, v in asdict(order).items() if k in ("status", *ORDER_DATA)},
            effects)


def canonical(kinds: frozenset[str]) -> list[tuple[str, bool]]:
    return [(kind, False) for kind in TYPES if kind in kinds]


@PROPERTY
@given(deliveries())
@example((frozenset(TYPES), LIFECYCLE, [1, 1, 1, 1]))
@example((frozenset(TYPES), LIFECYCLE[::-1], [4]))
def test_the_final_status_depends_only_on_the_set_of_events(delivery):
    kinds, sequence, sizes = delivery
    order, effects = deliver(sequence, sizes)
    status = None if order is None else order["status"]
    assert status == expected_status(kinds), f"{sequence} in batches of {sizes}"
    # However often an event came, each call was made at most once, and the SMS iff the order is cancelled.
    sent = {effect: n for (effect, _), n in effects.sent.items()}
    assert sent.get("sms", 0) == (status is OrderStatus.CANCELLED), sent
    assert sent.get("waybill", 0) <= ({"ORDER_PAID", "ORDER_CONFIRM"} <= kinds), sent


@hsettings(PROPERTY, max_examples=300)
@given(deliveries())
def test_the_final_order_row_depends_only_on_the_set_of_events(delivery):
    """Status and data (what the local steps copy onto the order), against the same events
    delivered once each, in lifecycle order, in one batch."""
    kinds, sequence, sizes = delivery
    expected, _ = deliver(canonical(kinds), [len(kinds)])
    order, _ = deliver(sequence, sizes)
    assert order == expected, f"{sequence} in batches of {sizes}"


def test_the_canonical_delivery_ends_as_the_docs_say():
    order, effects = deliver(canonical(frozenset(TYPES)), [1, 1, 1, 1])
    assert order["status"] is OrderStatus.CANCELLED and order["paid_cents"] == 12_900
    assert sorted(effects.sent.values()) == [1, 1] and {e for e, _ in effects.sent} == {"waybill", "sms"}
    assert expected_status(frozenset({"ORDER_PAID", "ORDER_CONFIRM", "ORDER_CANCEL"})) is None
