"""The logistics API: ``POST /v1/waybills`` with ``Idempotency-Key``; a key seen before
answers with the same waybill. Contract: ``replays``. The waybill's default provider
(``EFFECTS__WAYBILL__PROVIDER=waybill``; its URL: ``EFFECTS__WAYBILL__URL``, alias ``LOGISTICS_URL``).

=====================  ==================================================
what happened          what it means
=====================  ==================================================
2xx                    done; the waybill number is the receipt
2xx, bad waybill_no    failed: effect_bad_receipt (this record only)
3xx                    outcome unknown: retry, same token
409                    the same key is still in progress: retry, same token
429                    not done, "not yet": called again after its
                       Retry-After, same token, no retry used up
other 4xx (not 408,    a business refusal: failed for good
429)
408, 5xx,              not done, or outcome unknown: retry, same token
timeout, reset
connection refused,    surely not sent: retry, same token
no connection within
the connect timeout
=====================  ==================================================

Redirects are never followed: an answer we did not ask for is no answer. A
waybill number is checked against the receipt table's column before T3: a
service that answers success with a number that is not a string, or longer than
the column, gets this one record failed with a clear reason instead of making
the whole batch's T3 fail.
"""

from __future__ import annotations

import aiohttp
import orjson

from app.adapters.effects import call_timeout, rate_limited, transport_errors, waybill_number
from app.adapters.effects.provider import Provider, where
from app.pipeline.errors import EffectRejected, EffectUnavailable
from app.pipeline.excerpts import excerpt
from app.pipeline.model import EffectJob
from app.pipeline.ports import Receipt
from app.pipeline.steps import ISSUE_WAYBILL, Contract
from app.settings.effects import ResolvedEffect

RETRY_LATER = {408, 409, 429}


class WaybillClient:
    contract = Contract.REPLAYS

    def __init__(self, session: aiohttp.ClientSession, *, base_url: str, timeout_seconds: float,
                 connect_timeout_seconds: float | None = None) -> None:
        self.session = session
        self.url = f"{base_url.rstrip('/')}/v1/waybills"
        self.timeout = call_timeout(timeout_seconds, connect_timeout_seconds or timeout_seconds / 2)

    async def call(self, job: EffectJob) -> Receipt:
        at = where(job)
        with transport_errors(at, self.timeout):
            async with self.session.post(self.url, json=job.request, timeout=self.timeout,
                                         headers={"Idempotency-Key": job.token}, allow_redirects=False) as resp:
                body = await resp.read()
                if resp.status in (200, 201):
                    return Receipt(reference=_waybill_no(at, resp.status, body))
                if resp.status == 429:
                    raise rate_limited(at, resp.headers)
                if 400 <= resp.status < 500 and resp.status not in RETRY_LATER:
                    raise EffectRejected(f"{at}: refused with {resp.status}: {excerpt(body)}")
                raise EffectUnavailable(f"{at}: answered {resp.status}")


def _waybill_no(at: str, status: int, body: bytes) -> str:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    value = doc.get("waybill_no") if isinstance(doc, dict) else None
    return waybill_number(at, str(status), value, answer=excerpt(body, 200))


def build(session: aiohttp.ClientSession, settings: ResolvedEffect) -> WaybillClient:
    return WaybillClient(session, base_url=settings.url, timeout_seconds=settings.timeout_seconds,
                         connect_timeout_seconds=settings.connect_timeout_seconds)


PROVIDER = Provider("waybill", ISSUE_WAYBILL, Contract.REPLAYS, build, services=("waybill",))
