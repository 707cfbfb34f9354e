"""The external effects over HTTP (aiohttp): the logistics API and the SMS gateway.

How a call ends decides what may happen next, and the two services differ:

=====================  =====================================  ==========================================
what happened          logistics (honours Idempotency-Key)    SMS gateway (no idempotency key)
=====================  =====================================  ==========================================
2xx                    done, receipt written                  done
2xx, bad waybill_no    failed: effect_bad_receipt             -
3xx                    outcome unknown: retry, same token     outcome unknown: failed, reconcile by hand
409                    same key still in progress: retry,     surely not sent: retry
                       same token
4xx (not 408/409/429)  business refusal: failed for good      surely not sent: retry
408, 429               not done: retry, same token            surely not sent: retry
5xx                    outcome unknown: retry, same token     outcome unknown: failed, reconcile by hand
timeout / reset        outcome unknown: retry, same token     outcome unknown: failed, reconcile by hand
connection refused     not sent: retry                        surely not sent: retry
=====================  =====================================  ==========================================

Redirects are never followed: a POST answered with a 303 to a page that then
answers 4xx would read as "refused", and an SMS the gateway did accept would
go out again. A 3xx is an answer whose outcome we do not know.

A waybill number is checked against the receipt table's column before T3: a
service that answers success with a number that is not a string, or longer
than the column, gets this one record failed with a clear reason instead of
making the whole batch's T3 fail.
"""

from __future__ import annotations

import asyncio

import aiohttp
import orjson

from app.metrics import EFFECT_CALLS
from app.pipeline.errors import (EffectBadReceipt, EffectNotDelivered, EffectRejected, EffectUnavailable,
                                 PipelineError, UnknownOutcomeNonIdempotent)
from app.pipeline.plan import EffectJob
from app.pipeline.ports import Receipt
from app.pipeline.steps import Effect
from tables.schema import t_waybill_receipt

RETRY_LATER = {408, 409, 429}      # 409: the same idempotency key is still being worked on
WAYBILL_NO_MAX = t_waybill_receipt.c.waybill_no.type.length


class HttpEffects:
    def __init__(self, session: aiohttp.ClientSession, *, logistics_url: str, sms_url: str,
                 timeout_seconds: float) -> None:
        self.session = session
        self.waybills_url = f"{logistics_url.rstrip('/')}/v1/waybills"
        self.sms_url = f"{sms_url.rstrip('/')}/v1/sms"
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds)

    async def call(self, job: EffectJob) -> Receipt:
        try:
            if job.effect is Effect.WAYBILL:
                receipt = await self._issue_waybill(job)
            else:
                receipt = await self._send_sms(job)
        except PipelineError as exc:
            EFFECT_CALLS.labels(job.effect.value, exc.reason).inc()
            raise
        EFFECT_CALLS.labels(job.effect.value, "ok").inc()
        return receipt

    async def _issue_waybill(self, job: EffectJob) -> Receipt:
        where = f"logistics for {job.order_no}"
        try:
            async with self.session.post(self.waybills_url, json=job.request, timeout=self.timeout,
                                         headers={"Idempotency-Key": job.token}, allow_redirects=False) as resp:
                body = await resp.read()
                if resp.status in (200, 201):
                    return Receipt("waybill_issued", _waybill_no(where, resp.status, body))
                if 400 <= resp.status < 500 and resp.status not in RETRY_LATER:
                    raise EffectRejected(f"{where}: refused with {resp.status}: {body[:300]!r}")
                raise EffectUnavailable(f"{where}: answered {resp.status}")
        except PipelineError:
            raise
        except asyncio.TimeoutError:
            raise EffectUnavailable(f"{where}: no answer within {self.timeout.total}s") from None
        except aiohttp.ClientError as exc:
            raise EffectUnavailable(f"{where}: {exc.__class__.__name__}: {exc}") from None

    async def _send_sms(self, job: EffectJob) -> Receipt:
        where = f"SMS for {job.order_no}"
        try:
            async with self.session.post(self.sms_url, json=job.request, timeout=self.timeout,
                                         allow_redirects=False) as resp:
                body = await resp.read()
                if 200 <= resp.status < 300:
                    return Receipt("sms_accepted")
                if 400 <= resp.status < 500:
                    raise EffectNotDelivered(f"{where}: refused with {resp.status}: {body[:300]!r}")
                raise UnknownOutcomeNonIdempotent(f"{where}: answered {resp.status}; it may have been sent")
        except PipelineError:
            raise
        except aiohttp.ClientConnectorError as exc:
            # The connection never opened: nothing was sent.
            raise EffectNotDelivered(f"{where}: {exc}") from None
        except asyncio.TimeoutError:
            raise UnknownOutcomeNonIdempotent(
                f"{where}: no answer within {self.timeout.total}s; it may have been sent") from None
        except aiohttp.ClientError as exc:
            raise UnknownOutcomeNonIdempotent(
                f"{where}: {exc.__class__.__name__} after the request; it may have been sent") from None


def _waybill_no(where: str, status: int, body: bytes) -> str:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    value = doc.get("waybill_no") if isinstance(doc, dict) else None
    if value is None or value == "":
        # Perhaps a glitch: the same token asks again and gets the same waybill.
        raise EffectUnavailable(f"{where}: {status} without a waybill_no: {body[:200]!r}")
    if not isinstance(value, str):
        raise EffectBadReceipt(f"{where}: {status} with a waybill_no that is not a string: {value!r:.100}")
    if len(value) > WAYBILL_NO_MAX:
        raise EffectBadReceipt(f"{where}: {status} with a waybill_no of {len(value)} characters, longer than "
                               f"the {WAYBILL_NO_MAX} the receipt holds: {value[:80]!r}...")
    return value
