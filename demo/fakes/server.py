"""The fakes' app: every fake provider of the registry on one aiohttp app, with what they share.

Each fake's routes come from its module (:mod:`demo.fakes.registry` lists them); what a fake call
goes through is here: its faults (:mod:`demo.fakes.faults`, by the fake's name), the ledger
(:mod:`demo.fakes.ledger`), the numbers it hands out, the calls in flight per key. Besides the
fakes' routes:

* ``GET /__ledger``: the ledger; ``POST /__reset`` clears ledger and faults;
* ``POST /__config``: faults by fake name (``{"waybill": {"fail_next": 2}}``); an unknown name or
  setting answers 400;
* ``GET /__health``; ``/__gone`` (404: where ``redirect_next`` points).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from urllib.parse import urlencode

from aiohttp import web

from demo.fakes import registry
from demo.fakes.fake import Fake
from demo.fakes.faults import Faults
from demo.fakes.ledger import Ledger


class FakeServices:
    def __init__(self, fakes: Iterable[Fake] | None = None) -> None:
        self.fakes = tuple(registry.FAKES if fakes is None else fakes)
        self.reset_all()

    def reset_all(self) -> None:
        self.faults = {fake.name: Faults() for fake in self.fakes}
        self.ledger = Ledger()
        self._serial = itertools.count(1)

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes([route for fake in self.fakes for route in fake.routes(self)])
        app.add_routes([
            web.get("/__ledger", self.get_ledger),
            web.post("/__config", self.set_config),
            web.post("/__reset", self.reset),
            web.get("/__health", self.health),
            web.route("*", "/__gone", self.gone),
        ])
        return app

    # -- what a fake's call goes through -------------------------------------------------

    def serial(self) -> int:
        """The next number the fakes hand out (waybills, messages), one sequence for all."""
        return next(self._serial)

    def called(self, service: str, request: web.Request | None = None, **details) -> None:
        """A raw call, in the ledger (with the W3C trace context it carried)."""
        self.ledger.calls.append({"service": service, **details, "at": time.time(),
                                  **(_trace_headers(request) if request is not None else {})})

    async def fault(self, name: str, request: web.Request, order_no: str | None,
                    asked: dict | None = None) -> web.Response | None:
        """Apply ``name``'s injected faults; returns a response to send instead of doing the work.
        ``asked`` is the request as ``echo_orders`` repeats it."""
        faults = self.faults[name]
        if faults.in_outage():
            # Down: the call hangs, then gets nothing done.
            self.ledger.outage_calls[name] += 1
            await asyncio.sleep(faults.timeout_ms / 1000)
            return web.json_response({"error": "provider down"}, status=503)
        if (wait := faults.retry_after()) is not None:
            self.ledger.rate_limited[name] += 1
            return web.json_response({"error": "too many requests"}, status=429, headers={"Retry-After": str(wait)})
        if latency := faults.latency():
            await asyncio.sleep(latency)
        if faults.take("timeout_next", "timeout_rate") or order_no in faults.hang_orders:
            self.injected(name, "timeout")
            await asyncio.sleep(faults.timeout_ms / 1000)
        while order_no is not None and order_no in faults.held_orders:
            await asyncio.sleep(0.05)
        if faults.take("fail_next", "fail_rate"):
            self.injected(name, "fail")
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

    def lookup_fault(self, name: str) -> web.Response | None:
        """A 503 while ``name``'s ``lookup_fail_next`` counts down."""
        faults = self.faults[name]
        if faults.lookup_fail_next <= 0:
            return None
        faults.lookup_fail_next -= 1
        self.injected(name, "lookup_fail")
        return web.json_response({"error": "injected failure"}, status=503)

    def after_work(self, name: str, request: web.Request) -> web.Response | None:
        """The faults that strike once the work is done: the connection dropped (a reset), or an
        answer that points elsewhere (a redirect, returned to send instead of the answer)."""
        faults = self.faults[name]
        if request.transport is not None and faults.take("reset_next", "reset_rate"):
            # The work is done; the caller never hears about it.
            self.injected(name, "reset")
            request.transport.abort()
        if faults.redirect_next > 0:
            faults.redirect_next -= 1
            # The work is done; the answer points somewhere that knows nothing of it.
            return web.Response(status=303, headers={"Location": "/__gone"})
        return None

    def injected(self, name: str, kind: str) -> None:
        self.ledger.injected[name][kind] += 1

    def known(self, name: str, key: str) -> str | None:
        """What ``name`` answers a repeated ``key`` with (its first call's reference), or None when the
        key is new to it: never taken, ``ignore_idempotency_key``, or taken longer ago than it keeps keys."""
        faults = self.faults[name]
        answer = self.ledger.answers[name].get(key)
        if answer is None or faults.ignore_idempotency_key or faults.forgotten(self.ledger.taken_at.get((name, key))):
            return None
        return answer

    def did(self, fake: Fake, order_no: str, reference: str, key: str | None, *, first: bool = False,
            idempotent: bool = True) -> None:
        """``fake`` did its effect for ``order_no`` under ``key``: what ``key`` answers from now on
        (``first``: the first reference stays the answer, as a provider whose lookup finds the first),
        when it took the key (``idempotent``: a key it keeps, not a reference it only files), and the
        effect in the ledger."""
        now = time.time()
        if key is not None:
            answers = self.ledger.answers[fake.name]
            answers[key] = answers.get(key, reference) if first else reference
        if key is not None and idempotent:
            self.ledger.taken_at[fake.name, key] = now
            self.ledger.keys[fake.name].setdefault(key, now)
        self.ledger.effects[fake.effect][order_no].append(
            {"reference": reference, "key": key, "at": now, "provider": fake.name})

    @contextmanager
    def in_flight(self, key: str) -> Iterator[None]:
        ledger = self.ledger
        ledger.in_flight[key] += 1
        ledger.peak_in_flight = max(ledger.peak_in_flight, ledger.in_flight[key])
        try:
            yield
        finally:
            ledger.in_flight[key] -= 1

    # -- the fakes' own routes ------------------------------------------------------------

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
        for name, changes in config.items():
            if name not in self.faults:
                raise ValueError(f"unknown service {name!r}; use one of {', '.join(sorted(self.faults))}")
            self.faults[name].update(changes)

    async def reset(self, request: web.Request) -> web.Response:
        self.reset_all()
        return web.json_response({"ok": True})


def _trace_headers(request: web.Request) -> dict[str, str]:
    """The W3C trace context a call carried (the tracing test reads what the provider received)."""
    return {name: request.headers[name] for name in ("traceparent", "tracestate") if name in request.headers}
