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

It lists what it issued and cancels a waybill (its ``listing``, for reconciliation):
``GET /v1/waybills?from=&to=&limit=&after=`` (epoch seconds, a page at a time, ``next`` the
``after`` of the next page), ``GET /v1/waybills?order_no=`` (every waybill of one order, whenever
issued) and ``POST /v1/waybills/{waybill_no}/cancel`` with an ``Idempotency-Key`` (a cancel
repeated answers as the first did; 404: no such waybill). The cancel's answer names the waybill
it cancelled: :class:`Cancelled` carries that name, for the caller to check.

It keeps a key 24 hours (``keys_kept_for``); a key older than that is new to it again. A step whose
first call may have reached it longer ago than that is not called again: it has no lookup by key, so
the event goes to a person (``key_horizon_passed``) with the token to look for.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import aiohttp
import orjson

from app.adapters.effects import call_timeout, rate_limited, transport_errors, waybill_number
from app.adapters.effects.provider import CANCELLED, Cancelled, Issued, Provider, where
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


class WaybillListing:
    """The logistics API's own records: what it issued over a time range, and a cancel."""

    def __init__(self, session: aiohttp.ClientSession, *, base_url: str, timeout_seconds: float,
                 connect_timeout_seconds: float | None = None) -> None:
        self.session = session
        self.url = f"{base_url.rstrip('/')}/v1/waybills"
        self.timeout = call_timeout(timeout_seconds, connect_timeout_seconds or timeout_seconds / 2)

    async def issued(self, since: datetime, until: datetime, *, page_size: int) -> AsyncIterator[list[Issued]]:
        query = {"from": f"{since.timestamp():.6f}", "to": f"{until.timestamp():.6f}", "limit": str(page_size)}
        async for page in self._pages(query):
            yield page

    async def of_order(self, order_no: str) -> list[Issued]:
        found: list[Issued] = []
        async for page in self._pages({"order_no": order_no}):
            found += [item for item in page if item.order_no == order_no]
        return found

    async def _pages(self, asked: dict[str, str]) -> AsyncIterator[list[Issued]]:
        after: str | None = None
        while True:
            query = {**asked, **({"after": after} if after else {})}
            doc = await self._get(query)
            page = [_issued(item) for item in doc.get("waybills") or ()]
            if page:
                yield page
            following = doc.get("next")
            if not page or not isinstance(following, str) or not following:
                return
            if following == after:         # a provider that does not move on would be read forever
                raise EffectUnavailable(f"waybill listing: the page after {after} points at itself")
            after = following

    async def _get(self, query: dict[str, str]) -> dict:
        at = "waybill listing"
        with transport_errors(at, self.timeout):
            async with self.session.get(self.url, params=query, timeout=self.timeout, allow_redirects=False) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise _refusal(at, resp.status, body)
        return _object(at, body)

    async def cancel(self, reference: str, key: str) -> Cancelled:
        at = f"waybill cancel of {reference}"
        with transport_errors(at, self.timeout):
            async with self.session.post(f"{self.url}/{quote(reference, safe='')}/cancel", timeout=self.timeout,
                                         headers={"Idempotency-Key": key}, allow_redirects=False) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise _refusal(at, resp.status, body)
        doc = _object(at, body)
        if doc.get("status") != CANCELLED:
            raise EffectUnavailable(f"{at}: 200 without status cancelled: {excerpt(body, 200)}")
        by, named = doc.get("idempotency_key"), doc.get("waybill_no")
        return Cancelled(named if isinstance(named, str) else repr(named)[:64], by if isinstance(by, str) else None,
                         _moment(doc.get("cancelled_at")))


def _object(at: str, body: bytes) -> dict:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        raise EffectUnavailable(f"{at}: 200 without a JSON object: {excerpt(body, 200)}")
    return doc


def _refusal(at: str, status: int, body: bytes) -> Exception:
    """A 4xx other than 408 and 429 will not change on its own; anything else may."""
    if 400 <= status < 500 and status not in (408, 429):
        return EffectRejected(f"{at}: refused with {status}: {excerpt(body)}")
    return EffectUnavailable(f"{at}: answered {status}")


def _issued(item: object) -> Issued:
    doc = item if isinstance(item, dict) else {}
    number, order, created = doc.get("waybill_no"), doc.get("order_no"), _moment(doc.get("created_at"))
    if not isinstance(number, str) or not isinstance(order, str) or created is None:
        raise EffectUnavailable(f"waybill listing: an entry without waybill_no, order_no or created_at: {item!r:.200}")
    key = doc.get("idempotency_key")
    return Issued(number, order, key if isinstance(key, str) else None, created, str(doc.get("status") or "issued"))


def _moment(value: object) -> datetime | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, UTC)
    return None


def build(session: aiohttp.ClientSession, settings: ResolvedEffect) -> WaybillClient:
    return WaybillClient(session, base_url=settings.url, timeout_seconds=settings.timeout_seconds,
                         connect_timeout_seconds=settings.connect_timeout_seconds)


def listing(session: aiohttp.ClientSession, settings: ResolvedEffect) -> WaybillListing:
    return WaybillListing(session, base_url=settings.url, timeout_seconds=settings.timeout_seconds,
                          connect_timeout_seconds=settings.connect_timeout_seconds)


# It answers a repeated Idempotency-Key with the first waybill for 24 hours (as Stripe does its keys);
# past that, a call in doubt goes to a person: it has no lookup by key (its listing, by time range, is
# reconciliation's: paging the account's whole traffic since the first call is no answer within a call).
PROVIDER = Provider("waybill", ISSUE_WAYBILL, Contract.REPLAYS, build, listing=listing,
                    keys_kept_for=timedelta(hours=24))
