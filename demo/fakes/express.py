"""The fake express courier (the provider ``app/adapters/effects/express.py`` calls), as its API's
description says: every request signed (HMAC-SHA256, checked here with code of its own, not the
client's: the account :data:`ACCOUNTS`, a timestamp within 5 minutes, a nonce never seen before),
every answer an envelope ``{"code", "message", "data"}``.

* ``POST /express/v1/orders`` ``{"out_order_no", "order_no", "address"}`` -> code 0 with
  ``data.waybill_no`` for a new reference, code 1002 (duplicate) for one seen before;
* ``GET /express/v1/orders/{out_order_no}`` -> code 0 with the waybill (the first issued for that
  reference), or code 1004 (not found).

A bad signature answers 401 with code 1001 (the ledger counts them: ``refused_signatures``). Its
waybills count with the logistics API's (``waybills``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import TYPE_CHECKING

from aiohttp import web

from demo.fakes.fake import Fake

if TYPE_CHECKING:
    from demo.fakes.server import FakeServices

# The fake's accounts: key id -> secret. A worker signs with the first (FAKE.settings).
ACCOUNTS = {"demo-merchant": "demo-express-secret-not-for-production"}
CLOCK_SKEW_SECONDS = 300
ORDERS = "/express/v1/orders"


class ExpressCourier:
    def __init__(self, fakes: FakeServices) -> None:
        self.fakes = fakes

    def routes(self) -> list[web.RouteDef]:
        return [web.post(ORDERS, self.order), web.get(f"{ORDERS}/{{out_order_no}}", self.lookup)]

    def refusal(self, request: web.Request, body: bytes) -> web.Response | None:
        """401 with code 1001 unless the request is signed as the express API wants: its own check,
        written from the API's description, not with the client's code."""
        ledger, headers = self.fakes.ledger, request.headers
        secret = ACCOUNTS.get(headers.get("X-Express-Key", ""))
        timestamp, nonce = headers.get("X-Express-Timestamp", ""), headers.get("X-Express-Nonce", "")
        signed = "\n".join([request.method, request.path, timestamp, nonce, hashlib.sha256(body).hexdigest()])
        expected = (hmac.new(secret.encode(), signed.encode(), hashlib.sha256).hexdigest()
                    if secret is not None else None)
        fresh = timestamp.isdigit() and abs(time.time() - int(timestamp)) <= CLOCK_SKEW_SECONDS
        if (expected is None or not fresh or not nonce or nonce in ledger.nonces
                or not hmac.compare_digest(expected, headers.get("X-Express-Signature", ""))):
            ledger.refused_signatures += 1
            return web.json_response({"code": 1001, "message": "invalid signature"}, status=401)
        ledger.nonces.add(nonce)
        return None

    async def order(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        ref = body.get("out_order_no") if isinstance(body, dict) else None
        self.fakes.called("express", key=ref, body=body)
        if (refusal := self.refusal(request, raw)) is not None:
            return refusal
        with self.fakes.in_flight(f"waybill:{ref}"):
            return await self._order(request, body, ref)

    async def _order(self, request: web.Request, body: dict, ref: str | None) -> web.Response:
        fakes = self.fakes
        order_no = body.get("order_no")
        if not ref or not order_no or not body.get("address"):
            return web.json_response({"code": 2000, "message": "out_order_no, order_no and address are required"})
        if (response := await fakes.fault(FAKE.name, request, order_no, body)) is not None:
            return response
        if fakes.known(FAKE.name, ref) is not None:
            return web.json_response({"code": 1002, "message": f"duplicate out_order_no {ref}"})
        waybill_no = f"EX{fakes.serial():010d}"
        fakes.did(FAKE, order_no, waybill_no, ref, first=True)      # its lookup finds the first
        fakes.ledger.waybills[order_no].append(waybill_no)
        if (redirect := fakes.after_work(FAKE.name, request)) is not None:
            return redirect
        return web.json_response({"code": 0, "message": "ok", "data": {"waybill_no": waybill_no}})

    async def lookup(self, request: web.Request) -> web.Response:
        ref = request.match_info["out_order_no"]
        self.fakes.called("express_lookup", key=ref)
        if (refusal := self.refusal(request, await request.read())) is not None:
            return refusal
        if (failure := self.fakes.lookup_fault(FAKE.name)) is not None:
            return failure
        waybill_no = self.fakes.ledger.answers[FAKE.name].get(ref)
        if waybill_no is None:
            return web.json_response({"code": 1004, "message": f"no order {ref}"})
        return web.json_response({"code": 0, "message": "ok", "data": {"waybill_no": waybill_no}})


KEY_ID, SECRET = next(iter(ACCOUNTS.items()))
FAKE = Fake("express", "waybill", lambda fakes: ExpressCourier(fakes).routes(), services=("express", "express_lookup"),
            settings={"KEY_ID": KEY_ID, "SECRET": SECRET})
