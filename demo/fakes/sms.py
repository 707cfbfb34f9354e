"""The fake SMS gateway (the provider ``app/adapters/effects/sms.py`` calls), as its contract says:

* ``POST /v1/sms`` with JSON ``{"phone", "text", "client_ref"?}`` -> ``202 {"message_id"}``. No
  idempotency key: every accepted call is one more SMS, whatever its client_ref.
* ``GET /v1/sms/{client_ref}`` -> ``200 {"client_ref", "message_id", "status"}`` if a message with
  that client_ref was ever accepted, ``404`` if not.

The ledger files each message under the order its text names (``sms``), with ``at``, when it was
accepted.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from aiohttp import web

from demo.fakes.fake import Fake

if TYPE_CHECKING:
    from demo.fakes.server import FakeServices

ORDER_IN_TEXT = re.compile(r"ORD-\d{8}-[A-Za-z0-9]+")


class SmsGateway:
    def __init__(self, fakes: FakeServices) -> None:
        self.fakes = fakes

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/v1/sms", self.send), web.get("/v1/sms/{client_ref}", self.lookup)]

    async def send(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.fakes.called("sms", request, body=body)
        if not body.get("phone") or not body.get("text"):
            return web.json_response({"error": "phone and text are required"}, status=400)
        match = ORDER_IN_TEXT.search(body["text"])
        order_no = match.group(0) if match else "-"
        with self.fakes.in_flight(f"sms:{order_no}"):
            return await self._send(request, body, order_no)

    async def _send(self, request: web.Request, body: dict, order_no: str) -> web.Response:
        fakes = self.fakes
        if (response := await fakes.fault(FAKE.name, request, order_no, body)) is not None:
            return response
        message_id = f"SMS{fakes.serial():010d}"
        fakes.ledger.sms[order_no].append({"message_id": message_id, **body, "at": time.time()})
        # No key: the client_ref is what its lookup finds the message by, never a reason to refuse one.
        fakes.did(FAKE, order_no, message_id, body.get("client_ref") or None, idempotent=False)
        if (redirect := fakes.after_work(FAKE.name, request)) is not None:
            return redirect
        return web.json_response({"message_id": message_id}, status=202)

    async def lookup(self, request: web.Request) -> web.Response:
        ref = request.match_info["client_ref"]
        self.fakes.called("sms_lookup", client_ref=ref)
        if (failure := self.fakes.lookup_fault(FAKE.name)) is not None:
            return failure
        message_id = self.fakes.ledger.answers[FAKE.name].get(ref)
        if message_id is None:
            return web.json_response({"error": f"no message with client_ref {ref}"}, status=404)
        return web.json_response({"client_ref": ref, "message_id": message_id, "status": "accepted"})


FAKE = Fake("sms", "sms", lambda fakes: SmsGateway(fakes).routes(), services=("sms", "sms_lookup"))
