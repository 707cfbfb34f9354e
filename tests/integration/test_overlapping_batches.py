"""Two batches of one worker in flight at once (BATCHES_IN_FLIGHT) against real MariaDB and the
fake services: they share the worker's owner, so a batch with an order of a batch still in flight
must wait for it; batches of other orders go on meanwhile."""

from __future__ import annotations

import asyncio

from harness.events import event, order_no
from harness.pipeline import paid_orders, source


async def until(condition, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def waybill_calls(harness, order: str) -> list:
    return [c for c in harness.fakes.ledger.calls if c["service"] == "waybill" and c["body"].get("order_no") == order]


async def test_a_batch_with_an_order_whose_call_is_in_flight_waits_and_makes_no_second_call(harness):
    p = await harness.processor(lease=60.0)
    [order] = await paid_orders(p, 1, "INFL")
    batches = harness.batches(p)
    confirm = event(order, "ORDER_CONFIRM")
    harness.fakes.configure({"waybill": {"latency_ms": 1000}})

    first = asyncio.create_task(batches.handle([source(confirm)]))
    await until(lambda: waybill_calls(harness, order))             # its call is on its way
    # The same CONFIRM again (from another partition), and an order of its own.
    other = order_no(prefix="INFL")
    second = asyncio.create_task(batches.handle([source(confirm), source(event(other, "ORDER_CREATED"))]))
    alone = asyncio.create_task(batches.handle([source(event(order_no(prefix="INFL"), "ORDER_CREATED"))]))
    await asyncio.wait_for(alone, 10)                               # no order in common: not held up
    assert not first.done() and not second.done()
    a, b = await asyncio.gather(first, second)

    assert len(waybill_calls(harness, order)) == 1, "a second call while the first was in flight"
    assert a.outcomes == {"applied": 1} and not a.dead_letters, a
    assert b.outcomes == {"duplicate": 1, "applied": 1} and not b.dead_letters and b.order_waits == 1, b
    [row] = harness.idem(f"{order}:ORDER_CONFIRM:issue_waybill")
    assert (row["status"], row["attempt"]) == (2, 1)               # done, by the first claim
