"""An express courier's API, of the kind most logistics providers offer: every request signed, every
answer in an envelope, and a repeated order reference refused as a duplicate (not answered with
the first waybill). Contract: ``refuses_duplicates``.

Requests (``EFFECTS__WAYBILL__PROVIDER=express``):

* ``POST /express/v1/orders`` ``{"out_order_no": <token>, "order_no", "address"}``: a waybill for a
  reference (the step's persisted token) the provider has not seen.
* ``GET /express/v1/orders/{out_order_no}``: the waybill issued for a reference.

It refuses a repeated reference for 72 hours (``keys_kept_for``); later, the same reference would
be a new order. A step whose first call is older than that is looked up first (its lookup reads the
courier's orders): found, it is the receipt; not found, the event goes to a person, never sent again.

Every request carries ``X-Express-Key`` (``EFFECTS__WAYBILL__KEY_ID``), ``X-Express-Timestamp``,
``X-Express-Nonce`` and ``X-Express-Signature``: HMAC-SHA256 (hex) under
``EFFECTS__WAYBILL__SECRET`` of ``method``, ``path``, ``timestamp``, ``nonce`` and the SHA-256
(hex) of the body, joined by newlines.

=====================  ==================================================
what happened          what it means
=====================  ==================================================
code 0                 done; the waybill number is the receipt
code 1002 (duplicate)  the reference was used before: its waybill is
                       looked up (inside the same call's time) and is the
                       receipt; not found yet: retry, same token
429 to the request    not done, "not yet": called again after its
                       Retry-After, same token, no retry used up (429 to
                       the lookup after a duplicate: retry, same token)
code 1003, 408, 5xx,   not done, or outcome unknown: retry, same token
timeout, reset, no
envelope
code 1001, 401, 403    the signature or the account was refused: the
                       deployment's settings are wrong. Refused at start-up
                       (the worker checks its credentials), and a call
                       that meets it fails for a person with the settings
                       to check, never retried in a loop
another code, other    a business refusal: failed for good
4xx
connection refused,    surely not sent: retry, same token
no connection within
the connect timeout
=====================  ==================================================
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import aiohttp
import orjson

from app.adapters.effects import call_timeout, rate_limited, transport_errors, waybill_number
from app.adapters.effects.provider import Provider, where
from app.adapters.effects.signing import CredentialsRefused, Envelope, HmacSigner, Reply, Verdict
from app.pipeline.errors import EffectRejected, EffectUnavailable, PipelineError, RateLimited
from app.pipeline.excerpts import excerpt
from app.pipeline.model import EffectJob
from app.pipeline.ports import Receipt
from app.pipeline.steps import ISSUE_WAYBILL, Contract
from app.settings.effects import ResolvedEffect

ORDERS = "/express/v1/orders"
ENVELOPE = Envelope(ok=(0,), unauthorised=(1001,), duplicate=(1002,), retry_later=(1003,), not_found=(1004,))
HEADERS = {"key_header": "X-Express-Key", "timestamp_header": "X-Express-Timestamp",
           "nonce_header": "X-Express-Nonce", "signature_header": "X-Express-Signature"}
RETRY_STATUS = {408, 429}


class ExpressClient:
    contract = Contract.REFUSES_DUPLICATES

    def __init__(self, session: aiohttp.ClientSession, *, base_url: str, signer: HmacSigner, timeout_seconds: float,
                 connect_timeout_seconds: float | None = None, effect: str = ISSUE_WAYBILL.name,
                 lookup_settle_seconds: float = 30.0) -> None:
        self.session = session
        # How long after a call in doubt its lookup is asked (past the key horizon: asked before any call).
        self.lookup_settle_seconds = lookup_settle_seconds
        self.base = base_url.rstrip("/")
        self.signer = signer
        self.total = timeout_seconds
        self.timeout = call_timeout(timeout_seconds, connect_timeout_seconds or timeout_seconds / 2)
        self.effect = effect

    async def call(self, job: EffectJob) -> Receipt:
        at = where(job)
        with transport_errors(at, self.timeout):
            # The send and, after a refused duplicate, the lookup share the call's time.
            async with asyncio.timeout(self.total):
                body = orjson.dumps({"out_order_no": job.token, **job.request})
                status, raw, reply = await self._ask("POST", ORDERS, body, at)
                if reply.verdict is Verdict.OK:
                    return Receipt(reference=_waybill_no(at, reply))
                if reply.verdict is Verdict.DUPLICATE:
                    found = await self._find(job.token, at)
                    if found is None:
                        raise EffectUnavailable(f"{at}: refused as a duplicate, but no waybill is found under its "
                                                "reference yet")
                    return found
                raise self._error(at, status, raw, reply)

    async def lookup(self, job: EffectJob) -> Receipt | None:
        """The waybill issued for ``job``'s token, None if the courier has none: asked before a call
        whose reference the courier may have forgotten (its first call is past ``keys_kept_for``)."""
        at = f"{where(job)}: lookup"
        with transport_errors(at, self.timeout):
            async with asyncio.timeout(self.total):
                status, raw, reply = await self._ask("GET", f"{ORDERS}/{job.token}", b"", at)
        if reply.verdict is Verdict.OK:
            return Receipt(reference=_waybill_no(at, reply))
        if reply.verdict is Verdict.NOT_FOUND:
            return None
        raise self._error(at, status, raw, reply)

    async def _find(self, token: str, at: str) -> Receipt | None:
        try:
            status, raw, reply = await self._ask("GET", f"{ORDERS}/{token}", b"", f"{at}: lookup")
        except RateLimited as exc:
            # Only the lookup was refused: the request before it reached the provider (a duplicate).
            raise EffectUnavailable(f"{exc}; the request was refused as a duplicate before") from None
        if reply.verdict is Verdict.OK:
            return Receipt(reference=_waybill_no(at, reply))
        if reply.verdict is Verdict.NOT_FOUND:
            return None
        raise self._error(f"{at}: lookup", status, raw, reply)

    async def _ask(self, method: str, path: str, body: bytes, at: str) -> tuple[int, bytes, Reply]:
        headers = {**self.signer.headers(method, path, body), "Content-Type": "application/json"}
        async with self.session.request(method, f"{self.base}{path}", data=body or None, headers=headers,
                                        timeout=self.timeout, allow_redirects=False) as resp:
            raw = await resp.read()
            if resp.status == 429:
                raise rate_limited(at, resp.headers)
            reply = ENVELOPE.read(raw)
            if reply is None:
                if resp.status in (401, 403):
                    return resp.status, raw, Reply(resp.status, "", None, Verdict.UNAUTHORISED)
                if 400 <= resp.status < 500 and resp.status not in RETRY_STATUS:
                    raise EffectRejected(f"{at}: refused with {resp.status}: {excerpt(raw)}")
                raise EffectUnavailable(f"{at}: answered {resp.status} without the provider's envelope")
            if resp.status >= 500 or resp.status in RETRY_STATUS:
                return resp.status, raw, Reply(reply.code, reply.message, None, Verdict.RETRY_LATER)
            if resp.status in (401, 403):
                return resp.status, raw, Reply(reply.code, reply.message, None, Verdict.UNAUTHORISED)
            return resp.status, raw, reply

    def _error(self, at: str, status: int, raw: bytes, reply: Reply) -> PipelineError:
        said = f"code {reply.code}: {reply.message}" if reply.message else f"code {reply.code}"
        if reply.verdict is Verdict.RETRY_LATER:
            return EffectUnavailable(f"{at}: answered {status}, {said}; retry later")
        if reply.verdict is Verdict.UNAUTHORISED:
            return EffectRejected(
                f"{at}: refused with {status}, {said}: the provider refused this deployment's signature; check "
                f"EFFECTS__{self.effect.upper()}__KEY_ID and EFFECTS__{self.effect.upper()}__SECRET, then retry "
                "these records from the console")
        return EffectRejected(f"{at}: refused with {status}, {said}: {excerpt(raw)}")

    async def check_credentials(self) -> None:
        """Raise :class:`CredentialsRefused` if the provider refuses this deployment's signature (a
        lookup of a reference nobody used: an accepted signature answers "not found"). Any other
        trouble (the provider down) is not the settings' fault and raises nothing here."""
        try:
            async with asyncio.timeout(self.total):
                status, raw, reply = await self._ask("GET", f"{ORDERS}/credentials-check", b"", "credentials check")
        except (PipelineError, TimeoutError, aiohttp.ClientError):
            return
        if reply.verdict is Verdict.UNAUTHORISED:
            raise CredentialsRefused(
                f"the provider of {self.effect} at {self.base} refused this deployment's signature (answered "
                f"{status}, code {reply.code}: {reply.message or excerpt(raw)}): check "
                f"EFFECTS__{self.effect.upper()}__KEY_ID and EFFECTS__{self.effect.upper()}__SECRET")


def _waybill_no(at: str, reply: Reply) -> str:
    data: Any = reply.data
    return waybill_number(at, f"code {reply.code}", data.get("waybill_no") if isinstance(data, dict) else None)


def build(session: aiohttp.ClientSession, settings: ResolvedEffect) -> ExpressClient:
    signer = HmacSigner.from_settings(settings.name, settings.key_id, settings.secret, **HEADERS)
    return ExpressClient(session, base_url=settings.url, signer=signer, timeout_seconds=settings.timeout_seconds,
                         connect_timeout_seconds=settings.connect_timeout_seconds, effect=settings.name,
                         lookup_settle_seconds=settings.lookup_settle_seconds)


# It refuses a repeated reference for 72 hours; its lookup by reference reads its orders, which it keeps.
PROVIDER = Provider("express", ISSUE_WAYBILL, Contract.REFUSES_DUPLICATES, build,
                    token_paths=(f"{ORDERS}/{{out_order_no}}",), keys_kept_for=timedelta(hours=72))
