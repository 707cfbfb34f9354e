"""The fake logistics API (the provider ``app/adapters/effects/waybill.py`` calls), as its contract says:

* ``POST /v1/waybills`` with header ``Idempotency-Key`` and JSON ``{"order_no", "address"}`` ->
  ``201 {"waybill_no"}`` for a new key, ``200`` with the *same* waybill for a key seen before;
  ``400`` without a key.
* ``GET /v1/waybills?from=<epoch s>&to=<epoch s>&limit=&after=`` -> ``200 {"waybills": [{"waybill_no",
  "order_no", "idempotency_key", "created_at", "status"}], "next"}``: every waybill issued at or after
  ``from`` and before ``to`` (``created_at``: epoch seconds, this API's clock; ``status``: ``issued`` or
  ``cancelled``), oldest first, ``limit`` (1-1000, 1000) at a time; ``next`` is the ``after`` of the
  next page, null on the last. ``400`` for a bad range. What the provider's own records say it did,
  for reconciliation (``app/reconcile/providers.py``). ``GET /v1/waybills?order_no=<order>`` (with
  ``limit`` and ``after``, without a range) lists every waybill of that order, whenever issued: what a
  person's compensation reads again before it cancels (``app/reconcile/at_provider.py``).
* ``POST /v1/waybills/{waybill_no}/cancel`` with header ``Idempotency-Key`` -> ``200 {"waybill_no",
  "status": "cancelled", "cancelled_at", "idempotency_key"}``; a cancel of a waybill cancelled before
  answers ``200`` with the same body (the first cancel's key and time), whatever its key; ``404``
  for a waybill never issued, ``400`` without a key. The ledger's ``cancels`` holds each waybill
  cancelled (once), ``cancel_calls`` every cancel asked and ``listings`` every listing: apart from
  ``calls``, which holds the effects' calls (the chaos checker holds each service there to exactly
  once). The faults do not touch them.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from aiohttp import web

from demo.fakes.fake import Fake

if TYPE_CHECKING:
    from demo.fakes.server import FakeServices

LIST_LIMIT = 1000             # the most waybills one page of the listing holds
LISTED = ("waybill_no", "order_no", "idempotency_key", "created_at", "status")


class LogisticsApi:
    def __init__(self, fakes: FakeServices) -> None:
        self.fakes = fakes

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/v1/waybills", self.issue), web.get("/v1/waybills", self.listing),
                web.post("/v1/waybills/{waybill_no}/cancel", self.cancel)]

    async def issue(self, request: web.Request) -> web.Response:
        body = await request.json()
        key = request.headers.get("Idempotency-Key")
        with self.fakes.in_flight(f"waybill:{key}"):
            return await self._issue(request, body, key)

    async def _issue(self, request: web.Request, body: dict, key: str | None) -> web.Response:
        fakes, ledger = self.fakes, self.fakes.ledger
        order_no = body.get("order_no")
        fakes.called("waybill", request, key=key, body=body)
        if not key:
            return web.json_response({"error": "Idempotency-Key header is required"}, status=400)
        if not order_no or not body.get("address"):
            return web.json_response({"error": "order_no and address are required"}, status=400)
        asked = {"idempotency_key": key, **body}
        if (response := await fakes.fault(FAKE.name, request, order_no, asked)) is not None:
            return response
        if (waybill_no := fakes.known(FAKE.name, key)) is not None:
            status = 200
        else:
            status, waybill_no = 201, f"WB{fakes.serial():010d}"
            fakes.did(FAKE, order_no, waybill_no, key)
            ledger.waybills[order_no].append(waybill_no)
            ledger.issued[waybill_no] = {"waybill_no": waybill_no, "order_no": order_no, "idempotency_key": key,
                                         "created_at": time.time(), "status": "issued"}
        if (redirect := fakes.after_work(FAKE.name, request)) is not None:
            return redirect
        override = fakes.faults[FAKE.name].waybill_no_override
        return web.json_response({"waybill_no": waybill_no if override is None else override}, status=status)

    async def listing(self, request: web.Request) -> web.Response:
        ledger, query = self.fakes.ledger, request.query
        ledger.listings.append({"query": dict(query), "at": time.time()})
        order = query.get("order_no")
        try:
            since = float(query["from"]) if order is None else -math.inf
            until = float(query["to"]) if order is None else math.inf
            limit = int(query.get("limit") or LIST_LIMIT)
        except (KeyError, ValueError):
            return web.json_response({"error": "from and to (epoch seconds), or order_no, are required; limit is a "
                                               "number"}, status=400)
        after = ledger.issued.get(query.get("after", ""))
        if not ((order is not None or (math.isfinite(since) and math.isfinite(until))) and since <= until
                and 1 <= limit <= LIST_LIMIT):
            return web.json_response({"error": f"from <= to, and limit 1-{LIST_LIMIT}"}, status=400)
        # Issued in order (their numbers and times both grow), so a page goes on after its last.
        found = [w for w in ledger.issued.values() if since <= w["created_at"] < until
                 and (order is None or w["order_no"] == order)
                 and (after is None or (w["created_at"], w["waybill_no"]) > (after["created_at"], after["waybill_no"]))]
        page = [{name: w[name] for name in LISTED} for w in found[:limit]]
        return web.json_response({"waybills": page, "next": page[-1]["waybill_no"] if len(found) > limit else None})

    async def cancel(self, request: web.Request) -> web.Response:
        ledger = self.fakes.ledger
        number, key = request.match_info["waybill_no"], request.headers.get("Idempotency-Key")
        ledger.cancel_calls.append({"key": key, "waybill_no": number, "at": time.time()})
        if not key:
            return web.json_response({"error": "Idempotency-Key header is required"}, status=400)
        waybill = ledger.issued.get(number)
        if waybill is None:
            return web.json_response({"error": f"no waybill {number}"}, status=404)
        if waybill["status"] != "cancelled":          # no await since the look: one cancel wins
            waybill.update(status="cancelled", cancelled_at=time.time(), cancel_key=key)
            ledger.cancels.append({"waybill_no": number, "key": key, "at": waybill["cancelled_at"]})
        named = self.fakes.faults[FAKE.name].cancel_answer_override
        return web.json_response({"waybill_no": number if named is None else named, "status": "cancelled",
                                  "cancelled_at": waybill["cancelled_at"], "idempotency_key": waybill["cancel_key"]})


FAKE = Fake("waybill", "waybill", lambda fakes: LogisticsApi(fakes).routes(), services=("waybill",))
