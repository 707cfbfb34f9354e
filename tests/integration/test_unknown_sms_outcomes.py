"""An SMS whose outcome is unknown is looked up before it is sent again; the lookup's 404 is
believed only once a request still on its way has surely landed. Real MariaDB, the fake
gateway over real HTTP, registering a request seconds after it arrived (a queue, a load
balancer, a gateway that accepts before it records)."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.adapters.effects import EffectClients
from app.pipeline.errors import EffectOutcomeUnknown
from app.pipeline.model import EffectJob
from app.pipeline.outcomes import Outcome
from app.pipeline.ports import Receipt
from harness.pipeline import ev, paid_orders


class Died(BaseException):
    """The worker died right after this call (no T3, no ack)."""


class Staged(EffectClients):
    """The harness's clients, with one order's call held up (a slow call ahead of it in the
    only slot) and the worker dying right after another order's call."""

    def __init__(self, inner: EffectClients, *, hold: dict[str, float], die_after: set[str]) -> None:
        self.__dict__.update(inner.__dict__)
        self.hold, self.die_after = hold, die_after

    async def call(self, job: EffectJob) -> Receipt:
        if job.order_no in self.hold:
            await asyncio.sleep(self.hold[job.order_no])
            return Receipt(reference="a slow call of another order")
        try:
            return await super().call(job)
        finally:
            if job.order_no in self.die_after:
                raise Died()


async def test_an_sms_sent_late_in_its_lease_by_a_worker_that_died_is_found_not_sent_again(harness):
    """Worker A claims two CANCELs (lease 6 s, calls of 1 s, one at a time). The first call takes
    4 s, so the second SMS goes out 4 s after the claim, with 2 s of lease left (enough: a call
    needs 1.5 s), and A dies right after it. The gateway registers it 4 s after it arrived. A
    lookup 5 s after the claim, when the lease has ended, would answer 404 and the SMS would go
    out twice; the settle (5 s) counts from the end of A's lease instead, when it has landed."""
    lease, timeout, settle = 6.0, 1.0, 5.0
    setup = await harness.processor()
    slow, order = await paid_orders(setup, 2, "LATESMS")
    a = await harness.processor(lease=lease, timeout=timeout, margin=0.5, concurrency=1, settle=settle)
    a.effects = Staged(a.effects, hold={slow: 4.0}, die_after={order})
    harness.fakes.configure({"sms": {"timeout_next": 1, "timeout_ms": 4000}})
    claimed = time.monotonic()
    with pytest.raises(Died):
        await a.run([ev(slow, "ORDER_CANCEL"), ev(order, "ORDER_CANCEL")])
    assert harness.fakes.ledger.sms[order] == []                       # still on its way

    b = await harness.processor(lease=lease, timeout=timeout, margin=0.5, settle=settle)
    while True:                                                        # as the compensator would, every 0.5 s
        [result] = await b.run([ev(order, "ORDER_CANCEL")])
        if result.outcome is not None:
            break
        assert isinstance(result.error, (EffectOutcomeUnknown,)) or result.error.reason == "lease_held", result
        assert time.monotonic() - claimed < 30, "the SMS was never settled"
        await asyncio.sleep(0.5)
    while harness.fakes.ledger.in_flight[f"sms:{order}"]:           # A's request has landed
        await asyncio.sleep(0.1)

    assert result.outcome is Outcome.APPLIED
    assert len(harness.fakes.ledger.sms[order]) == 1, harness.fakes.ledger.sms[order]
    lookups = [c for c in harness.fakes.ledger.calls if c["service"] == "sms_lookup"]
    assert len(lookups) == 1 and time.monotonic() - claimed >= lease + settle
    [row] = harness.idem(f"{order}:ORDER_CANCEL:send_cancel_sms")
    assert (row["status"], row["outcome"]) == (2, "sms_accepted")
