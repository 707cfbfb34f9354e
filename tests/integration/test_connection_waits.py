"""Only a request that was sent can have an unknown outcome: a call that waited for a connection
(none free in its pool) and got none within its limit sent nothing, and says so; and the worker's
callers of the services (the order agent, the compensator) never wait for each other's
connections. Real HTTP to the fake services, real aiohttp pools."""

from __future__ import annotations

import asyncio
import time
from datetime import date

import aiohttp
import pytest

from app.adapters.effects import http_session
from app.adapters.effects.sms import SmsClient
from app.bootstrap import Runtime
from app.pipeline.errors import EffectNotDelivered, EffectOutcomeUnknown
from app.pipeline.model import EffectJob
from app.pipeline.states import OrderStatus
from app.pipeline.steps import ISSUE_WAYBILL, SEND_SMS
from demo.fakes.registry import worker_settings
from harness.events import order_no
from harness.fakes import fakes_in_process


def job(effect, order: str, token: str) -> EffectJob:
    request = ({"phone": "+8613800000000", "text": "cancelled"} if effect is SEND_SMS else
               {"order_no": order, "address": "1 Test Road"})
    return EffectJob(0, order, f"{order}:X:{effect.name}", date.today(), effect.name, effect, token, 1, request,
                     OrderStatus.CANCELLED)


async def test_an_sms_that_waited_in_vain_for_a_pooled_connection_was_not_sent_and_says_so():
    """One connection, held by a call the gateway answers only after the call's 1.5 s limit: the
    second SMS waits for the pool. It must end as not delivered (retried as it is) once its
    connection limit is out, not as "may have been sent" (looked up, or left to a person) when
    the call's whole limit is: the gateway never saw it."""
    async with fakes_in_process({"sms": {"latency_ms": 4_000}}) as (fakes, url):
        async with http_session(1) as session:
            client = SmsClient(session, base_url=url, timeout_seconds=1.5, connect_timeout_seconds=0.5)
            first, second = order_no(prefix="POOL"), order_no(prefix="POOL")
            holding = asyncio.create_task(client.call(job(SEND_SMS, first, "ref-holding")))
            while not fakes.ledger.calls:                   # the first request reached the gateway: the pool is full
                await asyncio.sleep(0.01)
            with pytest.raises(EffectNotDelivered) as waited:
                await client.call(job(SEND_SMS, second, "ref-waiting"))
            assert "no connection within 0.5s" in str(waited.value)
            with pytest.raises(EffectOutcomeUnknown):    # the one that was sent may have been
                await holding
    refs = [call["body"].get("client_ref") for call in fakes.ledger.calls]
    assert refs == ["ref-holding"], refs


async def test_a_connection_that_never_opens_is_not_a_call_that_may_have_been_sent():
    """A TLS endpoint that takes the TCP connection and never answers the handshake (an overloaded
    terminator): the call's connection limit runs out before a byte of the request was written."""
    received = bytearray()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while chunk := await reader.read(65536):     # the ClientHello, and nothing after it
            received.extend(chunk)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with http_session(4) as session:
            client = SmsClient(session, base_url=f"https://127.0.0.1:{port}", timeout_seconds=1.5,
                               connect_timeout_seconds=0.5)
            with pytest.raises(EffectNotDelivered) as hung:
                await client.call(job(SEND_SMS, order_no(prefix="POOL"), "ref-never-sent"))
            assert "no connection within 0.5s" in str(hung.value)
    finally:
        server.close()
        await server.wait_closed()
    assert received and b"ref-never-sent" not in received       # a handshake began; no request followed


async def test_the_order_agent_never_waits_for_a_connection_the_compensator_holds(settings):
    """One call in flight each (EFFECT_CONCURRENCY=1): the compensator's redrive holds its only
    connection on a gateway that hangs, and the order agent's waybill call goes through at once
    on a pool of its own."""
    async with fakes_in_process({"sms": {"latency_ms": 4_000}}) as (fakes, url):
        s = settings.model_copy(update={
            **{name.lower(): value for name, value in worker_settings(url).items()}, "effect_concurrency": 1,
            "effect_timeout_seconds": 3.0, "batch_size": 1, "compensation_drain_batch_size": 1,
            "compensator_batch_size": 1, "bulk_chunk_size": 1})
        runtime = await Runtime(s).start(kafka=False)
        try:
            redriving = asyncio.create_task(
                runtime.compensator.processor.effects.call(job(SEND_SMS, order_no(prefix="POOL"), "ref-redrive")))
            while not fakes.ledger.calls:
                await asyncio.sleep(0.01)
            order = order_no(prefix="POOL")
            started = time.monotonic()
            receipt = await runtime.processor.effects.call(job(ISSUE_WAYBILL, order, "key-live"))
            assert receipt.reference and time.monotonic() - started < 1.0
            with pytest.raises((EffectOutcomeUnknown, aiohttp.ClientError)):
                await redriving
        finally:
            await runtime.stop()
    assert [call["service"] for call in fakes.ledger.calls] == ["sms", "waybill"]
