"""A fake logistics API and SMS gateway that keep the real contracts, for
``make run``, the tests and the benchmark.

Contracts:

* ``POST /v1/waybills`` with header ``Idempotency-Key`` and JSON
  ``{"order_no", "address"}`` -> ``201 {"waybill_no"}`` for a new key,
  ``200`` with the *same* waybill for a key seen before; ``400`` without a key.
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
  once). The faults below do not touch them.
* ``POST /v1/sms`` with JSON ``{"phone", "text", "client_ref"?}`` -> ``202 {"message_id"}``.
  No idempotency key: every accepted call is one more SMS, whatever its client_ref.
* ``GET /v1/sms/{client_ref}`` -> ``200 {"client_ref", "message_id", "status"}`` if a message
  with that client_ref was ever accepted, ``404`` if not.
* The express courier (``app/adapters/effects/express.py``): every request signed (HMAC-SHA256,
  checked here on its own: the account :data:`EXPRESS_ACCOUNTS`, a timestamp within 5 minutes, a
  nonce never seen before), every answer an envelope ``{"code", "message", "data"}``.
  ``POST /express/v1/orders`` ``{"out_order_no", "order_no", "address"}`` -> code 0 with
  ``data.waybill_no`` for a new reference, code 1002 (duplicate) for one seen before;
  ``GET /express/v1/orders/{out_order_no}`` -> code 0 with the waybill, or code 1004 (not found).
  A bad signature answers 401 with code 1001. Its waybills count with the others (``waybills``).

Faults are injected per service through ``POST /__config`` (or ``--config``)::

    {"waybill": {"latency_ms": 5, "fail_next": 2, "fail_status": 503,
                 "timeout_next": 1, "reset_next": 1, "reject_orders": ["ORD-..."],
                 "fail_orders": ["ORD-..."], "ignore_idempotency_key": false,
                 "fail_rate": 0.02, "timeout_rate": 0.01, "reset_rate": 0.02, "seed": 7},
     "sms": {...}}

``reject_orders`` answer 422 (a business refusal) for those orders, every
time; ``fail_orders`` answer ``fail_status`` for them, every time;
``hang_orders`` hang ``timeout_ms`` for those orders, every time, and then do the work (a
slow call for one order while the others go on); ``held_orders`` hold calls for those orders
until the order leaves the set (a later ``POST /__config`` without it), then do the work (a gate a
test opens when it is ready, not after a time); ``echo_orders`` answer 422 repeating the
request back (its JSON, and the
``Idempotency-Key``), as UTF-8 without escapes and as a form-encoded trace, the
way a service that quotes what it refused does (personal data and tokens in a
message: what a viewer must not see).
``conflict_next`` answers 409 ("this idempotency key is still in progress")
without doing the work; ``redirect_next`` does the work, then answers
``303 See Other`` pointing at ``/__gone``, which answers 404;
``waybill_no_override`` (any JSON value) replaces the waybill number in the
answer, to play a service that breaks its own contract; ``cancel_answer_override`` does
the same to a cancel's answer (the cancel is done, the answer names another waybill).

``forget_keys_after_seconds`` (``waybill``, ``express``; 0: never) plays a provider that keeps an
idempotency key for a while only: a key (a reference) first taken longer ago than that is new to it
again, so a call with it issues a second waybill (the express courier no longer refuses it as a
duplicate). Its records stay: the listing and the express lookup still find the first waybill. The
ledger's ``keys`` holds when each key was first taken, per service (``{"waybill": {key: at}}``).

``fail_next``/``timeout_next``/``reset_next`` count down per call. A *timeout*
sleeps ``timeout_ms`` before answering (and then does the work, for a caller
that may have given up); a *reset* does the work (issues the waybill, sends
the SMS) and then drops the connection without a response: the caller cannot
know it succeeded.

``fail_rate``/``timeout_rate``/``reset_rate`` (0 to 1) are the same faults at
random, each call drawing once per rate that is set, from a generator seeded
with ``seed`` (set ``seed`` again to start its sequence over). The draws are
reproducible; which call meets which draw is not, since calls race each other.
A countdown still in progress wins over its rate.

A provider's pace, per service: ``latency_median_ms`` and ``latency_sigma`` draw each call's
latency from a lognormal distribution (median 100, sigma 0.8: mean about 138 ms, p99 about
640 ms), added to ``latency_ms``; ``timeout_rate`` with ``timeout_ms`` makes a share of calls hang;
``calls_per_second`` answers ``429`` with ``Retry-After`` (whole seconds) to calls above that rate
(a bucket holding one second's calls); ``outage_seconds`` starts an outage now, for that long,
in which every call hangs ``timeout_ms`` and then answers 503 without doing anything. The ledger
counts the 429s (``rate_limited``) and the calls an outage met (``outage_calls``) per service.

``GET /__ledger`` returns every raw call, the unique waybills per order, every waybill the
logistics API issued with its key, time and status (``issued``), the waybills cancelled (``cancels``), the
SMS per order (each with ``at``, when it was accepted: the epoch seconds), and the highest number of calls that were in flight at once for
one idempotency key (or, for SMS, one order); ``POST /__reset`` clears ledger
and faults.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import itertools
import json
import math
import random
import re
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import urlencode

from aiohttp import web

ORDER_IN_TEXT = re.compile(r"ORD-\d{8}-[A-Za-z0-9]+")
# The express fake's accounts: key id -> secret (the provider module's fake settings sign with these).
EXPRESS_ACCOUNTS = {"demo-merchant": "demo-express-secret-not-for-production"}
EXPRESS_CLOCK_SKEW_SECONDS = 300
PACE = ("latency_median_ms", "latency_sigma", "calls_per_second", "outage_seconds", "forget_keys_after_seconds")
LIST_LIMIT = 1000             # the most waybills one page of the logistics API's listing holds
LISTED = ("waybill_no", "order_no", "idempotency_key", "created_at", "status")


def worker_urls(url: str) -> dict[str, str]:
    """The settings that send every effect of a worker to the fakes at ``url``, whichever of its
    providers the worker picks: read from the providers' registry, so that every test, benchmark and
    chaos run that starts a worker on the fakes (``harness.fakes``) sends a new effect there too."""
    from app.adapters.effects.registry import fake_settings  # the fakes serve without the app's adapters
    return fake_settings(url)


@dataclass
class Faults:
    latency_ms: float = 0.0
    fail_next: int = 0
    fail_status: int = 503
    timeout_next: int = 0
    timeout_ms: float = 60_000.0
    reset_next: int = 0
    reject_orders: set[str] = field(default_factory=set)
    fail_orders: set[str] = field(default_factory=set)
    echo_orders: set[str] = field(default_factory=set)
    hang_orders: set[str] = field(default_factory=set)
    held_orders: set[str] = field(default_factory=set)
    ignore_idempotency_key: bool = False
    conflict_next: int = 0
    redirect_next: int = 0
    waybill_no_override: object = None
    cancel_answer_override: object = None
    lookup_fail_next: int = 0
    forget_keys_after_seconds: float = 0.0
    fail_rate: float = 0.0
    timeout_rate: float = 0.0
    reset_rate: float = 0.0
    seed: int | None = None
    # A provider's pace (see the module's docstring).
    latency_median_ms: float = 0.0
    latency_sigma: float = 0.0
    calls_per_second: float = 0.0
    outage_seconds: float = 0.0
    _rng: random.Random = field(default_factory=random.Random, repr=False)
    _outage_until: float = field(default=0.0, repr=False)
    _tokens: float = field(default=0.0, repr=False)
    _tokens_at: float = field(default=0.0, repr=False)

    def update(self, changes: dict) -> None:
        for name, value in changes.items():
            if name.startswith("_") or not hasattr(self, name):
                raise ValueError(f"unknown fault setting {name!r}")
            if name.endswith("_rate") and not 0 <= float(value) <= 1:
                raise ValueError(f"{name} must be between 0 and 1, got {value!r}")
            if name in PACE and float(value) < 0:
                raise ValueError(f"{name} must not be negative, got {value!r}")
            setattr(self, name, set(value) if name.endswith("_orders") else value)
            if name == "seed":
                self._rng.seed(value)
            elif name == "outage_seconds":
                self._outage_until = time.monotonic() + float(value)
            elif name == "calls_per_second":
                self._tokens, self._tokens_at = float(value), time.monotonic()

    def forgotten(self, taken_at: float | None) -> bool:
        """Whether a key taken at ``taken_at`` (None: never) is new to the provider again."""
        forget = self.forget_keys_after_seconds
        return taken_at is not None and forget > 0 and time.time() - taken_at > forget

    def latency(self) -> float:
        """This call's latency in seconds: ``latency_ms``, plus a lognormal draw when a median is set."""
        ms = self.latency_ms
        if self.latency_median_ms:
            ms += self._rng.lognormvariate(math.log(self.latency_median_ms), self.latency_sigma)
        return ms / 1000

    def in_outage(self) -> bool:
        return time.monotonic() < self._outage_until

    def retry_after(self) -> int | None:
        """None when the call is within ``calls_per_second`` (a bucket of one second's calls,
        refilled at that rate); else the whole seconds after which one is, for ``Retry-After``."""
        rate = self.calls_per_second
        if not rate:
            return None
        now = time.monotonic()
        self._tokens = min(float(rate), self._tokens + (now - self._tokens_at) * rate)
        self._tokens_at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return None
        return max(1, math.ceil((1 - self._tokens) / rate))

    def take(self, countdown: str, rate: str) -> bool:
        """Whether this call meets the fault: its countdown first, else a draw at its rate."""
        if getattr(self, countdown) > 0:
            setattr(self, countdown, getattr(self, countdown) - 1)
            return True
        chance = getattr(self, rate)
        return chance > 0 and self._rng.random() < chance


@dataclass
class Ledger:
    calls: list[dict] = field(default_factory=list)
    waybill_by_key: dict[str, str] = field(default_factory=dict)
    waybills: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    # The logistics API's own records, by waybill number, in the order issued: what its listing answers.
    issued: dict[str, dict] = field(default_factory=dict)
    cancels: list[dict] = field(default_factory=list)         # each waybill cancelled, once
    cancel_calls: list[dict] = field(default_factory=list)    # each cancel asked
    listings: list[dict] = field(default_factory=list)        # each listing asked
    sms: dict[str, list[dict]] = field(default_factory=lambda: defaultdict(list))
    sms_by_ref: dict[str, str] = field(default_factory=dict)
    express_by_ref: dict[str, str] = field(default_factory=dict)
    # When each key was last taken as new (what a provider that forgets keys counts from), and first taken.
    taken_at: dict[tuple[str, str], float] = field(default_factory=dict)
    keys: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    nonces: set[str] = field(default_factory=set)
    refused_signatures: int = 0
    in_flight: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    peak_in_flight: int = 0
    rate_limited: dict[str, int] = field(default_factory=lambda: defaultdict(int))    # 429s, by service
    outage_calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))    # calls met by an outage

    def as_json(self) -> dict:
        return {"calls": self.calls, "waybills": self.waybills, "issued": list(self.issued.values()),
                "cancels": self.cancels, "cancel_calls": self.cancel_calls, "listings": self.listings, "sms": self.sms,
                "peak_in_flight_per_key": self.peak_in_flight, "refused_signatures": self.refused_signatures,
                "rate_limited": self.rate_limited, "outage_calls": self.outage_calls, "keys": self.keys,
                "counts": {"calls": len(self.calls),
                           "waybills": sum(len(v) for v in self.waybills.values()),
                           "sms": sum(len(v) for v in self.sms.values())}}


class FakeServices:
    def __init__(self) -> None:
        self.faults = {"waybill": Faults(), "sms": Faults(), "express": Faults()}
        self.ledger = Ledger()
        self._serial = itertools.count(1)

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes([
            web.post("/v1/waybills", self.waybill),
            web.get("/v1/waybills", self.waybill_list),
            web.post("/v1/waybills/{waybill_no}/cancel", self.waybill_cancel),
            web.post("/v1/sms", self.sms),
            web.get("/v1/sms/{client_ref}", self.sms_lookup),
            web.post("/express/v1/orders", self.express),
            web.get("/express/v1/orders/{out_order_no}", self.express_lookup),
            web.get("/__ledger", self.get_ledger),
            web.post("/__config", self.set_config),
            web.post("/__reset", self.reset),
            web.get("/__health", self.health),
            web.route("*", "/__gone", self.gone),
        ])
        return app

    async def _fault(self, service: str, request: web.Request, order_no: str | None,
                     asked: dict | None = None) -> web.Response | None:
        """Apply injected faults; returns a response to send instead of doing the work. ``asked``
        is the request as ``echo_orders`` repeats it."""
        faults = self.faults[service]
        if faults.in_outage():
            # Down: the call hangs, then gets nothing done.
            self.ledger.outage_calls[service] += 1
            await asyncio.sleep(faults.timeout_ms / 1000)
            return web.json_response({"error": "provider down"}, status=503)
        if (wait := faults.retry_after()) is not None:
            self.ledger.rate_limited[service] += 1
            return web.json_response({"error": "too many requests"}, status=429, headers={"Retry-After": str(wait)})
        if latency := faults.latency():
            await asyncio.sleep(latency)
        if faults.take("timeout_next", "timeout_rate") or order_no in faults.hang_orders:
            await asyncio.sleep(faults.timeout_ms / 1000)
        while order_no is not None and order_no in faults.held_orders:
            await asyncio.sleep(0.05)
        if faults.take("fail_next", "fail_rate"):
            return web.json_response({"error": "injected failure"}, status=faults.fail_status)
        if faults.conflict_next > 0:
            faults.conflict_next -= 1
            return web.json_response({"error": "a request with this key is in progress"}, status=409)
        if order_no in faults.reject_orders:
            return web.json_response({"error": f"order {order_no} rejected"}, status=422)
        if order_no in faults.fail_orders:
            return web.json_response({"error": "injected failure"}, status=faults.fail_status)
        if order_no in faults.echo_orders:
            echo = {"error": "undeliverable", "request": asked, "trace": urlencode(asked or {})}
            return web.Response(body=json.dumps(echo, ensure_ascii=False).encode(), status=422,
                                content_type="application/json")
        return None

    def _maybe_reset(self, service: str, request: web.Request) -> None:
        faults = self.faults[service]
        if request.transport is not None and faults.take("reset_next", "reset_rate"):
            # The work is done; the caller never hears about it.
            request.transport.abort()

    def _maybe_redirect(self, service: str) -> web.Response | None:
        faults = self.faults[service]
        if faults.redirect_next > 0:
            faults.redirect_next -= 1
            # The work is done; the answer points somewhere that knows nothing of it.
            return web.Response(status=303, headers={"Location": "/__gone"})
        return None

    def _known(self, service: str, key: str, known: dict) -> bool:
        """Whether the provider still answers ``key`` as a repeat: it has it, and has not forgotten it."""
        faults = self.faults[service]
        return (key in known and not faults.ignore_idempotency_key
                and not faults.forgotten(self.ledger.taken_at.get((service, key))))

    def _taken(self, service: str, key: str) -> None:
        now = time.time()
        self.ledger.taken_at[service, key] = now
        self.ledger.keys[service].setdefault(key, now)

    @contextmanager
    def _in_flight(self, key: str):
        ledger = self.ledger
        ledger.in_flight[key] += 1
        ledger.peak_in_flight = max(ledger.peak_in_flight, ledger.in_flight[key])
        try:
            yield
        finally:
            ledger.in_flight[key] -= 1

    async def waybill(self, request: web.Request) -> web.Response:
        body = await request.json()
        key = request.headers.get("Idempotency-Key")
        with self._in_flight(f"waybill:{key}"):
            return await self._waybill(request, body, key)

    async def _waybill(self, request: web.Request, body: dict, key: str | None) -> web.Response:
        order_no = body.get("order_no")
        self.ledger.calls.append({"service": "waybill", "key": key, "body": body, "at": time.time(),
                                  **_trace_headers(request)})
        if not key:
            return web.json_response({"error": "Idempotency-Key header is required"}, status=400)
        if not order_no or not body.get("address"):
            return web.json_response({"error": "order_no and address are required"}, status=400)
        asked = {"idempotency_key": key, **body}
        if (response := await self._fault("waybill", request, order_no, asked)) is not None:
            return response
        faults = self.faults["waybill"]
        if self._known("waybill", key, self.ledger.waybill_by_key):
            status, waybill_no = 200, self.ledger.waybill_by_key[key]
        else:
            status, waybill_no = 201, f"WB{next(self._serial):010d}"
            self.ledger.waybill_by_key[key] = waybill_no
            self._taken("waybill", key)
            self.ledger.waybills[order_no].append(waybill_no)
            self.ledger.issued[waybill_no] = {"waybill_no": waybill_no, "order_no": order_no, "idempotency_key": key,
                                              "created_at": time.time(), "status": "issued"}
        self._maybe_reset("waybill", request)
        if (redirect := self._maybe_redirect("waybill")) is not None:
            return redirect
        if faults.waybill_no_override is not None:
            waybill_no = faults.waybill_no_override
        return web.json_response({"waybill_no": waybill_no}, status=status)

    async def waybill_list(self, request: web.Request) -> web.Response:
        query = request.query
        self.ledger.listings.append({"query": dict(query), "at": time.time()})
        order = query.get("order_no")
        try:
            since = float(query["from"]) if order is None else -math.inf
            until = float(query["to"]) if order is None else math.inf
            limit = int(query.get("limit") or LIST_LIMIT)
        except (KeyError, ValueError):
            return web.json_response({"error": "from and to (epoch seconds), or order_no, are required; limit is a "
                                               "number"}, status=400)
        after = self.ledger.issued.get(query.get("after", ""))
        if not ((order is not None or (math.isfinite(since) and math.isfinite(until))) and since <= until
                and 1 <= limit <= LIST_LIMIT):
            return web.json_response({"error": f"from <= to, and limit 1-{LIST_LIMIT}"}, status=400)
        # Issued in order (their numbers and times both grow), so a page goes on after its last.
        found = [w for w in self.ledger.issued.values() if since <= w["created_at"] < until
                 and (order is None or w["order_no"] == order)
                 and (after is None or (w["created_at"], w["waybill_no"]) > (after["created_at"], after["waybill_no"]))]
        page = [{name: w[name] for name in LISTED} for w in found[:limit]]
        return web.json_response({"waybills": page, "next": page[-1]["waybill_no"] if len(found) > limit else None})

    async def waybill_cancel(self, request: web.Request) -> web.Response:
        number, key = request.match_info["waybill_no"], request.headers.get("Idempotency-Key")
        self.ledger.cancel_calls.append({"key": key, "waybill_no": number, "at": time.time()})
        if not key:
            return web.json_response({"error": "Idempotency-Key header is required"}, status=400)
        waybill = self.ledger.issued.get(number)
        if waybill is None:
            return web.json_response({"error": f"no waybill {number}"}, status=404)
        if waybill["status"] != "cancelled":          # no await since the look: one cancel wins
            waybill.update(status="cancelled", cancelled_at=time.time(), cancel_key=key)
            self.ledger.cancels.append({"waybill_no": number, "key": key, "at": waybill["cancelled_at"]})
        named = self.faults["waybill"].cancel_answer_override
        return web.json_response({"waybill_no": number if named is None else named, "status": "cancelled",
                                  "cancelled_at": waybill["cancelled_at"], "idempotency_key": waybill["cancel_key"]})

    async def sms(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.ledger.calls.append({"service": "sms", "body": body, "at": time.time(), **_trace_headers(request)})
        if not body.get("phone") or not body.get("text"):
            return web.json_response({"error": "phone and text are required"}, status=400)
        match = ORDER_IN_TEXT.search(body["text"])
        order_no = match.group(0) if match else "-"
        with self._in_flight(f"sms:{order_no}"):
            return await self._sms(request, body, order_no)

    async def _sms(self, request: web.Request, body: dict, order_no: str) -> web.Response:
        if (response := await self._fault("sms", request, order_no, body)) is not None:
            return response
        message_id = f"SMS{next(self._serial):010d}"
        self.ledger.sms[order_no].append({"message_id": message_id, **body, "at": time.time()})
        if body.get("client_ref"):
            self.ledger.sms_by_ref[body["client_ref"]] = message_id
        self._maybe_reset("sms", request)
        if (redirect := self._maybe_redirect("sms")) is not None:
            return redirect
        return web.json_response({"message_id": message_id}, status=202)

    async def sms_lookup(self, request: web.Request) -> web.Response:
        ref = request.match_info["client_ref"]
        self.ledger.calls.append({"service": "sms_lookup", "client_ref": ref, "at": time.time()})
        if (failure := self._lookup_fault("sms")) is not None:
            return failure
        message_id = self.ledger.sms_by_ref.get(ref)
        if message_id is None:
            return web.json_response({"error": f"no message with client_ref {ref}"}, status=404)
        return web.json_response({"client_ref": ref, "message_id": message_id, "status": "accepted"})

    def _lookup_fault(self, service: str) -> web.Response | None:
        """A 503 while the service's ``lookup_fail_next`` counts down."""
        faults = self.faults[service]
        if faults.lookup_fail_next <= 0:
            return None
        faults.lookup_fail_next -= 1
        return web.json_response({"error": "injected failure"}, status=503)

    def _express_refusal(self, request: web.Request, body: bytes) -> web.Response | None:
        """401 with code 1001 unless the request is signed as the express API wants: its own check,
        written from the API's description, not with the client's code."""
        headers = request.headers
        secret = EXPRESS_ACCOUNTS.get(headers.get("X-Express-Key", ""))
        timestamp, nonce = headers.get("X-Express-Timestamp", ""), headers.get("X-Express-Nonce", "")
        signed = "\n".join([request.method, request.path, timestamp, nonce, hashlib.sha256(body).hexdigest()])
        expected = (hmac.new(secret.encode(), signed.encode(), hashlib.sha256).hexdigest()
                    if secret is not None else None)
        fresh = timestamp.isdigit() and abs(time.time() - int(timestamp)) <= EXPRESS_CLOCK_SKEW_SECONDS
        if (expected is None or not fresh or not nonce or nonce in self.ledger.nonces
                or not hmac.compare_digest(expected, headers.get("X-Express-Signature", ""))):
            self.ledger.refused_signatures += 1
            return web.json_response({"code": 1001, "message": "invalid signature"}, status=401)
        self.ledger.nonces.add(nonce)
        return None

    async def express(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        ref = body.get("out_order_no") if isinstance(body, dict) else None
        self.ledger.calls.append({"service": "express", "key": ref, "body": body, "at": time.time()})
        if (refusal := self._express_refusal(request, raw)) is not None:
            return refusal
        with self._in_flight(f"waybill:{ref}"):
            return await self._express(request, body, ref)

    async def _express(self, request: web.Request, body: dict, ref: str | None) -> web.Response:
        order_no = body.get("order_no")
        if not ref or not order_no or not body.get("address"):
            return web.json_response({"code": 2000, "message": "out_order_no, order_no and address are required"})
        if (response := await self._fault("express", request, order_no, body)) is not None:
            return response
        if self._known("express", ref, self.ledger.express_by_ref):
            return web.json_response({"code": 1002, "message": f"duplicate out_order_no {ref}"})
        waybill_no = f"EX{next(self._serial):010d}"
        self.ledger.express_by_ref.setdefault(ref, waybill_no)      # its lookup finds the first
        self._taken("express", ref)
        self.ledger.waybills[order_no].append(waybill_no)
        self._maybe_reset("express", request)
        if (redirect := self._maybe_redirect("express")) is not None:
            return redirect
        return web.json_response({"code": 0, "message": "ok", "data": {"waybill_no": waybill_no}})

    async def express_lookup(self, request: web.Request) -> web.Response:
        ref = request.match_info["out_order_no"]
        self.ledger.calls.append({"service": "express_lookup", "key": ref, "at": time.time()})
        if (refusal := self._express_refusal(request, await request.read())) is not None:
            return refusal
        if (failure := self._lookup_fault("express")) is not None:
            return failure
        waybill_no = self.ledger.express_by_ref.get(ref)
        if waybill_no is None:
            return web.json_response({"code": 1004, "message": f"no order {ref}"})
        return web.json_response({"code": 0, "message": "ok", "data": {"waybill_no": waybill_no}})

    async def gone(self, request: web.Request) -> web.Response:
        return web.json_response({"error": "nothing here"}, status=404)

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def get_ledger(self, request: web.Request) -> web.Response:
        return web.json_response(self.ledger.as_json())

    async def set_config(self, request: web.Request) -> web.Response:
        try:
            self.configure(await request.json())
        except (ValueError, TypeError, KeyError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"ok": True})

    def configure(self, config: dict) -> None:
        for service, changes in config.items():
            if service not in self.faults:
                raise ValueError(f"unknown service {service!r}; use one of {', '.join(sorted(self.faults))}")
            self.faults[service].update(changes)

    async def reset(self, request: web.Request) -> web.Response:
        self.__init__()
        return web.json_response({"ok": True})


def _trace_headers(request: web.Request) -> dict[str, str]:
    """The W3C trace context a call carried (the tracing test reads what the provider received)."""
    return {name: request.headers[name] for name in ("traceparent", "tracestate") if name in request.headers}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Fake logistics API and SMS gateway")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8900)
    parser.add_argument("--config", default="{}", help="initial faults, JSON (see module docstring)")
    args = parser.parse_args(argv)
    fakes = FakeServices()
    fakes.configure(json.loads(args.config))
    web.run_app(fakes.app(), host=args.host, port=args.port, access_log=None,
                print=lambda _: print(f"fake services on http://{args.host}:{args.port}", flush=True))


if __name__ == "__main__":
    main()
