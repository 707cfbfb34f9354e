"""A provider added from outside the product, the way the docs' Architecture page says a new one is,
all in one module: an effect (loyalty points credited when an order is paid, voided by a cancel),
its step on ORDER_PAID, the provider that serves it (idempotent by key: ``replays``), and its fake.
Nothing of the product or the demo names it: a chaos run installs it only when asked (``--preload``).

:func:`installed` lists all three while it runs: the step (``harness.scenarios.declared``: the
pipelines' table is read when an event is planned), the provider (``app.adapters.effects.registry``)
and the fake (``demo.fakes.registry``). ``tests/unit/test_a_provider_added.py`` checks that every
place that must know sees it; ``tests/chaos/test_a_provider_added.py`` runs the short chaos storm
with it installed in every process the run starts (``harness.preload``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta

import aiohttp
from aiohttp import web

from app.adapters.effects import call_timeout, rate_limited, registry, transport_errors
from app.adapters.effects.provider import Provider, where
from app.pipeline.errors import EffectRejected, EffectUnavailable
from app.pipeline.events import EventType
from app.pipeline.model import EffectJob
from app.pipeline.ports import Receipt
from app.pipeline.states import OrderStatus
from app.pipeline.steps import PIPELINES, Contract, Effect, EffectStep
from app.settings.effects import ResolvedEffect
from demo.fakes import registry as fakes
from demo.fakes.fake import Fake
from harness.scenarios import declared

# -- the effect and its step ------------------------------------------------------------------

POINTS = Effect("points", done="points_credited",
                request=lambda event, order: {"order_no": order.order_no, "amount_cents": order.paid_cents})
CREDIT = EffectStep("credit_points", POINTS, voided_by=frozenset({OrderStatus.CANCELLED}))
CREDITS = "/loyalty/v1/credits"

# -- the provider ---------------------------------------------------------------------------


class LoyaltyClient:
    contract = Contract.REPLAYS

    def __init__(self, session: aiohttp.ClientSession, settings: ResolvedEffect) -> None:
        self.session, self.url = session, f"{settings.url.rstrip('/')}{CREDITS}"
        self.timeout = call_timeout(settings.timeout_seconds, settings.connect_timeout_seconds)

    async def call(self, job: EffectJob) -> Receipt:
        at = where(job)
        with transport_errors(at, self.timeout):
            async with self.session.post(self.url, json=job.request, timeout=self.timeout, allow_redirects=False,
                                         headers={"Idempotency-Key": job.token}) as resp:
                body = await resp.json(content_type=None) if resp.status in (200, 201) else None
                if isinstance(body, dict) and isinstance(body.get("credit_id"), str):
                    return Receipt(reference=body["credit_id"])
                if resp.status == 429:
                    raise rate_limited(at, resp.headers)
                if 400 <= resp.status < 500 and resp.status not in (408, 409):
                    raise EffectRejected(f"{at}: refused with {resp.status}")
                raise EffectUnavailable(f"{at}: answered {resp.status}")


PROVIDER = Provider("loyalty", POINTS, Contract.REPLAYS, LoyaltyClient, keys_kept_for=timedelta(days=30))

# -- its fake -------------------------------------------------------------------------------


def routes(shared) -> list[web.RouteDef]:
    async def credit(request: web.Request) -> web.Response:
        body, key = await request.json(), request.headers.get("Idempotency-Key")
        order_no = body.get("order_no")
        shared.called("loyalty", request, key=key, body=body)
        if not key or not order_no:
            return web.json_response({"error": "Idempotency-Key and order_no are required"}, status=400)
        with shared.in_flight(f"loyalty:{key}"):
            if (response := await shared.fault(FAKE.name, request, order_no, body)) is not None:
                return response
            if (credit_id := shared.known(FAKE.name, key)) is None:
                credit_id = f"PT{shared.serial():010d}"
                shared.did(FAKE, order_no, credit_id, key)
            if (redirect := shared.after_work(FAKE.name, request)) is not None:
                return redirect
            return web.json_response({"credit_id": credit_id, "at": time.time()})

    return [web.post(CREDITS, credit)]


FAKE = Fake("loyalty", "points", routes, services=("loyalty",))


@contextmanager
def installed() -> Iterator[None]:
    paid = PIPELINES[EventType.PAID]
    with declared(EventType.PAID, replace(paid, effects=(*paid.effects, CREDIT))), registry.added(PROVIDER), \
            fakes.added(FAKE):
        yield
