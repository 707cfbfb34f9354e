"""The SMS gateway: ``POST /v1/sms``, without an idempotency key: every accepted call is
one more message, so a call whose outcome is unknown is never repeated.

=====================  ==================================================
what happened          what it means
=====================  ==================================================
2xx                    done; the message id is the receipt
4xx                    surely not sent: retry
3xx, 5xx, timeout,     it may have been sent: failed,
reset                  unknown_outcome_non_idempotent (reconcile by hand)
connection refused     surely not sent: retry
=====================  ==================================================

Redirects are never followed: a 303 after the gateway accepted the message,
followed to a page that answers 4xx, would read as "not sent", and the SMS
would go out again.
"""

from __future__ import annotations

import asyncio

import aiohttp
import orjson

from app.pipeline.errors import EffectNotDelivered, PipelineError, UnknownOutcomeNonIdempotent
from app.pipeline.model import EffectJob
from app.pipeline.ports import Receipt


class SmsClient:
    def __init__(self, session: aiohttp.ClientSession, *, base_url: str, timeout_seconds: float) -> None:
        self.session = session
        self.url = f"{base_url.rstrip('/')}/v1/sms"
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds)

    async def call(self, job: EffectJob) -> Receipt:
        where = f"SMS for {job.order_no}"
        try:
            async with self.session.post(self.url, json=job.request, timeout=self.timeout,
                                         allow_redirects=False) as resp:
                body = await resp.read()
                if 200 <= resp.status < 300:
                    return Receipt(reference=_message_id(body))
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


def _message_id(body: bytes) -> str | None:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    value = doc.get("message_id") if isinstance(doc, dict) else None
    return value if isinstance(value, str) else None
