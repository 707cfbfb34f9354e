"""The SMS gateway: ``POST /v1/sms`` without an idempotency key: every accepted call is
one more message. The call carries the step's persisted token as ``client_ref``; a
gateway that offers the lookup ``GET /v1/sms/{client_ref}`` (200: accepted, with the
message; 404: never accepted) lets a call whose outcome is unknown be verified instead
of given up on (``EFFECTS__SMS__LOOKUP``, alias ``SMS_LOOKUP``). Contract: ``lookup``, or ``none``
when the deployed gateway has no lookup.

=====================  ==================================================
what happened          what it means
=====================  ==================================================
2xx                    done; the message id is the receipt
4xx                    surely not sent: retry
3xx, 5xx, timeout,     it may have been sent. With the lookup: retry,
reset                  which asks the gateway first (200: done, 404: send
                       again with the same client_ref). Without it:
                       failed, unknown_outcome_non_idempotent (a person
                       reconciles)
connection refused,    surely not sent: retry
no connection within
the connect timeout
=====================  ==================================================

Only the request itself can be "maybe sent": the wait for a connection (a free one of the
pool, or a new one) has a limit of its own (``EFFECT_CONNECT_TIMEOUT_SECONDS``) inside the
call's, and running out of it means nothing was written.

The gateway answers its lookup for a client_ref for 7 days (``keys_kept_for``): an SMS whose first
call is older than that and that its lookup does not find goes to a person, never sent again.

Redirects are never followed: a 303 after the gateway accepted the message,
followed to a page that answers 4xx, would read as "not sent", and the SMS
would go out again.
"""

from __future__ import annotations

from datetime import timedelta

import aiohttp
import orjson

from app.adapters.effects import call_timeout, rate_limited, transport_errors
from app.adapters.effects.provider import Provider, where
from app.pipeline.errors import (
    EffectNotDelivered,
    EffectOutcomeUnknown,
    EffectUnavailable,
    PipelineError,
    UnknownOutcomeNonIdempotent,
)
from app.pipeline.excerpts import excerpt
from app.pipeline.model import EffectJob
from app.pipeline.ports import Receipt
from app.pipeline.steps import SEND_SMS, Contract
from app.settings.effects import ResolvedEffect


class SmsClient:
    def __init__(self, session: aiohttp.ClientSession, *, base_url: str, timeout_seconds: float,
                 connect_timeout_seconds: float | None = None, lookup: bool = True,
                 lookup_settle_seconds: float = 30.0) -> None:
        self.session = session
        self.url = f"{base_url.rstrip('/')}/v1/sms"
        self.timeout = call_timeout(timeout_seconds, connect_timeout_seconds or timeout_seconds / 2)
        self.lookup_enabled = lookup
        self.contract = Contract.LOOKUP if lookup else Contract.NONE
        self.lookup_settle_seconds = lookup_settle_seconds

    async def call(self, job: EffectJob) -> Receipt:
        at = where(job)
        with transport_errors(at, self.timeout, in_doubt=self._maybe_sent):
            async with self.session.post(self.url, json={**job.request, "client_ref": job.token},
                                         timeout=self.timeout, allow_redirects=False) as resp:
                body = await resp.read()
                if 200 <= resp.status < 300:
                    return Receipt(reference=_message_id(body))
                if resp.status == 429:
                    raise rate_limited(at, resp.headers)
                if 400 <= resp.status < 500:
                    raise EffectNotDelivered(f"{at}: refused with {resp.status}: {excerpt(body)}")
                error = self._maybe_sent(f"{at}: answered {resp.status}")
                error.provider_down = resp.status >= 500
                raise error

    def _maybe_sent(self, message: str) -> PipelineError:
        """A call that may have been sent: looked up once the settle has passed (with the lookup)."""
        message = f"{message}; it may have been sent"
        if self.lookup_enabled:
            return EffectOutcomeUnknown(message, wait_seconds=self.lookup_settle_seconds)
        return UnknownOutcomeNonIdempotent(message)

    async def lookup(self, job: EffectJob) -> Receipt | None:
        """Whether the gateway ever accepted ``job``'s token as a client_ref."""
        at = f"{where(job)}: lookup"
        try:
            async with self.session.get(f"{self.url}/{job.token}", timeout=self.timeout,
                                        allow_redirects=False) as resp:
                body = await resp.read()
                if resp.status == 200:
                    return Receipt(reference=_message_id(body))
                if resp.status == 404:
                    return None
                raise EffectUnavailable(f"{at}: answered {resp.status}; cannot tell yet")
        except PipelineError:
            raise
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise EffectUnavailable(f"{at}: {exc.__class__.__name__}; cannot tell yet") from None


def _message_id(body: bytes) -> str | None:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    value = doc.get("message_id") if isinstance(doc, dict) else None
    return value if isinstance(value, str) else None


def build(session: aiohttp.ClientSession, settings: ResolvedEffect) -> SmsClient:
    return SmsClient(session, base_url=settings.url, timeout_seconds=settings.timeout_seconds,
                     connect_timeout_seconds=settings.connect_timeout_seconds, lookup=settings.lookup,
                     lookup_settle_seconds=settings.lookup_settle_seconds)


# Its lookup answers for a client_ref for 7 days; past that, a "not found" proves nothing.
PROVIDER = Provider("sms", SEND_SMS, Contract.LOOKUP, build,
                    lookup_optional=True, token_paths=("/v1/sms/{client_ref}",), keys_kept_for=timedelta(days=7))
